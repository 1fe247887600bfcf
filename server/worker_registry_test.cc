// The worker registry alone: registration checks, tasks and reservations, the scheduler's view,
// heartbeats, streams and death.
#include "server/worker_registry.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

v1::RegisterWorkerRequest Registration(const std::string& name, int64_t memory, int slots) {
  v1::RegisterWorkerRequest r;
  r.set_name(name);
  r.mutable_capabilities()->set_total_memory_bytes(memory);
  r.mutable_capabilities()->set_max_ranks(slots);
  r.mutable_capabilities()->add_dtypes(v1::DTYPE_FP32);
  r.mutable_capabilities()->add_ring_backends("gloo");
  return r;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  TaskEntry* Place(const std::string& task_id, const std::string& worker, int64_t bytes) {
    TaskEntry task;
    task.task_id = task_id;
    task.job_id = "j-1";
    task.worker_id = worker;
    task.memory_bytes = bytes;
    return registry_.AddTask(task);
  }
  Metrics metrics_;
  WorkerRegistry registry_{&metrics_};
  const absl::Time t0_ = absl::FromUnixSeconds(1000);
};

TEST_F(WorkerRegistryTest, RegistrationsAreChecked) {
  v1::RegisterWorkerRequest r = Registration("w", 1000, 1);
  EXPECT_TRUE(WorkerRegistry::ValidateRegistration(r).ok());
  r.mutable_capabilities()->set_max_ranks(0);
  EXPECT_THAT(std::string(WorkerRegistry::ValidateRegistration(r).message()),
              HasSubstr("capabilities.max_ranks: must be >= 1, got 0"));
  r = Registration("w", 1000, 1);
  r.mutable_capabilities()->add_head_dims(0);
  EXPECT_THAT(std::string(WorkerRegistry::ValidateRegistration(r).message()),
              HasSubstr("capabilities.head_dims[0]: must be >= 1, got 0"));
  r = Registration(std::string(300, 'n'), 1000, 1);
  EXPECT_THAT(std::string(WorkerRegistry::ValidateRegistration(r).message()),
              HasSubstr("name: must be at most 256 characters"));
}

// A rank can count on the smaller of what the heartbeat said is free and what reservations leave.
TEST_F(WorkerRegistryTest, TheViewCountsReservationsAndLeavesOutRefusers) {
  WorkerEntry* w = registry_.Add(Registration("a", 1000, 2), "w-a", t0_);
  Place("t-1", "w-a", 300);
  std::vector<scheduler::WorkerInfo> view = registry_.View(true);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(view[0].free_memory_bytes, 700);
  EXPECT_EQ(view[0].running_ranks, 1);
  v1::HeartbeatRequest beat;
  beat.set_free_memory_bytes(500);
  registry_.Heartbeat(w, beat, t0_, absl::Seconds(1));
  EXPECT_EQ(registry_.View(true)[0].free_memory_bytes, 500);
  w->refused_since_heartbeat = true;
  EXPECT_TRUE(registry_.View(true).empty());
  EXPECT_EQ(registry_.View(false).size(), 1u);
  registry_.Heartbeat(w, beat, t0_, absl::Seconds(1));
  EXPECT_EQ(registry_.View(true).size(), 1u);
  registry_.EraseTask("t-1", false, "");
  EXPECT_EQ(registry_.View(true)[0].running_ranks, 0);
}

// A task the coordinator cancelled keeps its slot until the worker says it ended (a heartbeat that
// no longer lists it, or its final report): a cancelled training rank takes a step and a
// checkpoint to stop, and a rank placed there meanwhile would only be refused. A CancelTask says
// whether to stop at once.
TEST_F(WorkerRegistryTest, ACancelledTaskHoldsItsSlotUntilTheWorkerSaysItEnded) {
  WorkerEntry* w = registry_.Add(Registration("a", 1000, 1), "w-a", t0_);
  registry_.Dispatch(Place("t-1", "w-a", 300), v1::WorkerCommand(), t0_);
  registry_.Dispatch(Place("t-2", "w-a", 300), v1::WorkerCommand(), t0_);
  w->outbox.clear();
  registry_.EraseTask("t-1", /*cancel=*/true, "the job was cancelled");
  registry_.EraseTask("t-2", /*cancel=*/true, "its ring failed", /*abort=*/true);
  ASSERT_EQ(w->outbox.size(), 2u);
  EXPECT_FALSE(w->outbox[0].cancel().abort());
  EXPECT_TRUE(w->outbox[1].cancel().abort());
  EXPECT_EQ(registry_.View(true)[0].running_ranks, 1);  // Both stopping; one slot.
  v1::HeartbeatRequest beat;
  beat.add_tasks()->set_task_id("t-1");
  registry_.Heartbeat(w, beat, t0_, absl::Seconds(1));
  EXPECT_EQ(w->stopping.size(), 1u);
  EXPECT_EQ(registry_.View(true)[0].running_ranks, 1);
  registry_.StoppedTask(w, "t-1");
  EXPECT_EQ(registry_.View(true)[0].running_ranks, 0);
  // A heartbeat that lists a task the coordinator does not know (a restart forgot it) holds a slot
  // too, until a heartbeat no longer lists it.
  v1::HeartbeatRequest old;
  old.add_tasks()->set_task_id("t-from-before");
  registry_.Heartbeat(w, old, t0_, absl::Seconds(1));
  EXPECT_EQ(registry_.View(true)[0].running_ranks, 1);
  registry_.Heartbeat(w, v1::HeartbeatRequest(), t0_, absl::Seconds(1));
  EXPECT_EQ(registry_.View(true)[0].running_ranks, 0);
}

// A worker whose heartbeat says its device failed takes no ranks and counts for nothing the
// cluster could run (it leaves the ready set and both views), is listed with the error and counted
// as device_failed, until a heartbeat without the error.
TEST_F(WorkerRegistryTest, AWorkerWhoseDeviceFailedTakesNoRanksUntilItWorks) {
  WorkerEntry* w = registry_.Add(Registration("gpu", 1000, 1), "w-g", t0_);
  registry_.OpenStream(w);
  ASSERT_EQ(registry_.ReadyCount(), 1);
  v1::HeartbeatRequest beat;
  beat.set_free_memory_bytes(1000);
  beat.set_device_error("INTERNAL: an illegal memory access was encountered");
  registry_.Heartbeat(w, beat, t0_, absl::Seconds(1));
  EXPECT_FALSE(WorkerRegistry::TakesWork(*w));
  EXPECT_EQ(registry_.ReadyCount(), 0);
  EXPECT_EQ(registry_.ReadySet(), "");
  EXPECT_TRUE(registry_.View(true).empty());
  EXPECT_TRUE(registry_.View(false).empty());
  v1::ListWorkersResponse list = registry_.List(false);
  ASSERT_EQ(list.workers_size(), 1);
  EXPECT_THAT(list.workers(0).device_error(), HasSubstr("illegal memory access"));
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("dattn_workers{state=\"device_failed\"} 1"));
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("dattn_workers{state=\"ready\"} 0"));
  // A long message is kept bounded.
  beat.set_device_error(std::string(5000, 'e'));
  registry_.Heartbeat(w, beat, t0_, absl::Seconds(1));
  EXPECT_EQ(registry_.List(false).workers(0).device_error().size(), 1024u);

  beat.clear_device_error();
  registry_.Heartbeat(w, beat, t0_, absl::Seconds(1));
  EXPECT_TRUE(WorkerRegistry::TakesWork(*w));
  EXPECT_EQ(registry_.View(true).size(), 1u);
  EXPECT_EQ(registry_.List(false).workers(0).device_error(), "");
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("dattn_workers{state=\"device_failed\"} 0"));
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("dattn_workers{state=\"ready\"} 1"));
}

TEST_F(WorkerRegistryTest, HeartbeatsCancelUnknownTasksAndResendLostAssignments) {
  WorkerEntry* w = registry_.Add(Registration("a", 1000, 2), "w-a", t0_);
  registry_.OpenStream(w);
  TaskEntry* task = Place("t-1", "w-a", 10);
  v1::WorkerCommand assign;
  assign.mutable_assign()->set_task_id("t-1");
  registry_.Dispatch(task, assign, t0_);
  StreamStep step = registry_.NextStep(w, 1, false);
  ASSERT_EQ(step.kind, StreamStep::Kind::kSend);  // Written to a stream that then broke.
  v1::HeartbeatRequest beat;
  beat.add_tasks()->set_task_id("t-stale");
  // Too early to resend; the stale task gets a cancel.
  EXPECT_TRUE(registry_.Heartbeat(w, beat, t0_ + absl::Seconds(1), absl::Seconds(1)).empty());
  step = registry_.NextStep(w, 1, false);
  ASSERT_EQ(step.kind, StreamStep::Kind::kSend);
  EXPECT_EQ(step.command.cancel().task_id(), "t-stale");
  // Two intervals later, neither started nor listed: send it again.
  std::vector<TaskEntry*> resend =
      registry_.Heartbeat(w, v1::HeartbeatRequest(), t0_ + absl::Seconds(3), absl::Seconds(1));
  ASSERT_EQ(resend.size(), 1u);
  EXPECT_EQ(resend[0]->task_id, "t-1");
}

TEST_F(WorkerRegistryTest, StreamsEndForTheRightReasons) {
  WorkerEntry* w = registry_.Add(Registration("a", 1000, 1), "w-a", t0_);
  const uint64_t first = registry_.OpenStream(w);
  EXPECT_EQ(registry_.NextStep(w, first, false).kind, StreamStep::Kind::kWait);
  const uint64_t second = registry_.OpenStream(w);
  EXPECT_EQ(registry_.NextStep(w, first, false).end.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(registry_.NextStep(w, second, true).end.code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(registry_.SetDraining(w, true).ok());
  EXPECT_TRUE(registry_.NextStep(w, second, false).end.ok());  // Drained and idle.
  ASSERT_TRUE(registry_.SetDraining(w, false).ok());
  EXPECT_EQ(registry_.NextStep(w, second, false).kind, StreamStep::Kind::kWait);
  Place("t-1", "w-a", 10);
  EXPECT_EQ(registry_.MarkDead(w, t0_), std::vector<std::string>({"t-1"}));
  EXPECT_EQ(registry_.NextStep(w, second, false).end.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.SetDraining(w, true).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerRegistryTest, SilentWorkersAreFoundAndDeadOnesForgotten) {
  WorkerEntry* w = registry_.Add(Registration("a", 1000, 1), "w-a", t0_);
  registry_.Add(Registration("b", 1000, 1), "w-b", t0_ + absl::Seconds(5));
  std::vector<WorkerEntry*> silent = registry_.Silent(t0_ + absl::Seconds(11), absl::Seconds(10));
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0], w);
  registry_.MarkDead(w, t0_ + absl::Seconds(11));
  EXPECT_EQ(registry_.FindByIdOrName("a"), w);
  EXPECT_EQ(registry_.ReadySet(), "w-b");
  registry_.ForgetDead(t0_ + absl::Seconds(12), absl::Minutes(1));
  EXPECT_NE(registry_.Find("w-a"), nullptr);
  registry_.ForgetDead(t0_ + absl::Minutes(2), absl::Minutes(1));
  EXPECT_EQ(registry_.Find("w-a"), nullptr);
}

}  // namespace
}  // namespace server
}  // namespace dattn
