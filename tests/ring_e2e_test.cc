// End-to-end tests of multi-rank (ring) attention jobs: the real dattn-coordinator, dattn-worker
// and dattn binaries on loopback, CPU workers forming Gloo rings of 2 and 4 ranks through the
// coordinator's rendezvous stores.
//
// - Ring jobs submitted and watched through the CLI give what the single-rank job of the same spec
//   and seed gives: checksums to fp64 rounding and the returned output to 1e-12 (docs/ENGINE.md's
//   fp64 tolerance), for patterns whose segments span ranks, both modes, causal or not, backward.
// - A worker killed (SIGKILL) while its rank runs: the job's history names it, and the job runs
//   again on the survivors.
// - A worker killed for good under a 4-rank job that allows a shrink: the job continues on a ring
// of
//   2 of the 3 workers left, with the single-rank job's result.
// - An allocation that fails once is retried by the worker after releasing its caches (the same
//   result, attempt 1); one that fails again is reported, saying so.
// - A rank that never arrives (its worker frozen with SIGSTOP before the ring forms): the formation
//   fails within the formation timeout with an event naming the rank and its worker; never a hang.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "dattn/v1/job_service.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/cluster.h"
#include "tests/cluster_fixture.h"

namespace dattn::testing {
namespace {

using std::chrono::seconds;

// One spec, as CLI flags: B = 2, N = 96, H = 3 (H % G != 0), D = 8, fp64, forward and backward, two
// steps. With w = [16, 64] the 64-segments cross the shard boundaries of 2 and of 4 ranks, and the
// 16-segments those of 4 ranks (at positions 24 and 72).
struct Case {
  std::string mode;
  bool causal = false;
  int ranks = 2;
  int seed = 0;
};

std::vector<std::string> CaseFlags(const Case& c, int ranks) {
  return {"--batch=2",        "--seq-len=96",
          "--heads=3",        "--head-dim=8",
          "--segments=16,64", "--rates=1,2",
          "--mode=" + c.mode, c.causal ? "--causal" : "--no-causal",
          "--dtype=fp64",     "--pass=fwd-bwd",
          "--iterations=2",   "--seed=" + std::to_string(c.seed),
          "--device=cpu",     "--ranks=" + std::to_string(ranks)};
}

class RingE2E : public ClusterTest {
 protected:
  dattn::v1::Job Finished(const std::string& id) {
    dattn::v1::Job job;
    EXPECT_TRUE(cluster_->WaitForJobEnd(id, seconds(60), &job)) << cluster_->Logs();
    return job;
  }

  // Four workers declared dead 1.5 s after their last heartbeat, and jobs of up to 4 attempts:
  // the cluster of the worker-fault tests.
  void StartFaultCluster() {
    ClusterOptions options;
    options.dead_after_ms = 1500;
    options.max_attempts = 4;
    StartCluster(4, options);
  }

  // Cancels job `id` with the CLI and expects it to end CANCELLED.
  void CancelAndExpectCancelled(const std::string& id) {
    ProcessResult c = cluster_->Cli({"cancel", id});
    EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
    const dattn::v1::Job job = Finished(id);
    EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_CANCELLED) << EventsText(job);
  }

  // A 2-rank job of seconds per step on one thread, for ever (it runs until cancelled), submitted
  // and followed until both ranks have finished `steps` steps (the job's progress is the slower
  // rank's); its id, and the job as then in *job. Empty (and a test failure) if it does not get
  // there within 30 s.
  std::string StartEndlessRing(int64_t steps, dattn::v1::Job* job) {
    const std::string id =
        Submit({"--batch=1", "--seq-len=4096", "--heads=4", "--head-dim=32", "--segments=512,2048",
                "--rates=1,2", "--dtype=fp32", "--pass=fwd-bwd", "--iterations=1000000",
                "--device=cpu", "--ranks=2"});
    const auto deadline = std::chrono::steady_clock::now() + seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_RUNNING, seconds(30), job)) break;
      if (job->progress().steps_done() >= steps && job->worker_ids_size() == 2) return id;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "job " << id << " did not run " << steps
                  << " steps on 2 ranks: " << EventsText(*job) << cluster_->Logs();
    return "";
  }

  // Waits until a later attempt of job `id` runs on two workers, neither of them `gone`, at most
  // until `deadline`; true then (with the job in *job).
  bool WaitRecoveredWithout(const std::string& id, const std::string& gone,
                            std::chrono::steady_clock::time_point deadline, dattn::v1::Job* job) {
    while (std::chrono::steady_clock::now() < deadline) {
      if (cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_RUNNING, seconds(1), job) &&
          job->attempt() >= 2 && job->worker_ids_size() == 2 &&
          cluster_->WorkerName(job->worker_ids(0)) != gone &&
          cluster_->WorkerName(job->worker_ids(1)) != gone) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
};

TEST_F(RingE2E, RingJobsThroughTheCliEqualTheSingleRankJob) {
  StartCluster(4);
  const std::vector<Case> cases = {{"grouped", false, 2, 11},
                                   {"mixture", true, 2, 12},
                                   {"grouped", true, 4, 13},
                                   {"mixture", false, 4, 14}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.mode + (c.causal ? " causal" : "") + " x" + std::to_string(c.ranks));
    const std::string dir = cluster_->dir() + "/" + c.mode + std::to_string(c.ranks);
    const std::string single_file = dir + "-single.npy", ring_file = dir + "-ring.npy";
    const std::string single = Submit(CaseFlags(c, 1), {"--output-file=" + single_file});
    // The ring job is followed live, as a user would: progress and the end show in the stream.
    const std::string ring =
        Submit(CaseFlags(c, c.ranks), {"--output-file=" + ring_file, "--watch"});
    EXPECT_NE(last_out_.find("progress"), std::string::npos) << last_out_;
    EXPECT_NE(last_out_.find("succeeded"), std::string::npos) << last_out_;
    EXPECT_NE(last_out_.find("of " + std::to_string(c.ranks) + " ranks succeeded"),
              std::string::npos)
        << last_out_;

    const dattn::v1::Job a = Finished(single), b = Finished(ring);
    ASSERT_EQ(a.state(), dattn::v1::JOB_STATE_SUCCEEDED) << a.state_reason();
    ASSERT_EQ(b.state(), dattn::v1::JOB_STATE_SUCCEEDED) << b.state_reason() << EventsText(b);
    const auto& one = a.result().attention();
    const auto& many = b.result().attention();
    ASSERT_EQ(many.ranks_size(), c.ranks);
    for (int r = 0; r < c.ranks; ++r) {
      EXPECT_EQ(many.ranks(r).rank(), r);
      EXPECT_GT(many.ranks(r).ring_formation_seconds(), 0.0);
      EXPECT_GT(many.ranks(r).tflops(), 0.0);
    }
    EXPECT_EQ(b.worker_ids_size(), c.ranks);
    EXPECT_EQ(b.progress().steps_done(), 2);
    EXPECT_DOUBLE_EQ(many.flops_per_step(), one.flops_per_step());
    EXPECT_GT(many.tflops(), 0.0);
    // fp64 end to end: sums of squares to rounding; plain sums relative to their scale.
    EXPECT_NEAR(many.out_sum_squares(), one.out_sum_squares(), 1e-11 * one.out_sum_squares());
    EXPECT_NEAR(many.grad_sum_squares(), one.grad_sum_squares(), 1e-11 * one.grad_sum_squares());
    EXPECT_NEAR(many.out_sum(), one.out_sum(), 1e-10 * std::sqrt(one.out_sum_squares()));
    EXPECT_NEAR(many.grad_sum(), one.grad_sum(), 1e-10 * std::sqrt(one.grad_sum_squares()));

    // The returned outputs: the ring's is assembled from its ranks' shards, the same tensor.
    const std::string x = ReadNpyData(single_file), y = ReadNpyData(ring_file);
    ASSERT_EQ(x.size(), size_t{2 * 96 * 3 * 8 * 8});
    ASSERT_EQ(y.size(), x.size());
    const double* p = reinterpret_cast<const double*>(x.data());
    const double* q = reinterpret_cast<const double*>(y.data());
    double err = 0, norm = 0;
    for (size_t i = 0; i < x.size() / 8; ++i) {
      err += (p[i] - q[i]) * (p[i] - q[i]);
      norm += p[i] * p[i];
    }
    ASSERT_GT(norm, 1.0);
    EXPECT_LE(std::sqrt(err / norm), 1e-12);
  }
  // The metrics saw the rings form.
  ProcessOptions curl;
  curl.name = "curl";
  curl.log_dir = cluster_->dir();
  curl.argv = {"/usr/bin/curl", "-sf", "http://" + cluster_->metrics_address() + "/metrics"};
  ProcessResult m = RunCommand(curl, seconds(10));
  ASSERT_EQ(m.exit_code, 0) << m.err;
  // At least the four rings above formed (a formation retried on a loaded machine adds more).
  const std::string formed = "dattn_ring_formations_total{backend=\"gloo\",outcome=\"formed\"} ";
  const size_t at = m.out.find(formed);
  ASSERT_NE(at, std::string::npos) << m.out;
  EXPECT_GE(std::atof(m.out.c_str() + at + formed.size()), 4.0) << m.out;
  EXPECT_NE(m.out.find("dattn_worker_rank_step_seconds_count{worker=\"worker-"), std::string::npos);
}

// Out of memory while running, at a real allocation site: two workers whose devices fail
// allocations past 200 KB while they report the host's memory (--fault-device-memory-bytes). The
// coordinator places the job on one rank (its plan fits what the workers report); the rank runs out
// of memory allocating its tensors, and the job, whose policy allows more ranks, moves down its
// ladder to a 2-rank ring that fits, with the single-rank run's result.
TEST_F(RingE2E, ARankOutOfMemoryMovesTheJobDownItsLadderWithTheSameResult) {
  StartCluster(1);
  const Case c{"grouped", true, 1, 21};
  const dattn::v1::Job control = Finished(Submit(CaseFlags(c, 1)));
  ASSERT_EQ(control.state(), dattn::v1::JOB_STATE_SUCCEEDED) << control.state_reason();
  ProcessResult drained = cluster_->Cli({"drain", "worker-0"});
  ASSERT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  for (int i = 0; i < 2; ++i) {
    std::string error;
    ASSERT_GE(cluster_->AddWorker(1, &error, "small-" + std::to_string(i),
                                  {"--fault-device-memory-bytes=200000"}),
              0)
        << error;
  }
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(2, seconds(30))) << cluster_->Logs();

  std::vector<std::string> flags = CaseFlags(c, 1);
  flags.push_back("--more-ranks=true");
  const dattn::v1::Job job = Finished(Submit(flags));
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
  EXPECT_EQ(job.spec().attention().num_ranks(), 2);
  EXPECT_EQ(job.requested_spec().attention().num_ranks(), 1);
  EXPECT_EQ(job.attempt(), 2);
  const std::string events = EventsText(job);
  EXPECT_NE(events.find("(code RESOURCE_EXHAUSTED)"), std::string::npos) << events;
  EXPECT_NE(events.find("--fault-device-memory-bytes"), std::string::npos) << events;
  EXPECT_NE(events.find("out of memory while running: the recovery ladder runs it with 2 ranks"),
            std::string::npos)
      << events;
  const auto& one = control.result().attention();
  const auto& two = job.result().attention();
  ASSERT_EQ(two.ranks_size(), 2);
  EXPECT_NEAR(two.out_sum_squares(), one.out_sum_squares(), 1e-11 * one.out_sum_squares());
  EXPECT_NEAR(two.grad_sum_squares(), one.grad_sum_squares(), 1e-11 * one.grad_sum_squares());
  EXPECT_NEAR(two.out_sum(), one.out_sum(), 1e-10 * std::sqrt(one.out_sum_squares()));
  EXPECT_NEAR(two.grad_sum(), one.grad_sum(), 1e-10 * std::sqrt(one.grad_sum_squares()));
}

// The worker's own step: a worker whose second allocation fails once (--fault-allocation-failures
// 2:1, as if another process held the memory for a moment) releases its caches and allocates again;
// the job succeeds on its first attempt with the undisturbed result, and says so. A worker whose
// allocations fail twice reports RESOURCE_EXHAUSTED, saying it retried, and the coordinator's
// ladder takes over (here: no rung allowed, so the job fails with both messages).
TEST_F(RingE2E, AnAllocationThatFailsOnceIsRetriedByTheWorker) {
  StartCluster(1);
  const Case c{"grouped", true, 1, 23};
  const dattn::v1::Job control = Finished(Submit(CaseFlags(c, 1)));
  ASSERT_EQ(control.state(), dattn::v1::JOB_STATE_SUCCEEDED) << control.state_reason();
  ProcessResult drained = cluster_->Cli({"drain", "worker-0"});
  ASSERT_EQ(drained.exit_code, 0) << drained.out << drained.err;
  std::string error;
  ASSERT_GE(cluster_->AddWorker(1, &error, "flaky", {"--fault-allocation-failures=2:1"}), 0)
      << error;
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(1, seconds(30))) << cluster_->Logs();
  const std::string id = Submit(CaseFlags(c, 1));
  const dattn::v1::Job job = Finished(id);
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
  EXPECT_EQ(job.attempt(), 1);
  ASSERT_EQ(job.result().attention().ranks_size(), 1);
  EXPECT_EQ(job.result().attention().ranks(0).out_of_memory_retries(), 1);
  EXPECT_EQ(job.result().attention().out_sum(), control.result().attention().out_sum());
  EXPECT_EQ(job.result().attention().grad_sum_squares(),
            control.result().attention().grad_sum_squares());
  ProcessResult status = cluster_->Cli({"status", id});
  EXPECT_NE(status.out.find("rank 0 ran out at set-up and fit when retried"), std::string::npos)
      << status.out;

  std::string twice_error;
  const int twice =
      cluster_->AddWorker(1, &twice_error, "flaky-twice", {"--fault-allocation-failures=1:2"});
  ASSERT_GE(twice, 0) << twice_error;
  ASSERT_EQ(cluster_->Cli({"drain", "flaky"}).exit_code, 0);
  ASSERT_TRUE(cluster_->WaitForReadyWorkers(1, seconds(30))) << cluster_->Logs();
  const dattn::v1::Job failed = Finished(Submit(CaseFlags(c, 1)));
  EXPECT_EQ(failed.state(), dattn::v1::JOB_STATE_FAILED) << EventsText(failed);
  EXPECT_NE(failed.state_reason().find("retried once after releasing the device's caches"),
            std::string::npos)
      << failed.state_reason();
}

// kill -9 of a worker whose rank runs: its peer sees the connection drop, the job's history names
// the lost worker, and the job runs again on the survivors.
TEST_F(RingE2E, KilledWorkerDuringARingRunIsRecoveredOnTheSurvivors) {
  StartFaultCluster();
  dattn::v1::Job job;
  const std::string id = StartEndlessRing(2, &job);
  ASSERT_FALSE(id.empty());
  const std::string victim = cluster_->WorkerName(job.worker_ids(1));
  const int index = cluster_->WorkerIndex(victim);
  ASSERT_GE(index, 0) << victim;
  cluster_->worker(index).Signal(SIGKILL);
  ASSERT_TRUE(cluster_->worker(index).Wait(seconds(10)).has_value());

  // Recovered: a later attempt runs on two workers, neither of them the victim.
  ASSERT_TRUE(
      WaitRecoveredWithout(id, victim, std::chrono::steady_clock::now() + seconds(60), &job))
      << EventsText(job) << cluster_->Logs();
  bool named = false;
  for (const auto& e : job.events()) {
    if ((e.kind() == "ring_failed" || e.kind() == "worker_lost") &&
        e.message().find(victim) != std::string::npos) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << EventsText(job);
  EXPECT_TRUE(HasEvent(job, "requeued")) << EventsText(job);

  CancelAndExpectCancelled(id);
}

// kill -9 of a worker of a 4-rank job that allows a shrink, with no worker to replace it: the 4
// ranks cannot be placed on the 3 workers left, so the job continues on the largest ring they hold
// that divides N (2) and ends with the single-rank job's result.
TEST_F(RingE2E, AWorkerLostForGoodShrinksTheRingWithTheSameResult) {
  ClusterOptions options;
  options.dead_after_ms = 1500;
  options.max_attempts = 4;
  options.coordinator_flags = {"--feasibility-settle-ms=1000"};
  StartCluster(4, options);
  auto flags = [](int ranks, int iterations) {
    return ShrinkableAttentionFlags(2048, ranks, iterations, 31, /*single_device=*/false);
  };
  const std::string id = Submit(flags(4, 60));
  dattn::v1::Job job;
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         !(cluster_->WaitForJobState(id, dattn::v1::JOB_STATE_RUNNING, seconds(30), &job) &&
           job.progress().steps_done() >= 1)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_RUNNING) << EventsText(job) << cluster_->Logs();
  ASSERT_LT(job.progress().steps_done(), 60) << "the job ended before the kill";
  const std::string victim = cluster_->WorkerName(job.worker_ids(3));
  const int index = cluster_->WorkerIndex(victim);
  ASSERT_GE(index, 0) << victim;
  cluster_->worker(index).Signal(SIGKILL);

  job = Finished(id);
  ASSERT_EQ(job.state(), dattn::v1::JOB_STATE_SUCCEEDED) << job.state_reason() << EventsText(job);
  EXPECT_EQ(job.spec().attention().num_ranks(), 2) << EventsText(job);
  EXPECT_EQ(job.requested_spec().attention().num_ranks(), 4);
  const std::string events = EventsText(job);
  EXPECT_NE(events.find(victim), std::string::npos) << events;
  EXPECT_NE(events.find("shrunk: the ready workers cannot hold the job as it ran (4 ranks)"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("it continues on 2 ranks ("), std::string::npos) << events;
  ASSERT_EQ(job.result().attention().ranks_size(), 2);
  for (const std::string& w : job.worker_ids()) EXPECT_NE(cluster_->WorkerName(w), victim);

  // The single-rank run of the same inputs (every step computes the same pass).
  const dattn::v1::Job control = Finished(Submit(flags(1, 1)));
  ASSERT_EQ(control.state(), dattn::v1::JOB_STATE_SUCCEEDED) << control.state_reason();
  const auto& one = control.result().attention();
  const auto& two = job.result().attention();
  EXPECT_NEAR(two.out_sum_squares(), one.out_sum_squares(), 1e-11 * one.out_sum_squares());
  EXPECT_NEAR(two.grad_sum_squares(), one.grad_sum_squares(), 1e-11 * one.grad_sum_squares());
  EXPECT_NEAR(two.out_sum(), one.out_sum(), 1e-10 * std::sqrt(one.out_sum_squares()));
  EXPECT_NEAR(two.grad_sum(), one.grad_sum(), 1e-10 * std::sqrt(one.grad_sum_squares()));
}

// SIGSTOP of a worker whose rank runs (a hung process, not a dead one): detected within the ring's
// timeout, never a hang. The frozen worker stops heartbeating and its peer's collective stops
// completing; the job's history names the frozen worker and a later attempt runs on two others.
TEST_F(RingE2E, AFrozenRankIsDetectedWithinTheRingTimeoutAndRecovered) {
  StartFaultCluster();
  dattn::v1::Job job;
  const std::string id = StartEndlessRing(1, &job);
  ASSERT_FALSE(id.empty());
  const std::string frozen = cluster_->WorkerName(job.worker_ids(0));
  const int index = cluster_->WorkerIndex(frozen);
  ASSERT_GE(index, 0) << frozen;
  const auto stopped = std::chrono::steady_clock::now();
  cluster_->worker(index).Signal(SIGSTOP);

  // Within the ring timeout (20 s here), a later attempt runs on two other workers.
  const bool recovered = WaitRecoveredWithout(id, frozen, stopped + seconds(20), &job);
  cluster_->worker(index).Signal(SIGCONT);
  ASSERT_TRUE(recovered) << "not recovered within 20 s of the SIGSTOP: " << EventsText(job)
                         << cluster_->Logs();
  EXPECT_NE(EventsText(job).find(frozen), std::string::npos) << EventsText(job);
  CancelAndExpectCancelled(id);
}

// A worker frozen before its rank can arrive: the other rank's formation times out, and the job
// fails (one attempt allowed here) with an event naming the missing rank and its worker.
TEST_F(RingE2E, ARankThatNeverArrivesFailsTheFormationNamingIt) {
  ClusterOptions options;
  options.dead_after_ms = 60000;  // The frozen worker stays "alive": only the ring can tell.
  options.max_attempts = 1;
  options.ring_formation_timeout_ms = 1500;
  StartCluster(2, options);
  cluster_->worker(1).Signal(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  const std::string id = Submit({"--seq-len=96", "--heads=3", "--head-dim=8", "--segments=16,64",
                                 "--rates=1,2", "--dtype=fp64", "--device=cpu", "--ranks=2"});
  dattn::v1::Job job = Finished(id);
  const auto took = std::chrono::steady_clock::now() - start;
  cluster_->worker(1).Signal(SIGCONT);
  EXPECT_LT(took, seconds(20));
  EXPECT_EQ(job.state(), dattn::v1::JOB_STATE_FAILED) << EventsText(job);
  ASSERT_TRUE(HasEvent(job, "ring_formation_failed")) << EventsText(job);
  int frozen_rank = -1;
  for (int r = 0; r < job.worker_ids_size(); ++r) {
    if (cluster_->WorkerName(job.worker_ids(r)) == "worker-1") frozen_rank = r;
  }
  ASSERT_GE(frozen_rank, 0);
  for (const auto& e : job.events()) {
    if (e.kind() != "ring_formation_failed") continue;
    EXPECT_NE(e.message().find("rank " + std::to_string(frozen_rank) + " on "), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("(worker-1)"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("never arrived"), std::string::npos) << e.message();
  }
  EXPECT_NE(job.state_reason().find("worker-1"), std::string::npos) << job.state_reason();
  // The CLI shows the reason too.
  ProcessResult status = cluster_->Cli({"status", id, "--events"});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("ring_formation_failed"), std::string::npos) << status.out;
}

}  // namespace
}  // namespace dattn::testing
