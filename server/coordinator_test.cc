#include "server/coordinator.h"

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
#include "engine/comm/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_state.h"
#include "server/metrics.h"
#include "worker/ring_join.h"

namespace dattn {
namespace server {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Polls `done` until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

std::string NewDataDir() {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/coordinator_test_", getpid(), "_",
                      counter++);
}

// A small valid single-rank CPU job.
v1::SubmitJobRequest ValidRequest(const std::string& key) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key(key);
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("test job");
  v1::AttentionJobSpec* a = spec->mutable_attention();
  a->mutable_attention()->add_segment_lengths(64);
  a->mutable_attention()->add_dilation_rates(1);
  a->mutable_shape()->set_batch(1);
  a->mutable_shape()->set_seq_len(256);
  a->mutable_shape()->set_num_heads(2);
  a->mutable_shape()->set_head_dim(16);
  a->set_dtype(v1::DTYPE_FP32);
  a->set_num_ranks(1);
  a->set_iterations(4);
  a->set_device(v1::DEVICE_PREFERENCE_CPU);
  return request;
}

// Plays a worker through the core API, as the WorkerRegistry handlers would.
class FakeWorker {
 public:
  FakeWorker(Coordinator* coordinator, std::string name, int64_t memory = int64_t{1} << 30,
             int max_ranks = 1, bool joins_rings = true)
      : coordinator_(coordinator), name_(std::move(name)) {
    v1::RegisterWorkerRequest request;
    request.set_name(name_);
    request.set_address("127.0.0.1:0");
    request.set_version("test");
    v1::WorkerCapabilities* caps = request.mutable_capabilities();
    caps->set_is_gpu(false);
    caps->set_device_name("cpu");
    caps->set_total_memory_bytes(memory);
    caps->add_dtypes(v1::DTYPE_FP32);
    caps->add_dtypes(v1::DTYPE_FP64);
    caps->set_max_ranks(max_ranks);
    caps->set_num_threads(2);
    if (joins_rings) caps->add_ring_backends("gloo");
    absl::StatusOr<v1::RegisterWorkerResponse> response = coordinator_->RegisterWorker(request);
    EXPECT_TRUE(response.ok()) << response.status();
    if (response.ok()) id_ = response->worker_id();
    // Heartbeats every 25 ms, far inside the tests' dead_after, until StopHeartbeats().
    heartbeat_ = std::thread([this] {
      while (beating_) {
        v1::HeartbeatRequest request;
        request.set_worker_id(id_);
        request.set_free_memory_bytes(int64_t{1} << 30);
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

  v1::HeartbeatResponse Heartbeat(std::vector<std::string> running = {}) {
    v1::HeartbeatRequest request;
    request.set_worker_id(id_);
    request.set_free_memory_bytes(int64_t{1} << 30);
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
                        int max_ranks = 1, bool stream = true, bool joins_rings = true) {
    workers_.push_back(
        std::make_unique<FakeWorker>(coordinator_.get(), name, memory, max_ranks, joins_rings));
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

  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason = "") {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    request.set_reason(reason);
    return coordinator_->CancelJob(request);
  }

  CoordinatorOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

// -------------------------------------------------------------------------------------------------
// Validation: every malformed request class gets the right code and a message naming field and
// value.

struct BadRequest {
  const char* name;
  std::function<void(v1::SubmitJobRequest*)> mutate;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

TEST_F(CoordinatorTest, ValidationTable) {
  using C = absl::StatusCode;
  auto attention = [](v1::SubmitJobRequest* r) { return r->mutable_spec()->mutable_attention(); };
  const std::vector<BadRequest> cases = {
      {"empty key",
       [](auto* r) { r->clear_idempotency_key(); },
       C::kInvalidArgument,
       {"idempotency_key:", "got 0"}},
      {"long key",
       [](auto* r) { r->set_idempotency_key(std::string(129, 'k')); },
       C::kInvalidArgument,
       {"idempotency_key:", "got 129"}},
      {"no spec", [](auto* r) { r->clear_spec(); }, C::kInvalidArgument, {"spec: required"}},
      {"long name",
       [](auto* r) { r->mutable_spec()->set_name(std::string(129, 'n')); },
       C::kInvalidArgument,
       {"spec.name:", "got 129"}},
      {"tenant charset",
       [](auto* r) { r->mutable_spec()->set_tenant("team a"); },
       C::kInvalidArgument,
       {"spec.tenant:", "\"team a\"", "[A-Za-z0-9._-]"}},
      {"long tenant",
       [](auto* r) { r->mutable_spec()->set_tenant(std::string(65, 't')); },
       C::kInvalidArgument,
       {"spec.tenant:", "got 65"}},
      {"priority high",
       [](auto* r) { r->mutable_spec()->set_priority(101); },
       C::kInvalidArgument,
       {"spec.priority:", "got 101"}},
      {"priority low",
       [](auto* r) { r->mutable_spec()->set_priority(-101); },
       C::kInvalidArgument,
       {"spec.priority:", "got -101"}},
      {"no work",
       [](auto* r) { r->mutable_spec()->clear_attention(); },
       C::kInvalidArgument,
       {"spec.attention: required"}},
      {"no attention spec",
       [&](auto* r) { attention(r)->clear_attention(); },
       C::kInvalidArgument,
       {"spec.attention.attention: required"}},
      {"empty segments",
       [&](auto* r) {
         attention(r)->mutable_attention()->clear_segment_lengths();
         attention(r)->mutable_attention()->clear_dilation_rates();
       },
       C::kInvalidArgument,
       {"spec.attention.attention.segment_lengths is empty"}},
      {"100000 patterns",
       [&](auto* r) {
         v1::AttentionSpec* a = attention(r)->mutable_attention();
         a->set_mode(v1::ATTENTION_MODE_MIXTURE);
         for (int i = 0; i < 99999; ++i) {
           a->add_segment_lengths(64);
           a->add_dilation_rates(1);
         }
       },
       C::kInvalidArgument,
       {"spec.attention.attention.segment_lengths: at most 64 patterns", "got 100000"}},
      {"unknown fields stuffed into the spec",
       [](auto* r) {
         r->mutable_spec()
             ->GetReflection()
             ->MutableUnknownFields(r->mutable_spec())
             ->AddLengthDelimited(999, std::string(100000, 'x'));
       },
       C::kInvalidArgument,
       {"spec: is 1000", "more than the 65536"}},
      {"length mismatch",
       [&](auto* r) { attention(r)->mutable_attention()->add_dilation_rates(2); },
       C::kInvalidArgument,
       {"spec.attention.attention.segment_lengths has 1", "(64)", "(1, 2)"}},
      {"zero segment",
       [&](auto* r) { attention(r)->mutable_attention()->set_segment_lengths(0, 0); },
       C::kInvalidArgument,
       {"spec.attention.attention.segment_lengths[0] = 0"}},
      {"zero rate",
       [&](auto* r) { attention(r)->mutable_attention()->set_dilation_rates(0, -2); },
       C::kInvalidArgument,
       {"spec.attention.attention.dilation_rates[0] = -2"}},
      {"negative scale",
       [&](auto* r) { attention(r)->mutable_attention()->set_scale(-0.5); },
       C::kInvalidArgument,
       {"spec.attention.attention.scale = -0.5"}},
      {"unknown mode",
       [&](auto* r) {
         attention(r)->mutable_attention()->set_mode(static_cast<v1::AttentionMode>(7));
       },
       C::kInvalidArgument,
       {"spec.attention.attention.mode: unknown value 7"}},
      {"blocked in grouped",
       [&](auto* r) {
         attention(r)->mutable_attention()->set_head_offsets(v1::HEAD_OFFSETS_BLOCKED);
       },
       C::kInvalidArgument,
       {"spec.attention.attention.head_offsets = blocked"}},
      {"no shape",
       [&](auto* r) { attention(r)->clear_shape(); },
       C::kInvalidArgument,
       {"spec.attention.shape: required"}},
      {"zero head_dim",
       [&](auto* r) { attention(r)->mutable_shape()->set_head_dim(0); },
       C::kInvalidArgument,
       {"spec.attention.shape.head_dim: must be >= 1, got 0"}},
      {"negative batch",
       [&](auto* r) { attention(r)->mutable_shape()->set_batch(-3); },
       C::kInvalidArgument,
       {"spec.attention.shape.batch: must be >= 1, got -3"}},
      {"heads < patterns",
       [&](auto* r) {
         attention(r)->mutable_shape()->set_num_heads(1);
         attention(r)->mutable_attention()->add_segment_lengths(128);
         attention(r)->mutable_attention()->add_dilation_rates(2);
       },
       C::kInvalidArgument,
       {"spec.attention:", "H = 1", "G = 2"}},
      {"overflow",
       [&](auto* r) {
         attention(r)->mutable_shape()->set_batch(int64_t{1} << 40);
         attention(r)->mutable_shape()->set_seq_len(int64_t{1} << 20);
       },
       C::kInvalidArgument,
       {"spec.attention.shape:", "overflows"}},
      {"no dtype",
       [&](auto* r) { attention(r)->set_dtype(v1::DTYPE_UNSPECIFIED); },
       C::kInvalidArgument,
       {"spec.attention.dtype: required", "DTYPE_UNSPECIFIED"}},
      {"unknown dtype",
       [&](auto* r) { attention(r)->set_dtype(static_cast<v1::DType>(9)); },
       C::kInvalidArgument,
       {"spec.attention.dtype: unknown value 9"}},
      {"dtype not on cpu",
       [&](auto* r) { attention(r)->set_dtype(v1::DTYPE_BF16); },
       C::kInvalidArgument,
       {"spec.attention.dtype: bf16 does not run on CPU workers"}},
      {"dtype not on gpu",
       [&](auto* r) {
         attention(r)->set_dtype(v1::DTYPE_FP64);
         attention(r)->set_device(v1::DEVICE_PREFERENCE_GPU);
       },
       C::kInvalidArgument,
       {"spec.attention.dtype: fp64 does not run on GPU workers"}},
      {"zero ranks",
       [&](auto* r) { attention(r)->set_num_ranks(0); },
       C::kInvalidArgument,
       {"spec.attention.num_ranks: must be >= 1, got 0"}},
      {"ranks not dividing",
       [&](auto* r) { attention(r)->set_num_ranks(3); },
       C::kInvalidArgument,
       {"spec.attention.num_ranks: must divide shape.seq_len = 256, got 3"}},
      {"ring too big for its output limit",
       [&](auto* r) {
         attention(r)->set_num_ranks(4);
         attention(r)->set_return_output(true);
         attention(r)->mutable_shape()->set_seq_len(int64_t{1} << 20);
       },
       C::kInvalidArgument,
       {"spec.attention.return_output:", "64.00 MiB"}},
      {"unknown pass",
       [&](auto* r) { attention(r)->set_pass(static_cast<v1::Pass>(5)); },
       C::kInvalidArgument,
       {"spec.attention.pass: unknown value 5"}},
      {"negative iterations",
       [&](auto* r) { attention(r)->set_iterations(-1); },
       C::kInvalidArgument,
       {"spec.attention.iterations:", "got -1"}},
      {"too many iterations",
       [&](auto* r) { attention(r)->set_iterations(1000001); },
       C::kInvalidArgument,
       {"spec.attention.iterations:", "got 1000001"}},
      {"unknown device",
       [&](auto* r) { attention(r)->set_device(static_cast<v1::DevicePreference>(4)); },
       C::kInvalidArgument,
       {"spec.attention.device: unknown value 4"}},
      {"output too large",
       [&](auto* r) {
         attention(r)->set_return_output(true);
         attention(r)->mutable_shape()->set_seq_len(int64_t{1} << 20);
         attention(r)->mutable_shape()->set_head_dim(16);  // 1 * 2^20 * 2 * 16 * 4 B = 128 MiB
       },
       C::kInvalidArgument,
       {"spec.attention.return_output:", "128.00 MiB", "64.00 MiB"}},
  };
  for (const BadRequest& c : cases) {
    SCOPED_TRACE(c.name);
    v1::SubmitJobRequest request = ValidRequest(absl::StrCat("key-", c.name));
    c.mutate(&request);
    absl::StatusOr<v1::SubmitJobResponse> response = coordinator_->SubmitJob(request);
    ASSERT_FALSE(response.ok());
    EXPECT_EQ(response.status().code(), c.code) << response.status();
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(std::string(response.status().message()), HasSubstr(part));
    }
  }
  // Nothing was stored.
  absl::StatusOr<v1::ListJobsResponse> list = coordinator_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 0);
}

TEST_F(CoordinatorTest, OtherRequestValidation) {
  v1::ListJobsRequest list;
  list.set_page_size(1001);
  EXPECT_THAT(std::string(coordinator_->ListJobs(list).status().message()),
              HasSubstr("page_size: must be 1 .. 1000 (0 means 50), got 1001"));
  list.set_page_size(0);
  list.add_states(v1::JOB_STATE_UNSPECIFIED);
  EXPECT_EQ(coordinator_->ListJobs(list).status().code(), absl::StatusCode::kInvalidArgument);
  list.clear_states();
  list.set_kind("training");
  EXPECT_THAT(std::string(coordinator_->ListJobs(list).status().message()),
              HasSubstr("kind: must be \"attention\" or empty, got \"training\""));

  EXPECT_EQ(coordinator_->GetJob(v1::GetJobRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::GetJobRequest get;
  get.set_job_id("j-0000000000000000");
  EXPECT_EQ(coordinator_->GetJob(get).status().code(), absl::StatusCode::kNotFound);
  get.set_max_events(10001);
  EXPECT_THAT(std::string(coordinator_->GetJob(get).status().message()),
              HasSubstr("max_events: must be 0 (the default, 1000) to 10000, got 10001"));
  get.set_max_events(-1);
  EXPECT_EQ(coordinator_->GetJob(get).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(Cancel("j-1", std::string(257, 'r')).status().message()),
              HasSubstr("reason: must be at most 256 characters, got 257"));
  EXPECT_EQ(Cancel("j-missing").status().code(), absl::StatusCode::kNotFound);

  v1::RegisterWorkerRequest reg;
  reg.set_name("w");
  reg.mutable_capabilities()->set_max_ranks(0);
  reg.mutable_capabilities()->add_dtypes(v1::DTYPE_FP32);
  EXPECT_THAT(std::string(coordinator_->RegisterWorker(reg).status().message()),
              HasSubstr("capabilities.max_ranks: must be >= 1, got 0"));
  reg.mutable_capabilities()->set_max_ranks(1);
  reg.mutable_capabilities()->add_dtypes(static_cast<v1::DType>(12));
  EXPECT_THAT(std::string(coordinator_->RegisterWorker(reg).status().message()),
              HasSubstr("capabilities.dtypes[1]: unknown value 12"));

  v1::TaskReport report;
  report.set_task_id("t");
  EXPECT_EQ(coordinator_->ReportTask(report).status().code(), absl::StatusCode::kInvalidArgument);
  report.set_state(v1::TASK_STATE_SUCCEEDED);
  EXPECT_THAT(std::string(coordinator_->ReportTask(report).status().message()),
              HasSubstr("rank_result: required"));
}

// -------------------------------------------------------------------------------------------------
// Submission, the queue and feasibility.

TEST_F(CoordinatorTest, SubmitWithoutWorkersQueues) {
  v1::Job a = Submit(ValidRequest("a"));
  v1::Job b = Submit(ValidRequest("b"));
  EXPECT_THAT(a.job_id(), ::testing::MatchesRegex("j-[0-9a-f]{16}"));
  EXPECT_NE(a.job_id(), b.job_id());
  EXPECT_EQ(a.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(a.attempt(), 0);
  EXPECT_EQ(Get(a.job_id()).queue_position(), 1);
  EXPECT_EQ(Get(b.job_id()).queue_position(), 2);
  v1::Job with_events = Get(a.job_id(), true);
  ASSERT_EQ(with_events.events_size(), 1);
  EXPECT_EQ(with_events.events(0).kind(), "submitted");
  EXPECT_EQ(with_events.events(0).seq(), 1);
  EXPECT_EQ(with_events.events(0).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(with_events.progress().steps_total(), 4);
}

TEST_F(CoordinatorTest, IdempotentResubmit) {
  absl::StatusOr<v1::SubmitJobResponse> first = coordinator_->SubmitJob(ValidRequest("same"));
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->created());
  absl::StatusOr<v1::SubmitJobResponse> again = coordinator_->SubmitJob(ValidRequest("same"));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created());
  EXPECT_EQ(again->job().job_id(), first->job().job_id());

  v1::SubmitJobRequest other = ValidRequest("same");
  other.mutable_spec()->set_priority(5);
  absl::StatusOr<v1::SubmitJobResponse> conflict = coordinator_->SubmitJob(other);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(conflict.status().message()), HasSubstr("same"));
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("dattn_jobs_submitted_total{kind=\"attention\"} 1"));
}

TEST_F(CoordinatorTest, InfeasibleJobIsRejectedWithPlannerNumbers) {
  AddWorker("tiny", /*memory=*/1024);
  absl::StatusOr<v1::SubmitJobResponse> response = coordinator_->SubmitJob(ValidRequest("big"));
  ASSERT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted) << response.status();
  const std::string message(response.status().message());
  EXPECT_THAT(message, HasSubstr("can never run"));
  EXPECT_THAT(message, HasSubstr("memory plan per rank: inputs"));
  EXPECT_THAT(message, HasSubstr("KiB"));  // The worker's memory, from the scheduler.
}

// -------------------------------------------------------------------------------------------------
// The whole path with a fake worker.

TEST_F(CoordinatorTest, SubmitPlaceReportSucceeded) {
  FakeWorker* worker = AddWorker("cpu-0");
  v1::SubmitJobRequest request = ValidRequest("ok");
  request.mutable_spec()->mutable_attention()->set_return_output(true);
  const std::string id = Submit(request).job_id();

  std::optional<v1::WorkerCommand> command = worker->Next();
  ASSERT_TRUE(command.has_value());
  ASSERT_TRUE(command->has_assign());
  const v1::TaskAssignment& assign = command->assign();
  EXPECT_EQ(assign.task_id(), id + "/1/0");
  EXPECT_EQ(assign.job_id(), id);
  EXPECT_EQ(assign.attempt(), 1);
  EXPECT_EQ(assign.rank(), 0);
  EXPECT_EQ(assign.spec().attention().shape().seq_len(), 256);
  v1::Job placed = Get(id);
  EXPECT_EQ(placed.state(), v1::JOB_STATE_PLACED);
  EXPECT_EQ(placed.attempt(), 1);
  EXPECT_THAT(placed.worker_ids(), ElementsAre(worker->id()));
  EXPECT_EQ(placed.queue_position(), 0);

  ASSERT_TRUE(worker->Report(assign.task_id(), v1::TASK_STATE_STARTED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Get(id).has_start_time());
  absl::StatusOr<v1::ReportTaskResponse> progress =
      worker->Report(assign.task_id(), v1::TASK_STATE_PROGRESS, 2);
  ASSERT_TRUE(progress.ok());
  EXPECT_FALSE(progress->stop());
  EXPECT_EQ(Get(id).progress().steps_done(), 2);

  v1::TaskReport done;
  done.set_worker_id(worker->id());
  done.set_task_id(assign.task_id());
  done.set_state(v1::TASK_STATE_SUCCEEDED);
  done.mutable_rank_result()->set_seconds_per_step(0.5);
  done.mutable_rank_result()->set_out_sum(3.0);
  done.mutable_rank_result()->set_out_sum_squares(9.0);
  // Its output: the job's whole (B, N, H, D) = (1, 256, 2, 16) fp32, as the rank's one shard.
  std::string bytes(1 * 256 * 2 * 16 * 4, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  done.mutable_output()->set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {1, 256, 2, 16}) done.mutable_output()->add_shape(d);
  done.mutable_output()->set_data(bytes);
  absl::StatusOr<v1::ReportTaskResponse> finished = coordinator_->ReportTask(done);
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_FALSE(finished->stop());

  v1::Job job = Get(id, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(job.has_end_time());
  EXPECT_EQ(job.progress().steps_done(), 4);
  const v1::AttentionJobResult& result = job.result().attention();
  ASSERT_EQ(result.ranks_size(), 1);
  EXPECT_EQ(result.ranks(0).worker_id(), worker->id());
  EXPECT_DOUBLE_EQ(result.seconds_per_step(), 0.5);
  EXPECT_DOUBLE_EQ(result.out_sum(), 3.0);
  EXPECT_GT(result.flops_per_step(), 0);
  EXPECT_DOUBLE_EQ(result.tflops(), result.flops_per_step() / 0.5 / 1e12);
  EXPECT_EQ(result.output().data(), bytes);
  EXPECT_THAT(result.output().shape(), ElementsAre(1, 256, 2, 16));
  EXPECT_THAT(EventKinds(job),
              ElementsAre("submitted", "placed", "started", "progress", "succeeded"));
  for (int i = 0; i < job.events_size(); ++i) EXPECT_EQ(job.events(i).seq(), i + 1);

  // A repeated final report is stale: the worker is told to stop, nothing changes.
  absl::StatusOr<v1::ReportTaskResponse> again = coordinator_->ReportTask(done);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->stop());
  EXPECT_EQ(Get(id, true).events_size(), 5);

  const std::string text = metrics_->Serialize();
  EXPECT_THAT(text,
              HasSubstr("dattn_jobs_finished_total{kind=\"attention\",state=\"succeeded\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_jobs{kind=\"attention\",state=\"succeeded\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_jobs{kind=\"attention\",state=\"running\"} 0"));
  EXPECT_THAT(text, HasSubstr("dattn_attention_tokens_total 1024"));  // B*N*iterations = 1*256*4.
  EXPECT_THAT(text, HasSubstr("dattn_job_queue_wait_seconds_count{kind=\"attention\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_job_duration_seconds_count{kind=\"attention\"} 1"));
}

// A long history: GetJob returns the latest max_events, oldest first, and counts the rest.
TEST_F(CoordinatorTest, GetJobReturnsTheLatestEventsAndCountsTheRest) {
  FakeWorker* worker = AddWorker("cpu-0");
  v1::SubmitJobRequest request = ValidRequest("long");
  request.mutable_spec()->mutable_attention()->set_iterations(100);
  const std::string id = Submit(request).job_id();
  std::optional<v1::WorkerCommand> command = worker->Next();
  ASSERT_TRUE(command.has_value() && command->has_assign());
  const std::string task = command->assign().task_id();
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());
  for (int step = 1; step <= 6; ++step) {
    ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_PROGRESS, step).ok());
  }
  v1::GetJobRequest some;
  some.set_job_id(id);
  some.set_include_events(true);
  some.set_max_events(2);
  absl::StatusOr<v1::Job> latest = coordinator_->GetJob(some);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_THAT(EventKinds(*latest), ElementsAre("progress", "progress"));
  EXPECT_EQ(latest->events(0).progress().steps_done(), 5);
  EXPECT_EQ(latest->events(1).progress().steps_done(), 6);
  const v1::Job all = Get(id, true);  // max_events 0: up to 1000
  EXPECT_EQ(all.events_size(), 9);    // submitted, placed, started, 6 x progress
  EXPECT_EQ(all.events_omitted(), 0);
  EXPECT_EQ(latest->events_omitted(), 7);
  EXPECT_EQ(all.events(0).kind(), "submitted");
}

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

// -------------------------------------------------------------------------------------------------
// Cancel.

TEST_F(CoordinatorTest, CancelQueuedJob) {
  const std::string id = Submit(ValidRequest("q")).job_id();
  absl::StatusOr<v1::Job> cancelled = Cancel(id, "changed my mind");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(cancelled->state_reason(), HasSubstr("changed my mind"));
  // Again: OK and unchanged.
  absl::StatusOr<v1::Job> again = Cancel(id, "twice");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(again->state_reason(), HasSubstr("changed my mind"));
  EXPECT_THAT(EventKinds(Get(id, true)), ElementsAre("submitted", "cancelled"));
  // A worker arriving later gets nothing.
  FakeWorker* worker = AddWorker("late");
  EXPECT_FALSE(worker->Next(absl::Milliseconds(200)).has_value());
}

// An assignment written to a stream that broke right after never reached the worker: its
// heartbeats do not list the task, so the coordinator sends it again (same task id), and the job
// does not sit PLACED forever.
TEST_F(CoordinatorTest, AssignmentLostInTransitIsSentAgain) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("lost")).job_id();
  std::optional<v1::WorkerCommand> first = worker->Next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(first->has_assign());
  const std::string task = first->assign().task_id();
  worker->Drop(task);  // The worker never saw it.
  std::optional<v1::WorkerCommand> again = worker->Next(absl::Seconds(2));
  ASSERT_TRUE(again.has_value()) << "the lost assignment was not sent again";
  ASSERT_TRUE(again->has_assign());
  EXPECT_EQ(again->assign().task_id(), task);
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_SUCCEEDED);
  // A task the worker lists is not sent again.
  EXPECT_FALSE(worker->Next(absl::Milliseconds(300)).has_value());
}

TEST_F(CoordinatorTest, CancelRunningJobWaitsForTheWorker) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("r")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const std::string task = assign->assign().task_id();
  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_STARTED).ok());

  absl::StatusOr<v1::Job> requested = Cancel(id, "stop it");
  ASSERT_TRUE(requested.ok());
  EXPECT_EQ(requested->state(), v1::JOB_STATE_RUNNING);
  std::optional<v1::WorkerCommand> cancel = worker->Next();
  ASSERT_TRUE(cancel.has_value());
  ASSERT_TRUE(cancel->has_cancel());
  EXPECT_EQ(cancel->cancel().task_id(), task);
  EXPECT_THAT(cancel->cancel().reason(), HasSubstr("stop it"));
  // Progress reports meanwhile are answered stop = false: "stop" would tell the worker not to
  // report again, and the job ends only with the worker's final CANCELLED report.
  absl::StatusOr<v1::ReportTaskResponse> progress =
      worker->Report(task, v1::TASK_STATE_PROGRESS, 1);
  ASSERT_TRUE(progress.ok());
  EXPECT_FALSE(progress->stop());
  EXPECT_EQ(Get(id, false).state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(worker->Report(task, v1::TASK_STATE_CANCELLED).ok());
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(job.state_reason(), HasSubstr("stop it"));
  EXPECT_THAT(EventKinds(job), ElementsAre("submitted", "placed", "started", "cancel_requested",
                                           "progress", "cancelled"));
  // Finished jobs other than cancelled ones cannot be cancelled.
  const std::string next = Submit(ValidRequest("s")).job_id();
  std::optional<v1::WorkerCommand> second = worker->Next();
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(worker->Report(second->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  absl::StatusOr<v1::Job> late = Cancel(next);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("already succeeded"));
}

TEST_F(CoordinatorTest, CancelRequestedThenWorkerLostEndsCancelled) {
  FakeWorker* worker = AddWorker("cpu-0");
  const std::string id = Submit(ValidRequest("x")).job_id();
  ASSERT_TRUE(worker->Next().has_value());
  ASSERT_TRUE(Cancel(id).ok());
  // The worker dies before confirming: the cancel completes rather than the job requeueing.
  worker->StopHeartbeats();
  ASSERT_TRUE(WaitState(id, v1::JOB_STATE_CANCELLED));
  EXPECT_THAT(EventKinds(Get(id, true)),
              ElementsAre("submitted", "placed", "cancel_requested", "worker_lost", "cancelled"));
}

// -------------------------------------------------------------------------------------------------
// Failures and recovery.

TEST_F(CoordinatorTest, WorkerDeathRequeuesThenFails) {
  options_.max_attempts = 2;
  Restart();
  const std::string id = Submit(ValidRequest("d")).job_id();
  for (int attempt = 1; attempt <= 2; ++attempt) {
    SCOPED_TRACE(attempt);
    FakeWorker* worker = AddWorker(absl::StrCat("mortal-", attempt));
    std::optional<v1::WorkerCommand> assign = worker->Next();
    ASSERT_TRUE(assign.has_value());
    EXPECT_EQ(assign->assign().attempt(), attempt);
    ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED).ok());
    worker->StopHeartbeats();  // Dead after 500 ms.
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
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("dattn_recoveries_total{kind=\"worker_lost\"} 2"));
  EXPECT_THAT(metrics_->Serialize(), HasSubstr("dattn_workers{state=\"dead\"} 2"));
}

TEST_F(CoordinatorTest, HeartbeatsKeepAWorkerAlive) {
  FakeWorker* worker = AddWorker("steady");
  const std::string id = Submit(ValidRequest("h")).job_id();
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  for (int i = 0; i < 20; ++i) {  // 1 s, twice dead_after, with the worker's own heartbeats.
    v1::HeartbeatResponse hb = worker->Heartbeat({assign->assign().task_id()});
    EXPECT_FALSE(hb.reregister());
    EXPECT_FALSE(hb.drain());
    absl::SleepFor(absl::Milliseconds(50));
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
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recoveries_total{kind=\"worker_reregistered\"} 1"));
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

// -------------------------------------------------------------------------------------------------
// Restart recovery.

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
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_recoveries_total{kind=\"coordinator_restarted\"} 1"));

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

TEST_F(CoordinatorTest, SecondCoordinatorOnTheSameDataDirIsRefused) {
  Coordinator second(options_, nullptr);
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(second.Health().code(), absl::StatusCode::kUnavailable);
  v1::GetJobRequest get;
  get.set_job_id("j-1");
  EXPECT_EQ(second.GetJob(get).status().code(), absl::StatusCode::kUnavailable);
}

// -------------------------------------------------------------------------------------------------
// WatchJob and ListJobs.

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

TEST_F(CoordinatorTest, ListJobsPagesNewestFirstAndFilters) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    v1::SubmitJobRequest request = ValidRequest(absl::StrCat("k", i));
    request.mutable_spec()->set_tenant(i % 2 == 0 ? "even" : "odd");
    ids.push_back(Submit(request).job_id());
  }
  ASSERT_TRUE(Cancel(ids[1]).ok());
  std::vector<std::string> listed;
  v1::ListJobsRequest request;
  request.set_page_size(2);
  int pages = 0;
  do {
    absl::StatusOr<v1::ListJobsResponse> page = coordinator_->ListJobs(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs_size(), 2);
    for (const v1::Job& job : page->jobs()) listed.push_back(job.job_id());
    request.set_page_token(page->next_page_token());
    ++pages;
  } while (!request.page_token().empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_THAT(listed, ElementsAre(ids[4], ids[3], ids[2], ids[1], ids[0]));

  v1::ListJobsRequest filtered;
  filtered.set_tenant("odd");
  filtered.add_states(v1::JOB_STATE_QUEUED);
  absl::StatusOr<v1::ListJobsResponse> odd = coordinator_->ListJobs(filtered);
  ASSERT_TRUE(odd.ok());
  ASSERT_EQ(odd->jobs_size(), 1);
  EXPECT_EQ(odd->jobs(0).job_id(), ids[3]);
  EXPECT_GT(odd->jobs(0).queue_position(), 0);  // Active jobs show live fields.

  request.set_page_token("garbage");
  EXPECT_EQ(coordinator_->ListJobs(request).status().code(), absl::StatusCode::kInvalidArgument);
}

// -------------------------------------------------------------------------------------------------
// Shutdown.

TEST_F(CoordinatorTest, ShutdownStopsSubmitsAndRequeuesUnfinishedJobs) {
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

  const absl::Time start = absl::Now();
  ASSERT_TRUE(coordinator_->Drain(absl::Milliseconds(100)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
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

// -------------------------------------------------------------------------------------------------
// Rings.

v1::SubmitJobRequest RingRequest(const std::string& key, int ranks) {
  v1::SubmitJobRequest request = ValidRequest(key);
  request.mutable_spec()->mutable_attention()->set_num_ranks(ranks);
  return request;
}

// A report of `task`'s rank with its ring formed.
v1::TaskReport FormedReport(const FakeWorker& worker, const std::string& task, v1::TaskState state,
                            double formation_seconds) {
  v1::TaskReport report;
  report.set_worker_id(worker.id());
  report.set_task_id(task);
  report.set_state(state);
  report.set_ring_formation_seconds(formation_seconds);
  return report;
}

// The ranks' assignments, by rank, from each worker's next command.
std::vector<v1::TaskAssignment> Assignments(const std::vector<FakeWorker*>& workers) {
  std::vector<v1::TaskAssignment> out(workers.size());
  for (FakeWorker* worker : workers) {
    std::optional<v1::WorkerCommand> command = worker->Next();
    EXPECT_TRUE(command.has_value() && command->has_assign());
    if (!command.has_value() || !command->has_assign()) return {};
    const int rank = command->assign().rank();
    EXPECT_LT(rank, static_cast<int>(out.size()));
    if (rank < static_cast<int>(out.size())) out[rank] = command->assign();
  }
  return out;
}

// The worker whose id is `id`.
FakeWorker* Holder(const std::vector<FakeWorker*>& workers, const std::string& id) {
  for (FakeWorker* w : workers) {
    if (w->id() == id) return w;
  }
  return nullptr;
}

TEST_F(CoordinatorTest, RingJobRunsAsAGangWithItsRendezvousAndCombinedResult) {
  std::vector<FakeWorker*> workers = {AddWorker("cpu-0"), AddWorker("cpu-1")};
  v1::SubmitJobRequest request = RingRequest("ring", 2);
  request.mutable_spec()->mutable_attention()->set_return_output(true);
  const std::string id = Submit(request).job_id();
  std::vector<v1::TaskAssignment> ranks = Assignments(workers);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::Job placed = Get(id);
  ASSERT_EQ(placed.worker_ids_size(), 2);
  for (int r = 0; r < 2; ++r) {
    const v1::RingInfo& ring = ranks[r].ring();
    EXPECT_EQ(ranks[r].task_id(), absl::StrCat(id, "/1/", r));
    EXPECT_EQ(ring.ring_id(), id + "/1");
    EXPECT_EQ(ring.rank(), r);
    EXPECT_EQ(ring.size(), 2);
    EXPECT_EQ(ring.backend(), "gloo");
    EXPECT_EQ(ring.formation_timeout_ms(),
              absl::ToInt64Milliseconds(options_.ring_formation_timeout));
    EXPECT_EQ(ring.comm_timeout_ms(), absl::ToInt64Milliseconds(options_.ring_comm_timeout));
    EXPECT_EQ(ring.store_address(), ranks[0].ring().store_address());
  }
  // The store is up, and it is the ring's own: it holds what ranks put there.
  const std::string address = ranks[0].ring().store_address();
  {
    absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
        comm::TcpStore::Connect(address, absl::Seconds(2), absl::Seconds(2));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set(worker::JoinedKey(id + "/1", 0), "rank 0").ok());
    EXPECT_TRUE((*store)->Get(worker::JoinedKey(id + "/1", 0), absl::ZeroDuration()).ok());
  }
  v1::Job job = Get(id, true);
  EXPECT_THAT(job.events(1).message(), HasSubstr("gloo ring " + id + "/1"));
  EXPECT_THAT(job.events(1).message(), HasSubstr("rank 1 on "));

  // Each rank returns its (1, 128, 2, 16) fp32 shard; the job's output is rank 0's then rank 1's.
  std::string shards[2];
  for (int r = 0; r < 2; ++r) {
    FakeWorker* worker = Holder(workers, placed.worker_ids(r));
    ASSERT_NE(worker, nullptr);
    ASSERT_TRUE(coordinator_
                    ->ReportTask(
                        FormedReport(*worker, ranks[r].task_id(), v1::TASK_STATE_STARTED, 0.25 + r))
                    .ok());
    shards[r] = std::string(128 * 2 * 16 * 4, static_cast<char>('a' + r));
    v1::TaskReport done =
        FormedReport(*worker, ranks[r].task_id(), v1::TASK_STATE_SUCCEEDED, 0.25 + r);
    v1::RankResult* result = done.mutable_rank_result();
    result->set_seconds_per_step(0.1 * (r + 1));
    result->set_tflops(1.0 + r);
    result->set_out_sum(1.5);
    result->set_out_sum_squares(2.0 + r);
    done.mutable_output()->set_dtype(v1::DTYPE_FP32);
    for (int64_t d : {1, 128, 2, 16}) done.mutable_output()->add_shape(d);
    done.mutable_output()->set_data(shards[r]);
    absl::StatusOr<v1::ReportTaskResponse> reply = coordinator_->ReportTask(done);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_FALSE(reply->stop());
  }
  job = Get(id, true);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.state_reason();
  const v1::AttentionJobResult& result = job.result().attention();
  ASSERT_EQ(result.ranks_size(), 2);
  EXPECT_DOUBLE_EQ(result.seconds_per_step(), 0.2);  // The slower rank.
  EXPECT_DOUBLE_EQ(result.out_sum(), 3.0);
  EXPECT_DOUBLE_EQ(result.out_sum_squares(), 5.0);
  EXPECT_DOUBLE_EQ(result.ranks(1).ring_formation_seconds(), 1.25);
  EXPECT_EQ(result.output().data(), shards[0] + shards[1]);
  EXPECT_THAT(result.output().shape(), ElementsAre(1, 256, 2, 16));

  const std::string text = metrics_->Serialize();
  EXPECT_THAT(text,
              HasSubstr("dattn_ring_formations_total{backend=\"gloo\",outcome=\"formed\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_ring_formation_seconds_count{backend=\"gloo\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_ring_formation_seconds_sum{backend=\"gloo\"} 1.25"));
  EXPECT_THAT(text, HasSubstr("dattn_attention_job_tflops_count{device=\"cpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_attention_step_seconds_count{device=\"cpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_worker_rank_step_seconds_count{worker=\"cpu-1\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_worker_attention_tflops{worker=\""));
  EXPECT_THAT(text, HasSubstr("dattn_worker_memory_free_bytes{worker=\"cpu-0\"} 1073741824"));
  EXPECT_THAT(text, HasSubstr("dattn_worker_memory_reserved_bytes{worker=\"cpu-0\"} 0"));

  // The attempt is over: its store goes away (the scheduling loop destroys it).
  EXPECT_TRUE(WaitFor([&] {
    return !comm::TcpStore::Connect(address, absl::Milliseconds(50), absl::Milliseconds(50)).ok();
  }));
}

TEST_F(CoordinatorTest, RingFormationTimeoutNamesTheMissingRankAndRequeues) {
  std::vector<FakeWorker*> workers = {AddWorker("early"), AddWorker("late")};
  const std::string id = Submit(RingRequest("form", 2)).job_id();
  std::vector<v1::TaskAssignment> ranks = Assignments(workers);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::Job placed = Get(id);
  FakeWorker* first = Holder(workers, placed.worker_ids(0));
  FakeWorker* second = Holder(workers, placed.worker_ids(1));
  ASSERT_TRUE(first != nullptr && second != nullptr);
  // Rank 1's worker says it is still preparing; rank 0 arrives, waits, and times out.
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(second->id());
  v1::RunningTask* running = heartbeat.add_tasks();
  running->set_task_id(ranks[1].task_id());
  running->set_phase(v1::RANK_PHASE_PREPARING);
  ASSERT_TRUE(coordinator_->Heartbeat(heartbeat).ok());
  {
    absl::StatusOr<std::unique_ptr<comm::TcpStore>> store = comm::TcpStore::Connect(
        ranks[0].ring().store_address(), absl::Seconds(2), absl::Seconds(2));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set(worker::JoinedKey(ranks[0].ring().ring_id(), 0), "early").ok());
  }
  ASSERT_TRUE(first
                  ->Fail(ranks[0].task_id(), absl::StatusCode::kDeadlineExceeded,
                         "ring formation timed out after 30s: rank 1 of 2 never arrived")
                  .ok());
  // Requeued (and, both workers being free, possibly placed again at once).
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.attempt(), 2);
  std::vector<std::string> kinds = EventKinds(job);
  kinds.resize(std::min<size_t>(kinds.size(), 4));
  EXPECT_THAT(kinds, ElementsAre("submitted", "placed", "ring_formation_failed", "requeued"));
  const std::string& message = job.events(2).message();
  EXPECT_THAT(message, HasSubstr("ring " + id + "/1 did not form"));
  // Rank 1, its worker (id and name) and what that worker last said of it.
  EXPECT_THAT(message, ::testing::ContainsRegex("rank 1 on " + second->id() +
                                                " \\((early|late)\\) \\(preparing"));
  EXPECT_THAT(message, HasSubstr("never arrived within 30.0 s"));
  EXPECT_THAT(message, HasSubstr("rank 1 of 2 never arrived"));  // The reporting rank's words.
  EXPECT_THAT(job.events(3).message(), HasSubstr("ring formation failed: rank 1 on"));
  // The rank that never arrived is told to stop; the job runs again as attempt 2.
  std::optional<v1::WorkerCommand> cancel = second->Next();
  ASSERT_TRUE(cancel.has_value());
  ASSERT_TRUE(cancel->has_cancel());
  EXPECT_EQ(cancel->cancel().task_id(), ranks[1].task_id());
  std::optional<v1::WorkerCommand> again = first->Next();
  ASSERT_TRUE(again.has_value() && again->has_assign());
  EXPECT_EQ(again->assign().attempt(), 2);
  EXPECT_EQ(again->assign().ring().ring_id(), id + "/2");
  EXPECT_NE(again->assign().ring().store_address(), ranks[0].ring().store_address());
  EXPECT_THAT(metrics_->Serialize(),
              HasSubstr("dattn_ring_formations_total{backend=\"gloo\",outcome=\"timed_out\"} 1"));
}

TEST_F(CoordinatorTest, RingRankFailureCancelsItsPeersAndRequeues) {
  std::vector<FakeWorker*> workers = {AddWorker("cpu-0"), AddWorker("cpu-1")};
  const std::string id = Submit(RingRequest("peer", 2)).job_id();
  std::vector<v1::TaskAssignment> ranks = Assignments(workers);
  ASSERT_EQ(ranks.size(), 2u);
  const v1::Job placed = Get(id);
  FakeWorker* first = Holder(workers, placed.worker_ids(0));
  FakeWorker* second = Holder(workers, placed.worker_ids(1));
  for (int r = 0; r < 2; ++r) {
    FakeWorker* w = r == 0 ? first : second;
    ASSERT_TRUE(
        coordinator_->ReportTask(FormedReport(*w, ranks[r].task_id(), v1::TASK_STATE_STARTED, 0.1))
            .ok());
  }
  v1::TaskReport failed = FormedReport(*second, ranks[1].task_id(), v1::TASK_STATE_FAILED, 0.1);
  failed.set_error("ring forward on rank 1 of 2, phase 1 of 2: recv from rank 0 failed");
  failed.set_error_code(static_cast<int>(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(coordinator_->ReportTask(failed).ok());
  v1::Job job = Get(id, true);
  EXPECT_EQ(job.attempt(), 2);
  std::vector<std::string> kinds = EventKinds(job);
  kinds.resize(std::min<size_t>(kinds.size(), 5));
  EXPECT_THAT(kinds, ElementsAre("submitted", "placed", "started", "ring_failed", "requeued"));
  EXPECT_THAT(job.events(3).message(), HasSubstr("rank 1 on " + second->id()));
  EXPECT_THAT(job.events(3).message(), HasSubstr("recv from rank 0 failed"));
  EXPECT_THAT(job.events(3).message(), HasSubstr("rank 0 on " + first->id()));
  // Its peer is cancelled (it still runs); the failing rank, which stopped, is not.
  std::optional<v1::WorkerCommand> cancel = first->Next();
  ASSERT_TRUE(cancel.has_value());
  ASSERT_TRUE(cancel->has_cancel());
  EXPECT_EQ(cancel->cancel().task_id(), ranks[0].task_id());
  // The peer's late report of the old attempt is stale.
  absl::StatusOr<v1::ReportTaskResponse> late =
      first->Fail(ranks[0].task_id(), absl::StatusCode::kAborted,
                  "communicator aborted: the task was cancelled");
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->stop());
  const std::string text = metrics_->Serialize();
  EXPECT_THAT(text,
              HasSubstr("dattn_ring_formations_total{backend=\"gloo\",outcome=\"formed\"} 1"));
  EXPECT_THAT(text, HasSubstr("dattn_recoveries_total{kind=\"task_failed\"} 1"));
}

TEST_F(CoordinatorTest, RingsGoOnlyToWorkersThatJoinThem) {
  AddWorker("solo-0", int64_t{1} << 30, 1, true, /*joins_rings=*/false);
  AddWorker("solo-1", int64_t{1} << 30, 1, true, /*joins_rings=*/false);
  absl::StatusOr<v1::SubmitJobResponse> ring = coordinator_->SubmitJob(RingRequest("r", 2));
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(ring.status().message()), HasSubstr("join sequence-parallel rings"));
  EXPECT_TRUE(coordinator_->SubmitJob(ValidRequest("single")).ok());
}

TEST_F(CoordinatorTest, UncheckedJobsAreCheckedOnceTheReadyWorkersSettle) {
  options_.feasibility_settle = absl::Milliseconds(150);
  Restart();
  // Queued while no worker exists: a ring too large for the cluster to come, a job that fits, and
  // an fp32 DEVICE_PREFERENCE_ANY job (queued for GPUs first, as none were there to say).
  const std::string too_big = Submit(RingRequest("big", 4)).job_id();
  const std::string fits = Submit(ValidRequest("fits")).job_id();
  v1::SubmitJobRequest any = ValidRequest("any");
  any.mutable_spec()->mutable_attention()->set_device(v1::DEVICE_PREFERENCE_ANY);
  const std::string any_id = Submit(any).job_id();
  FakeWorker* worker = AddWorker("only", int64_t{1} << 30, /*max_ranks=*/2);
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
  options_.feasibility_settle = absl::Milliseconds(50);
  Restart();
  std::vector<FakeWorker*> workers = {AddWorker("a"), AddWorker("b")};
  const std::string first = Submit(ValidRequest("first")).job_id();
  ASSERT_TRUE(WaitState(first, v1::JOB_STATE_PLACED));
  FakeWorker* idle =
      Holder(workers, Get(first).worker_ids(0)) == workers[0] ? workers[1] : workers[0];
  // Fits the two workers, so it is accepted; one is busy, so it waits.
  const std::string ring = Submit(RingRequest("ring", 2)).job_id();
  idle->StopHeartbeats();  // Dead after 500 ms: one worker left, too few for the ring.
  ASSERT_TRUE(WaitFor([&] {
    return metrics_->Serialize().find("dattn_workers{state=\"dead\"} 1") != std::string::npos;
  }));
  absl::SleepFor(absl::Milliseconds(300));  // Well past the settle time.
  v1::Job job = Get(ring, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.state_reason();
  EXPECT_THAT(EventKinds(job), ElementsAre("submitted"));
}

// After a restart, workers re-register one by one (each once its cancelled tasks stop). A ring that
// was running before is not failed by the feasibility check while only part of its cluster is back.
TEST_F(CoordinatorTest, ARingPlacedBeforeARestartWaitsForItsWorkers) {
  options_.feasibility_settle = absl::Milliseconds(50);
  Restart();
  std::vector<FakeWorker*> workers = {AddWorker("a"), AddWorker("b")};
  const std::string ring = Submit(RingRequest("ring", 2)).job_id();
  ASSERT_TRUE(WaitState(ring, v1::JOB_STATE_PLACED));
  Restart();
  FakeWorker* back = AddWorker("a");
  absl::SleepFor(absl::Milliseconds(400));  // Well past the settle time, one worker of two back.
  v1::Job job = Get(ring, true);
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.state_reason();
  FakeWorker* other = AddWorker("b");
  ASSERT_TRUE(WaitState(ring, v1::JOB_STATE_PLACED)) << Get(ring).state_reason();
  EXPECT_TRUE(back->Next().has_value());
  EXPECT_TRUE(other->Next().has_value());
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

// -------------------------------------------------------------------------------------------------
// Metrics.

TEST_F(CoordinatorTest, MetricNamesArePresentFromTheStart) {
  const std::string text = metrics_->Serialize();
  for (const char* name :
       {"# TYPE dattn_jobs gauge", "# TYPE dattn_jobs_submitted_total counter",
        "# TYPE dattn_jobs_finished_total counter", "# TYPE dattn_queue_depth gauge",
        "# TYPE dattn_job_duration_seconds histogram",
        "# TYPE dattn_job_queue_wait_seconds histogram",
        "# TYPE dattn_attention_tokens_total counter", "# TYPE dattn_attention_flops_total counter",
        "# TYPE dattn_workers gauge", "# TYPE dattn_recoveries_total counter",
        "# TYPE dattn_store_commit_seconds histogram"}) {
    EXPECT_THAT(text, HasSubstr(name));
  }
  Submit(ValidRequest("m"));
  AddWorker("cpu-0", int64_t{1} << 30, 1, /*stream=*/false);
  const std::string after = metrics_->Serialize();
  EXPECT_THAT(after, HasSubstr("dattn_workers{state=\"ready\"} 1"));
  EXPECT_THAT(after, ::testing::ContainsRegex("dattn_store_commit_seconds_count [1-9]"));
}

}  // namespace
}  // namespace server
}  // namespace dattn
