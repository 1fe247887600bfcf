// Workers as the coordinator sees them: slots and memory, lost assignments, heartbeats and death,
// failed and refused ranks, re-registration, drain, broken streams, jobs checked against workers.
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

#include "absl/strings/match.h"
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

TEST_F(CoordinatorTest, WorkerSlotsAndMemoryLimitPlacement) {
  FakeWorker* worker = AddWorker("cpu-0", int64_t{1} << 30, /*max_ranks=*/1);
  const std::string a = Submit(ValidRequest("a")).job_id();
  const std::string b = Submit(ValidRequest("b")).job_id();
  std::optional<v1::WorkerCommand> first = worker->Next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->assign().job_id(), a);
  // One slot: b waits until a ends.
  EXPECT_FALSE(worker->Next(absl::Milliseconds(200)).has_value());
  EXPECT_EQ(Get(b).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(b).queue_position(), 1);
  ASSERT_TRUE(worker->Report(first->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  std::optional<v1::WorkerCommand> second = worker->Next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->assign().job_id(), b);
}

// An assignment written to a stream that broke right after never reached the worker: its
// heartbeats do not list the task, so once two heartbeat intervals have passed the coordinator
// sends it again (same task id), and the job does not sit PLACED forever. On a FakeClock: nothing
// is resent however long the real wait until the clock passes the two intervals.
TEST_F(CoordinatorTest, AssignmentLostInTransitIsSentAgain) {
  UseFakeClock();
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("lost")).job_id();
  std::optional<v1::WorkerCommand> first = worker->Next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->has_assign());
  const std::string task = first->assign().task_id();
  worker->Drop(task);  // The worker never saw it.
  EXPECT_FALSE(worker->Next(absl::Milliseconds(300)).has_value()) << "resent before its time";
  clock_.Advance(2 * options_.heartbeat_interval);
  std::optional<v1::WorkerCommand> again = worker->Next(absl::Seconds(5));
  ASSERT_TRUE(again.has_value()) << "the lost assignment was not sent again";
  ASSERT_TRUE(again->has_assign());
  EXPECT_EQ(again->assign().task_id(), task);
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  // A task the worker lists is not sent again.
  clock_.Advance(4 * options_.heartbeat_interval);
  EXPECT_FALSE(worker->Next(absl::Milliseconds(300)).has_value());
}

TEST_F(CoordinatorTest, CancelRequestedThenWorkerLostEndsCancelled) {
  UseFakeClock();
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("x")).job_id();
  ASSERT_TRUE(worker->Next().has_value());
  ASSERT_TRUE(Cancel(id).ok());
  // The worker dies before confirming: the cancel completes rather than the job requeueing.
  worker->StopHeartbeats();
  clock_.Advance(options_.dead_after + absl::Milliseconds(1));
  ASSERT_TRUE(WaitState(id, v1::JOB_STATE_CANCELLED));
  EXPECT_THAT(EventKinds(Get(id, true)),
              ElementsAre("submitted", "placed", "cancel_requested", "worker_lost", "cancelled"));
}

// On a FakeClock: a worker is declared dead when the clock passes dead_after since its last
// heartbeat, not before, however long the real wait.
TEST_F(CoordinatorTest, WorkerDeathRequeuesThenFails) {
  options_.max_attempts = 2;
  options_.dead_after = absl::Minutes(1);
  UseFakeClock();
  const std::string id = Submit(ValidRequest("d")).job_id();
  for (int attempt = 1; attempt <= 2; ++attempt) {
    SCOPED_TRACE(attempt);
    FakeWorker* worker = AddWorker(absl::StrCat("mortal-", attempt));
    std::optional<v1::WorkerCommand> assign = worker->Next();
    ASSERT_TRUE(assign.has_value());
    EXPECT_EQ(assign->assign().attempt(), attempt);
    ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED).ok());
    worker->StopHeartbeats();
    clock_.Advance(absl::Seconds(59));
    absl::SleepFor(absl::Milliseconds(100));  // Monitor passes run: it is not dead yet.
    EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(WaitFor([&] { return Get(id).state() != v1::JOB_STATE_RUNNING; }));
    // Its stream ends, and its late reports are refused.
    ASSERT_TRUE(WaitFor([&] { return worker->stream_ended(); }));
    EXPECT_EQ(worker->stream_status().code(), absl::StatusCode::kNotFound);
    absl::StatusOr<v1::ReportTaskResponse> late =
        worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED);
    ASSERT_TRUE(late.ok());
    EXPECT_TRUE(late->stop());
    EXPECT_TRUE(worker->Heartbeat().reregister());
  }
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.state_reason(), HasSubstr("no heartbeat"));
  EXPECT_THAT(job.state_reason(), HasSubstr("mortal-2"));
  EXPECT_THAT(job.state_reason(), HasSubstr("exhausted (2 of 2)"));
  EXPECT_THAT(EventKinds(job),
              ElementsAre("submitted", "placed", "started", "worker_lost", "requeued", "placed",
                          "started", "worker_lost", "failed"));
  EXPECT_THAT(job.events(3).message(), HasSubstr("mortal-1"));
  EXPECT_EQ(job.events(4).state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recoveries_total{kind=\"worker_lost\",outcome=\"requeued\"} 1"));
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recoveries_total{kind=\"worker_lost\",outcome=\"failed\"} 1"));
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("dattn_workers{state=\"dead\"} 2"));
}

TEST_F(CoordinatorTest, HeartbeatsKeepAWorkerAlive) {
  UseFakeClock();
  FakeWorker* worker = AddWorker("steady");
  const std::string id = Submit(ValidRequest("h")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  for (int i = 0; i < 20; ++i) {  // Twice dead_after on the clock, a heartbeat every 1/10 of it.
    v1::HeartbeatResponse hb = worker->Heartbeat({assign->assign().task_id()});
    EXPECT_FALSE(hb.reregister());
    EXPECT_FALSE(hb.drain());
    clock_.Advance(options_.dead_after / 10);
  }
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_PLACED);
  // A task the coordinator does not know is cancelled through the stream.
  worker->Heartbeat({assign->assign().task_id(), "j-gone/1/0"});
  std::optional<v1::WorkerCommand> cancel = worker->Next();
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->cancel().task_id(), "j-gone/1/0");
}

TEST_F(CoordinatorTest, RetryableTaskFailureRequeuesAndOtherFailuresFail) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("f")).job_id();
  std::optional<v1::WorkerCommand> first = worker->Next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(
      worker->Fail(first->assign().task_id(), absl::StatusCode::kUnavailable, "gloo peer gone")
          .ok());
  std::optional<v1::WorkerCommand> second = worker->Next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->assign().attempt(), 2);
  EXPECT_EQ(second->assign().task_id(), id + "/2/0");
  ASSERT_TRUE(worker
                  ->Fail(second->assign().task_id(), absl::StatusCode::kInvalidArgument,
                         "head dim D = 16 is not supported")
                  .ok());
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.state_reason(), HasSubstr("head dim D = 16 is not supported"));
  EXPECT_THAT(job.state_reason(), HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(EventKinds(job), ElementsAre("submitted", "placed", "requeued", "placed", "failed"));
  EXPECT_THAT(job.events(2).message(), HasSubstr("gloo peer gone"));
}

// A rank its worker refused before starting it (no free slot) is not a failure of the job: far
// more refusals than max_attempts (3) leave the job to succeed on its next placement, and a
// coordinator restart does not count them either.
TEST_F(CoordinatorTest, RefusedRanksDoNotSpendAttempts) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("refused")).job_id();
  for (int i = 1; i <= 5; ++i) {
    std::optional<v1::WorkerCommand> next = worker->Next();
    ASSERT_TRUE(next.has_value()) << "placement " << i;
    EXPECT_EQ(next->assign().attempt(), i);
    ASSERT_TRUE(worker->Refuse(next->assign().task_id()).ok());
  }
  std::optional<v1::WorkerCommand> last = worker->Next();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->assign().attempt(), 6);
  ASSERT_TRUE(worker->Report(last->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  const std::vector<std::string> kinds = EventKinds(job);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "refused"), 5) << testing::PrintToString(kinds);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "failed"), 0);
  EXPECT_THAT(job.events(2).message(), HasSubstr("slot(s) busy"));
  EXPECT_THAT(job.events(2).message(), HasSubstr("not a failed attempt"));

  // After a restart the refusals still do not count: two real failures requeue, the third fails.
  const std::string id2 = Submit(ValidRequest("refused-2")).job_id();
  for (int i = 0; i < 4; ++i) {
    std::optional<v1::WorkerCommand> next = worker->Next();
    ASSERT_TRUE(next.has_value());
    ASSERT_TRUE(worker->Refuse(next->assign().task_id()).ok());
  }
  Restart();
  worker = AddWorker("cpu-0");
  for (int failures = 1; failures <= 3; ++failures) {
    std::optional<v1::WorkerCommand> next = worker->Next();
    ASSERT_TRUE(next.has_value()) << "failure " << failures;
    ASSERT_TRUE(
        worker->Fail(next->assign().task_id(), absl::StatusCode::kUnavailable, "peer gone").ok());
    if (failures < 3) {
      EXPECT_NE(Get(id2).state(), v1::JOB_STATE_FAILED) << failures;
    }
  }
  EXPECT_EQ(Get(id2).state(), v1::JOB_STATE_FAILED);
}

// A worker that refuses every rank cannot keep a job cycling for ever.
TEST_F(CoordinatorTest, EndlessRefusalsFailTheJob) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("refused-forever")).job_id();
  for (int i = 0; i <= kMaxRefusals; ++i) {
    std::optional<v1::WorkerCommand> next = worker->Next();
    ASSERT_TRUE(next.has_value()) << "placement " << i;
    ASSERT_TRUE(worker->Refuse(next->assign().task_id()).ok());
  }
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.state_reason(), HasSubstr(absl::StrCat("refused ", kMaxRefusals + 1, " times")));
}

TEST_F(CoordinatorTest, OutOfMemoryFailsWithThePlannerEstimate) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("oom")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  ASSERT_TRUE(
      worker
          ->Fail(assign->assign().task_id(), absl::StatusCode::kResourceExhausted, "out of memory")
          .ok());
  v1::Job job = Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.state_reason(), HasSubstr("planner estimate"));
  EXPECT_THAT(job.state_reason(), HasSubstr("measured free"));
}

// A job whose ranks heartbeat but finish no step past its stall limit is stopped and requeued,
// not left RUNNING for ever; steps keep the clock from running out.
TEST_F(CoordinatorTest, AStalledJobIsRecoveredAndProgressKeepsItRunning) {
  FakeWorker* worker = AddWorker("stuck-0");
  v1::SubmitJobRequest request = ValidRequest("stalled");
  request.mutable_spec()->mutable_attention()->set_iterations(1000);
  request.mutable_spec()->mutable_recovery()->set_stall_seconds(1);
  const std::string id = Submit(request).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const std::string task = assign->assign().task_id();
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());
  // Steps every 300 ms for 2 s: running throughout.
  for (int step = 1; step <= 7; ++step) {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_PROGRESS, step).ok());
    ASSERT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING) << "step " << step;
  }
  // Then none: within a second or two the job is stopped (CancelTask) and requeued as attempt 2.
  std::optional<v1::WorkerCommand> cancel = worker->Next(absl::Seconds(5));
  ASSERT_TRUE(cancel.has_value());
  EXPECT_TRUE(cancel->has_cancel()) << cancel->DebugString();
  // The stopped rank's end frees the slot for the next attempt.
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_CANCELLED).ok());
  std::optional<v1::WorkerCommand> again = worker->Next(absl::Seconds(5));
  while (again.has_value() && again->has_cancel()) again = worker->Next(absl::Seconds(5));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->assign().attempt(), 2) << again->DebugString();
  const v1::Job job = Get(id, true);
  EXPECT_THAT(EventKinds(job), testing::Contains("stalled"));
  bool said = false;
  for (const v1::JobEvent& e : job.events()) {
    said |=
        e.kind() == "stalled" && absl::StrContains(e.message(), "stalled: no step finished for ") &&
        absl::StrContains(e.message(),
                          "7 of 1000 done; the stall limit is 1.0 s, spec.recovery.stall_seconds");
  }
  EXPECT_TRUE(said) << job.DebugString();
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recoveries_total{kind=\"stalled\",outcome=\"requeued\"} 1"));

  // The limit is checked: negative or over a week is refused, naming the field.
  request.set_idempotency_key("stall-bad");
  request.mutable_spec()->mutable_recovery()->set_stall_seconds(-1);
  absl::StatusOr<v1::SubmitJobResponse> bad = coordinator_->SubmitJob(request);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("spec.recovery.stall_seconds"));
}

// A worker that stops hands its running rank back: the job is requeued without spending an
// attempt, however often it happens (max_attempts is 3 here).
TEST_F(CoordinatorTest, RanksHandedBackByAStoppingWorkerSpendNoAttempt) {
  FakeWorker* worker = AddWorker("leaving-0");
  const std::string id = Submit(ValidRequest("handed-back")).job_id();
  for (int round = 1; round <= 5; ++round) {
    std::optional<v1::WorkerCommand> assign = worker->Next();
    while (assign.has_value() && !assign->has_assign()) assign = worker->Next();
    ASSERT_TRUE(assign.has_value()) << "round " << round;
    ASSERT_EQ(assign->assign().attempt(), round);
    const std::string task = assign->assign().task_id();
    ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());
    worker->Drop(task);
    v1::TaskReport report;
    report.set_worker_id(worker->id());
    report.set_task_id(task);
    report.set_state(v1::TASK_STATE_CANCELLED);
    report.set_handed_back(true);
    ASSERT_TRUE(coordinator_->ReportTask(report).ok());
  }
  const v1::Job job = Get(id, true);
  EXPECT_NE(job.state(), v1::JOB_STATE_FAILED) << job.state_reason();
  EXPECT_GE(job.attempt(), 5);
  EXPECT_THAT(EventsText(job),
              HasSubstr("handed its rank back unfinished: its worker is stopping"));
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recoveries_total{kind=\"worker_stopping\",outcome=\"requeued\"} 5"));
  // Rounds 2 .. 5 ran again after a hand-back: four times to recover observed.
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recovery_seconds_count{kind=\"worker_stopping\"} 4"));
}

TEST_F(CoordinatorTest, ReregisteringWorkerRecoversItsTasks) {
  FakeWorker* old_worker = AddWorker("pod-7");
  const std::string id = Submit(ValidRequest("re")).job_id();
  std::optional<v1::WorkerCommand> assign = old_worker->Next();
  ASSERT_TRUE(assign.has_value());
  // The same name registers again (the process restarted): the old registration's job is requeued
  // and placed on the new one as attempt 2.
  FakeWorker* new_worker = AddWorker("pod-7");
  EXPECT_NE(new_worker->id(), old_worker->id());
  std::optional<v1::WorkerCommand> again = new_worker->Next();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->assign().attempt(), 2);
  v1::Job job = Get(id, true);
  EXPECT_THAT(EventKinds(job),
              ElementsAre("submitted", "placed", "worker_lost", "requeued", "placed"));
  EXPECT_THAT(job.events(2).message(), HasSubstr("registered again"));
  absl::StatusOr<v1::ReportTaskResponse> stale =
      old_worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED);
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->stop());
  EXPECT_THAT(
      metrics_->Serialize(),
      HasSubstr("dattn_recoveries_total{kind=\"worker_reregistered\",outcome=\"requeued\"} 1"));
}

TEST_F(CoordinatorTest, DrainedWorkerGetsNoNewWorkAndItsStreamEnds) {
  FakeWorker* worker = AddWorker("drain-me");
  const std::string a = Submit(ValidRequest("a")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  v1::DrainWorkerRequest drain;
  drain.set_worker_id("drain-me");  // By name.
  absl::StatusOr<v1::Worker> drained = coordinator_->DrainWorker(drain);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->state(), v1::WORKER_STATE_DRAINING);
  EXPECT_THAT(drained->task_ids(), ElementsAre(assign->assign().task_id()));
  EXPECT_TRUE(coordinator_->DrainWorker(drain).ok());  // Idempotent.
  EXPECT_TRUE(worker->Heartbeat().drain());
  const std::string b = Submit(ValidRequest("b")).job_id();  // Accepted: workers may come.
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  ASSERT_TRUE(WaitFor([&] { return worker->stream_ended(); }));
  EXPECT_TRUE(worker->stream_status().ok()) << worker->stream_status();
  EXPECT_EQ(Get(b).state(), v1::JOB_STATE_QUEUED);
  drain.set_worker_id("nobody");
  EXPECT_EQ(coordinator_->DrainWorker(drain).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<v1::ListWorkersResponse> list =
      coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->workers_size(), 1);
  EXPECT_EQ(list->workers(0).name(), "drain-me");
  EXPECT_EQ(list->workers(0).capabilities().max_ranks(), 1);
  EXPECT_TRUE(list->workers(0).has_last_heartbeat());
}

// A worker leaving (SIGTERM with --drain-wait-s) drains itself through its heartbeat: the answer
// says drain, nothing new is placed on it, and its running rank finishes.
TEST_F(CoordinatorTest, ALeavingWorkerDrainsItselfByHeartbeat) {
  FakeWorker* worker = AddWorker("leaving");
  const std::string a = Submit(ValidRequest("a")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value() && assign->has_assign());
  v1::HeartbeatRequest leaving;
  leaving.set_worker_id(worker->id());
  leaving.set_free_memory_bytes(int64_t{1} << 30);
  leaving.add_tasks()->set_task_id(assign->assign().task_id());
  leaving.set_draining(true);
  absl::StatusOr<v1::HeartbeatResponse> answer = coordinator_->Heartbeat(leaving);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->drain());
  absl::StatusOr<v1::ListWorkersResponse> list =
      coordinator_->ListWorkers(v1::ListWorkersRequest());
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->workers_size(), 1);
  EXPECT_EQ(list->workers(0).state(), v1::WORKER_STATE_DRAINING);
  const std::string b = Submit(ValidRequest("b")).job_id();
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  ASSERT_TRUE(WaitState(a, v1::JOB_STATE_SUCCEEDED));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Get(b).state(), v1::JOB_STATE_QUEUED) << "nothing new on a leaving worker";
}

TEST_F(CoordinatorTest, AWorkerWhoseStreamBrokeGetsNoNewRanks) {
  FakeWorker* worker = AddWorker("flaky");
  worker->StopStream();  // The worker's connection goes away; it still heartbeats.
  const std::string id = Submit(ValidRequest("wait")).job_id();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_QUEUED);
  worker->StartStream();  // Back: the job goes to it.
  std::optional<v1::WorkerCommand> command = worker->Next();
  ASSERT_TRUE(command.has_value() && command->has_assign());
  EXPECT_EQ(command->assign().job_id(), id);
}

TEST_F(CoordinatorTest, UncheckedJobsAreCheckedOnceTheReadyWorkersSettle) {
  options_.feasibility_settle = absl::Seconds(30);
  UseFakeClock();
  // Queued while no worker exists: a ring too large for the cluster to come, a job that fits, and
  // an fp32 DEVICE_PREFERENCE_ANY job (queued for GPUs first, as none were there to say).
  const std::string too_big = Submit(RingRequest("big", 4)).job_id();
  const std::string fits = Submit(ValidRequest("fits")).job_id();
  v1::SubmitJobRequest any = ValidRequest("any");
  any.mutable_spec()->mutable_attention()->set_device(v1::DEVICE_PREFERENCE_ANY);
  const std::string any_id = Submit(any).job_id();
  FakeWorker* worker = AddWorker("only", int64_t{1} << 30, /*max_ranks=*/2);
  // Not checked before the ready set has been still for the settle time on the clock.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Get(too_big).state(), v1::JOB_STATE_QUEUED);
  AdvanceLive(absl::Seconds(31));
  ASSERT_TRUE(WaitState(too_big, v1::JOB_STATE_FAILED));
  v1::Job job = Get(too_big, true);
  EXPECT_THAT(job.state_reason(), HasSubstr("can never run on the ready workers"));
  EXPECT_THAT(job.state_reason(), HasSubstr("at most 2 ranks can ever fit"));
  EXPECT_THAT(job.state_reason(), HasSubstr("memory plan per rank: inputs"));
  EXPECT_THAT(EventKinds(job), ElementsAre("submitted", "failed"));
  // The others run on it, the ANY job on the CPU.
  std::set<std::string> placed;
  for (int i = 0; i < 2; ++i) {
    std::optional<v1::WorkerCommand> command = worker->Next();
    ASSERT_TRUE(command.has_value() && command->has_assign());
    placed.insert(command->assign().job_id());
  }
  EXPECT_EQ(placed, (std::set<std::string>{fits, any_id}));
}

TEST_F(CoordinatorTest, ACheckedJobWaitsWhenWorkersGoAway) {
  options_.feasibility_settle = absl::Seconds(5);
  UseFakeClock();
  std::vector<FakeWorker*> workers = {AddWorker("a"), AddWorker("b")};
  const std::string first = Submit(ValidRequest("first")).job_id();
  ASSERT_TRUE(WaitState(first, v1::JOB_STATE_PLACED));
  FakeWorker* idle =
      Holder(workers, Get(first).worker_ids(0)) == workers[0] ? workers[1] : workers[0];
  // Fits the two workers, so it is accepted; one is busy, so it waits.
  const std::string ring = Submit(RingRequest("ring", 2)).job_id();
  idle->StopHeartbeats();  // Dead after dead_after: one worker left, too few for the ring.
  AdvanceLive(options_.dead_after + absl::Milliseconds(1));
  ASSERT_TRUE(WaitFor([&] {
    return metrics_->Serialize().find("dattn_workers{state=\"dead\"} 1") != std::string::npos;
  }));
  AdvanceLive(absl::Seconds(10));           // Well past the settle time.
  absl::SleepFor(absl::Milliseconds(100));  // Scheduling passes run.
  v1::Job job = Get(ring, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.state_reason();
  EXPECT_THAT(EventKinds(job), ElementsAre("submitted"));
}

// An undrained worker is READY again, hears drain = false, and gets the work queued meanwhile.
TEST_F(CoordinatorTest, UndrainedWorkerTakesWorkAgain) {
  FakeWorker* worker = AddWorker("undrain-me");
  v1::DrainWorkerRequest drain;
  drain.set_worker_id("undrain-me");
  ASSERT_TRUE(coordinator_->DrainWorker(drain).ok());
  const std::string queued = Submit(ValidRequest("while-drained")).job_id();
  ASSERT_TRUE(WaitFor([&] { return worker->stream_ended(); }));  // Drained and idle.
  EXPECT_EQ(Get(queued).state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("dattn_workers{state=\"draining\"} 1"));

  v1::UndrainWorkerRequest undrain;
  undrain.set_worker_id(worker->id());  // By id.
  absl::StatusOr<v1::Worker> undrained = coordinator_->UndrainWorker(undrain);
  ASSERT_TRUE(undrained.ok()) << undrained.status();
  EXPECT_EQ(undrained->state(), v1::WORKER_STATE_READY);
  undrain.set_worker_id("undrain-me");  // By name; idempotent.
  undrained = coordinator_->UndrainWorker(undrain);
  ASSERT_TRUE(undrained.ok()) << undrained.status();
  EXPECT_EQ(undrained->state(), v1::WORKER_STATE_READY);
  EXPECT_FALSE(worker->Heartbeat().drain());
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("dattn_workers{state=\"draining\"} 0"));

  // The worker reopens its stream, as a real one does, and gets the queued job.
  worker->StopStream();
  worker->StartStream();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  EXPECT_EQ(assign->assign().job_id(), queued);
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(queued).state(), v1::JOB_STATE_SUCCEEDED);

  undrain.set_worker_id("nobody");
  absl::StatusOr<v1::Worker> missing = coordinator_->UndrainWorker(undrain);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("\"nobody\""));
  undrain.clear_worker_id();
  EXPECT_EQ(coordinator_->UndrainWorker(undrain).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A dead worker cannot be undrained.
  worker->StopHeartbeats();
  undrain.set_worker_id("undrain-me");
  ASSERT_TRUE(WaitFor([&] {
    return coordinator_->UndrainWorker(undrain).status().code() ==
           absl::StatusCode::kFailedPrecondition;
  }));
  EXPECT_THAT(coordinator_->UndrainWorker(undrain).status().message(), HasSubstr("is dead"));
}

}  // namespace
}  // namespace server
}  // namespace dattn
