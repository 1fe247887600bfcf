#include "worker/deployment_task.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "model/batch_generator.h"
#include "model/config.h"
#include "model/cpu_layer_ops.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "model/longnet.h"
#include "model/model_folder.h"
#include "model/ring_sequence_attention.h"

namespace dattn {
namespace worker {
namespace {

// The model, loaded from the plan's checkpoint onto the worker's device.
struct Loaded {
  std::unique_ptr<model::ServingModel> served;
  v1::DeploymentStatus status;
};

absl::StatusOr<Loaded> Load(const v1::DeploymentRankPlan& plan,
                            const DeploymentTaskOptions& options, comm::Communicator* ring) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<model::LongNetConfig> planned = model::ParseConfigJson(plan.model_config_json());
  if (!planned.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan's model config: ", planned.status().message()));
  }
  // A checkpoint (its checksums verified) or an imported model (model/model_folder.h); its
  // errors name the folder or the file.
  absl::StatusOr<model::ModelFolder> folder = model::ModelFolder::Open(plan.checkpoint());
  if (!folder.ok()) return folder.status();
  absl::StatusOr<model::LongNetConfig> found = model::ParseConfigJson(folder->model_config_json());
  if (!found.ok() || *found != *planned) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model folder ", plan.checkpoint(),
        ": its model is not the one the deployment was submitted with (the folder changed since); "
        "submit the deployment again"));
  }
  absl::StatusOr<model::ParamLayout> layout = model::BuildParamLayout(*planned);
  if (!layout.ok()) return layout.status();
  std::vector<float> params(static_cast<size_t>(layout->total()));
  if (absl::Status s = folder->ReadWeights(*layout, absl::MakeSpan(params)); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("model folder ", plan.checkpoint(), ": ", s.message()));
  }
  absl::StatusOr<std::unique_ptr<model::ServingModel>> served =
      options.new_serving_model
          ? options.new_serving_model(*planned, params, plan.max_context(), plan.max_batch(), ring)
          : model::NewCpuServingModel(*planned, params, plan.max_context(), plan.max_batch(),
                                      options.num_threads, ring);
  if (!served.ok()) return served.status();
  Loaded loaded;
  loaded.served = *std::move(served);
  v1::DeploymentStatus& st = loaded.status;
  st.set_ready(true);
  st.set_load_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  st.set_parameters(loaded.served->parameters());
  st.set_vocab_size(planned->vocab_size);
  st.set_cache_bytes_per_sequence(loaded.served->cache_bytes_per_sequence());
  st.set_ranks(ring == nullptr ? 1 : ring->size());
  st.set_checkpoint_step(folder->step());
  st.set_model_source(folder->Describe());
  st.set_device(loaded.served->device());
  return loaded;
}

// log p(tokens[i + 1] | tokens[..i]) for every i, from one forward pass (over the ring on a
// ring: Decoder::Score).
absl::StatusOr<v1::ScoreResponse> Score(model::ServingModel& served,
                                        const v1::ScoreRequest& request, int64_t max_context) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = request.tokens_size();
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: ", n, " given; scoring needs at least 2 (the first is context)"));
  }
  if (n > max_context) {
    return absl::OutOfRangeError(
        absl::StrCat("tokens: ", n, " pass the deployment's max_context of ", max_context));
  }
  std::vector<int32_t> tokens(request.tokens().begin(), request.tokens().end());
  std::vector<double> logprobs(static_cast<size_t>(n - 1));
  if (absl::Status s = served.Score(tokens.data(), n, logprobs.data()); !s.ok()) return s;
  v1::ScoreResponse response;
  double sum = 0;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const double lp = logprobs[static_cast<size_t>(i)];
    if (!std::isfinite(lp)) {
      return absl::InternalError(
          absl::StrCat("the model's log-probability of token ", i + 1, " is ", lp));
    }
    response.add_logprobs(lp);
    sum += lp;
  }
  response.set_tokens(n);
  response.set_loss(-sum / static_cast<double>(n - 1));
  response.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return response;
}

model::GenerationRequest ToRequest(const v1::GenerateRequest& r) {
  model::GenerationRequest g;
  g.prompt.assign(r.prompt().begin(), r.prompt().end());
  g.options.sampling.temperature = r.sampling().temperature();
  g.options.sampling.top_k = r.sampling().top_k();
  g.options.sampling.top_p = r.sampling().top_p() == 0 ? 1.0 : r.sampling().top_p();
  g.options.sampling.seed = r.sampling().seed();
  g.options.max_tokens = r.max_tokens() == 0 ? 16 : r.max_tokens();
  for (const v1::TokenSequence& stop : r.stop()) {
    g.options.stop_sequences.emplace_back(stop.tokens().begin(), stop.tokens().end());
  }
  g.priority = r.priority();
  return g;
}

// What the reader thread hands the serving loop.
class Inbox {
 public:
  void Push(v1::ServeWork work) {
    absl::MutexLock lock(&mu_);
    work_.push_back(std::move(work));
  }
  void End() {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }
  // Takes what came; waits up to `wait` while nothing did.
  std::deque<v1::ServeWork> Take(absl::Duration wait, bool* ended) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !work_.empty() || ended_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
    *ended = ended_;
    return std::exchange(work_, {});
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::ServeWork> work_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

v1::ServeUpdate Error(int64_t request_id, const absl::Status& s) {
  v1::ServeUpdate u;
  u.set_request_id(request_id);
  u.set_error(std::string(s.message()));
  u.set_error_code(static_cast<int>(s.code()));
  return u;
}

}  // namespace

absl::Status RequestFailure(const absl::Status& error) {
  if (!absl::IsAborted(error)) return error;
  return absl::UnavailableError(absl::StrCat("the deployment's ring broke under the request (",
                                             error.message(),
                                             "); the deployment is placed again: retry"));
}

absl::Status RunDeploymentTask(const v1::TaskAssignment& assignment,
                               const DeploymentTaskOptions& options) {
  if (!assignment.has_deployment_plan()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", assignment.task_id(), " carries no deployment plan"));
  }
  const v1::DeploymentRankPlan& plan = assignment.deployment_plan();
  auto cancelled = [&] { return options.is_cancelled && options.is_cancelled(); };
  comm::Communicator* ring = nullptr;
  if (plan.ranks() > 1) {
    if (!options.join_ring) {
      return absl::FailedPreconditionError(
          absl::StrCat("task ", assignment.task_id(), ": a deployment on ", plan.ranks(),
                       " ranks, and this worker was given no way to join its ring"));
    }
    absl::StatusOr<comm::Communicator*> joined = options.join_ring();
    if (!joined.ok()) return joined.status();
    ring = *joined;
    if (ring->size() != plan.ranks() || ring->rank() != assignment.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("task ", assignment.task_id(), ": its ring is rank ", ring->rank(), " of ",
                       ring->size(), ", the plan rank ", assignment.rank(), " of ", plan.ranks()));
    }
  }
  absl::StatusOr<Loaded> loaded = Load(plan, options, ring);
  if (!loaded.ok()) return loaded.status();
  if (cancelled()) return absl::CancelledError("undeployed while loading");
  model::ServingModel& served = *loaded->served;
  if (ring != nullptr && ring->rank() > 0) {
    if (options.on_following) options.on_following();
    absl::Status followed = served.Follow();
    if (cancelled()) return absl::CancelledError("the deployment was stopped");
    if (followed.ok()) {
      return absl::UnavailableError("rank 0 of the deployment stopped serving; it is placed again");
    }
    return followed;
  }
  // Rank 0 of a ring drives the others; idle, it tells them it is alive well within their wait.
  if (absl::Status s = served.Lead(); !s.ok()) return s;
  const absl::Duration keep_alive =
      ring == nullptr ? absl::InfiniteDuration() : std::min(absl::Seconds(1), ring->timeout() / 4);
  auto release = absl::MakeCleanup([&served] { (void)served.Release(); });
  absl::StatusOr<std::unique_ptr<ServeChannel>> channel = options.open_channel(loaded->status);
  if (!channel.ok()) return channel.status();
  if (options.on_status) options.on_status(loaded->status);

  Inbox inbox;
  ServeChannel* const ch = channel->get();
  std::thread reader([ch, &inbox] {
    v1::ServeWork work;
    while (ch->Read(&work)) inbox.Push(std::move(work));
    inbox.End();
  });
  v1::DeploymentStatus status = loaded->status;
  std::map<int64_t, int64_t> generator_of;  // The coordinator's request id -> the generator's.
  bool broken = false;
  auto send = [&](const v1::ServeUpdate& u) {
    if (!broken && !ch->Write(u)) broken = true;
  };
  absl::Time last_status = absl::Now();
  absl::Status outcome = absl::OkStatus();
  while (true) {
    if (options.is_cancelled && options.is_cancelled()) {
      outcome = absl::CancelledError("the deployment was stopped");
      break;
    }
    bool ended = false;
    const bool busy = served.running() > 0 || served.queued() > 0;
    std::deque<v1::ServeWork> work =
        inbox.Take(busy ? absl::ZeroDuration() : options.idle_wait, &ended);
    for (v1::ServeWork& w : work) {
      const int64_t id = w.request_id();
      if (w.has_score()) {
        absl::StatusOr<v1::ScoreResponse> score = Score(served, w.score(), plan.max_context());
        v1::ServeUpdate u;
        if (score.ok()) {
          u.set_request_id(id);
          *u.mutable_score() = *std::move(score);
        } else {
          u = Error(id, RequestFailure(score.status()));
        }
        status.set_requests_done(status.requests_done() + 1);
        send(u);
      } else if (w.has_generate()) {
        // Queued requests that the next round admits (free sequences) are not waiting.
        const int64_t free_sequences = std::max<int64_t>(0, plan.max_batch() - served.running());
        if (served.queued() - free_sequences >= std::max(1, plan.max_queued())) {
          send(Error(id, absl::ResourceExhaustedError(
                             absl::StrCat("the deployment's queue is full (", served.queued(),
                                          " requests wait for one of its ", plan.max_batch(),
                                          " sequences); retry later"))));
          continue;
        }
        model::GenerationRequest request = ToRequest(w.generate());
        if (w.timeout_seconds() > 0) {
          request.deadline = absl::Now() + absl::Seconds(w.timeout_seconds());
        }
        request.on_token = [&send, &status, id](const model::GeneratedToken& t) {
          v1::ServeUpdate u;
          u.set_request_id(id);
          u.mutable_token()->set_token(t.token);
          u.mutable_token()->set_logprob(t.logprob);
          status.set_tokens_generated(status.tokens_generated() + 1);
          send(u);
          return true;
        };
        request.on_done = [&send, &status, &generator_of,
                           id](absl::StatusOr<model::GenerateResult> result) {
          generator_of.erase(id);
          status.set_requests_done(status.requests_done() + 1);
          if (!result.ok()) {
            send(Error(id, RequestFailure(result.status())));
            return;
          }
          v1::ServeUpdate u;
          u.set_request_id(id);
          v1::GenerateDone* done = u.mutable_done();
          done->set_finish_reason(model::FinishReasonName(result->finish));
          done->set_prompt_tokens(result->prompt_tokens);
          done->set_generated_tokens(static_cast<int64_t>(result->tokens.size()));
          done->set_queue_seconds(result->queue_seconds);
          done->set_prefill_seconds(result->prefill_seconds);
          send(u);
        };
        absl::StatusOr<int64_t> queued = served.Submit(std::move(request));
        if (!queued.ok()) {
          send(Error(id, queued.status()));
        } else {
          generator_of[id] = *queued;
        }
      } else if (w.cancel()) {
        auto it = generator_of.find(id);
        if (it != generator_of.end()) served.Cancel(it->second);
      }
    }
    if (served.running() > 0 || served.queued() > 0) {
      absl::StatusOr<model::TickStats> tick = served.Tick(absl::Now());
      if (!tick.ok()) {
        outcome = tick.status();  // Every request in the step was failed with it.
        break;
      }
    } else if (absl::Status alive = served.KeepAlive(keep_alive); !alive.ok()) {
      outcome = alive;  // A follower is gone: the ring is placed again.
      break;
    }
    status.set_running(served.running());
    status.set_queued(served.queued());
    if (options.on_status && absl::Now() - last_status >= options.status_interval) {
      last_status = absl::Now();
      options.on_status(status);
    }
    if (ended || broken) {
      if (!(options.is_cancelled && options.is_cancelled())) {
        outcome = absl::UnavailableError(
            "the Serve stream to the coordinator ended; the deployment is placed again");
      } else {
        outcome = absl::CancelledError("the deployment was stopped");
      }
      break;
    }
  }
  // Whatever is still in flight ends now, its client told why (as far as the stream still goes).
  for (const auto& [id, queued] : std::map<int64_t, int64_t>(generator_of)) {
    served.Cancel(queued);
  }
  (void)ch->Close();
  reader.join();
  return outcome;
}

}  // namespace worker
}  // namespace dattn
