#include "worker/training_task.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/training_job.h"
#include "engine/comm/tcp_store.h"
#include "gtest/gtest.h"
#include "worker/cpu_device.h"

namespace dattn {
namespace worker {
namespace {

// A folder of its own under the test's temporary directory.
std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// About 60 KB of structured text.
std::string Corpus() {
  static const std::string path = [] {
    const std::string p = TempDir("corpus") + "/text.txt";
    std::ofstream out(p);
    static const char* const kWords[] = {"in",    "the",   "beginning", "was",    "word", "and",
                                         "light", "shone", "upon",      "waters", "of",   "deep"};
    uint64_t x = 99;
    for (int line = 0; out.tellp() < 60000; ++line) {
      out << line << ": ";
      for (int w = 0; w < 10; ++w) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        out << kWords[(x >> 33) % 12] << (w == 9 ? ".\n" : " ");
      }
    }
    return p;
  }();
  return path;
}

std::string Config(int steps, int checkpoint_every, const std::string& data = Corpus()) {
  return absl::StrCat(R"({
    "model": {"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 2, "ffn_dim": 64,
              "attention": {"segment_lengths": [16, 32], "dilation_rates": [1, 2]}},
    "threads": 1,
    "data": {"paths": [")",
                      data, R"("], "validation_fraction": 0.05},
    "seq_len": 64, "batch_size": 4, "steps": )",
                      steps, R"(, "seed": 3,
    "optimizer": {"lr": 3e-3, "warmup_steps": 2},
    "eval": {"every": 0, "batches": 1},
    "checkpoint": {"every": )",
                      checkpoint_every, R"(, "keep_last": 2}})");
}

// The assignment of rank `rank` of a D x S job, planned by the coordinator's own analysis.
v1::TaskAssignment Task(const std::string& config, int data, int sequence, int rank,
                        const std::string& checkpoint_root, const std::string& store,
                        const std::string& ring_id, const std::string& init_from = "") {
  v1::TrainingJobSpec spec;
  spec.set_config_json(config);
  spec.set_data_parallel(data);
  spec.set_sequence_parallel(sequence);
  spec.set_device(v1::DEVICE_PREFERENCE_CPU);
  spec.set_checkpoint_dir(checkpoint_root);
  spec.set_init_from(init_from);
  absl::StatusOr<api::TrainingJobInfo> info = api::AnalyzeTrainingJob(spec, "spec.training");
  EXPECT_TRUE(info.ok()) << info.status();
  v1::TaskAssignment task;
  task.set_job_id("j-test");
  task.set_attempt(1);
  task.set_rank(rank);
  task.set_task_id(absl::StrCat(ring_id, "/", rank));
  *task.mutable_spec()->mutable_training() = spec;
  if (info.ok()) {
    *task.mutable_training_plan() =
        api::PlanTrainingRank(*info, info->variants[0], rank, task.job_id());
  }
  if (data * sequence > 1) {
    v1::RingInfo* ring = task.mutable_ring();
    ring->set_ring_id(ring_id);
    ring->set_rank(rank);
    ring->set_size(data * sequence);
    ring->set_backend("gloo");
    ring->set_store_address(store);
    ring->set_formation_timeout_ms(20000);
    ring->set_comm_timeout_ms(20000);
  }
  return task;
}

struct JobRun {
  std::vector<absl::StatusOr<TrainingTaskResult>> results;
  std::vector<v1::TrainingProgress> last;  // Each rank's last reported progress.
  std::vector<double> seconds;             // Each rank's wall time.
};

// Runs every rank of a D x S job on its own thread (one CPU device each) through a fresh store.
JobRun RunJob(const std::string& config, int data, int sequence, const std::string& root,
              const std::string& ring_id,
              const std::function<bool(int rank, int64_t step)>& cancel = nullptr,
              const std::string& init_from = "",
              const std::function<void(int rank, TrainingTaskOptions*)>& edit = nullptr) {
  const int world = data * sequence;
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  EXPECT_TRUE(server.ok()) << server.status();
  JobRun run;
  run.results.assign(world, absl::UnknownError("not run"));
  run.last.resize(world);
  run.seconds.resize(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<TaskDevice>> device = NewCpuDevice();
      ASSERT_TRUE(device.ok()) << device.status();
      std::atomic<int64_t> step{0};
      TrainingTaskOptions options;
      options.member_name = absl::StrCat("thread-", r);
      options.on_progress = [&, r](const v1::TrainingProgress& p) {
        step = p.step();
        run.last[r] = p;
      };
      if (cancel) options.is_cancelled = [&, r] { return cancel(r, step.load()); };
      if (edit) edit(r, &options);
      const auto start = std::chrono::steady_clock::now();
      run.results[r] = RunTrainingTask(
          Task(config, data, sequence, r, root, (*server)->address(), ring_id, init_from),
          device->get(), options);
      run.seconds[r] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  for (std::thread& t : threads) t.join();
  return run;
}

std::vector<double> Curve(const TrainingTaskResult& r) {
  std::vector<double> out;
  for (const v1::LossPoint& p : r.result.loss_curve()) out.push_back(p.loss());
  return out;
}

TEST(TrainingTaskTest, PlansAreCheckedAgainstTheTaskAndTheDevice) {
  const BackendCaps cpu{"cpu", Device::kCpu, {DType::kFloat32}, {}};
  v1::TaskAssignment task = Task(Config(4, 0), 2, 1, 1, "", "127.0.0.1:1", "j/1");
  EXPECT_TRUE(PlanTrainingTask(task, cpu).ok());
  v1::TaskAssignment no_plan = task;
  no_plan.clear_training_plan();
  EXPECT_NE(PlanTrainingTask(no_plan, cpu).status().message().find("no training_plan"),
            std::string::npos);
  v1::TaskAssignment wrong_ring = task;
  wrong_ring.mutable_ring()->set_rank(0);
  EXPECT_NE(PlanTrainingTask(wrong_ring, cpu).status().message().find("does not match"),
            std::string::npos);
  const BackendCaps gpu{"cuda", Device::kCuda, {DType::kFloat32}, {}};
  EXPECT_NE(PlanTrainingTask(task, gpu).status().message().find("planned for a CPU worker"),
            std::string::npos);
  // A rank planned for a GPU worker is accepted by one, whatever training devices this process
  // registered (a GPU worker makes its CUDA model through its device), and refused by a CPU worker.
  v1::TaskAssignment for_gpu = task;
  std::string json = for_gpu.training_plan().trainer_config_json();
  json.replace(json.find("\"device\": \"cpu\""), 15, "\"device\": \"cuda\"");
  for_gpu.mutable_training_plan()->set_trainer_config_json(json);
  absl::StatusOr<TrainingTaskPlan> on_gpu = PlanTrainingTask(for_gpu, gpu);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  EXPECT_EQ(on_gpu->config.device, "cuda");
  EXPECT_NE(PlanTrainingTask(for_gpu, cpu).status().message().find("planned for a GPU worker"),
            std::string::npos);
}

// A 2 x 2 gang (data x sequence) follows the single rank's losses, every rank reports the same
// figures, and the job's checkpoints are written once, sharded.
TEST(TrainingTaskTest, TwoByTwoFollowsOneRank) {
  const std::string config = Config(6, 3);
  JobRun one = RunJob(config, 1, 1, TempDir("one"), "one/1");
  JobRun four = RunJob(config, 2, 2, TempDir("four"), "four/1");
  ASSERT_TRUE(one.results[0].ok()) << one.results[0].status();
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(four.results[r].ok()) << four.results[r].status();
  const std::vector<double> x = Curve(*one.results[0]);
  ASSERT_EQ(x.size(), 6u);
  for (int r = 0; r < 4; ++r) {
    const std::vector<double> y = Curve(*four.results[r]);
    ASSERT_EQ(y.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(y[i], x[i], 1e-4 * std::abs(x[i])) << "rank " << r << " step " << i + 1;
      EXPECT_EQ(y[i], Curve(*four.results[0])[i]) << "ranks disagree at step " << i + 1;
    }
  }
  const v1::TrainingJobResult& r = four.results[0]->result;
  EXPECT_EQ(r.steps(), 6);
  ASSERT_EQ(r.checkpoints_size(), 2);
  EXPECT_EQ(r.checkpoints(0).step(), 3);
  EXPECT_EQ(r.checkpoints(1).step(), 6);
  EXPECT_GT(r.checkpoints(1).bytes(), 0);
  EXPECT_EQ(r.final_checkpoint(), r.checkpoints(1).path());
  EXPECT_TRUE(std::filesystem::exists(r.final_checkpoint() + "/MANIFEST.json"));
  EXPECT_EQ(four.last[0].checkpoints_size(), 2);
  EXPECT_GT(r.tokens_per_second(), 0);
  // The median step of 6: between none and all of the attempt's step time.
  EXPECT_GT(r.median_step_seconds(), 0);
  EXPECT_LE(r.median_step_seconds(), r.seconds());
}

// A cancel stops every rank at the same step with a checkpoint; the job run again continues from
// it and ends with the losses of a run that never stopped, bit for bit.
TEST(TrainingTaskTest, ACancelledGangSavesAndTheRerunContinuesBitForBit) {
  const std::string config = Config(8, 0);  // No periodic checkpoint: the cancel writes one.
  JobRun whole = RunJob(config, 2, 2, TempDir("whole"), "whole/1");
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(whole.results[r].ok()) << whole.results[r].status();

  const std::string root = TempDir("stopped");
  // Rank 2 alone sees the cancel, after its third step: the others learn it collectively.
  JobRun stopped = RunJob(config, 2, 2, root, "stopped/1",
                          [](int rank, int64_t step) { return rank == 2 && step >= 3; });
  int64_t saved = -1;
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(stopped.results[r].status().code(), absl::StatusCode::kCancelled)
        << r << ": " << stopped.results[r].status();
    ASSERT_EQ(stopped.last[r].checkpoints_size(), 1) << "rank " << r;
    if (saved < 0) saved = stopped.last[r].checkpoints(0).step();
    EXPECT_EQ(stopped.last[r].checkpoints(0).step(), saved) << "rank " << r;
  }
  EXPECT_GE(saved, 3);
  EXPECT_LT(saved, 8);

  JobRun again = RunJob(config, 2, 2, root, "stopped/2");
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(again.results[r].ok()) << again.results[r].status();
  EXPECT_EQ(again.results[0]->result.resumed_from_step(), saved);
  // The restore was timed: a positive time, and not more than the attempt took in all.
  EXPECT_GT(again.results[0]->result.restore_seconds(), 0);
  EXPECT_LT(again.results[0]->result.restore_seconds(), 60);
  const std::vector<double> want = Curve(*whole.results[0]);
  const std::vector<double> got = Curve(*again.results[0]);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
}

// init_from: a new job starts from another run's final weights (a lower first loss than a fresh
// start), and a checkpoint of another model is refused naming the difference.
TEST(TrainingTaskTest, InitFromLoadsTheWeightsOfAnotherRun) {
  const std::string config = Config(6, 0);
  const std::string trained = TempDir("trained");
  JobRun first = RunJob(config, 1, 1, trained, "trained/1");
  ASSERT_TRUE(first.results[0].ok()) << first.results[0].status();
  JobRun fresh = RunJob(config, 1, 1, "", "fresh/1");
  JobRun warm = RunJob(config, 2, 1, "", "warm/1", nullptr, trained + "/j-test");
  ASSERT_TRUE(fresh.results[0].ok()) << fresh.results[0].status();
  ASSERT_TRUE(warm.results[0].ok()) << warm.results[0].status();
  EXPECT_LT(Curve(*warm.results[0]).front(), Curve(*fresh.results[0]).front() - 0.1);

  std::string other = config;
  other.replace(other.find("\"d_model\": 32"), 13, "\"d_model\": 16");
  JobRun refused = RunJob(other, 1, 1, "", "other/1", nullptr, trained + "/j-test");
  EXPECT_EQ(refused.results[0].status().code(), absl::StatusCode::kFailedPrecondition)
      << refused.results[0].status();
  EXPECT_NE(refused.results[0].status().message().find("model config differs"), std::string::npos)
      << refused.results[0].status();
}

// A cancel that the gang cannot answer together (a peer stuck in a step: here rank 0 blocks for
// 5 s in its progress callback) ends the cancelled rank after its grace, not at the communicator's
// timeout (20 s here): the watchdog aborts its communicators.
TEST(TrainingTaskTest, ACancelThatCannotBeAgreedEndsAfterTheGrace) {
  JobRun run = RunJob(
      Config(50, 0), 2, 1, "", "stuck/1",
      [](int rank, int64_t step) { return rank == 1 && step >= 2; }, "",
      [](int rank, TrainingTaskOptions* options) {
        options->cancel_grace = absl::Milliseconds(300);
        if (rank != 0) return;
        auto report = options->on_progress;
        options->on_progress = [report](const v1::TrainingProgress& p) {
          report(p);
          if (p.step() == 2) std::this_thread::sleep_for(std::chrono::seconds(5));
        };
      });
  ASSERT_EQ(run.results[1].status().code(), absl::StatusCode::kCancelled)
      << run.results[1].status();
  EXPECT_NE(run.results[1].status().message().find("did not stop within"), std::string::npos)
      << run.results[1].status();
  EXPECT_LT(run.seconds[1], 4.0) << "the cancelled rank waited for its stuck peer";
  // Rank 0 woke to a closed peer.
  EXPECT_FALSE(run.results[0].ok());
}

// A device whose memory is its own (as a GPU's): the free memory it reports is scripted, one
// figure per call (the last repeats), over the host device's work.
class ScriptedMemoryDevice final : public ForwardingDevice {
 public:
  ScriptedMemoryDevice(std::shared_ptr<TaskDevice> base, std::vector<int64_t> used)
      : ForwardingDevice(std::move(base)), used_(std::move(used)) {}
  bool host_memory() const override { return false; }
  int64_t total_memory_bytes() const override { return kTotal; }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override {
    const size_t at = std::min(calls_.fetch_add(1), used_.size() - 1);
    return kTotal - used_[at];
  }
  static constexpr int64_t kTotal = int64_t{80} << 30;

 private:
  const std::vector<int64_t> used_;
  mutable std::atomic<size_t> calls_{0};
};

// On a device with memory of its own the result carries the rank's plan and its measured peak: the
// highest use after a step above the use when the rank started.
TEST(TrainingTaskTest, TheResultCarriesThePlanAndTheMeasuredPeak) {
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok()) << host.status();
  constexpr int64_t kMiB = int64_t{1} << 20;
  // Calls: the free-memory check, the start, then one per step (4 steps).
  ScriptedMemoryDevice device(
      std::shared_ptr<TaskDevice>(std::move(*host)),
      {100 * kMiB, 100 * kMiB, 130 * kMiB, 145 * kMiB, 140 * kMiB, 141 * kMiB});
  const std::string root = TempDir("memory");
  absl::StatusOr<TrainingTaskResult> result =
      RunTrainingTask(Task(Config(4, 0), 1, 1, 0, root, "127.0.0.1:1", "j-memory/1"), &device, {});
  ASSERT_TRUE(result.ok()) << result.status();
  const v1::TrainingJobResult& r = result->result;
  EXPECT_EQ(r.steps(), 4);
  absl::StatusOr<TrainingTaskPlan> plan = PlanTrainingTask(
      Task(Config(4, 0), 1, 1, 0, root, "127.0.0.1:1", "j-memory/1"), device.caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(r.planned_rank_bytes(), 0);
  EXPECT_EQ(r.planned_rank_bytes(), plan->memory_bytes);
  EXPECT_EQ(r.measured_rank_peak_bytes(), 45 * kMiB);

  // On the host device (memory shared with everything else): the plan only.
  absl::StatusOr<std::unique_ptr<TaskDevice>> cpu = NewCpuDevice();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<TrainingTaskResult> on_host = RunTrainingTask(
      Task(Config(2, 0), 1, 1, 0, TempDir("memory-host"), "127.0.0.1:1", "j-memory-host/1"),
      cpu->get(), {});
  ASSERT_TRUE(on_host.ok()) << on_host.status();
  EXPECT_GT(on_host->result.planned_rank_bytes(), 0);
  EXPECT_EQ(on_host->result.measured_rank_peak_bytes(), 0);
}

// A device whose first `failures` models cannot be made (RESOURCE_EXHAUSTED, as a GPU's arenas
// when another process holds the memory) and that counts the cache releases.
class ModelOomDevice : public ForwardingDevice {
 public:
  ModelOomDevice(std::shared_ptr<TaskDevice> base, int failures)
      : ForwardingDevice(std::move(base)), failures_(failures) {}
  absl::StatusOr<std::unique_ptr<model::TrainableModel>> NewTrainableModel(
      const model::LongNetConfig& config, const model::ModelOptions& options, int threads,
      comm::Communicator* sequence_group) override {
    if (made_++ < failures_) {
      return absl::ResourceExhaustedError("cudaMalloc of the model's arena (2.0 GiB) failed");
    }
    return ForwardingDevice::NewTrainableModel(config, options, threads, sequence_group);
  }
  absl::StatusOr<int64_t> ReleaseCaches() override {
    ++releases;
    return int64_t{1} << 20;
  }
  int releases = 0;

 private:
  const int failures_;
  int made_ = 0;
};

// The worker's own step for a training rank: making the model out of memory is retried once after
// releasing the caches; the run is then the undisturbed one. Twice: RESOURCE_EXHAUSTED saying so.
TEST(TrainingTaskTest, AModelOutOfMemoryIsRetriedOnceAfterReleasingCaches) {
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok()) << host.status();
  std::shared_ptr<TaskDevice> base = *std::move(host);
  absl::StatusOr<TrainingTaskResult> clean = RunTrainingTask(
      Task(Config(3, 0), 1, 1, 0, TempDir("oom-clean"), "127.0.0.1:1", "j-oom-clean/1"), base.get(),
      {});
  ASSERT_TRUE(clean.ok()) << clean.status();

  ModelOomDevice once(base, 1);
  std::vector<OomRetry> retries;
  TrainingTaskOptions options;
  options.on_out_of_memory_retry = [&](const OomRetry& r) { retries.push_back(r); };
  absl::StatusOr<TrainingTaskResult> result = RunTrainingTask(
      Task(Config(3, 0), 1, 1, 0, TempDir("oom-once"), "127.0.0.1:1", "j-oom-once/1"), &once,
      options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(once.releases, 1);
  ASSERT_EQ(retries.size(), 1u);
  EXPECT_TRUE(retries[0].recovered);
  EXPECT_EQ(retries[0].released_bytes, int64_t{1} << 20);
  EXPECT_EQ(result->result.final_loss(), clean->result.final_loss());

  ModelOomDevice twice(base, 2);
  retries.clear();
  result = RunTrainingTask(
      Task(Config(3, 0), 1, 1, 0, TempDir("oom-twice"), "127.0.0.1:1", "j-oom-twice/1"), &twice,
      options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_NE(result.status().message().find("retried once after releasing the device's caches, "
                                           "which gave back 1.00 MiB"),
            std::string::npos)
      << result.status();
  ASSERT_EQ(retries.size(), 1u);
  EXPECT_FALSE(retries[0].recovered);
}

// A run that diverges (a gradient norm that is not finite, step after step) fails the job with
// FAILED_PRECONDITION: the coordinator requeues ABORTED (a broken ring), and a rerun from the last
// checkpoint would only diverge again.
TEST(TrainingTaskTest, ADivergedRunIsNotRetryable) {
  std::string config = Config(20, 0);
  const std::string lr = "\"lr\": 3e-3";
  config.replace(config.find(lr), lr.size(),
                 "\"lr\": 1e30, \"max_grad_norm\": null, \"max_consecutive_skips\": 2");
  JobRun run = RunJob(config, 2, 1, "", "diverged/1");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(run.results[r].status().code(), absl::StatusCode::kFailedPrecondition)
        << "rank " << r << ": " << run.results[r].status();
    EXPECT_NE(run.results[r].status().message().find("diverged"), std::string::npos)
        << run.results[r].status();
  }
}

TEST(TrainingTaskTest, AMissingDataFileIsNamed) {
  JobRun run = RunJob(Config(2, 0, "/nonexistent/corpus.txt"), 1, 1, "", "missing/1");
  ASSERT_FALSE(run.results[0].ok());
  EXPECT_NE(run.results[0].status().message().find("/nonexistent/corpus.txt"), std::string::npos)
      << run.results[0].status();
}

}  // namespace
}  // namespace worker
}  // namespace dattn
