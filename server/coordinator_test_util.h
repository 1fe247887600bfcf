// What the coordinator's tests share: a fixture that opens a coordinator on a fresh data dir (on
// the real clock, or on a FakeClock the test advances), and FakeWorker, which plays a worker
// through the same calls the WorkerRegistry service makes.
#ifndef DATTN_SERVER_COORDINATOR_TEST_UTIL_H_
#define DATTN_SERVER_COORDINATOR_TEST_UTIL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace dattn {
namespace server {
namespace ctest {

// Polls `done` (every 5 ms of real time) until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(5));

// A fresh data dir under TEST_TMPDIR.
std::string NewDataDir();

// A small valid single-rank CPU job with idempotency key `key`.
v1::SubmitJobRequest ValidRequest(const std::string& key);

// Plays a worker through the core API, as the WorkerRegistry handlers would.
class FakeWorker {
 public:
  // gpu: registers as a GPU worker (bf16, fp16, fp32; NCCL rings) instead of a CPU one.
  FakeWorker(Coordinator* coordinator, std::string name, int64_t memory = int64_t{1} << 30,
             int max_ranks = 1, bool joins_rings = true, bool gpu = false)
      : coordinator_(coordinator), name_(std::move(name)) {
    v1::RegisterWorkerRequest request;
    request.set_name(name_);
    request.set_address("127.0.0.1:0");
    request.set_version("test");
    v1::WorkerCapabilities* caps = request.mutable_capabilities();
    caps->set_is_gpu(gpu);
    caps->set_device_name(gpu ? "NVIDIA H200" : "cpu");
    caps->set_total_memory_bytes(memory);
    if (gpu) {
      caps->add_dtypes(v1::DTYPE_BF16);
      caps->add_dtypes(v1::DTYPE_FP16);
      caps->add_dtypes(v1::DTYPE_FP32);
    } else {
      caps->add_dtypes(v1::DTYPE_FP32);
      caps->add_dtypes(v1::DTYPE_FP64);
    }
    caps->set_max_ranks(max_ranks);
    caps->set_num_threads(2);
    if (joins_rings) caps->add_ring_backends(gpu ? "nccl" : "gloo");
    absl::StatusOr<v1::RegisterWorkerResponse> response = coordinator_->RegisterWorker(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (response.ok()) id_ = response->worker_id();
    // Heartbeats every 25 ms, far inside the tests' dead_after, until StopHeartbeats().
    heartbeat_ = std::thread([this] {
      while (beating_) {
        v1::HeartbeatRequest request;
        request.set_worker_id(id_);
        request.set_free_memory_bytes(free_memory_);
        {
          // Like a real worker: every task received and not yet finished is listed.
          absl::MutexLock lock(&mu_);
          for (const std::string& task : held_) request.add_tasks()->set_task_id(task);
        }
        coordinator_->Heartbeat(request).IgnoreError();
        absl::SleepFor(absl::Milliseconds(25));
      }
    });
  }
  ~FakeWorker() {
    StopHeartbeats();
    StopStream();
  }

  // The worker falls silent (as if killed): the coordinator declares it dead after dead_after.
  void StopHeartbeats() {
    beating_ = false;
    if (heartbeat_.joinable()) heartbeat_.join();
  }
  bool beating() const { return beating_; }
  // One heartbeat now, listing the tasks held, as the heartbeat thread sends them.
  v1::HeartbeatResponse HeartbeatHeld() {
    std::vector<std::string> held;
    {
      absl::MutexLock lock(&mu_);
      held.assign(held_.begin(), held_.end());
    }
    return Heartbeat(held);
  }

  const std::string& id() const { return id_; }

  void StartStream() {
    stop_ = false;
    stream_ = std::thread([this] {
      v1::StreamAssignmentsRequest request;
      request.set_worker_id(id_);
      absl::Status s = coordinator_->StreamAssignments(
          request,
          [this](const v1::WorkerCommand& command) {
            absl::MutexLock lock(&mu_);
            commands_.push_back(command);
            if (command.has_assign()) held_.insert(command.assign().task_id());
            return true;
          },
          [this] { return stop_.load(); });
      absl::MutexLock lock(&mu_);
      stream_status_ = s;
      stream_ended_ = true;
    });
  }
  void StopStream() {
    stop_ = true;
    if (stream_.joinable()) stream_.join();
  }
  bool stream_ended() {
    absl::MutexLock lock(&mu_);
    return stream_ended_;
  }
  absl::Status stream_status() {
    absl::MutexLock lock(&mu_);
    return stream_status_;
  }

  // The next command the coordinator sent, waiting up to 5 s.
  std::optional<v1::WorkerCommand> Next(absl::Duration timeout = absl::Seconds(5)) {
    std::optional<v1::WorkerCommand> out;
    WaitFor(
        [&] {
          absl::MutexLock lock(&mu_);
          if (commands_.empty()) return false;
          out = commands_.front();
          commands_.pop_front();
          return true;
        },
        timeout);
    return out;
  }

  // The free memory the heartbeats report from now on (1 GiB until set).
  void SetFreeMemory(int64_t bytes) { free_memory_ = bytes; }

  v1::HeartbeatResponse Heartbeat(std::vector<std::string> running = {}) {
    v1::HeartbeatRequest request;
    request.set_worker_id(id_);
    request.set_free_memory_bytes(free_memory_);
    for (const std::string& task : running) request.add_tasks()->set_task_id(task);
    absl::StatusOr<v1::HeartbeatResponse> response = coordinator_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::HeartbeatResponse();
  }

  absl::StatusOr<v1::ReportTaskResponse> Report(const std::string& task_id, v1::TaskState state,
                                                int64_t steps = 0) {
    if (state == v1::TASK_STATE_SUCCEEDED || state == v1::TASK_STATE_CANCELLED) Drop(task_id);
    v1::TaskReport report;
    report.set_worker_id(id_);
    report.set_task_id(task_id);
    report.set_state(state);
    if (state == v1::TASK_STATE_PROGRESS) report.mutable_progress()->set_steps_done(steps);
    if (state == v1::TASK_STATE_SUCCEEDED) {
      v1::RankResult* r = report.mutable_rank_result();
      r->set_seconds_total(0.4);
      r->set_seconds_per_step(0.1);
      r->set_out_sum(1.5);
      r->set_out_sum_squares(7.25);
      r->set_peak_memory_bytes(4096);
    }
    return coordinator_->ReportTask(report);
  }

  absl::StatusOr<v1::ReportTaskResponse> Fail(const std::string& task_id, absl::StatusCode code,
                                              const std::string& error) {
    Drop(task_id);
    v1::TaskReport report;
    report.set_worker_id(id_);
    report.set_task_id(task_id);
    report.set_state(v1::TASK_STATE_FAILED);
    report.set_error(error);
    report.set_error_code(static_cast<int>(code));
    return coordinator_->ReportTask(report);
  }

  // Refuses a task before starting it (no free slot), as a real worker's RefuseTask does.
  absl::StatusOr<v1::ReportTaskResponse> Refuse(const std::string& task_id) {
    Drop(task_id);
    v1::TaskReport report;
    report.set_worker_id(id_);
    report.set_task_id(task_id);
    report.set_state(v1::TASK_STATE_FAILED);
    report.set_error(absl::StrCat("worker ", name_, " has all 1 slot(s) busy"));
    report.set_error_code(static_cast<int>(absl::StatusCode::kUnavailable));
    report.set_refused(true);
    return coordinator_->ReportTask(report);
  }

  // Uploads `data` as the output shard of `task_id` with `header`, in chunks of `chunk` bytes.
  absl::StatusOr<v1::UploadOutputResponse> Upload(const std::string& task_id,
                                                  const v1::TensorHeader& header,
                                                  const std::string& data,
                                                  int64_t chunk = int64_t{1} << 20) {
    std::vector<v1::UploadOutputRequest> messages;
    v1::UploadOutputRequest first;
    first.set_worker_id(id_);
    first.set_task_id(task_id);
    *first.mutable_chunk()->mutable_header() = header;
    messages.push_back(first);
    for (int64_t offset = 0; offset < static_cast<int64_t>(data.size()); offset += chunk) {
      v1::UploadOutputRequest m;
      m.mutable_chunk()->set_offset(offset);
      m.mutable_chunk()->set_data(data.substr(offset, chunk));
      messages.push_back(std::move(m));
    }
    size_t next = 1;
    return coordinator_->UploadOutput(messages[0], [&](v1::UploadOutputRequest* out) {
      if (next >= messages.size()) return false;
      *out = messages[next++];
      return true;
    });
  }

  // Forgets a task, as a worker does once its final report is taken.
  void Drop(const std::string& task_id) {
    absl::MutexLock lock(&mu_);
    held_.erase(task_id);
  }

 private:
  Coordinator* coordinator_;
  std::string name_;
  std::string id_;
  std::thread stream_;
  std::thread heartbeat_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> beating_{true};
  std::atomic<int64_t> free_memory_{int64_t{1} << 30};  // What heartbeats report free.
  absl::Mutex mu_;
  std::deque<v1::WorkerCommand> commands_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> held_ ABSL_GUARDED_BY(mu_);  // Tasks received and not yet finished.
  absl::Status stream_status_ ABSL_GUARDED_BY(mu_);
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.data_dir = NewDataDir();
    options_.dead_after = absl::Milliseconds(500);
    options_.heartbeat_interval = absl::Milliseconds(50);
    options_.max_attempts = 3;
    options_.progress_persist_interval = absl::ZeroDuration();
    options_.stream_poll_interval = absl::Milliseconds(20);
    Open();
  }
  void TearDown() override {
    workers_.clear();
    if (coordinator_ != nullptr) {
      EXPECT_TRUE(coordinator_->Close().ok());
    }
  }

  // Runs the coordinator on a FakeClock from now on (restarting it): timeouts then pass only when
  // the test advances clock_.
  void UseFakeClock() {
    options_.clock = &clock_;
    Restart();
  }

  // Moves the FakeClock forward by `d` in steps of at most dead_after / 2, each followed by a
  // heartbeat of every worker still beating: live workers stay alive whatever `d` is, silent ones
  // die once dead_after has passed.
  void AdvanceLive(absl::Duration d) {
    const absl::Duration step = options_.dead_after / 2;
    while (d > absl::ZeroDuration()) {
      const absl::Duration now = std::min(d, step);
      clock_.Advance(now);
      d -= now;
      for (const auto& worker : workers_) {
        if (worker->beating()) worker->HeartbeatHeld();
      }
    }
  }

  void Open() {
    metrics_ = std::make_unique<Metrics>();
    coordinator_ = std::make_unique<Coordinator>(options_, metrics_.get());
    ASSERT_TRUE(coordinator_->Start().ok());
  }
  // A new coordinator on the same data dir (the old one's workers are forgotten, as in a restart).
  void Restart() {
    workers_.clear();
    ASSERT_TRUE(coordinator_->Close().ok());
    coordinator_.reset();
    Open();
  }

  FakeWorker* AddWorker(const std::string& name, int64_t memory = int64_t{1} << 30,
                        int max_ranks = 1, bool stream = true, bool joins_rings = true,
                        bool gpu = false) {
    workers_.push_back(std::make_unique<FakeWorker>(coordinator_.get(), name, memory, max_ranks,
                                                    joins_rings, gpu));
    if (stream) workers_.back()->StartStream();
    return workers_.back().get();
  }

  v1::Job Submit(const v1::SubmitJobRequest& request) {
    absl::StatusOr<v1::SubmitJobResponse> response = coordinator_->SubmitJob(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->job() : v1::Job();
  }

  v1::Job Get(const std::string& job_id, bool events = false) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    request.set_include_events(events);
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  bool WaitState(const std::string& job_id, v1::JobState state) {
    return WaitFor([&] { return Get(job_id).state() == state; });
  }

  static std::vector<std::string> EventKinds(const v1::Job& job) {
    std::vector<std::string> kinds;
    for (const v1::JobEvent& e : job.events()) kinds.push_back(e.kind());
    return kinds;
  }
  // Every event of the job, one "kind: message" a line.
  static std::string EventsText(const v1::Job& job) {
    std::string text;
    for (const v1::JobEvent& e : job.events())
      absl::StrAppend(&text, e.kind(), ": ", e.message(), "\n");
    return text;
  }

  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason = "") {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    request.set_reason(reason);
    return coordinator_->CancelJob(request);
  }

  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

// ValidRequest's job on `ranks` ranks.
v1::SubmitJobRequest RingRequest(const std::string& key, int ranks);

// The trainer config of the recovery tests (the ladder, ring shrink), at `micro` micro-batches: a
// rank of it needs less memory with each doubling of the micro-batches.
std::string LadderTrainingConfig(int micro);

// A report of `task`'s rank with its ring formed after `formation_seconds`.
v1::TaskReport FormedReport(const FakeWorker& worker, const std::string& task, v1::TaskState state,
                            double formation_seconds);

// The ranks' assignments, by rank, from each worker's next command.
std::vector<v1::TaskAssignment> Assignments(const std::vector<FakeWorker*>& workers);

// The worker whose id is `id`, or nullptr.
FakeWorker* Holder(const std::vector<FakeWorker*>& workers, const std::string& id);

}  // namespace ctest
}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_COORDINATOR_TEST_UTIL_H_
