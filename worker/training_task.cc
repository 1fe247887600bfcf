#include "worker/training_task.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "api/training_job.h"
#include "base/median.h"
#include "engine/comm/abort_all.h"
#include "model/checkpoint.h"
#include "model/collective.h"
#include "model/trainer.h"
#include "nlohmann/json.hpp"
#include "worker/oom_retry.h"
#include "worker/ring_join.h"

namespace dattn {
namespace worker {
namespace {

absl::Status Invalid(const v1::TaskAssignment& task, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("task ", task.task_id(), ": ", what));
}

absl::Status Prefixed(const absl::Status& s, const std::string& prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / double(1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", bytes / double(1 << 20));
  return absl::StrFormat("%.2f KiB", bytes / 1024.0);
}

// Bytes of every regular file under `dir`.
int64_t FolderBytes(const std::string& dir) {
  std::error_code ec;
  int64_t total = 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  }
  return total;
}

v1::TrainingEvaluation ToProto(const model::EvalResult& e) {
  v1::TrainingEvaluation out;
  out.set_step(e.step);
  out.set_has_validation(e.has_loss);
  if (e.has_loss) {
    out.set_validation_loss(e.loss);
    if (std::isfinite(e.bits_per_byte)) out.set_bits_per_byte(e.bits_per_byte);
  }
  if (e.has_retrieval && e.retrieval.examples > 0) {
    out.set_retrieval_examples(e.retrieval.examples);
    out.set_retrieval_accuracy(static_cast<double>(e.retrieval.exact) /
                               static_cast<double>(e.retrieval.examples));
    if (e.retrieval.answer_tokens > 0) {
      out.set_retrieval_token_accuracy(static_cast<double>(e.retrieval.correct_tokens) /
                                       static_cast<double>(e.retrieval.answer_tokens));
    }
  }
  out.set_seconds(e.seconds);
  return out;
}

// Aborts the rank's communicators once a cancel has gone unanswered for `grace`: the ranks stop
// together at a step boundary (and save a checkpoint) when they can; a hung peer or a step far
// longer than the grace must not keep a cancelled task running until the communicators' timeout.
class CancelWatchdog {
 public:
  CancelWatchdog(std::function<bool()> is_cancelled, absl::Duration grace)
      : is_cancelled_(std::move(is_cancelled)), grace_(grace) {
    if (is_cancelled_) thread_ = std::thread([this] { Loop(); });
  }
  ~CancelWatchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  void Watch(std::vector<comm::Communicator*> comms) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    comms_ = std::move(comms);
  }
  bool fired() const { return fired_.load(); }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Time cancelled_at = absl::InfiniteFuture();
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        // Polls every 100 ms; the destructor's `done_` ends the wait at once.
        mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Milliseconds(100));
        if (done_) return;
      }
      if (cancelled_at == absl::InfiniteFuture()) {
        if (!is_cancelled_()) continue;
        cancelled_at = absl::Now();
      }
      if (absl::Now() - cancelled_at < grace_ || fired_.exchange(true)) continue;
      absl::MutexLock lock(&mu_);
      comm::AbortAll(comms_, absl::StrCat("the task was cancelled and did not stop within ",
                                          absl::FormatDuration(grace_)));
    }
  }

  const std::function<bool()> is_cancelled_;
  const absl::Duration grace_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<comm::Communicator*> comms_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// Loads the weights of `from` (a step folder or a root with step folders) into the trainer's model.
absl::Status InitFrom(const std::string& from, model::Trainer* trainer) {
  std::string dir = from;
  if (!std::filesystem::exists(std::filesystem::path(from) / model::kManifestFile)) {
    absl::StatusOr<model::CheckpointEntry> latest = model::LatestCheckpoint(from);
    if (!latest.ok()) return Prefixed(latest.status(), "init_from: ");
    dir = latest->path;
  }
  absl::StatusOr<model::Checkpoint> checkpoint = model::Checkpoint::Open(dir);
  if (!checkpoint.ok()) return Prefixed(checkpoint.status(), "init_from: ");
  // The checkpoint's model config must be the job's: its config.json holds the trainer config (or
  // a model config) of the run that wrote it.
  const model::LongNetConfig& want = trainer->config().model;
  // (The model part is read on its own: the trainer config around it may name a device, "cuda",
  // that this process does not train on.)
  const nlohmann::json stored =
      nlohmann::json::parse(checkpoint->model_config_json(), nullptr, false);
  absl::StatusOr<model::LongNetConfig> model_config = absl::InvalidArgumentError("not JSON");
  if (stored.is_object()) {
    auto it = stored.find("model");
    model_config = model::ParseConfigJson(it != stored.end() ? it->dump() : stored.dump());
  }
  if (!model_config.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "init_from ", dir, ": its config.json holds no model config this build reads: ",
        model_config.status().message()));
  }
  if (*model_config != want) {
    return absl::FailedPreconditionError(absl::StrCat(
        "init_from ", dir, ": its model config differs from the job's \"model\" (checkpoint: ",
        model::ConfigToJson(*model_config), ")"));
  }
  model::TrainableModel& m = trainer->model();
  std::vector<float> weights(static_cast<size_t>(m.layout().total()));
  if (absl::Status s = checkpoint->ReadWeights(m.layout(), 0, absl::MakeSpan(weights)); !s.ok()) {
    return Prefixed(s, "init_from: ");
  }
  return m.WriteParams(0, weights);
}

}  // namespace

absl::StatusOr<TrainingTaskPlan> PlanTrainingTask(const v1::TaskAssignment& task,
                                                  const BackendCaps& caps) {
  if (!task.spec().has_training()) return Invalid(task, "the job has no training work");
  if (!task.has_training_plan()) {
    return Invalid(task,
                   "the assignment has no training_plan (a coordinator older than this "
                   "worker)");
  }
  const v1::TrainingRankPlan& p = task.training_plan();
  TrainingTaskPlan plan;
  plan.rank = p.rank();
  plan.data_parallel = p.data_parallel();
  plan.sequence_parallel = p.sequence_parallel();
  if (plan.data_parallel < 1 || plan.sequence_parallel < 1) {
    return Invalid(task, absl::StrCat("training_plan degrees ", plan.data_parallel, " x ",
                                      plan.sequence_parallel, " must be >= 1"));
  }
  plan.world = plan.data_parallel * plan.sequence_parallel;
  if (plan.rank < 0 || plan.rank >= plan.world) {
    return Invalid(
        task, absl::StrCat("training_plan rank ", plan.rank, " outside [0, ", plan.world, ")"));
  }
  if (plan.world > 1) {
    if (task.ring().size() != plan.world || task.ring().rank() != plan.rank) {
      return Invalid(
          task, absl::StrCat("ring rank ", task.ring().rank(), " of ", task.ring().size(),
                             " does not match the plan's rank ", plan.rank, " of ", plan.world));
    }
  }
  // The config's "device" is the kind the coordinator placed the rank on ("cpu" or "cuda"): checked
  // against this worker's device here, not against the training devices this process registered
  // (a GPU worker builds its CUDA model through its TaskDevice, without the registry).
  nlohmann::json json = nlohmann::json::parse(p.trainer_config_json(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return Invalid(task, "training_plan's trainer config is not a JSON object");
  }
  std::string device = "cpu";
  if (auto it = json.find("device"); it != json.end()) {
    if (!it->is_string() || (*it != "cpu" && *it != "cuda")) {
      return Invalid(task, absl::StrCat("training_plan's trainer config: device ", it->dump(),
                                        " is neither \"cpu\" nor \"cuda\""));
    }
    device = it->get<std::string>();
    json.erase(it);
  }
  absl::StatusOr<model::TrainerConfig> config = model::ParseTrainerConfigJson(json.dump());
  if (!config.ok()) {
    return Invalid(task,
                   absl::StrCat("training_plan's trainer config: ", config.status().message()));
  }
  plan.config = *std::move(config);
  plan.config.device = device;
  const bool want_gpu = device == "cuda";
  if (want_gpu != (caps.device == Device::kCuda)) {
    return Invalid(task, absl::StrCat("the rank was planned for a ", want_gpu ? "GPU" : "CPU",
                                      " worker; this one is a ",
                                      caps.device == Device::kCuda ? "GPU" : "CPU", " worker"));
  }
  plan.checkpoint_dir = p.checkpoint_dir();
  plan.init_from = p.init_from();
  if (p.memory_bytes() <= 0) {
    return Invalid(task,
                   absl::StrCat("training_plan memory_bytes ", p.memory_bytes(), " must be > 0"));
  }
  plan.memory_bytes = p.memory_bytes();
  plan.memory_plan = p.memory_plan();
  plan.flops_per_step = p.flops_per_step();
  return plan;
}

absl::StatusOr<TrainingTaskResult> RunTrainingTask(const v1::TaskAssignment& task,
                                                   TaskDevice* device,
                                                   const TrainingTaskOptions& options,
                                                   v1::TrainingProgress* last) {
  absl::StatusOr<TrainingTaskPlan> planned = PlanTrainingTask(task, device->caps());
  if (!planned.ok()) return planned.status();
  const TrainingTaskPlan& plan = *planned;
  const model::TrainerConfig& config = plan.config;
  auto phase = [&](v1::RankPhase p) {
    if (options.on_phase) options.on_phase(p);
  };
  phase(v1::RANK_PHASE_PREPARING);
  const int threads = config.threads > 0 ? static_cast<int>(config.threads) : options.num_threads;
  const std::string where = plan.world > 1 ? absl::StrCat("ring ", task.ring().ring_id(), " rank ",
                                                          plan.rank, " of ", plan.world, ": ")
                                           : absl::StrCat("task ", task.task_id(), ": ");

  absl::StatusOr<int64_t> available = options.reserve_memory
                                          ? options.reserve_memory(plan.memory_bytes)
                                          : device->FreeMemoryBytes();
  if (!available.ok()) return available.status();
  if (plan.memory_bytes > *available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "task ", task.task_id(), " needs ", FormatBytes(plan.memory_bytes), " (", plan.memory_plan,
        ") but only ", FormatBytes(*available), " of ", device->caps().name, " memory is free"));
  }

  // Device memory (GPU workers): in use when the rank starts, and its highest level after each
  // step; the difference is the rank's measured peak, reported beside the plan. Host memory is
  // shared by the worker's tasks and every other process: not measured.
  const bool measure_memory = !device->host_memory();
  auto used_now = [&]() -> int64_t {
    absl::StatusOr<int64_t> free_bytes = device->FreeMemoryBytes();
    return free_bytes.ok() ? device->total_memory_bytes() - *free_bytes : -1;
  };
  const int64_t used_at_start = measure_memory ? used_now() : -1;
  int64_t used_high = used_at_start;

  // The data, read here before any peer waits for this rank.
  absl::StatusOr<model::TokenCorpus> corpus = model::OpenTrainingCorpus(config);
  if (!corpus.ok()) return Prefixed(corpus.status(), "training data: ");

  // The ring: the world's communicator, and the sequence group's.
  RingMembership membership;
  std::unique_ptr<comm::Communicator> group;
  CancelWatchdog watchdog(options.is_cancelled, options.cancel_grace);
  auto forget_comms = absl::MakeCleanup([&] {
    watchdog.Watch({});
    if (membership.comm != nullptr && options.on_communicators) {
      options.on_communicators({}, membership.formation_seconds);
    }
  });
  if (plan.world > 1) {
    phase(v1::RANK_PHASE_FORMING_RING);
    RingJoinOptions join;
    join.member_name = options.member_name;
    join.default_comm_timeout = options.default_comm_timeout;
    join.store_tls = options.store_tls;
    join.is_cancelled = options.is_cancelled;
    absl::StatusOr<RingMembership> joined = JoinRing(task.ring(), device, join);
    if (!joined.ok()) return joined.status();
    membership = *std::move(joined);
    std::vector<comm::Communicator*> comms = {membership.comm.get()};
    if (plan.sequence_parallel > 1) {
      const int s = plan.rank % plan.sequence_parallel;
      const int d = plan.rank / plan.sequence_parallel;
      const absl::Duration timeout = task.ring().comm_timeout_ms() > 0
                                         ? absl::Milliseconds(task.ring().comm_timeout_ms())
                                         : options.default_comm_timeout;
      absl::StatusOr<std::unique_ptr<comm::Communicator>> g = device->NewCommunicator(
          task.ring().backend(), membership.store, s, plan.sequence_parallel,
          api::SequenceGroupPrefix(task.ring().ring_id(), d), timeout);
      if (!g.ok()) {
        return Prefixed(g.status(), absl::StrCat(where, "forming sequence group ", d, ": "));
      }
      group = *std::move(g);
      comms.push_back(group.get());
    }
    watchdog.Watch(comms);
    if (options.on_communicators) options.on_communicators(comms, membership.formation_seconds);
  }
  // A broken ring leaves kernels spinning on the dead peer, on either communicator; releasing
  // device memory (the trainer's) or destroying a communicator waits for the whole device, so every
  // communicator is aborted together first (engine/comm/abort_all.h). Runs twice on the way out:
  // once before the trainer is destroyed (below) and once before the communicators are.
  auto rings_healthy = [&] {
    return (membership.comm == nullptr || membership.comm->health().ok()) &&
           (group == nullptr || group->health().ok());
  };
  auto abort_if_broken = [&] {
    if (!rings_healthy()) {
      comm::AbortAll({membership.comm.get(), group.get()}, "the ring broke; releasing this rank");
    }
  };
  auto abort_before_comms_go = absl::MakeCleanup(abort_if_broken);

  // The model, the collective and the trainer.
  model::ModelOptions model_options;
  model_options.checkpoint_activations = config.checkpoint_activations;
  // Out of memory making the model (its weights, gradients and arenas): released caches, once
  // more (oom_retry.h). Before any collective, so the peers only wait.
  absl::StatusOr<std::unique_ptr<model::TrainableModel>> made =
      absl::UnknownError("the model was not made");
  OomRetry oom;
  absl::Status making = RetryOnceOutOfMemory(
      device,
      [&] {
        made = device->NewTrainableModel(config.model, model_options, threads, group.get());
        return made.status();
      },
      [&] { made = absl::UnknownError("the model was not made"); }, &oom);
  if (oom.retries > 0 && options.on_out_of_memory_retry) options.on_out_of_memory_retry(oom);
  if (!making.ok()) return Prefixed(making, where);
  model::TrainableModel* model_ptr = made->get();
  std::unique_ptr<model::TrainerCollective> collective;
  if (plan.world > 1) {
    absl::StatusOr<std::unique_ptr<model::TrainerCollective>> c =
        device->NewTrainerCollective(membership.comm.get(), model_ptr);
    if (!c.ok()) return Prefixed(c.status(), where);
    collective = *std::move(c);
  }
  model::TrainerOptions trainer_options;
  trainer_options.checkpoint_dir = plan.checkpoint_dir;
  trainer_options.collective = collective.get();
  trainer_options.sequence_parallel = plan.sequence_parallel;
  absl::StatusOr<std::unique_ptr<model::Trainer>> created =
      model::Trainer::Create(config, *std::move(corpus), *std::move(made), trainer_options);
  if (!created.ok()) return Prefixed(created.status(), where);
  model::Trainer& trainer = **created;
  auto abort_before_trainer_goes = absl::MakeCleanup(abort_if_broken);

  // Continue from the job's newest complete checkpoint, or start fresh.
  v1::TrainingProgress progress;
  progress.set_steps_total(config.steps);
  if (!plan.checkpoint_dir.empty()) {
    absl::StatusOr<std::vector<model::CheckpointEntry>> existing =
        model::ListCheckpoints(plan.checkpoint_dir);
    if (!existing.ok()) return Prefixed(existing.status(), "checkpoint folder: ");
    bool any = false;
    for (const model::CheckpointEntry& e : *existing) any = any || e.has_manifest;
    if (any) {
      const absl::Time restore_start = absl::Now();
      if (absl::Status s = trainer.Resume(); !s.ok()) return Prefixed(s, where);
      progress.set_resumed_from_step(trainer.step());
      progress.set_restore_seconds(absl::ToDoubleSeconds(absl::Now() - restore_start));
    }
  }
  if (progress.resumed_from_step() == 0 && !plan.init_from.empty()) {
    if (absl::Status s = InitFrom(plan.init_from, &trainer); !s.ok()) return s;
  }

  // What the checkpoints folder holds (complete ones, after pruning): every report lists them.
  std::map<int64_t, v1::TrainingCheckpoint> known;  // step -> its record (bytes, seconds, time)
  auto refresh_checkpoints = [&]() {
    progress.clear_checkpoints();
    if (plan.checkpoint_dir.empty()) return;
    absl::StatusOr<std::vector<model::CheckpointEntry>> list =
        model::ListCheckpoints(plan.checkpoint_dir);
    if (!list.ok()) return;
    for (const model::CheckpointEntry& e : *list) {
      if (!e.has_manifest) continue;
      auto it = known.find(e.step);
      if (it == known.end()) {
        v1::TrainingCheckpoint c;
        c.set_step(e.step);
        c.set_path(e.path);
        c.set_bytes(FolderBytes(e.path));
        it = known.emplace(e.step, std::move(c)).first;
      }
      *progress.add_checkpoints() = it->second;
    }
  };
  refresh_checkpoints();

  const double peak =
      device->caps().device == Device::kCuda ? trainer.model().NominalPeakFlops() : 0.0;
  auto report = [&]() {
    if (last != nullptr) *last = progress;
    if (options.on_progress) options.on_progress(progress);
  };
  const int64_t first_step = trainer.step();
  double seconds = 0;  // This attempt's step time.
  std::vector<double> step_seconds;
  auto mark = std::chrono::steady_clock::now();

  model::RunCallbacks callbacks;
  std::atomic<bool> stop{false};
  callbacks.stop = &stop;
  callbacks.on_step = [&](const model::StepResult& r) {
    seconds += r.seconds;
    step_seconds.push_back(r.seconds);
    if (used_at_start >= 0) used_high = std::max(used_high, used_now());
    progress.set_step(r.step);
    progress.set_loss(r.loss);
    progress.set_learning_rate(r.lr);
    progress.set_grad_norm(r.grad_norm);
    progress.set_step_seconds(r.seconds);
    progress.set_tokens_per_second(r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0);
    // Every rank does its share of the step's FLOPs in the same time.
    progress.set_mfu(peak > 0 && r.seconds > 0 ? r.flops / r.seconds / peak : 0);
    progress.set_tokens_seen(trainer.tokens_seen());
    if (r.skipped) progress.set_skipped_steps(progress.skipped_steps() + 1);
    mark = std::chrono::steady_clock::now();
    report();
    // The stop is polled before every step: a cancel seen now stops the run before the next.
    if (options.is_cancelled && options.is_cancelled()) stop = true;
  };
  callbacks.on_eval = [&](const model::EvalResult& e) {
    *progress.mutable_last_evaluation() = ToProto(e);
    mark = std::chrono::steady_clock::now();
    report();
  };
  callbacks.on_checkpoint = [&](const std::string& path, int64_t step) {
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - mark).count();
    v1::TrainingCheckpoint c;
    c.set_step(step);
    c.set_path(path);
    c.set_bytes(FolderBytes(path));
    c.set_seconds(took);
    const int64_t now_ns = absl::ToUnixNanos(absl::Now());
    c.mutable_time()->set_seconds(now_ns / 1000000000);
    c.mutable_time()->set_nanos(static_cast<int32_t>(now_ns % 1000000000));
    known[step] = c;
    refresh_checkpoints();
    mark = std::chrono::steady_clock::now();
    report();
  };

  phase(v1::RANK_PHASE_RUNNING);
  // Where the run starts (resumed or fresh, the checkpoints there): the STARTED report says it.
  progress.set_step(trainer.step());
  progress.set_tokens_seen(trainer.tokens_seen());
  report();
  if (options.on_started) options.on_started();
  if (options.is_cancelled && options.is_cancelled()) stop = true;
  absl::Status run = trainer.Run(callbacks);
  if (!run.ok()) {
    if (run.code() == absl::StatusCode::kCancelled) {
      return absl::CancelledError(
          absl::StrCat(where, "cancelled after step ", trainer.step(),
                       trainer.step() > 0 && !plan.checkpoint_dir.empty()
                           ? absl::StrCat("; its checkpoint is in ", plan.checkpoint_dir)
                           : std::string()));
    }
    if (watchdog.fired()) {
      return absl::CancelledError(absl::StrCat(where, "cancelled; the ranks did not stop within ",
                                               absl::FormatDuration(options.cancel_grace),
                                               " and were interrupted: ", run.message()));
    }
    if (options.is_cancelled && options.is_cancelled()) {
      // Cancelled with the ring's communicators aborted (its attempt failed): nothing to save.
      return absl::CancelledError(absl::StrCat(where, "cancelled at once: ", run.message()));
    }
    // ABORTED with every communicator healthy is the trainer's own: the run diverged (too many
    // steps in a row without a finite gradient norm). A rerun from the last checkpoint would
    // diverge again, so it is not the retryable ABORTED of a broken ring (the coordinator requeues
    // those) but a failure of the job.
    if (run.code() == absl::StatusCode::kAborted && rings_healthy()) {
      return absl::FailedPreconditionError(absl::StrCat(where, run.message()));
    }
    return Prefixed(run, where);
  }

  // The run's result.
  TrainingTaskResult out;
  out.steps_done = trainer.step();
  out.ring_formation_seconds = membership.formation_seconds;
  v1::TrainingJobResult& r = out.result;
  r.set_steps(trainer.step());
  const model::TrainingHistory& history = trainer.history();
  if (!history.train.empty()) r.set_final_loss(history.train.back().loss);
  if (!history.evals.empty()) {
    *r.mutable_final_evaluation() = ToProto(history.evals.back());
  }
  r.set_tokens_seen(trainer.tokens_seen());
  r.set_seconds(seconds);
  const int64_t steps_here = trainer.step() - first_step;
  if (seconds > 0 && steps_here > 0) {
    const double tokens =
        static_cast<double>(steps_here) * static_cast<double>(config.batch_size * config.seq_len);
    r.set_tokens_per_second(tokens / seconds);
    if (peak > 0) {
      r.set_mfu(trainer.flops_per_step() * static_cast<double>(steps_here) / seconds / peak);
    }
  }
  r.set_median_step_seconds(Median(step_seconds));
  r.set_planned_rank_bytes(plan.memory_bytes);
  if (used_at_start >= 0) r.set_measured_rank_peak_bytes(used_high - used_at_start);
  *r.mutable_checkpoints() = progress.checkpoints();
  if (progress.checkpoints_size() > 0) {
    r.set_final_checkpoint(progress.checkpoints(progress.checkpoints_size() - 1).path());
  }
  r.set_resumed_from_step(progress.resumed_from_step());
  r.set_restore_seconds(progress.restore_seconds());
  r.set_skipped_steps(progress.skipped_steps());
  // The loss curve: every step, or kMaxLossCurvePoints spread evenly (first and last included).
  const size_t n = history.train.size();
  const size_t points = std::min<size_t>(n, api::kMaxLossCurvePoints);
  for (size_t i = 0; i < points; ++i) {
    const size_t at = points == 1 ? n - 1 : i * (n - 1) / (points - 1);
    v1::LossPoint* p = r.add_loss_curve();
    p->set_step(history.train[at].step);
    p->set_loss(history.train[at].loss);
  }
  return out;
}

}  // namespace worker
}  // namespace dattn
