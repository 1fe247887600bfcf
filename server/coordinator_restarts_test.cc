// Durability and streams: restarts, failed writes, a second coordinator, WatchJob, shutdown.
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "api/rendezvous.h"
#include "engine/comm/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/coordinator_test_util.h"
#include "server/job_state.h"
#include "server/metrics.h"

namespace dattn {
namespace server {
namespace {

using ctest::Assignments;
using ctest::FakeWorker;
using ctest::FormedReport;
using ctest::Holder;
using ctest::NewDataDir;
using ctest::RingRequest;
using ctest::ValidRequest;
using ctest::WaitFor;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using CoordinatorTest = ctest::CoordinatorTest;

// Runs ended by coordinator restarts are not the job's failures: after two restarts mid-run, the
// job's first real failure (a retryable one) still requeues it under max_attempts = 2.
TEST_F(CoordinatorTest, RestartsDoNotUseUpTheRetryBudget) {
  options_.max_attempts = 2;
  Restart();
  const std::string id = Submit(ValidRequest("budget")).job_id();
  std::string task;
  for (int run = 0; run < 3; ++run) {
    FakeWorker* worker = AddWorker(absl::StrCat("cpu-", run));
    std::optional<v1::WorkerCommand> assign = worker->Next();
    ASSERT_TRUE(assign.has_value()) << "run " << run;
    task = assign->assign().task_id();
    ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());
    if (run < 2) Restart();
  }
  EXPECT_EQ(Get(id).attempt(), 3);
  ASSERT_TRUE(workers_.back()->Fail(task, absl::StatusCode::kUnavailable, "peer went away").ok());
  v1::Job job = Get(id, true);
  EXPECT_NE(job.state(), v1::JOB_STATE_FAILED) << job.state_reason();
  EXPECT_THAT(EventKinds(job), Contains("requeued"));
}

TEST_F(CoordinatorTest, RestartRequeuesRunningJobsAndKeepsQueuedOrder) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string running = Submit(ValidRequest("running")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED).ok());
  const std::string q1 = Submit(ValidRequest("q1")).job_id();
  const std::string q2 = Submit(ValidRequest("q2")).job_id();
  const std::string old_worker_id = worker->id();

  Restart();

  v1::Job job = Get(running, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_EQ(EventKinds(job).back(), "coordinator_restarted");
  EXPECT_THAT(job.state_reason(), HasSubstr("requeued as attempt 2"));
  // Submit order is kept: the requeued job was submitted first.
  EXPECT_EQ(job.queue_position(), 1);
  EXPECT_EQ(Get(q1).queue_position(), 2);
  EXPECT_EQ(Get(q2).queue_position(), 3);
  // The old registration is unknown: told to register again; its reports are refused.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(old_worker_id);
  EXPECT_TRUE(coordinator_->Heartbeat(hb)->reregister());
  v1::TaskReport report;
  report.set_worker_id(old_worker_id);
  report.set_task_id(assign->assign().task_id());
  report.set_state(v1::TASK_STATE_SUCCEEDED);
  report.mutable_rank_result();
  EXPECT_TRUE(coordinator_->ReportTask(report)->stop());
  // Idempotency survives the restart.
  absl::StatusOr<v1::SubmitJobResponse> resubmit = coordinator_->SubmitJob(ValidRequest("q1"));
  ASSERT_TRUE(resubmit.ok());
  EXPECT_FALSE(resubmit->created());
  EXPECT_EQ(resubmit->job().job_id(), q1);
  // Gauges come from the store.
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_jobs{kind=\"attention\",state=\"queued\"} 3"));
  EXPECT_THAT(
      metrics_->Serialize(),
      HasSubstr("dattn_recoveries_total{kind=\"coordinator_restarted\",outcome=\"requeued\"} 1"));

  // A new worker runs attempt 2; the job succeeds once.
  FakeWorker* fresh = AddWorker("cpu-0");
  std::optional<v1::WorkerCommand> rerun = fresh->Next();
  ASSERT_TRUE(rerun.has_value());
  EXPECT_EQ(rerun->assign().task_id(), running + "/2/0");
  ASSERT_TRUE(fresh->Report(rerun->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(running).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, RestartHonoursARequestedCancel) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("c")).job_id();
  ASSERT_TRUE(worker->Next().has_value());
  ASSERT_TRUE(Cancel(id, "no longer needed").ok());
  Restart();
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(job.state_reason(), HasSubstr("restarted"));
}

// A write that fails because another process holds the store's lock past the busy timeout is not
// lost and does not wedge the job: the cancel's RPC fails UNAVAILABLE, the monitor records the
// write once the lock is gone (no further request needed), and the coordinator stays ready.
TEST_F(CoordinatorTest, AWriteThatFailedTransientlyIsRetried) {
  ASSERT_TRUE(coordinator_->Close().ok());
  coordinator_.reset();
  options_.store.busy_timeout = absl::Milliseconds(50);
  Open();
  const std::string id = Submit(ValidRequest("locked")).job_id();
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((options_.data_dir + "/jobs.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  absl::StatusOr<v1::Job> cancelled = Cancel(id, "while locked");
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kUnavailable) << cancelled.status();
  EXPECT_THAT(std::string(cancelled.status().message()), HasSubstr(id));
  absl::SleepFor(absl::Milliseconds(300));  // several monitor passes fail meanwhile
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  EXPECT_TRUE(WaitState(id, v1::JOB_STATE_CANCELLED));
  EXPECT_THAT(EventKinds(Get(id, true)), ElementsAre("submitted", "cancelled"));
  EXPECT_TRUE(coordinator_->Health().ok()) << coordinator_->Health();
  absl::StatusOr<v1::Job> again = Cancel(id, "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->state_reason(), HasSubstr("while locked"));
  // Later jobs are written as usual.
  const std::string next = Submit(ValidRequest("after")).job_id();
  EXPECT_EQ(Get(next).state(), v1::JOB_STATE_QUEUED);
}

// A placement whose "placed" write failed (the store locked by another process) is handed to its
// worker once the monitor has recorded the write, not before (a restart in between must not find a
// worker running a placement the store never saw), and not never.
TEST_F(CoordinatorTest, APlacementWhoseWriteStalledIsDispatchedOnceRecorded) {
  ASSERT_TRUE(coordinator_->Close().ok());
  coordinator_.reset();
  options_.store.busy_timeout = absl::Milliseconds(50);
  options_.feasibility_settle = absl::ZeroDuration();
  Open();
  const std::string id = Submit(ValidRequest("stalled-placement")).job_id();
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open((options_.data_dir + "/jobs.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  FakeWorker* w = AddWorker("w");
  // The worker's registration runs a pass at once: it places the job in memory, but the write
  // cannot commit, so no assignment goes out.
  EXPECT_FALSE(w->Next(absl::Milliseconds(600)).has_value()) << "dispatched before durable";
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  std::optional<v1::WorkerCommand> assign = w->Next(absl::Seconds(5));
  ASSERT_TRUE(assign.has_value() && assign->has_assign()) << "never dispatched";
  EXPECT_EQ(assign->assign().job_id(), id);
  ASSERT_TRUE(w->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_TRUE(WaitState(id, v1::JOB_STATE_SUCCEEDED));
  EXPECT_THAT(EventKinds(Get(id, true)),
              ElementsAre("submitted", "placed", "started", "succeeded"));
}

TEST_F(CoordinatorTest, SecondCoordinatorOnTheSameDataDirIsRefused) {
  Coordinator second(options_, nullptr);
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(second.Health().code(), absl::StatusCode::kUnavailable);
  v1::GetJobRequest get;
  get.set_job_id("j-1");
  EXPECT_EQ(second.GetJob(get).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoordinatorTest, WatchJobReplaysHistoryThenFollowsLive) {
  const std::string id = Submit(ValidRequest("w")).job_id();
  absl::Mutex mu;
  std::vector<v1::JobEvent> seen;
  absl::Status watch_status;
  bool done = false;
  std::thread watcher([&] {
    v1::WatchJobRequest request;
    request.set_job_id(id);
    absl::Status s = coordinator_->WatchJob(
        request,
        [&](const v1::JobEvent& e) {
          absl::MutexLock lock(&mu);
          seen.push_back(e);
          return true;
        },
        [] { return false; });
    absl::MutexLock lock(&mu);
    watch_status = s;
    done = true;
  });
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&mu);
    return seen.size() == 1;
  }));
  FakeWorker* worker = AddWorker("cpu-0");
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED).ok());
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&mu);
    return done;
  }));
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status;
  ASSERT_EQ(seen.size(), 4u);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i].seq(), static_cast<int64_t>(i + 1));
  EXPECT_EQ(seen.back().kind(), "succeeded");
  EXPECT_EQ(seen.back().state(), v1::JOB_STATE_SUCCEEDED);

  // A watch of a finished job replays what is after after_seq and ends at once.
  std::vector<std::string> kinds;
  v1::WatchJobRequest request;
  request.set_job_id(id);
  request.set_after_seq(2);
  ASSERT_TRUE(coordinator_
                  ->WatchJob(
                      request,
                      [&](const v1::JobEvent& e) {
                        kinds.push_back(e.kind());
                        return true;
                      },
                      nullptr)
                  .ok());
  EXPECT_THAT(kinds, ElementsAre("started", "succeeded"));
  request.set_job_id("j-unknown");
  EXPECT_EQ(coordinator_
                ->WatchJob(
                    request, [](const v1::JobEvent&) { return true; }, nullptr)
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, WatchEndsWhenCancelledOrStreamsClose) {
  const std::string id = Submit(ValidRequest("w")).job_id();
  v1::WatchJobRequest request;
  request.set_job_id(id);
  std::atomic<bool> cancel{false};
  absl::Status status;
  std::thread watcher([&] {
    status = coordinator_->WatchJob(
        request, [](const v1::JobEvent&) { return true; }, [&] { return cancel.load(); });
  });
  absl::SleepFor(absl::Milliseconds(50));
  cancel = true;
  watcher.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);

  std::thread second([&] {
    status = coordinator_->WatchJob(
        request, [](const v1::JobEvent&) { return true; }, nullptr);
  });
  absl::SleepFor(absl::Milliseconds(50));
  coordinator_->CloseStreams();
  second.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
}

// A long history is replayed a page at a time, in order and without gaps across page boundaries,
// and then followed live.
TEST_F(CoordinatorTest, WatchReplaysALongHistoryPageByPage) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("long-history")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const std::string task = assign->assign().task_id();
  const int progress_events = 2 * kWatchHistoryPage + 7;
  for (int i = 1; i <= progress_events; ++i) {
    ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_PROGRESS, i % 4).ok());
  }
  std::vector<int64_t> seqs;
  std::thread finisher;
  v1::WatchJobRequest request;
  request.set_job_id(id);
  absl::Status s = coordinator_->WatchJob(
      request,
      [&](const v1::JobEvent& e) {
        seqs.push_back(e.seq());
        // Once the whole history is out, the job ends live.
        if (seqs.size() == static_cast<size_t>(progress_events) + 3) {
          finisher = std::thread(
              [&] { ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_SUCCEEDED).ok()); });
        }
        return true;
      },
      nullptr);
  if (finisher.joinable()) finisher.join();
  ASSERT_TRUE(s.ok()) << s;
  // submitted, placed, started (with the first progress), the progress events, succeeded.
  ASSERT_EQ(seqs.size(), static_cast<size_t>(progress_events) + 4);
  for (size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], static_cast<int64_t>(i + 1));
}

TEST_F(CoordinatorTest, OpenWatchesAreBounded) {
  options_.max_watch_streams = 2;
  Restart();
  const std::string id = Submit(ValidRequest("bounded")).job_id();
  v1::WatchJobRequest request;
  request.set_job_id(id);
  std::atomic<bool> cancel_first{false}, cancel_rest{false};
  std::vector<std::thread> watches;
  std::atomic<int> emitted{0};
  for (int i = 0; i < 2; ++i) {
    watches.emplace_back([&, i] {
      coordinator_
          ->WatchJob(
              request,
              [&](const v1::JobEvent&) {
                ++emitted;
                return true;
              },
              [&, i] { return i == 0 ? cancel_first.load() : cancel_rest.load(); })
          .IgnoreError();
    });
  }
  ASSERT_TRUE(WaitFor([&] { return emitted.load() == 2; }));  // Both are open.
  absl::Status third = coordinator_->WatchJob(
      request, [](const v1::JobEvent&) { return true; }, nullptr);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_THAT(third.message(), HasSubstr("at most 2 WatchJob streams"));
  cancel_first = true;
  watches[0].join();
  watches.emplace_back([&] {
    coordinator_
        ->WatchJob(
            request,
            [&](const v1::JobEvent&) {
              ++emitted;
              return true;
            },
            [&] { return cancel_rest.load(); })
        .IgnoreError();
  });
  EXPECT_TRUE(WaitFor([&] { return emitted.load() == 3; }));  // A slot was free again.
  cancel_rest = true;
  for (size_t i = 1; i < watches.size(); ++i) watches[i].join();
}

// On a FakeClock: Drain waits out its timeout on the clock, however long the real wait.
TEST_F(CoordinatorTest, ShutdownStopsSubmitsAndRequeuesUnfinishedJobs) {
  options_.dead_after = absl::Hours(1);  // The clock moves by minutes; the worker must stay.
  UseFakeClock();
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("long")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED).ok());

  ASSERT_TRUE(coordinator_->Health().ok());
  coordinator_->StopAccepting();
  EXPECT_EQ(coordinator_->Health().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<v1::SubmitJobResponse> refused = coordinator_->SubmitJob(ValidRequest("late"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("shutting down"));
  // Reads and reports go on while draining.
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_PROGRESS, 1).ok());

  std::atomic<bool> drained{false};
  std::thread drain([&] {
    EXPECT_TRUE(coordinator_->Drain(absl::Minutes(10)).ok());
    drained = true;
  });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(drained) << "the drain timeout passed on the real clock";
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Minutes(10));
  drain.join();
  std::optional<v1::WorkerCommand> cancel = worker->Next();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->cancel().task_id(), assign->assign().task_id());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.attempt(), 2);
  EXPECT_THAT(job.state_reason(), HasSubstr("drain timeout"));
  coordinator_->CloseStreams();
  ASSERT_TRUE(WaitFor([&] { return worker->stream_ended(); }));
  EXPECT_EQ(worker->stream_status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(CoordinatorTest, DrainReturnsAsSoonAsRunningJobsEnd) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("short")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  coordinator_->StopAccepting();
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  });
  const absl::Time start = absl::Now();
  ASSERT_TRUE(coordinator_->Drain(absl::Seconds(20)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  finisher.join();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace server
}  // namespace dattn
