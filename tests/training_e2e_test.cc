// End-to-end tests of training jobs: the real dattn-coordinator, dattn-worker and dattn binaries on
// loopback, CPU workers training a small LongNet on a text file as one gang of D x S ranks (Gloo),
// checkpoints in a folder every worker reads and writes.
//
// - A 2 x 2 (data x sequence parallel) job submitted through the CLI follows the 1-rank job's
//   losses within fp32 tolerance, step by step.
// - kill -9 of one rank's worker after the first checkpoint: the job is requeued, continues from
//   its newest complete checkpoint, and its losses equal an uninterrupted run's bit for bit (fp32
//   on the CPU, one thread per rank, reductions in rank order).
// - kill -9 of one rank's worker with no worker to replace it: the gang shrinks to 1 x 2 and
//   continues from its checkpoint, following the uninterrupted run's losses within fp32 rounding.
// - kill -9 of the coordinator mid-run, then a restart: the workers stop their ranks together with
//   a checkpoint, the job runs again from it, and its losses equal the uninterrupted run's.
// - A training spec with a bad field gets INVALID_ARGUMENT naming it, through the real service.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "dattn/v1/job_service.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_fixture.h"
#include "tests/training_files.h"

namespace dattn::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kSteps = 120;
constexpr int kCheckpointEvery = 10;

class TrainingE2E : public ClusterTest {
 protected:
  // The corpus, the trainer config and a job file for D x S ranks under the cluster's folder;
  // returns the job file's path.
  std::string JobFile(const std::string& name, int data, int sequence, bool checkpoints = true) {
    return WriteTrainingJobFile(cluster_->dir(), name, data, sequence, kSteps, kCheckpointEvery,
                                checkpoints);
  }

  dattn::v1::Job Finished(const std::string& id, seconds timeout = seconds(240)) {
    dattn::v1::Job job;
    EXPECT_TRUE(cluster_->WaitForJobEnd(id, timeout, &job)) << cluster_->Logs();
    return job;
  }

  dattn::v1::Job Get(const std::string& id) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + seconds(10));
    dattn::v1::GetJobRequest request;
    request.set_job_id(id);
    dattn::v1::Job job;
    cluster_->jobs().GetJob(&context, request, &job);
    return job;
  }

  // Waits until the running job reports a complete checkpoint; false when it ends first.
  bool WaitForCheckpoint(const std::string& id, dattn::v1::Job* job) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      *job = Get(id);
      if (job->state() == dattn::v1::JOB_STATE_RUNNING &&
          job->progress().training().checkpoints_size() > 0) {
        return true;
      }
      if (job->state() >= dattn::v1::JOB_STATE_SUCCEEDED) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  // Every checkpoint is announced once, however many attempts reported it.
  static void ExpectEachCheckpointEventOnce(const dattn::v1::Job& job) {
    const std::map<std::string, int> seen = CheckpointEventCounts(job);
    EXPECT_FALSE(seen.empty()) << EventsText(job);
    for (const auto& [which, count] : seen) EXPECT_EQ(count, 1) << which << "\n" << EventsText(job);
  }

  static std::vector<double> Losses(const dattn::v1::Job& job) { return LossCurve(job); }

  // The uninterrupted 2 x 2 run every fault test compares with.
  std::vector<double> Reference() {
    const std::string id = Submit({"-f", JobFile("reference", 2, 2)});
    const dattn::v1::Job job = Finished(id);
    EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
    return Losses(job);
  }
};

TEST_F(TrainingE2E, TwoByTwoFollowsTheOneRankLossesAndReportsItsProgress) {
  StartCluster(4);
  const std::string one = Submit({"-f", JobFile("one", 1, 1)});
  const dattn::v1::Job a = Finished(one);
  // Followed live through the CLI, as a user would.
  const std::string four = Submit({"-f", JobFile("four", 2, 2), "--watch"});
  EXPECT_NE(last_out_.find("loss"), std::string::npos) << last_out_;
  const dattn::v1::Job b = Finished(four);
  ASSERT_EQ(a.state(), dattn::v1::JOB_STATE_SUCCEEDED) << a.state_reason() << EventsText(a);
  ASSERT_EQ(b.state(), dattn::v1::JOB_STATE_SUCCEEDED) << b.state_reason() << EventsText(b);
  EXPECT_EQ(b.worker_ids_size(), 4);
  const auto& r = b.result().training();
  EXPECT_EQ(r.steps(), kSteps);
  EXPECT_EQ(r.data_parallel(), 2);
  EXPECT_EQ(r.sequence_parallel(), 2);
  EXPECT_GT(r.tokens_per_second(), 0);
  ASSERT_TRUE(r.has_final_evaluation());
  EXPECT_TRUE(r.final_evaluation().has_validation());
  EXPECT_EQ(r.checkpoints_size(), 3);  // keep_last
  EXPECT_EQ(r.final_checkpoint(), r.checkpoints(2).path());
  EXPECT_TRUE(std::filesystem::exists(r.final_checkpoint() + "/MANIFEST.json"));
  EXPECT_TRUE(HasEvent(b, "checkpoint")) << EventsText(b);
  EXPECT_TRUE(HasEvent(b, "evaluation")) << EventsText(b);

  // Step by step, the 4-rank run is the 1-rank run up to fp32 rounding (sums in another order).
  const std::vector<double> x = Losses(a), y = Losses(b);
  ASSERT_EQ(x.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(y.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], x[i], 2e-4 * std::abs(x[i])) << "step " << i + 1;
  }
  EXPECT_LT(x.back(), x.front() - 0.5) << "the loss did not fall";

  // The CLI lists the checkpoints.
  ProcessResult listed = cluster_->Cli({"checkpoints", four});
  EXPECT_EQ(listed.exit_code, 0) << listed.out << listed.err;
  EXPECT_NE(listed.out.find(r.final_checkpoint()), std::string::npos) << listed.out;

  // A bad training spec, through the real service: INVALID_ARGUMENT naming the field.
  dattn::v1::SubmitJobRequest bad;
  bad.set_idempotency_key("bad-spec");
  bad.mutable_spec()->mutable_training()->set_config_json(
      R"({"seq_len": 60, "model": {"d_model": 32, "num_heads": 2, "num_layers": 1,
          "ffn_dim": 64, "attention": {"segment_lengths": [16], "dilation_rates": [1]}},
          "data": {"paths": ["/x"]}})");
  bad.mutable_spec()->mutable_training()->set_sequence_parallel(8);
  grpc::ClientContext context;
  dattn::v1::SubmitJobResponse response;
  const grpc::Status status = cluster_->jobs().SubmitJob(&context, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("spec.training.sequence_parallel"), std::string::npos)
      << status.error_message();
}

TEST_F(TrainingE2E, AKilledRankWorkerResumesFromTheCheckpointBitForBit) {
  StartCluster(5);  // One spare, so the requeued gang finds four workers at once.
  const std::vector<double> reference = Reference();
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));

  const std::string id = Submit({"-f", JobFile("killed", 2, 2)});
  dattn::v1::Job running;
  ASSERT_TRUE(WaitForCheckpoint(id, &running)) << EventsText(running) << cluster_->Logs();
  ASSERT_EQ(running.worker_ids_size(), 4);
  const int victim = cluster_->WorkerIndex(cluster_->WorkerName(running.worker_ids(1)));
  ASSERT_GE(victim, 0);
  cluster_->worker(victim).Signal(SIGKILL);

  const dattn::v1::Job job = Finished(id);
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
  EXPECT_GE(job.attempt(), 2) << EventsText(job);
  EXPECT_TRUE(HasEvent(job, "resumed")) << EventsText(job);
  const auto& r = job.result().training();
  EXPECT_GE(r.resumed_from_step(), kCheckpointEvery);
  EXPECT_LT(r.resumed_from_step(), kSteps);
  EXPECT_GT(r.restore_seconds(), 0);
  bool timed = false;  // The "resumed" event says how long the restore took.
  for (const auto& e : job.events()) {
    timed = timed || (e.kind() == "resumed" && e.message().find(" s") != std::string::npos &&
                      e.message().find("restored in ") != std::string::npos);
  }
  EXPECT_TRUE(timed) << EventsText(job);
  ExpectEachCheckpointEventOnce(job);
  const std::vector<double> losses = Losses(job);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i], reference[i]) << "step " << i + 1;
  }
}

// kill -9 of a rank's worker with no spare and no restart: the four-rank gang cannot run as it was
// on the three workers left, so it shrinks (shrink_ring, on by default for training jobs) to the
// most ranks that fit, 1 x 2, continues from its newest checkpoint with the same global batch, and
// follows the uninterrupted 2 x 2 run's losses within fp32 rounding.
TEST_F(TrainingE2E, AGangThatLostAWorkerForGoodShrinksAndFollowsTheLosses) {
  ClusterOptions options;
  options.coordinator_flags = {"--feasibility-settle-ms=1000"};
  StartCluster(4, options);
  const std::vector<double> reference = Reference();
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));

  const std::string id = Submit({"-f", JobFile("shrunk", 2, 2)});
  dattn::v1::Job running;
  ASSERT_TRUE(WaitForCheckpoint(id, &running)) << EventsText(running) << cluster_->Logs();
  const std::string victim = cluster_->WorkerName(running.worker_ids(2));
  const int index = cluster_->WorkerIndex(victim);
  ASSERT_GE(index, 0);
  cluster_->worker(index).Signal(SIGKILL);

  const dattn::v1::Job job = Finished(id);
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
  EXPECT_EQ(job.spec().training().data_parallel(), 1) << EventsText(job);
  EXPECT_EQ(job.spec().training().sequence_parallel(), 2);
  EXPECT_EQ(job.requested_spec().training().data_parallel(), 2);
  EXPECT_EQ(job.worker_ids_size(), 2);
  for (const std::string& w : job.worker_ids()) EXPECT_NE(cluster_->WorkerName(w), victim);
  const std::string events = EventsText(job);
  EXPECT_NE(events.find("shrunk: the ready workers cannot hold the job as it ran (4 ranks)"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("it continues on data_parallel 1, sequence_parallel 2"), std::string::npos)
      << events;
  EXPECT_TRUE(HasEvent(job, "resumed")) << events;
  const auto& r = job.result().training();
  EXPECT_EQ(r.data_parallel(), 1);
  EXPECT_EQ(r.sequence_parallel(), 2);
  EXPECT_GE(r.resumed_from_step(), kCheckpointEvery);
  ExpectEachCheckpointEventOnce(job);
  // The same global batch in other sums: the uninterrupted run's losses to fp32 rounding.
  const std::vector<double> losses = Losses(job);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], reference[i], 2e-4 * std::abs(reference[i])) << "step " << i + 1;
  }
  // `dattn status` says what it was asked to run as.
  ProcessResult status = cluster_->Cli({"status", id});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("Asked"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("2 data x 2 sequence parallel (4 ranks)"), std::string::npos)
      << status.out;
}

TEST_F(TrainingE2E, AKilledCoordinatorResumesTheJobFromACheckpointBitForBit) {
  StartCluster(4);
  const std::vector<double> reference = Reference();
  ASSERT_EQ(reference.size(), static_cast<size_t>(kSteps));

  const std::string id = Submit({"-f", JobFile("restarted", 2, 2)});
  dattn::v1::Job running;
  ASSERT_TRUE(WaitForCheckpoint(id, &running)) << EventsText(running) << cluster_->Logs();
  cluster_->coordinator().Kill();
  std::string error;
  ASSERT_TRUE(cluster_->StartCoordinator(&error)) << error;

  const dattn::v1::Job job = Finished(id);
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
  EXPECT_TRUE(HasEvent(job, "coordinator_restarted")) << EventsText(job);
  EXPECT_TRUE(HasEvent(job, "resumed")) << EventsText(job);
  EXPECT_GE(job.result().training().resumed_from_step(), kCheckpointEvery) << EventsText(job);
  EXPECT_LT(job.result().training().resumed_from_step(), kSteps) << EventsText(job);
  ExpectEachCheckpointEventOnce(job);
  const std::vector<double> losses = Losses(job);
  ASSERT_EQ(losses.size(), reference.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i], reference[i]) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace dattn::testing
