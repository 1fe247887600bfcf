// The coordinator's JobService through its C++ API: validation, submit, the queue, the whole path
// of a job, cancels, listings, metrics. Workers are played by FakeWorker.
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
#include "api/attention_job.h"
#include "api/rendezvous.h"
#include "api/training_job.h"
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
using ctest::LadderTrainingConfig;
using ctest::NewDataDir;
using ctest::RingRequest;
using ctest::ValidRequest;
using ctest::WaitFor;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using CoordinatorTest = ctest::CoordinatorTest;

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
       {"spec: a job must say its work: one of attention, training, deployment (none is set)"}},
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
         attention(r)->mutable_shape()->set_seq_len(int64_t{1} << 28);
         attention(r)->mutable_shape()->set_head_dim(16);  // 2^28 * 2 * 16 * 4 B = 32 GiB
       },
       C::kInvalidArgument,
       {"spec.attention.return_output:", "32.00 GiB", "16.00 GiB"}},
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
  list.set_kind("inference");
  EXPECT_THAT(
      std::string(coordinator_->ListJobs(list).status().message()),
      HasSubstr(
          "kind: must be one of attention, training, deployment or empty, got \"inference\""));
  list.set_kind("training");
  EXPECT_TRUE(coordinator_->ListJobs(list).ok());

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
              HasSubstr("rank_result (attention) or training_result (training): required"));
}

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

// TrainingJobSpec.auto_data_parallel: D is the largest divisor of batch_size / micro_batches whose
// gang the ready workers hold; the stored spec carries it; no ready worker to count is refused.
TEST_F(CoordinatorTest, AutoDataParallelTakesAsManyWorkersAsFit) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key("auto-d");
  v1::TrainingJobSpec* training = request.mutable_spec()->mutable_training();
  training->set_config_json(R"({
    "model": {"vocab_size": 256, "d_model": 32, "num_layers": 1, "num_heads": 4, "ffn_dim": 64,
              "attention": {"segment_lengths": [32], "dilation_rates": [1]}},
    "data": {"paths": ["/data/corpus.txt"]},
    "seq_len": 64, "batch_size": 16, "micro_batches": 2, "steps": 200})");
  training->set_device(v1::DEVICE_PREFERENCE_CPU);
  training->set_auto_data_parallel(true);

  absl::StatusOr<v1::SubmitJobResponse> none = coordinator_->SubmitJob(request);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("spec.training.auto_data_parallel: no worker is ready"));

  // Three single-rank workers: of D = 8, 4, 2, 1 (the divisors of 16 / 2), 2 is the largest that
  // fits.
  for (int i = 0; i < 3; ++i) AddWorker(absl::StrCat("cpu-", i), int64_t{1} << 30, 1, false);
  const v1::Job job = Submit(request);
  EXPECT_EQ(job.spec().training().data_parallel(), 2);
  EXPECT_FALSE(job.spec().training().auto_data_parallel());
  const v1::Job stored = Get(job.job_id(), true);
  EXPECT_EQ(stored.spec().training().data_parallel(), 2);
  ASSERT_GE(stored.events_size(), 1);
  EXPECT_THAT(stored.events(0).message(), HasSubstr("(data 2 x sequence 1)"));
  EXPECT_THAT(stored.events(0).message(),
              HasSubstr("auto_data_parallel: 2, the largest data-parallel degree (of ranks 8, 4, "
                        "2 tried, largest first) whose 2 ranks the 3 ready workers can hold"));
  // A retry with the same key and the spec as asked (auto) is the same job.
  absl::StatusOr<v1::SubmitJobResponse> retry = coordinator_->SubmitJob(request);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->created());
  EXPECT_EQ(retry->job().job_id(), job.job_id());
  EXPECT_TRUE(job.requested_spec().training().auto_data_parallel());

  // A worker holding two ranks more: D = 4.
  AddWorker("cpu-3", int64_t{1} << 30, 2, false);
  request.set_idempotency_key("auto-d-2");
  EXPECT_EQ(Submit(request).spec().training().data_parallel(), 4);

  // Both a D and auto: refused, naming the field.
  training->set_data_parallel(2);
  request.set_idempotency_key("auto-d-3");
  absl::StatusOr<v1::SubmitJobResponse> both = coordinator_->SubmitJob(request);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(both.status().message()), HasSubstr("spec.training.data_parallel"));
}

// Out of memory before placing: a training job too large for any ready worker as asked runs on the
// first rung of its recovery ladder that fits (more micro-batches here), says so with the numbers,
// keeps the spec it was asked for, and a retry of it is the same job. With split_batch off the
// next rung is more sequence ranks; with every fallback off it is refused as before.
TEST_F(CoordinatorTest, TheRecoveryLadderRunsAJobThatDoesNotFitAsAsked) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key("ladder");
  v1::TrainingJobSpec* training = request.mutable_spec()->mutable_training();
  auto config = LadderTrainingConfig;
  training->set_config_json(config(1));
  training->set_device(v1::DEVICE_PREFERENCE_CPU);
  // The planner's figure for one rank at 1, 2 and 4 micro-batches, and at 2 sequence ranks.
  auto memory = [&](int micro, int sequence) {
    v1::TrainingJobSpec t = *training;
    t.set_config_json(config(micro));
    t.set_sequence_parallel(sequence);
    absl::StatusOr<api::TrainingJobInfo> info = api::AnalyzeTrainingJob(t, "spec.training");
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->variants[0].memory_per_rank_bytes : 0;
  };
  const int64_t m1 = memory(1, 1), m2 = memory(2, 1), m4 = memory(4, 1), s2 = memory(1, 2);
  ASSERT_GT(m1, m2);
  ASSERT_GT(m2, m4);
  ASSERT_GT(m1, s2);
  // Two workers with room for a rank of 2 micro-batches (or of 2 sequence ranks), not of 1.
  const int64_t room = std::max(m2, s2) + (m1 - std::max(m2, s2)) / 2;
  AddWorker("small-0", room, 1, false);
  AddWorker("small-1", room, 1, false);
  const v1::Job job = Submit(request);
  EXPECT_THAT(job.spec().training().config_json(), HasSubstr("\"micro_batches\":2"));
  EXPECT_EQ(job.requested_spec().training().config_json(), config(1));
  const v1::Job stored = Get(job.job_id(), true);
  ASSERT_GE(stored.events_size(), 1);
  EXPECT_THAT(stored.events(0).message(), HasSubstr("out of memory as asked ("));
  EXPECT_THAT(stored.events(0).message(),
              HasSubstr("the recovery ladder runs it with micro_batches 2, sequence_parallel 1"));
  // A retry with the same key and the spec as first asked is the same job.
  absl::StatusOr<v1::SubmitJobResponse> retry = coordinator_->SubmitJob(request);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->created());
  EXPECT_EQ(retry->job().job_id(), job.job_id());

  // Without splitting the batch: two sequence ranks.
  request.set_idempotency_key("ladder-no-split");
  request.mutable_spec()->mutable_recovery()->set_split_batch(false);
  const v1::Job ranks = Submit(request);
  EXPECT_EQ(ranks.spec().training().sequence_parallel(), 2);
  EXPECT_THAT(ranks.spec().training().config_json(), HasSubstr("\"micro_batches\":1"));

  // No fallback allowed: refused as before, with the planner's numbers.
  request.set_idempotency_key("ladder-none");
  request.mutable_spec()->mutable_recovery()->set_more_ranks(false);
  absl::StatusOr<v1::SubmitJobResponse> refused = coordinator_->SubmitJob(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr("ladder")));

  // Training has no lower precision to fall back to: refused, naming the field.
  request.set_idempotency_key("ladder-precision");
  request.mutable_spec()->mutable_recovery()->set_lower_precision(true);
  absl::StatusOr<v1::SubmitJobResponse> precision = coordinator_->SubmitJob(request);
  EXPECT_EQ(precision.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(precision.status().message()),
              HasSubstr("spec.recovery.lower_precision"));
}

// An attention job keeps its shape unless its policy allows more: with more_ranks, one that no
// worker holds on one rank runs on two.
TEST_F(CoordinatorTest, AnAttentionJobMovesDownTheLadderOnlyWhenItsPolicySays) {
  v1::SubmitJobRequest request = ValidRequest("attention-ladder");
  v1::AttentionJobSpec* a = request.mutable_spec()->mutable_attention();
  a->mutable_shape()->set_seq_len(65536);
  a->mutable_shape()->set_num_heads(8);
  a->mutable_shape()->set_head_dim(64);
  auto memory = [&](int ranks) {
    v1::AttentionJobSpec job = *a;
    job.set_num_ranks(ranks);
    absl::StatusOr<api::AttentionJobInfo> info = api::AnalyzeAttentionJob(job, "spec.attention");
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->variants.back().memory_per_rank_bytes : 0;
  };
  const int64_t p1 = memory(1), p2 = memory(2);
  ASSERT_GT(p1, p2);
  AddWorker("half-0", (p1 + p2) / 2, 1, false);
  AddWorker("half-1", (p1 + p2) / 2, 1, false);
  absl::StatusOr<v1::SubmitJobResponse> refused = coordinator_->SubmitJob(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  request.mutable_spec()->mutable_recovery()->set_more_ranks(true);
  const v1::Job job = Submit(request);
  EXPECT_EQ(job.spec().attention().num_ranks(), 2);
  EXPECT_EQ(job.requested_spec().attention().num_ranks(), a->num_ranks());
  EXPECT_THAT(Get(job.job_id(), true).events(0).message(),
              HasSubstr("the recovery ladder runs it with 2 ranks"));
}

// Out of memory while running: a rank that reports RESOURCE_EXHAUSTED moves its job down the
// ladder (more micro-batches here, then more again), each rung a new attempt with the numbers in
// its event and the spec first asked for kept; with no attempt left the job fails as before.
TEST_F(CoordinatorTest, OutOfMemoryWhileRunningMovesDownTheLadder) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key("oom-ladder");
  v1::TrainingJobSpec* training = request.mutable_spec()->mutable_training();
  training->set_config_json(LadderTrainingConfig(1));
  training->set_device(v1::DEVICE_PREFERENCE_CPU);
  FakeWorker* worker = AddWorker("roomy-0", int64_t{64} << 30);
  const v1::Job job = Submit(request);
  EXPECT_EQ(job.spec().training().config_json(), LadderTrainingConfig(1));
  auto fail_next = [&](int attempt) -> std::string {
    std::optional<v1::WorkerCommand> assign = worker->Next();
    EXPECT_TRUE(assign.has_value());
    if (!assign.has_value()) return "";
    EXPECT_EQ(assign->assign().attempt(), attempt);
    const std::string config = assign->assign().spec().training().config_json();
    EXPECT_TRUE(worker
                    ->Fail(assign->assign().task_id(), absl::StatusCode::kResourceExhausted,
                           "allocating activations (1.2 GiB) failed")
                    .ok());
    return config;
  };
  fail_next(1);
  v1::Job after = Get(job.job_id(), true);
  EXPECT_EQ(after.attempt(), 2);  // Requeued (and perhaps placed again already).
  EXPECT_THAT(after.spec().training().config_json(), HasSubstr("\"micro_batches\":2"));
  EXPECT_EQ(after.requested_spec().training().config_json(), training->config_json());
  EXPECT_THAT(EventsText(after),
              HasSubstr("out of memory while running: the recovery ladder runs it with "
                        "micro_batches 2, sequence_parallel 1 ("));
  EXPECT_THAT(EventsText(after), HasSubstr(" planned per rank"));
  // The second attempt runs the rung; out of memory again, the next rung.
  EXPECT_THAT(fail_next(2), HasSubstr("\"micro_batches\":2"));
  after = Get(job.job_id());
  EXPECT_THAT(after.spec().training().config_json(), HasSubstr("\"micro_batches\":4"));
  // The third and last attempt: out of memory again fails the job, with the planner's numbers.
  EXPECT_THAT(fail_next(3), HasSubstr("\"micro_batches\":4"));
  ASSERT_TRUE(WaitState(job.job_id(), v1::JOB_STATE_FAILED));
  EXPECT_THAT(Get(job.job_id()).state_reason(), HasSubstr("attempt"));
  EXPECT_THAT(Get(job.job_id()).state_reason(), HasSubstr("allocating activations"));
  // A retry of the request as first asked is still the same job.
  absl::StatusOr<v1::SubmitJobResponse> retry = coordinator_->SubmitJob(request);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->created());
  EXPECT_EQ(retry->job().job_id(), job.job_id());

  // With no rung allowed, the first out of memory fails the job with the planner's numbers (it
  // is not rerun as it was, to run out again).
  request.set_idempotency_key("oom-no-ladder");
  request.mutable_spec()->mutable_recovery()->set_split_batch(false);
  request.mutable_spec()->mutable_recovery()->set_more_ranks(false);
  const v1::Job fixed = Submit(request);
  fail_next(1);
  ASSERT_TRUE(WaitState(fixed.job_id(), v1::JOB_STATE_FAILED));
  EXPECT_THAT(Get(fixed.job_id()).state_reason(), HasSubstr("planner estimate"));
}

// An attention job moves down the ladder while running only as its policy says: with more_ranks,
// a rank out of memory on one worker makes it a 2-rank ring; without, it fails as before
// (OutOfMemoryFailsWithThePlannerEstimate).
TEST_F(CoordinatorTest, AnAttentionJobOutOfMemoryWhileRunningSpreadsOverMoreRanks) {
  v1::SubmitJobRequest request = ValidRequest("attention-oom-ladder");
  v1::AttentionJobSpec* a = request.mutable_spec()->mutable_attention();
  a->mutable_shape()->set_seq_len(65536);
  a->mutable_shape()->set_num_heads(8);
  a->mutable_shape()->set_head_dim(64);
  request.mutable_spec()->mutable_recovery()->set_more_ranks(true);
  FakeWorker* w0 = AddWorker("oom-0", int64_t{64} << 30);
  FakeWorker* w1 = AddWorker("oom-1", int64_t{64} << 30);
  const v1::Job job = Submit(request);
  EXPECT_EQ(job.spec().attention().num_ranks(), 1);
  std::optional<v1::WorkerCommand> assign = w0->Next(absl::Milliseconds(500));
  FakeWorker* ran = w0;
  if (!assign.has_value()) {
    assign = w1->Next();
    ran = w1;
  }
  ASSERT_TRUE(assign.has_value());
  ASSERT_TRUE(
      ran->Fail(assign->assign().task_id(), absl::StatusCode::kResourceExhausted, "cudaMalloc")
          .ok());
  const v1::Job after = Get(job.job_id(), true);
  EXPECT_EQ(after.spec().attention().num_ranks(), 2);
  EXPECT_EQ(after.requested_spec().attention().num_ranks(), 1);
  EXPECT_THAT(EventsText(after), HasSubstr("the recovery ladder runs it with 2 ranks ("));
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

// Per-tenant quotas refuse a new job with RESOURCE_EXHAUSTED naming the quota; a retry of an
// accepted job is answered whatever the quota says; another tenant has its own.
TEST_F(CoordinatorTest, TenantQuotasRefuseNewJobsButNotRetries) {
  options_.quotas.max_queued_jobs = 2;
  UseFakeClock();
  v1::SubmitJobRequest a1 = ValidRequest("a1"), a2 = ValidRequest("a2"), a3 = ValidRequest("a3");
  for (v1::SubmitJobRequest* r : {&a1, &a2, &a3}) r->mutable_spec()->set_tenant("alice");
  const v1::Job first = Submit(a1);
  Submit(a2);
  absl::StatusOr<v1::SubmitJobResponse> third = coordinator_->SubmitJob(a3);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(third.status().message()),
      HasSubstr("tenant \"alice\" has 2 queued jobs, its quota (--tenant-max-queued-jobs 2)"));
  absl::StatusOr<v1::SubmitJobResponse> retry = coordinator_->SubmitJob(a1);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->created());
  EXPECT_EQ(retry->job().job_id(), first.job_id());
  v1::SubmitJobRequest b1 = ValidRequest("b1");
  b1.mutable_spec()->set_tenant("bob");
  EXPECT_TRUE(coordinator_->SubmitJob(b1).ok());
  // A job that leaves the queue makes room.
  ASSERT_TRUE(Cancel(first.job_id()).ok());
  EXPECT_TRUE(coordinator_->SubmitJob(a3).ok());
}

// The quota on running ranks: a tenant's jobs beyond it wait in the queue (saying why) while
// another tenant's run; a job larger than the quota is refused; a finished rank lets the next in.
TEST_F(CoordinatorTest, TenantRunningRanksQuotaHoldsJobsBackAndRefusesLargerOnes) {
  options_.quotas.max_running_ranks = 2;
  Restart();
  std::vector<FakeWorker*> workers;
  for (int i = 0; i < 4; ++i) workers.push_back(AddWorker(absl::StrCat("cpu-", i)));
  v1::SubmitJobRequest large = RingRequest("a-large", 4);
  large.mutable_spec()->set_tenant("alice");
  absl::StatusOr<v1::SubmitJobResponse> refused = coordinator_->SubmitJob(large);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("tenant \"alice\" may hold at most 2 ranks at once "
                        "(--tenant-max-running-ranks) and the job asks for 4"));

  std::vector<std::string> alice;
  for (int i = 0; i < 3; ++i) {
    v1::SubmitJobRequest r = ValidRequest(absl::StrCat("a", i));
    r.mutable_spec()->set_tenant("alice");
    alice.push_back(Submit(r).job_id());
  }
  v1::SubmitJobRequest b = ValidRequest("b0");
  b.mutable_spec()->set_tenant("bob");
  const std::string bob = Submit(b).job_id();
  ASSERT_TRUE(WaitState(alice[0], v1::JOB_STATE_PLACED));
  ASSERT_TRUE(WaitState(alice[1], v1::JOB_STATE_PLACED));
  ASSERT_TRUE(WaitState(bob, v1::JOB_STATE_PLACED)) << "another tenant is not held back";
  v1::Job waiting = Get(alice[2]);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(waiting.state_reason(),
              HasSubstr("waiting: tenant \"alice\" holds 2 ranks of its quota of 2 "
                        "(--tenant-max-running-ranks), the job asks for 1"));

  // One of alice's ranks finishes: her third job starts on the free worker.
  const std::string first_worker = Get(alice[0]).worker_ids(0);
  for (FakeWorker* w : workers) {
    if (w->id() != first_worker) continue;
    std::optional<v1::WorkerCommand> command = w->Next();
    ASSERT_TRUE(command.has_value() && command->has_assign());
    ASSERT_TRUE(w->Report(command->assign().task_id(), v1::TASK_STATE_STARTED).ok());
    ASSERT_TRUE(w->Report(command->assign().task_id(), v1::TASK_STATE_SUCCEEDED).ok());
  }
  ASSERT_TRUE(WaitState(alice[0], v1::JOB_STATE_SUCCEEDED));
  ASSERT_TRUE(WaitState(alice[2], v1::JOB_STATE_PLACED));
  EXPECT_THAT(Get(alice[2]).state_reason(), Not(HasSubstr("waiting")));
}

TEST_F(CoordinatorTest, TenantSubmitRateFollowsTheClock) {
  options_.quotas.submits_per_second = 1;
  UseFakeClock();
  EXPECT_TRUE(coordinator_->SubmitJob(ValidRequest("r1")).ok());
  absl::StatusOr<v1::SubmitJobResponse> fast = coordinator_->SubmitJob(ValidRequest("r2"));
  EXPECT_EQ(fast.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fast.status().message()), HasSubstr("--tenant-submits-per-second"));
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(coordinator_->SubmitJob(ValidRequest("r2")).ok());
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
  v1::TensorHeader header;
  header.set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {1, 256, 2, 16}) header.add_shape(d);
  header.set_total_bytes(static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(worker->Upload(assign.task_id(), header, bytes).ok());
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
  EXPECT_FALSE(result.has_output());  // Outputs are read with ReadOutput.
  EXPECT_THAT(result.output_info().shape(), ElementsAre(1, 256, 2, 16));
  std::string output;
  v1::ReadOutputRequest read;
  read.set_job_id(id);
  ASSERT_TRUE(coordinator_
                  ->ReadOutput(read,
                               [&](const v1::TensorChunk& chunk) {
                                 output += chunk.data();
                                 return true;
                               })
                  .ok());
  EXPECT_EQ(output, bytes);
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
