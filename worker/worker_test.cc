// Worker tests against an in-process fake WorkerRegistry on a unix socket (so that a test can stop
// the "coordinator" and start a new one at the same address).
#include "worker/worker.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "engine/comm/tcp_store.h"
#include "engine/memory_plan.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "worker/attention_task.h"
#include "worker/cpu_device.h"
#include "worker/fake_registry.h"
#include "worker/host_info.h"
#include "worker/test_plans.h"

namespace dattn {
namespace worker {
namespace {

WorkerOptions TestOptions(const std::string& address) {
  WorkerOptions options;
  options.coordinator_address = address;
  options.name = "test-worker";
  options.address = "127.0.0.1:1234";
  options.max_ranks = 1;
  options.threads_per_task = 1;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.rpc_timeout = absl::Seconds(2);
  options.backoff_initial = absl::Milliseconds(20);
  options.backoff_max = absl::Milliseconds(200);
  options.progress_interval = absl::Milliseconds(50);
  options.shutdown_report_deadline = absl::Seconds(2);
  return options;
}

// A small task: a few milliseconds per step on one thread.
v1::WorkerCommand Assign(const std::string& task_id, int iterations, int64_t seq_len = 64) {
  v1::WorkerCommand command;
  v1::TaskAssignment* task = command.mutable_assign();
  task->set_task_id(task_id);
  task->set_job_id("j-0000000000000001");
  task->set_attempt(1);
  task->set_rank(0);
  v1::AttentionJobSpec* job = task->mutable_spec()->mutable_attention();
  job->mutable_attention()->add_segment_lengths(32);
  job->mutable_attention()->add_segment_lengths(64);
  job->mutable_attention()->add_dilation_rates(1);
  job->mutable_attention()->add_dilation_rates(2);
  job->mutable_shape()->set_batch(1);
  job->mutable_shape()->set_seq_len(seq_len);
  job->mutable_shape()->set_num_heads(2);
  job->mutable_shape()->set_head_dim(16);
  job->set_dtype(v1::DTYPE_FP32);
  job->set_num_ranks(1);
  job->set_pass(v1::PASS_FORWARD);
  job->set_iterations(iterations);
  job->set_seed(7);
  *command.mutable_assign() = Planned(command.assign());
  return command;
}

// A task of tens of milliseconds per step (about 0.5 GFLOP), a million steps: it runs until
// stopped.
v1::WorkerCommand LongAssign(const std::string& task_id) {
  v1::WorkerCommand command = Assign(task_id, 1000000, 2048);
  v1::AttentionJobSpec* job = command.mutable_assign()->mutable_spec()->mutable_attention();
  job->mutable_attention()->clear_segment_lengths();
  job->mutable_attention()->clear_dilation_rates();
  job->mutable_attention()->add_segment_lengths(512);
  job->mutable_attention()->add_dilation_rates(1);
  job->mutable_shape()->set_num_heads(4);
  job->mutable_shape()->set_head_dim(32);
  *command.mutable_assign() = Planned(command.assign());
  return command;
}

v1::WorkerCommand Cancel(const std::string& task_id) {
  v1::WorkerCommand command;
  command.mutable_cancel()->set_task_id(task_id);
  command.mutable_cancel()->set_reason("test cancels it");
  return command;
}

// A communicator whose Abort waits at the device's abort gate before aborting (a slow
// ncclCommAbort); everything else goes to the wrapped one.
class GatedAbortComm;

// The host device with a memory of `capacity` bytes of which "free" is what its live allocations
// leave, and two gates: one that holds every tensor allocation, and one that holds every Abort of
// its communicators.
class GatedDevice final : public ForwardingDevice {
 public:
  explicit GatedDevice(int64_t capacity) : ForwardingDevice(HostDevice()), capacity_(capacity) {}

  void HoldAllocations(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_allocations_ = hold;
  }
  void HoldAborts(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_aborts_ = hold;
  }
  // Waits up to 10 s for `pred` (called with mu(), that is mu_, held).
  bool WaitFor(const std::function<bool()>& pred) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&pred, &std::function<bool()>::operator()),
                                absl::Seconds(10));
  }
  // What Health() answers from now on (a GPU's sticky error, or OK).
  void SetHealth(absl::Status health) {
    absl::MutexLock lock(&mu_);
    health_ = std::move(health);
  }
  absl::Mutex* mu() const ABSL_LOCK_RETURNED(mu_) { return &mu_; }
  int allocations_started() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return allocations_; }
  int aborts_started() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborts_; }

  // Called by GatedAbortComm::Abort before it aborts.
  void AbortGate() {
    absl::MutexLock lock(&mu_);
    ++aborts_;
    mu_.Await(absl::Condition(
        +[](bool* hold) { return !*hold; }, &hold_aborts_));
  }

  int device_index() const override { return 0; }
  int64_t total_memory_bytes() const override { return capacity_; }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override {
    absl::MutexLock lock(&mu_);
    return capacity_ - allocated_;
  }
  absl::Status Health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  bool host_memory() const override { return true; }
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes, const std::string& what) override {
    {
      absl::MutexLock lock(&mu_);
      ++allocations_;
      mu_.Await(absl::Condition(
          +[](bool* hold) { return !*hold; }, &hold_allocations_));
    }
    absl::StatusOr<DeviceBuffer> buffer = base().Allocate(bytes, what);
    if (!buffer.ok()) return buffer.status();
    std::function<void(void*)> free_host = buffer->get_deleter();
    absl::MutexLock lock(&mu_);
    allocated_ += bytes;
    return DeviceBuffer(buffer->release(), [this, free_host, bytes](void* p) {
      free_host(p);
      absl::MutexLock lock(&mu_);
      allocated_ -= bytes;
    });
  }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> NewCommunicator(
      const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
      const std::string& prefix, absl::Duration timeout) override;

 private:
  static std::shared_ptr<TaskDevice> HostDevice() {
    absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
    EXPECT_TRUE(host.ok()) << host.status();
    return host.ok() ? std::shared_ptr<TaskDevice>(*std::move(host)) : nullptr;
  }

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  int64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_allocations_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_aborts_ ABSL_GUARDED_BY(mu_) = false;
  int allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
};

class GatedAbortComm final : public comm::Communicator {
 public:
  GatedAbortComm(GatedDevice* device, std::unique_ptr<comm::Communicator> inner)
      : device_(device), inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  const char* name() const override { return inner_->name(); }
  absl::Duration timeout() const override { return inner_->timeout(); }
  absl::StatusOr<std::unique_ptr<comm::Work>> StartGroup(absl::Span<const comm::P2POp> ops,
                                                         comm::Stream after) override {
    return inner_->StartGroup(ops, after);
  }
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype,
                         comm::Stream stream) override {
    return inner_->AllGather(send, recv, count, dtype, stream);
  }
  absl::Status AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                         comm::ReduceOp op, comm::Stream stream) override {
    return inner_->AllReduce(send, recv, count, dtype, op, stream);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status Synchronize(comm::Stream stream) override { return inner_->Synchronize(stream); }
  void Abort(const std::string& reason) override {
    device_->AbortGate();
    inner_->Abort(reason);
  }
  absl::Status health() const override { return inner_->health(); }
  absl::StatusOr<std::unique_ptr<comm::Communicator>> Shrink(
      absl::Span<const int> exclude) override {
    return inner_->Shrink(exclude);
  }
  comm::CommStats stats() const override { return inner_->stats(); }

 private:
  GatedDevice* const device_;
  std::unique_ptr<comm::Communicator> inner_;
};

absl::StatusOr<std::unique_ptr<comm::Communicator>> GatedDevice::NewCommunicator(
    const std::string& backend, std::shared_ptr<comm::Store> store, int rank, int size,
    const std::string& prefix, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<comm::Communicator>> inner =
      base().NewCommunicator(backend, std::move(store), rank, size, prefix, timeout);
  if (!inner.ok()) return inner.status();
  return std::make_unique<GatedAbortComm>(this, *std::move(inner));
}

TEST(WorkerTest, RegistersWithItsCapabilitiesAndHeartbeats) {
  const std::string address = "unix:" + TestSocketPath("register");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  WorkerOptions options = TestOptions(address);
  options.max_ranks = 2;
  options.memory_bytes = int64_t{3} << 30;
  std::vector<bool> readiness;
  absl::Mutex readiness_mu;
  options.on_ready_change = [&](bool ready) {
    absl::MutexLock lock(&readiness_mu);
    readiness.push_back(ready);
  };
  Worker worker(options);
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.heartbeats_.size() >= 3;
  })) << "no heartbeats within 10 s";
  EXPECT_TRUE(worker.registered());
  EXPECT_EQ(worker.worker_id(), "w-1-1");
  {
    absl::MutexLock lock(&fake.mu_);
    ASSERT_EQ(fake.registrations_.size(), 1u);
    const v1::RegisterWorkerRequest& r = fake.registrations_[0];
    EXPECT_EQ(r.name(), "test-worker");
    EXPECT_EQ(r.address(), "127.0.0.1:1234");
    EXPECT_EQ(r.version(), kWorkerVersion);
    const v1::WorkerCapabilities& caps = r.capabilities();
    EXPECT_FALSE(caps.is_gpu());
    EXPECT_EQ(caps.device_name(), ReadCpuModel());
    EXPECT_FALSE(caps.device_name().empty());
    EXPECT_EQ(caps.device_index(), 0);
    EXPECT_EQ(caps.total_memory_bytes(), int64_t{3} << 30);
    EXPECT_EQ(std::vector<int>(caps.dtypes().begin(), caps.dtypes().end()),
              (std::vector<int>{v1::DTYPE_FP32, v1::DTYPE_FP64}));
    EXPECT_EQ(caps.max_ranks(), 2);
    EXPECT_EQ(caps.num_threads(), 1);
    // The host's ranks form Gloo rings.
    EXPECT_EQ(std::vector<std::string>(caps.ring_backends().begin(), caps.ring_backends().end()),
              std::vector<std::string>{"gloo"});
    for (const v1::HeartbeatRequest& h : fake.heartbeats_) {
      EXPECT_EQ(h.worker_id(), "w-1-1");
      EXPECT_EQ(h.free_memory_bytes(), int64_t{3} << 30);  // Override, nothing reserved.
      EXPECT_EQ(h.tasks_size(), 0);
    }
  }
  worker.Stop();
  absl::MutexLock lock(&readiness_mu);
  EXPECT_EQ(readiness, (std::vector<bool>{true, false}));
}

TEST(WorkerTest, AdvertisesMemTotalWithoutAnOverride) {
  const std::string address = "unix:" + TestSocketPath("memtotal");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return !fake.heartbeats_.empty(); }));
  absl::MutexLock lock(&fake.mu_);
  EXPECT_EQ(fake.registrations_[0].capabilities().total_memory_bytes(),
            *ReadMeminfoBytes("MemTotal"));
  EXPECT_GT(fake.heartbeats_[0].free_memory_bytes(), 0);
  EXPECT_LE(fake.heartbeats_[0].free_memory_bytes(), *ReadMeminfoBytes("MemTotal"));
}

TEST(WorkerTest, AssignmentRunsToASucceededReportWithItsResult) {
  const std::string address = "unix:" + TestSocketPath("succeed");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));

  v1::WorkerCommand command = Assign("j-1/1/0", 20);
  command.mutable_assign()->mutable_spec()->mutable_attention()->set_return_output(true);
  *command.mutable_assign() = Planned(command.assign());
  fake.Push(command);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-1/1/0"); }));
  std::vector<v1::TaskReport> reports = fake.ReportsOf("j-1/1/0");
  ASSERT_GE(reports.size(), 2u);
  EXPECT_EQ(reports.front().state(), v1::TASK_STATE_STARTED);
  EXPECT_EQ(reports.front().progress().steps_total(), 20);
  const v1::TaskReport& last = reports.back();
  ASSERT_EQ(last.state(), v1::TASK_STATE_SUCCEEDED) << last.error();
  EXPECT_EQ(last.worker_id(), "w-1-1");
  EXPECT_EQ(last.progress().steps_done(), 20);
  EXPECT_GT(last.time().seconds(), 0);
  for (const v1::TaskReport& r : reports) {
    EXPECT_TRUE(r.state() == v1::TASK_STATE_STARTED || r.state() == v1::TASK_STATE_PROGRESS ||
                &r == &reports.back())
        << "a report after the final one";
  }

  // The result is what the task runner computes for the same assignment.
  absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
  ASSERT_TRUE(host.ok()) << host.status();
  AttentionTaskOptions run;
  absl::StatusOr<AttentionTaskResult> want = RunAttentionTask(command.assign(), host->get(), run);
  ASSERT_TRUE(want.ok()) << want.status();
  const v1::RankResult& got = last.rank_result();
  EXPECT_EQ(got.worker_id(), "w-1-1");
  EXPECT_EQ(got.rank(), 0);
  EXPECT_DOUBLE_EQ(got.out_sum(), want->rank_result.out_sum());
  EXPECT_DOUBLE_EQ(got.out_sum_squares(), want->rank_result.out_sum_squares());
  EXPECT_GT(got.out_sum_squares(), 0.0);
  EXPECT_GT(got.seconds_per_step(), 0.0);
  EXPECT_GT(got.tflops(), 0.0);
  // The output went up before the report, in chunks, and the report does not carry it.
  EXPECT_FALSE(last.has_output());
  {
    absl::MutexLock lock(&fake.mu_);
    ASSERT_EQ(fake.uploads_.count("j-1/1/0"), 1u);
    const FakeRegistry::Upload& upload = fake.uploads_["j-1/1/0"];
    EXPECT_EQ(upload.data, want->output.data());
    EXPECT_EQ(upload.header.dtype(), v1::DTYPE_FP32);
    EXPECT_EQ(upload.header.total_bytes(), static_cast<int64_t>(want->output.data().size()));
  }

  // Finished and acknowledged: no longer listed in heartbeats. A heartbeat built while the final
  // report's answer was still on its way may list it; the first one built after it does not, and
  // none after that does.
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return !fake.heartbeats_.empty() && fake.heartbeats_.back().tasks_size() == 0;
  })) << "heartbeats still list the finished, reported task";
  const size_t seen = [&]() {
    absl::MutexLock lock(&fake.mu_);
    return fake.heartbeats_.size();
  }();
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.heartbeats_.size() >= seen + 2;
  }));
  absl::MutexLock lock(&fake.mu_);
  for (size_t i = seen - 1; i < fake.heartbeats_.size(); ++i) {
    EXPECT_EQ(fake.heartbeats_[i].tasks_size(), 0) << "heartbeat " << i;
  }
  EXPECT_EQ(worker.running_tasks(), 0);
}

TEST(WorkerTest, CancelMidRunEndsWithACancelledReport) {
  const std::string address = "unix:" + TestSocketPath("cancel");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  fake.Push(LongAssign("j-2/1/0"));
  // Running: a PROGRESS report, and a heartbeat that lists the task with steps done.
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-2/1/0", v1::TASK_STATE_PROGRESS);
  }));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return !fake.heartbeats_.empty() && fake.heartbeats_.back().tasks_size() == 1 &&
           fake.heartbeats_.back().tasks(0).task_id() == "j-2/1/0" &&
           fake.heartbeats_.back().tasks(0).steps_done() > 0 &&
           fake.heartbeats_.back().tasks(0).phase() == v1::RANK_PHASE_RUNNING;
  }));
  EXPECT_EQ(worker.running_tasks(), 1);
  fake.Push(Cancel("j-2/1/0"));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-2/1/0"); }));
  std::vector<v1::TaskReport> reports = fake.ReportsOf("j-2/1/0");
  EXPECT_EQ(reports.back().state(), v1::TASK_STATE_CANCELLED);
  EXPECT_FALSE(reports.back().handed_back()) << "the coordinator cancelled it";
  EXPECT_GT(reports.back().progress().steps_done(), 0);
  EXPECT_LT(reports.back().progress().steps_done(), 1000000);
  // PROGRESS is rate-limited to one per progress_interval (50 ms here).
  int progress = 0;
  for (const v1::TaskReport& r : reports) progress += r.state() == v1::TASK_STATE_PROGRESS;
  const double seconds =
      static_cast<double>(reports.back().time().seconds() - reports.front().time().seconds()) + 1;
  EXPECT_LE(progress, seconds / 0.05 + 2);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return worker.running_tasks() == 0; }));
}

TEST(WorkerTest, SlotsAreLimitedAndStopFromReportTaskEndsATaskSilently) {
  const std::string address = "unix:" + TestSocketPath("slots");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  Worker worker(TestOptions(address));  // max_ranks = 1
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  fake.Push(LongAssign("j-3/1/0"));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-3/1/0", v1::TASK_STATE_STARTED);
  }));
  fake.Push(Assign("j-4/1/0", 1));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-4/1/0"); }));
  std::vector<v1::TaskReport> refused = fake.ReportsOf("j-4/1/0");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].state(), v1::TASK_STATE_FAILED);
  EXPECT_EQ(refused[0].error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_NE(refused[0].error().find("slot"), std::string::npos) << refused[0].error();
  EXPECT_TRUE(refused[0].refused());

  // The coordinator answers the next PROGRESS with stop: the task ends and reports nothing more.
  fake.StopTaskOnReport("j-3/1/0");
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return worker.running_tasks() == 0; }));
  absl::SleepFor(absl::Milliseconds(300));
  for (const v1::TaskReport& r : fake.ReportsOf("j-3/1/0")) {
    EXPECT_LT(r.state(), v1::TASK_STATE_SUCCEEDED) << "a final report after stop";
  }
}

// A coordinator frees a rank's slot when its final report arrives and may place the next rank on
// the same worker at once: the slot must already be free then. Each final report here is answered
// by the next assignment of a chain on a one-slot worker, before the report's RPC returns; every
// task must run (none refused as busy) and the worker must count no running task at that moment.
TEST(WorkerTest, SlotIsFreeWhenTheFinalReportArrives) {
  const std::string address = "unix:" + TestSocketPath("slotfree");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  Worker worker(TestOptions(address));  // max_ranks = 1
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));

  constexpr int kTasks = 40;
  absl::Mutex mu;
  int next = 1;
  std::vector<int> running_at_report;
  fake.SetOnFinalReport([&](const v1::TaskReport& report) {
    absl::MutexLock lock(&mu);
    running_at_report.push_back(worker.running_tasks());
    if (report.state() == v1::TASK_STATE_SUCCEEDED && next < kTasks) {
      fake.Push(Assign(absl::StrCat("j-chain/1/", next++), 1, 32));
    }
  });
  fake.Push(Assign("j-chain/1/0", 1, 32));
  {
    absl::MutexLock lock(&mu);
    auto all_reported = [&]() { return running_at_report.size() >= static_cast<size_t>(kTasks); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_reported), absl::Seconds(60)));
  }
  for (int i = 0; i < kTasks; ++i) {
    const std::vector<v1::TaskReport> reports = fake.ReportsOf(absl::StrCat("j-chain/1/", i));
    ASSERT_FALSE(reports.empty()) << "task " << i;
    EXPECT_EQ(reports.back().state(), v1::TASK_STATE_SUCCEEDED)
        << "task " << i << ": " << reports.back().error();
    EXPECT_FALSE(reports.back().refused()) << "task " << i;
  }
  fake.SetOnFinalReport(nullptr);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(running_at_report.size(), static_cast<size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) {
    EXPECT_EQ(running_at_report[i], 0) << "task " << i << " still held its slot";
  }
}

// A drain is the coordinator's: it places nothing on a draining worker, so what still arrives was
// placed before the drain (or after an undrain not yet heard of) and runs. Readiness follows the
// drain.
TEST(WorkerTest, DrainedWorkerRunsWhatItIsStillSent) {
  const std::string address = "unix:" + TestSocketPath("drain");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  fake.SetDrain(true);
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.streams_opened_ >= 1 && worker.draining();
  }));
  fake.Push(Assign("j-5/1/0", 1));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-5/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-5/1/0").back().state(), v1::TASK_STATE_SUCCEEDED);

  fake.SetDrain(false);
  ASSERT_TRUE(
      fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return !worker.draining(); }));
  fake.Push(Assign("j-6/1/0", 1));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-6/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-6/1/0").back().state(), v1::TASK_STATE_SUCCEEDED);
}

// The coordinator ends a drained, idle worker's assignment stream, and the worker retries it with
// backoff. An undrain, heard in a heartbeat, reopens it at once rather than after the backoff
// (20 s here), so the worker takes work again within a heartbeat or two.
TEST(WorkerTest, UndrainReopensAClosedStreamWithoutWaitingOutTheBackoff) {
  const std::string address = "unix:" + TestSocketPath("undrain");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  WorkerOptions options = TestOptions(address);
  options.backoff_initial = absl::Seconds(20);
  options.backoff_max = absl::Seconds(20);
  Worker worker(options);
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  fake.SetCloseStreamsWhileDrained(true);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  fake.SetDrain(true);
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.streams_ended_ >= 1 && worker.draining();
  }));
  const absl::Time undrained = absl::Now();
  fake.SetDrain(false);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 2; },
      absl::Seconds(5)))
      << "the stream was not reopened within 5 s of the undrain";
  EXPECT_LT(absl::Now() - undrained, absl::Seconds(5));
  fake.Push(Assign("j-7/1/0", 1));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-7/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-7/1/0").back().state(), v1::TASK_STATE_SUCCEEDED);
}

// Heartbeat intervals and retry backoffs are read from the worker's clock: on a FakeClock the
// worker heartbeats only when the clock passes the interval, and reopens a stream the coordinator
// closed only when the clock passes the backoff, however long the real wait.
TEST(WorkerTest, HeartbeatsAndBackoffsFollowTheClock) {
  const std::string address = "unix:" + TestSocketPath("clock");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeClock clock;
  WorkerOptions options = TestOptions(address);  // Heartbeats every 100 ms (of the clock).
  options.clock = &clock;
  options.backoff_initial = absl::Minutes(1);
  options.backoff_max = absl::Minutes(1);
  Worker worker(options);
  ASSERT_TRUE(worker.Start().ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  auto heartbeats = [&]() {
    absl::MutexLock lock(&fake.mu_);
    return fake.heartbeats_.size();
  };
  auto streams_opened = [&]() {
    absl::MutexLock lock(&fake.mu_);
    return fake.streams_opened_;
  };
  // Before each Advance the test waits until the thread it means to wake waits for a deadline of
  // the clock as it stands (AwaitDeadlineAfter): a thread slow to get there (a loaded CI machine)
  // would otherwise count its interval from the advanced time and not wake.
  ASSERT_TRUE(clock.AwaitDeadlineAfter(clock.Now())) << "the session never waited for a heartbeat";
  const size_t before = heartbeats();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(heartbeats(), before) << "a heartbeat before the clock moved";
  clock.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.heartbeats_.size() >= before + 1;
  }));
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(heartbeats(), before + 1);
  ASSERT_TRUE(clock.AwaitDeadlineAfter(clock.Now())) << "no wait for the next heartbeat";

  // Drained and idle, the stream is closed; the worker waits its backoff (a minute +-20%) to reopen
  // it.
  fake.SetCloseStreamsWhileDrained(true);
  fake.SetDrain(true);
  clock.Advance(absl::Milliseconds(100));  // The heartbeat that says so.
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.streams_ended_ >= 1 && worker.draining();
  }));
  // The stream thread waits out its backoff (at least 48 s; a heartbeat waits 100 ms).
  ASSERT_TRUE(clock.AwaitDeadlineAfter(clock.Now() + absl::Seconds(30)))
      << "the stream thread never waited for its backoff";
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(streams_opened(), 1);
  clock.Advance(absl::Seconds(47));  // Less than any backoff drawn.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(streams_opened(), 1);
  clock.Advance(absl::Seconds(26));  // More than any.
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.streams_opened_ >= 2;
  })) << "the stream was not reopened once the backoff had passed on the clock";
}

TEST(WorkerTest, KeepsRetryingUntilTheCoordinatorStarts) {
  const std::string address = "unix:" + TestSocketPath("late");
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  absl::SleepFor(absl::Milliseconds(800));  // Several failed attempts (backoff 20 .. 200 ms).
  EXPECT_FALSE(worker.registered());
  EXPECT_EQ(worker.registrations(), 0);

  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.streams_opened_ >= 1;
  })) << "worker did not register and open its stream after the coordinator came up";
  EXPECT_TRUE(worker.registered());
  fake.Push(Assign("j-7/1/0", 2));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-7/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-7/1/0").back().state(), v1::TASK_STATE_SUCCEEDED);
}

TEST(WorkerTest, SurvivesACoordinatorRestartAndDeliversTheFinalReport) {
  const std::string address = "unix:" + TestSocketPath("restart");
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  v1::WorkerCommand command = LongAssign("j-8/1/0");
  command.mutable_assign()->mutable_spec()->mutable_attention()->set_iterations(30);
  *command.mutable_assign() = Planned(command.assign());
  {
    FakeCoordinator first(address, 1);
    FakeRegistry& fake = first.registry();
    ASSERT_TRUE(fake.WaitFor(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
    fake.Push(command);
    ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
      return fake.HasStateLocked("j-8/1/0", v1::TASK_STATE_STARTED);
    }));
  }  // The coordinator goes away mid-task.
  ::unlink(address.substr(5).c_str());
  ASSERT_TRUE([&]() {
    for (int i = 0; i < 1000 && worker.running_tasks() > 0; ++i)
      absl::SleepFor(absl::Milliseconds(20));
    return worker.running_tasks() == 0;
  }()) << "the task did not finish while the coordinator was down";
  absl::SleepFor(absl::Milliseconds(300));  // Reports fail and are retried meanwhile.

  // The restarted coordinator does not know "w-1-1": the heartbeat asks the worker to register
  // again, and the held final report goes out under the new registration.
  FakeCoordinator second(address, 2);
  FakeRegistry& fake = second.registry();
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasFinalLocked("j-8/1/0");
  })) << "final report lost across the coordinator restart";
  std::vector<v1::TaskReport> reports = fake.ReportsOf("j-8/1/0");
  EXPECT_EQ(reports.back().state(), v1::TASK_STATE_SUCCEEDED);
  EXPECT_EQ(reports.back().worker_id(), "w-2-1");
  EXPECT_EQ(reports.back().progress().steps_done(), 30);
  EXPECT_EQ(worker.registrations(), 2);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
}

TEST(WorkerTest, StopCancelsRunningTasksAndReportsThem) {
  const std::string address = "unix:" + TestSocketPath("stop");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  Worker worker(TestOptions(address));
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  fake.Push(LongAssign("j-9/1/0"));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-9/1/0", v1::TASK_STATE_STARTED);
  }));
  const absl::Time begin = absl::Now();
  worker.Stop();
  EXPECT_LT(absl::Now() - begin, absl::Seconds(5));
  absl::MutexLock lock(&fake.mu_);
  std::vector<v1::TaskReport> reports = fake.ReportsOfLocked("j-9/1/0");
  EXPECT_EQ(reports.back().state(), v1::TASK_STATE_CANCELLED);
  // Stopped by its own worker, not by the coordinator: the rank is handed back.
  EXPECT_TRUE(reports.back().handed_back());
}

// Leave(): heartbeats ask for a drain at once, readiness is off, and the call waits for the running
// task, then returns false at its deadline (Stop cancels the task); an idle worker leaves as soon
// as the coordinator has answered with the drain.
TEST(WorkerTest, LeavingAsksForADrainAndWaitsForRunningTasks) {
  const std::string address = "unix:" + TestSocketPath("leave");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  WorkerOptions options = TestOptions(address);
  options.heartbeat_interval = absl::Seconds(30);  // Only Leave's own heartbeat comes in time.
  Worker worker(options);
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));
  fake.Push(LongAssign("j-8/1/0"));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-8/1/0", v1::TASK_STATE_STARTED);
  }));
  const absl::Time begin = absl::Now();
  EXPECT_FALSE(worker.Leave(absl::Milliseconds(600))) << "the long task is still running";
  EXPECT_GE(absl::Now() - begin, absl::Milliseconds(600));
  EXPECT_LT(absl::Now() - begin, absl::Seconds(10));
  EXPECT_FALSE(worker.load().ready);
  // The leaving heartbeat went out at once (the interval is 30 s) and its answer drains the worker.
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return !fake.heartbeats_.empty() && fake.heartbeats_.back().draining();
  }));
  EXPECT_TRUE(fake.WaitFor([&]() { return worker.draining(); }))
      << "the coordinator answered the leaving heartbeat with a drain";
  worker.Stop();
  EXPECT_EQ(fake.ReportsOf("j-8/1/0").back().state(), v1::TASK_STATE_CANCELLED);

  // Idle: Leave returns true within a heartbeat round trip, not a heartbeat interval.
  const std::string address2 = "unix:" + TestSocketPath("leave-idle");
  FakeCoordinator coordinator2(address2);
  ASSERT_TRUE(coordinator2.ok());
  WorkerOptions idle_options = options;  // Heartbeats every 30 s: Leave sends its own at once.
  idle_options.coordinator_address = address2;
  Worker idle(idle_options);
  ASSERT_TRUE(idle.Start().ok());
  ASSERT_TRUE(coordinator2.registry().WaitFor([&]() { return idle.registered(); }));
  const absl::Time idle_begin = absl::Now();
  EXPECT_TRUE(idle.Leave(absl::Seconds(20)));
  EXPECT_LT(absl::Now() - idle_begin, absl::Seconds(5));
  idle.Stop();

  // No coordinator to confirm the drain (never registered): an idle worker does not wait for it.
  WorkerOptions alone = options;
  alone.coordinator_address = "unix:" + TestSocketPath("leave-alone");
  Worker lonely(alone);
  ASSERT_TRUE(lonely.Start().ok());
  const absl::Time lonely_begin = absl::Now();
  EXPECT_TRUE(lonely.Leave(absl::Seconds(20)));
  EXPECT_LT(absl::Now() - lonely_begin, absl::Seconds(5));
  lonely.Stop();
}

// Two slots, a device whose free memory fits one plan and not two. The first task is admitted and
// held before it allocates anything (the device still shows all its memory free); the second must
// not count the same free bytes: it is refused at once, naming its plan and the bytes left for it.
TEST(WorkerTest, TwoTasksNeverCountTheSameFreeMemory) {
  const std::string address = "unix:" + TestSocketPath("memory");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  const v1::WorkerCommand first = Assign("j-10/1/0", 2);
  auto plan_device = std::make_shared<GatedDevice>(0);
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(first.assign(), plan_device->caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t planned = plan->memory_bytes;
  const int64_t capacity = planned + planned / 2;
  auto device = std::make_shared<GatedDevice>(capacity);
  device->HoldAllocations(true);
  WorkerOptions options = TestOptions(address);
  options.max_ranks = 2;
  options.device = device;
  Worker worker(options);
  // Opens the gate before the worker's destructor waits for its tasks, whatever happens above.
  auto open = absl::MakeCleanup([&] { device->HoldAllocations(false); });
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));

  fake.Push(first);
  ASSERT_TRUE(device->WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(device->mu()) {
    return device->allocations_started() >= 1;
  })) << "the first task never started allocating";
  fake.Push(Assign("j-11/1/0", 2));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasFinalLocked("j-11/1/0");
  })) << "the second task was admitted on memory the first has planned";
  const v1::TaskReport refused = fake.ReportsOf("j-11/1/0").back();
  EXPECT_EQ(refused.state(), v1::TASK_STATE_FAILED);
  EXPECT_EQ(refused.error_code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(refused.error().find(plan->memory_plan), std::string::npos) << refused.error();
  EXPECT_NE(refused.error().find(absl::StrCat("only ", FormatBytes(capacity - planned), " of")),
            std::string::npos)
      << refused.error();

  device->HoldAllocations(false);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-10/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-10/1/0").back().state(), v1::TASK_STATE_SUCCEEDED)
      << fake.ReportsOf("j-10/1/0").back().error();
  // The first task's claim ends with it: the same plan fits again.
  fake.Push(Assign("j-12/1/0", 2));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-12/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-12/1/0").back().state(), v1::TASK_STATE_SUCCEEDED)
      << fake.ReportsOf("j-12/1/0").back().error();
}

// A device that fails its health check (a GPU's sticky CUDA error) is reported in every heartbeat,
// makes the worker not ready, and an assignment sent meanwhile is refused (no attempt spent);
// once the device works again the worker is ready and runs work.
TEST(WorkerTest, AFailedDeviceIsReportedAndItsAssignmentsRefused) {
  const std::string address = "unix:" + TestSocketPath("device");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  auto device = std::make_shared<GatedDevice>(int64_t{1} << 30);
  std::atomic<bool> ready{false};
  WorkerOptions options = TestOptions(address);
  options.device = device;
  options.on_ready_change = [&](bool r) { ready = r; };
  Worker worker(options);
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.streams_opened_ >= 1 && ready;
  }));

  device->SetHealth(absl::InternalError("an illegal memory access was encountered"));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return !fake.heartbeats_.empty() && fake.heartbeats_.back().device_error().find(
                                            "illegal memory access") != std::string::npos;
  })) << "no heartbeat reported the failed device";
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return !ready; }));
  fake.Push(Assign("j-30/1/0", 1));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-30/1/0"); }));
  const v1::TaskReport refused = fake.ReportsOf("j-30/1/0").back();
  EXPECT_EQ(refused.state(), v1::TASK_STATE_FAILED);
  EXPECT_TRUE(refused.refused());
  EXPECT_NE(refused.error().find("device failed"), std::string::npos) << refused.error();

  device->SetHealth(absl::OkStatus());
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return !fake.heartbeats_.empty() && fake.heartbeats_.back().device_error().empty();
  }));
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return ready.load(); }));
  fake.Push(Assign("j-31/1/0", 1));
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-31/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-31/1/0").back().state(), v1::TASK_STATE_SUCCEEDED);
}

// A rank of a two-rank ring is cancelled while both run on this worker, and its communicator's
// abort hangs (as ncclCommAbort may for seconds): the worker keeps heartbeating meanwhile, and the
// cancel completes once the abort returns.
TEST(WorkerTest, HeartbeatsGoOnWhileACancelledRingRankAborts) {
  const std::string address = "unix:" + TestSocketPath("abort");
  FakeCoordinator coordinator(address);
  ASSERT_TRUE(coordinator.ok());
  FakeRegistry& fake = coordinator.registry();
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> store = comm::TcpStoreServer::Start();
  ASSERT_TRUE(store.ok()) << store.status();
  auto device = std::make_shared<GatedDevice>(int64_t{1} << 30);
  WorkerOptions options = TestOptions(address);
  options.max_ranks = 2;
  options.device = device;
  Worker worker(options);
  auto open = absl::MakeCleanup([&] { device->HoldAborts(false); });
  ASSERT_TRUE(worker.Start().ok());
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.streams_opened_ >= 1; }));

  for (int rank = 0; rank < 2; ++rank) {
    v1::WorkerCommand command = Assign(absl::StrCat("j-20/1/", rank), 1000000);
    v1::TaskAssignment* task = command.mutable_assign();
    task->set_job_id("j-20");
    task->set_rank(rank);
    task->mutable_spec()->mutable_attention()->set_num_ranks(2);
    v1::RingInfo* ring = task->mutable_ring();
    ring->set_ring_id("j-20/1");
    ring->set_rank(rank);
    ring->set_size(2);
    ring->set_backend("gloo");
    ring->set_store_address((*store)->address());
    ring->set_formation_timeout_ms(10000);
    ring->set_comm_timeout_ms(5000);
    *task = Planned(*task);
    fake.Push(command);
  }
  ASSERT_TRUE(fake.WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) {
    return fake.HasStateLocked("j-20/1/0", v1::TASK_STATE_STARTED) &&
           fake.HasStateLocked("j-20/1/1", v1::TASK_STATE_STARTED);
  })) << "the ring did not start";

  device->HoldAborts(true);
  fake.Push(Cancel("j-20/1/0"));
  ASSERT_TRUE(device->WaitFor([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(device->mu()) {
    return device->aborts_started() >= 1;
  })) << "the cancel did not abort the rank's communicator";
  const size_t seen = [&]() {
    absl::MutexLock lock(&fake.mu_);
    return fake.heartbeats_.size();
  }();
  EXPECT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.heartbeats_.size() >= seen + 3; },
      absl::Seconds(3)))
      << "heartbeats stalled while a communicator was aborting";

  device->HoldAborts(false);
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-20/1/0"); }));
  EXPECT_EQ(fake.ReportsOf("j-20/1/0").back().state(), v1::TASK_STATE_CANCELLED)
      << fake.ReportsOf("j-20/1/0").back().error();
  // Its peer loses the ring and fails.
  ASSERT_TRUE(fake.WaitFor(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.HasFinalLocked("j-20/1/1"); }));
  EXPECT_EQ(fake.ReportsOf("j-20/1/1").back().state(), v1::TASK_STATE_FAILED);
}

TEST(WorkerTest, RejectsBadOptions) {
  WorkerOptions options = TestOptions("unix:/nonexistent");
  options.max_ranks = 0;
  EXPECT_EQ(Worker(options).Start().code(), absl::StatusCode::kInvalidArgument);
  options = TestOptions("");
  EXPECT_EQ(Worker(options).Start().code(), absl::StatusCode::kInvalidArgument);
  options = TestOptions("unix:/nonexistent");
  options.name.clear();
  EXPECT_EQ(Worker(options).Start().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
