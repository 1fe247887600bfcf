// A deployment's rank over an in-memory channel: it loads a checkpoint, answers Generate with the
// tokens model::Generate gives on the same weights (each token streamed, then done), Score with
// the forward pass's log-probabilities, refuses bad requests and a full queue naming why, ends a
// cancelled request at once, stops CANCELLED when undeployed and UNAVAILABLE when its stream ends.
#include "worker/deployment_task.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "model/longnet.h"
#include "model/testing/gloo_ranks.h"
#include "model/testing/test_checkpoint.h"

namespace dattn {
namespace worker {
namespace {

model::LongNetConfig Config() {
  model::LongNetConfig c;
  c.vocab_size = 32;
  c.d_model = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_dim = 24;
  c.segment_lengths = {4, 8};
  c.dilation_rates = {1, 2};
  return c;
}

// A checkpoint of a perturbed model; its weights in *weights.
std::string SaveModel(const std::string& name, std::vector<float>* weights) {
  const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(root);
  absl::StatusOr<std::string> dir =
      model::testing::SaveTestCheckpoint(root, Config(), 5, 3, 0.4f, weights);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

class FakeChannel : public ServeChannel {
 public:
  bool Read(v1::ServeWork* work) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](FakeChannel* c)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return !c->in_.empty() || c->closed_; },
        this));
    if (in_.empty()) return false;
    *work = in_.front();
    in_.pop_front();
    return true;
  }
  bool Write(const v1::ServeUpdate& update) override {
    absl::MutexLock lock(&mu_);
    out_.push_back(update);
    return !closed_;
  }
  absl::Status Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    return absl::OkStatus();
  }
  void Send(v1::ServeWork work) {
    absl::MutexLock lock(&mu_);
    in_.push_back(std::move(work));
  }
  // Waits (10 s at most) until request `id` has a final update; returns every update of it.
  std::vector<v1::ServeUpdate> Await(int64_t id) {
    absl::MutexLock lock(&mu_);
    auto final_for = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const v1::ServeUpdate& u : out_) {
        if (u.request_id() == id && (u.has_done() || u.has_score() || !u.error().empty())) {
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&final_for), absl::Seconds(10));
    std::vector<v1::ServeUpdate> mine;
    for (const v1::ServeUpdate& u : out_) {
      if (u.request_id() == id) mine.push_back(u);
    }
    return mine;
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::ServeWork> in_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ServeUpdate> out_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

struct Running {
  FakeChannel* channel = nullptr;  // Owned by the task once opened.
  std::atomic<bool> cancel{false};
  std::atomic<bool> opened{false};
  v1::DeploymentStatus ready;
  absl::Status outcome;
  std::thread thread;
};

v1::TaskAssignment Assignment(const std::string& checkpoint, int max_batch, int max_queued) {
  v1::TaskAssignment a;
  a.set_task_id("j-1/1/0");
  a.set_job_id("j-1");
  v1::DeploymentRankPlan* p = a.mutable_deployment_plan();
  p->set_checkpoint(checkpoint);
  p->set_model_config_json(model::ConfigToJson(Config()));
  p->set_max_context(64);
  p->set_max_batch(max_batch);
  p->set_max_queued(max_queued);
  return a;
}

void Start(Running* r, const v1::TaskAssignment& a) {
  r->thread = std::thread([r, a] {
    DeploymentTaskOptions o;
    o.num_threads = 1;
    o.is_cancelled = [r] { return r->cancel.load(); };
    o.open_channel =
        [r](const v1::DeploymentStatus& ready) -> absl::StatusOr<std::unique_ptr<ServeChannel>> {
      auto channel = std::make_unique<FakeChannel>();
      r->channel = channel.get();
      r->ready = ready;
      r->opened = true;
      return channel;
    };
    r->outcome = RunDeploymentTask(a, o);
  });
  for (int i = 0; i < 1000 && !r->opened; ++i) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(r->opened);
}

v1::ServeWork Generate(int64_t id, std::vector<int32_t> prompt, int64_t max_tokens) {
  v1::ServeWork w;
  w.set_request_id(id);
  for (int32_t t : prompt) w.mutable_generate()->add_prompt(t);
  w.mutable_generate()->set_max_tokens(max_tokens);
  return w;
}

TEST(DeploymentTaskTest, ServesGenerateAndScoreAsTheModelComputesThem) {
  std::vector<float> weights;
  const std::string dir = SaveModel("serve", &weights);
  Running r;
  Start(&r, Assignment(dir, 2, 8));
  EXPECT_TRUE(r.ready.ready());
  EXPECT_EQ(r.ready.checkpoint_step(), 3);
  EXPECT_EQ(r.ready.vocab_size(), 32);
  EXPECT_GT(r.ready.cache_bytes_per_sequence(), 0);

  // The same weights, generated with directly.
  auto lm = model::LongNetLM<float>::CreateCpu(Config(), {}, 1);
  ASSERT_TRUE((*lm)->CopyParamsFromHost(weights.data()).ok());
  auto decoder = model::Decoder<float>::Create(lm->get(), 64);
  model::GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 12;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  auto expected = model::Generate<float>(**decoder, prompt, o, nullptr);
  ASSERT_TRUE(expected.ok());

  r.channel->Send(Generate(7, prompt, 12));
  std::vector<v1::ServeUpdate> got = r.channel->Await(7);
  ASSERT_FALSE(got.empty());
  ASSERT_TRUE(got.back().has_done()) << got.back().DebugString();
  EXPECT_EQ(got.back().done().finish_reason(), "length");
  EXPECT_EQ(got.back().done().generated_tokens(), 12);
  ASSERT_EQ(got.size(), 13u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(got[i].token().token(), expected->tokens[i].token) << i;
    EXPECT_NEAR(got[i].token().logprob(), expected->tokens[i].logprob, 1e-6) << i;
  }

  // Score: the log-probability of each next token, from the forward pass.
  v1::ServeWork score;
  score.set_request_id(8);
  for (int32_t t : prompt) score.mutable_score()->add_tokens(t);
  r.channel->Send(score);
  got = r.channel->Await(8);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].has_score()) << got[0].DebugString();
  ASSERT_EQ(got[0].score().logprobs_size(), 7);
  model::TokenBatch b;
  b.tokens = prompt.data();
  b.batch = 1;
  b.seq_len = 8;
  ASSERT_TRUE((*lm)->Forward(b).ok());
  std::vector<float> logits(8 * 32);
  ASSERT_TRUE((*lm)->CopyLogitsToHost(logits.data()).ok());
  double sum = 0;
  for (int i = 0; i < 7; ++i) {
    double z = 0;
    for (int k = 0; k < 32; ++k) z += std::exp(static_cast<double>(logits[i * 32 + k]));
    const double lp = logits[i * 32 + prompt[i + 1]] - std::log(z);
    EXPECT_NEAR(got[0].score().logprobs(i), lp, 1e-5) << i;
    sum += lp;
  }
  EXPECT_NEAR(got[0].score().loss(), -sum / 7, 1e-5);

  // Bad requests: named, and the deployment keeps serving.
  r.channel->Send(Generate(9, {1, 40}, 3));
  got = r.channel->Await(9);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].error_code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(got[0].error().find("prompt token 1 is 40"), std::string::npos) << got[0].error();
  r.channel->Send(Generate(10, std::vector<int32_t>(65, 1), 3));
  got = r.channel->Await(10);
  EXPECT_EQ(got[0].error_code(), static_cast<int>(absl::StatusCode::kOutOfRange));

  // A cancel ends a long request at once.
  r.channel->Send(Generate(11, {1, 2}, 60));
  v1::ServeWork cancel;
  cancel.set_request_id(11);
  cancel.set_cancel(true);
  r.channel->Send(cancel);
  got = r.channel->Await(11);
  ASSERT_TRUE(got.back().has_done());
  EXPECT_EQ(got.back().done().finish_reason(), "cancelled");
  EXPECT_LT(got.back().done().generated_tokens(), 60);

  r.cancel = true;
  r.thread.join();
  EXPECT_TRUE(absl::IsCancelled(r.outcome)) << r.outcome;
}

// A deployment on a ring of S ranks (threads with Gloo communicators, as the worker's rendezvous
// would give them): rank 0 serves, the others follow it; Generate and Score give what one rank
// gives (the tokens exactly, log-probabilities to fp32 rounding), the status says the ring's size
// and the whole sequence's cache, a cancel ends every rank CANCELLED. Then a follower that dies
// ends rank 0's task with the ring's error within a keep-alive (the attempt is placed again),
// never a hang.
struct RingRun {
  std::vector<std::unique_ptr<Running>> ranks;
  std::vector<absl::Status> results;
  std::thread thread;
  std::atomic<bool> kill_follower{false};
};

void StartRing(RingRun* run, const std::string& dir, int ranks, absl::Duration timeout) {
  for (int r = 0; r < ranks; ++r) run->ranks.push_back(std::make_unique<Running>());
  run->thread = std::thread([run, dir, ranks, timeout] {
    run->results = model::testing::RunRanks(
        ranks, ranks,
        [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
          Running* r = run->ranks[static_cast<size_t>(rank)].get();
          v1::TaskAssignment a = Assignment(dir, 2, 8);
          a.set_task_id(absl::StrCat("j-1/1/", rank));
          a.set_rank(rank);
          a.mutable_deployment_plan()->set_ranks(ranks);
          DeploymentTaskOptions o;
          o.num_threads = 1;
          o.is_cancelled = [r] { return r->cancel.load(); };
          o.join_ring = [sp]() -> absl::StatusOr<comm::Communicator*> { return sp; };
          o.on_following = [r] { r->opened = true; };
          o.open_channel = [r](const v1::DeploymentStatus& ready)
              -> absl::StatusOr<std::unique_ptr<ServeChannel>> {
            auto channel = std::make_unique<FakeChannel>();
            r->channel = channel.get();
            r->ready = ready;
            r->opened = true;
            return channel;
          };
          // The last rank "dies" when told to: its communicator breaks, as a killed process's
          // connections do.
          std::thread killer;
          if (rank == ranks - 1) {
            killer = std::thread([run, r, sp] {
              while (!run->kill_follower.load() && !r->cancel.load()) {
                absl::SleepFor(absl::Milliseconds(10));
              }
              if (run->kill_follower.load()) sp->Abort("killed by the test");
            });
          }
          r->outcome = RunDeploymentTask(a, o);
          r->cancel = true;  // Stops the killer thread.
          if (killer.joinable()) killer.join();
          return absl::OkStatus();
        },
        timeout, absl::StrCat("deploy", ranks));
  });
  for (int i = 0; i < 3000; ++i) {
    bool all = true;
    for (const auto& r : run->ranks) all = all && r->opened.load();
    if (all) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (const auto& r : run->ranks) ASSERT_TRUE(r->opened);
}

TEST(DeploymentTaskTest, ARingOfRanksServesAsOneRank) {
  std::vector<float> weights;
  const std::string dir = SaveModel("ring", &weights);
  // One rank: the reference.
  Running one;
  Start(&one, Assignment(dir, 2, 8));
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  one.channel->Send(Generate(1, prompt, 14));
  // 64 tokens, the deployment's max_context: on a ring the call to the followers takes two
  // transfers (Decoder::Lead's packets).
  v1::ServeWork score;
  score.set_request_id(2);
  for (int32_t i = 0; i < 64; ++i) score.mutable_score()->add_tokens((i * 7 + 2) % 32);
  one.channel->Send(score);
  const std::vector<v1::ServeUpdate> expected = one.channel->Await(1);
  const std::vector<v1::ServeUpdate> expected_score = one.channel->Await(2);
  one.cancel = true;
  one.thread.join();
  ASSERT_EQ(expected.size(), 15u);
  ASSERT_TRUE(expected_score[0].has_score());

  for (int ranks : {2, 4}) {
    RingRun run;
    StartRing(&run, dir, ranks, absl::Seconds(60));
    Running& leader = *run.ranks[0];
    EXPECT_EQ(leader.ready.ranks(), ranks);
    EXPECT_EQ(leader.ready.cache_bytes_per_sequence(), one.ready.cache_bytes_per_sequence());
    // Two at once (the second prompt's tail on the last rank), then the Score.
    leader.channel->Send(Generate(1, prompt, 14));
    leader.channel->Send(Generate(3, {7, 7}, 5));
    leader.channel->Send(score);
    const std::vector<v1::ServeUpdate> got = leader.channel->Await(1);
    ASSERT_EQ(got.size(), expected.size()) << ranks << " ranks: " << got.back().DebugString();
    for (size_t i = 0; i + 1 < got.size(); ++i) {
      EXPECT_EQ(got[i].token().token(), expected[i].token().token()) << ranks << " ranks, " << i;
      EXPECT_NEAR(got[i].token().logprob(), expected[i].token().logprob(), 1e-5) << i;
    }
    EXPECT_TRUE(leader.channel->Await(3).back().has_done());
    const std::vector<v1::ServeUpdate> scored = leader.channel->Await(2);
    ASSERT_TRUE(scored[0].has_score()) << scored[0].DebugString();
    ASSERT_EQ(scored[0].score().logprobs_size(), 63);
    for (int i = 0; i < 63; ++i) {
      EXPECT_NEAR(scored[0].score().logprobs(i), expected_score[0].score().logprobs(i), 1e-5) << i;
    }
    for (const auto& r : run.ranks) r->cancel = true;
    run.thread.join();
    for (int r = 0; r < ranks; ++r) {
      EXPECT_TRUE(absl::IsCancelled(run.ranks[static_cast<size_t>(r)]->outcome))
          << ranks << " ranks, rank " << r << ": " << run.ranks[static_cast<size_t>(r)]->outcome;
    }
  }

  // A follower dies while rank 0 is idle: rank 0 learns it at its next keep-alive (at most 1 s;
  // the communicator's timeout is 8 s) and ends with the ring's error, not CANCELLED.
  RingRun run;
  StartRing(&run, dir, 2, absl::Seconds(8));
  const absl::Time killed = absl::Now();
  run.kill_follower = true;
  run.thread.join();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(8));
  const absl::Status& leader = run.ranks[0]->outcome;
  EXPECT_FALSE(leader.ok());
  EXPECT_FALSE(absl::IsCancelled(leader)) << leader;
  EXPECT_FALSE(run.ranks[1]->outcome.ok());
}

TEST(DeploymentTaskTest, AFullQueueIsRefusedAndAClosedStreamEndsTheTask) {
  std::vector<float> weights;
  const std::string dir = SaveModel("queue", &weights);
  Running r;
  Start(&r, Assignment(dir, /*max_batch=*/1, /*max_queued=*/1));
  // One runs, one waits, the third is refused.
  for (int id = 1; id <= 3; ++id) r.channel->Send(Generate(id, {1, 2, 3}, 50));
  std::vector<v1::ServeUpdate> third = r.channel->Await(3);
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].error_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(third[0].error().find("queue is full"), std::string::npos) << third[0].error();
  EXPECT_TRUE(r.channel->Await(1).back().has_done());
  EXPECT_TRUE(r.channel->Await(2).back().has_done());
  // The coordinator went away: the task ends UNAVAILABLE (placed again).
  ASSERT_TRUE(r.channel->Close().ok());
  r.thread.join();
  EXPECT_TRUE(absl::IsUnavailable(r.outcome)) << r.outcome;
}

TEST(DeploymentTaskTest, ACheckpointThatChangedIsRefused) {
  std::vector<float> weights;
  const std::string dir = SaveModel("changed", &weights);
  v1::TaskAssignment a = Assignment(dir, 1, 1);
  model::LongNetConfig other = Config();
  other.ffn_dim = 20;
  a.mutable_deployment_plan()->set_model_config_json(model::ConfigToJson(other));
  DeploymentTaskOptions o;
  o.open_channel =
      [](const v1::DeploymentStatus&) -> absl::StatusOr<std::unique_ptr<ServeChannel>> {
    return absl::InternalError("unused");
  };
  absl::Status s = RunDeploymentTask(a, o);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find(dir), std::string::npos) << s;
  a.mutable_deployment_plan()->set_checkpoint(dir + "-missing");
  s = RunDeploymentTask(a, o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir + "-missing"), std::string::npos) << s;
}

// A request that fails because the ring's communicator was aborted under it (the task cancelled
// when another rank's worker was lost) is told UNAVAILABLE (retry), naming the cause; its own
// errors keep their codes.
TEST(DeploymentTaskTest, ARequestUnderAnAbortedRingIsToldToRetry) {
  const absl::Status aborted = RequestFailure(absl::AbortedError(
      "gloo rank 0: communicator aborted: the task was cancelled: worker w-1 lost"));
  EXPECT_TRUE(absl::IsUnavailable(aborted)) << aborted;
  EXPECT_NE(aborted.message().find("worker w-1 lost"), std::string::npos) << aborted;
  EXPECT_NE(aborted.message().find("retry"), std::string::npos) << aborted;
  for (const absl::Status& own :
       {absl::InvalidArgumentError("token 99"), absl::DeadlineExceededError("deadline"),
        absl::InternalError("logit NaN"), absl::UnavailableError("peer closed")}) {
    EXPECT_EQ(RequestFailure(own), own);
  }
}

// The model is made by the worker's device (options.new_serving_model: TaskDevice::NewServingModel)
// from the checkpoint's weights, and what it says it is goes into the status; a device that cannot
// serve the deployment fails the task with its own error, before any channel opens.
TEST(DeploymentTaskTest, TheWorkersDeviceMakesTheModel) {
  std::vector<float> weights;
  const std::string dir = SaveModel("device", &weights);
  const v1::TaskAssignment a = Assignment(dir, 1, 1);
  DeploymentTaskOptions o;
  std::vector<float> seen;
  int64_t seen_context = 0, seen_batch = 0;
  o.new_serving_model =
      [&](const model::LongNetConfig& config, absl::Span<const float> params, int64_t max_context,
          int64_t max_batch,
          comm::Communicator* ring) -> absl::StatusOr<std::unique_ptr<model::ServingModel>> {
    EXPECT_EQ(config, Config());
    seen.assign(params.begin(), params.end());
    seen_context = max_context;
    seen_batch = max_batch;
    EXPECT_EQ(ring, nullptr);
    return absl::UnimplementedError("this device serves nothing");
  };
  bool opened = false;
  o.open_channel =
      [&](const v1::DeploymentStatus&) -> absl::StatusOr<std::unique_ptr<ServeChannel>> {
    opened = true;
    return absl::InternalError("unused");
  };
  absl::Status s = RunDeploymentTask(a, o);
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
  EXPECT_EQ(s.message(), "this device serves nothing");
  EXPECT_FALSE(opened);
  EXPECT_EQ(seen, weights);  // the checkpoint's weights, in the layout's order
  EXPECT_EQ(seen_context, 64);
  EXPECT_EQ(seen_batch, 1);

  // The CPU's model (the default) says what it is.
  Running r;
  Start(&r, Assignment(dir, 1, 1));
  EXPECT_EQ(r.ready.device(), "cpu fp32");
  EXPECT_EQ(r.ready.cache_bytes_per_sequence(),
            model::KvCacheGeometry::Make(Config(), 64)->ElementsPerSequence() * 4);
  r.cancel = true;
  r.thread.join();
  EXPECT_TRUE(absl::IsCancelled(r.outcome)) << r.outcome;
}

}  // namespace
}  // namespace worker
}  // namespace dattn
