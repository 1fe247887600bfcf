#include "worker/attention_task.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/cpu_backend.h"
#include "engine/validate.h"
#include "gtest/gtest.h"
#include "worker/random_inputs.h"

namespace dattn {
namespace worker {
namespace {

v1::TaskAssignment SmallTask(v1::DType dtype, v1::Pass pass, int iterations) {
  v1::TaskAssignment task;
  task.set_task_id("j-test/1/0");
  task.set_job_id("j-test");
  task.set_attempt(1);
  v1::AttentionJobSpec* job = task.mutable_spec()->mutable_attention();
  job->mutable_attention()->add_segment_lengths(16);
  job->mutable_attention()->add_segment_lengths(32);
  job->mutable_attention()->add_dilation_rates(1);
  job->mutable_attention()->add_dilation_rates(2);
  job->mutable_attention()->set_causal(true);
  job->mutable_shape()->set_batch(2);
  job->mutable_shape()->set_seq_len(80);   // Not a multiple of 32: a partial last segment.
  job->mutable_shape()->set_num_heads(3);  // H % G != 0.
  job->mutable_shape()->set_head_dim(8);
  job->set_dtype(dtype);
  job->set_num_ranks(1);
  job->set_pass(pass);
  job->set_iterations(iterations);
  job->set_seed(2024);
  return task;
}

// The inputs and outputs of a direct engine call on the task's problem.
struct Direct {
  std::vector<char> q, k, v, dout, out, lse, dq, dk, dv;
};

template <typename T>
void Sums(const std::vector<char>& bytes, double* sum, double* sum_squares) {
  const T* p = reinterpret_cast<const T*>(bytes.data());
  for (size_t i = 0; i < bytes.size() / sizeof(T); ++i) {
    *sum += p[i];
    *sum_squares += static_cast<double>(p[i]) * p[i];
  }
}

// Runs the engine directly on inputs made from the job's seed: what the task must reproduce.
Direct RunDirect(const v1::TaskAssignment& task, int threads) {
  const v1::AttentionJobSpec& job = task.spec().attention();
  AttentionSpec spec = *ToEngineSpec(job.attention());
  const DType dtype = *ToEngineDType(job.dtype());
  const FullShape full{job.shape().batch(), job.shape().seq_len(), job.shape().num_heads(),
                       job.shape().head_dim()};
  const std::vector<int64_t> shape = {full.batch, full.seq_len, full.num_heads, full.head_dim};
  const size_t bytes =
      static_cast<size_t>(full.batch * full.seq_len * full.num_heads * full.head_dim) *
      DTypeSize(dtype);
  Direct d;
  for (std::vector<char>* t : {&d.q, &d.k, &d.v, &d.dout, &d.out, &d.dq, &d.dk, &d.dv}) {
    t->assign(bytes, 0);
  }
  d.lse.assign(
      static_cast<size_t>(full.batch * full.num_heads * full.seq_len) * DTypeSize(LseDType(dtype)),
      0);
  auto view = [&](std::vector<char>& t) { return TensorView::Contiguous(t.data(), dtype, shape); };
  std::vector<char>* inputs[] = {&d.q, &d.k, &d.v, &d.dout};
  for (int t = 0; t < 4; ++t) {
    EXPECT_TRUE(FillStandardNormal(job.seed(), static_cast<InputTensor>(t), full, {0, full.seq_len},
                                   view(*inputs[t]))
                    .ok());
  }
  CpuBackendOptions options;
  options.num_threads = threads;
  std::unique_ptr<AttentionBackend> backend = NewCpuBackend(options);
  ForwardArgs fwd{view(d.q), view(d.k), view(d.v), view(d.out),
                  TensorView::Contiguous(d.lse.data(), LseDType(dtype),
                                         {full.batch, full.num_heads, full.seq_len})};
  absl::Status status = backend->Forward(spec, fwd);
  EXPECT_TRUE(status.ok()) << status;
  if (job.pass() == v1::PASS_FORWARD_BACKWARD) {
    BackwardArgs bwd{view(d.q),    view(d.k),  view(d.v),  view(d.out), fwd.lse,
                     view(d.dout), view(d.dq), view(d.dk), view(d.dv)};
    status = backend->Backward(spec, bwd);
    EXPECT_TRUE(status.ok()) << status;
  }
  return d;
}

std::unique_ptr<AttentionBackend> Backend(int threads) {
  CpuBackendOptions options;
  options.num_threads = threads;
  return NewCpuBackend(options);
}

void ExpectRelNear(double got, double want, double tol, const char* what) {
  EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want)))
      << what << ": got " << got << " want " << want;
}

TEST(AttentionTaskTest, ForwardChecksumsAndOutputMatchADirectEngineCall) {
  for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP64}) {
    v1::TaskAssignment task = SmallTask(dtype, v1::PASS_FORWARD, 3);
    task.mutable_spec()->mutable_attention()->set_return_output(true);
    std::unique_ptr<AttentionBackend> backend = Backend(2);
    AttentionTaskOptions options;
    options.num_threads = 2;
    absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, backend.get(), options);
    ASSERT_TRUE(result.ok()) << result.status();

    Direct d = RunDirect(task, 2);
    double sum = 0, sum_squares = 0;
    if (dtype == v1::DTYPE_FP32) {
      Sums<float>(d.out, &sum, &sum_squares);
    } else {
      Sums<double>(d.out, &sum, &sum_squares);
    }
    ASSERT_GT(sum_squares, 1.0);  // A zero output would make the comparison meaningless.
    ExpectRelNear(result->rank_result.out_sum(), sum, 1e-12, "out_sum");
    ExpectRelNear(result->rank_result.out_sum_squares(), sum_squares, 1e-12, "out_sum_squares");
    EXPECT_EQ(result->rank_result.grad_sum(), 0.0);
    EXPECT_EQ(result->rank_result.grad_sum_squares(), 0.0);

    ASSERT_TRUE(result->has_output);
    EXPECT_EQ(result->output.dtype(), dtype);
    EXPECT_EQ(std::vector<int64_t>(result->output.shape().begin(), result->output.shape().end()),
              (std::vector<int64_t>{2, 80, 3, 8}));
    ASSERT_EQ(result->output.data().size(), d.out.size());
    EXPECT_EQ(0, std::memcmp(result->output.data().data(), d.out.data(), d.out.size()))
        << "returned output differs from the engine's out for " << v1::DType_Name(dtype);
  }
}

TEST(AttentionTaskTest, ForwardBackwardGradChecksumsMatchADirectEngineCall) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 2);
  task.mutable_spec()->mutable_attention()->mutable_attention()->set_mode(
      v1::ATTENTION_MODE_MIXTURE);
  std::unique_ptr<AttentionBackend> backend = Backend(2);
  AttentionTaskOptions options;
  options.num_threads = 2;
  absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, backend.get(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->has_output);

  Direct d = RunDirect(task, 2);
  double out_sum = 0, out_sq = 0, grad_sum = 0, grad_sq = 0;
  Sums<double>(d.out, &out_sum, &out_sq);
  for (const std::vector<char>* g : {&d.dq, &d.dk, &d.dv}) Sums<double>(*g, &grad_sum, &grad_sq);
  ASSERT_GT(grad_sq, 0.0);
  ExpectRelNear(result->rank_result.out_sum(), out_sum, 1e-12, "out_sum");
  ExpectRelNear(result->rank_result.out_sum_squares(), out_sq, 1e-12, "out_sum_squares");
  ExpectRelNear(result->rank_result.grad_sum(), grad_sum, 1e-12, "grad_sum");
  ExpectRelNear(result->rank_result.grad_sum_squares(), grad_sq, 1e-12, "grad_sum_squares");

  AttentionSpec spec = *ToEngineSpec(task.spec().attention().attention());
  const double flops = dilation::NominalForwardFlops(spec, 2, 80, 3, 8) * 3.5;
  EXPECT_DOUBLE_EQ(result->flops_per_step, flops);
  EXPECT_EQ(result->steps_done, 2);
  const v1::RankResult& rank = result->rank_result;
  EXPECT_EQ(rank.rank(), 0);
  EXPECT_GT(rank.seconds_per_step(), 0.0);
  EXPECT_GE(rank.seconds_total(), rank.seconds_per_step());
  EXPECT_DOUBLE_EQ(rank.tflops(), flops / rank.seconds_per_step() / 1e12);
  EXPECT_GT(rank.peak_memory_bytes(), 0);
}

TEST(AttentionTaskTest, ReportsStartAndProgressAfterEveryStep) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 5);
  std::unique_ptr<AttentionBackend> backend = Backend(1);
  std::vector<std::pair<int64_t, int64_t>> progress;
  int started = 0;
  AttentionTaskOptions options;
  options.on_started = [&]() {
    EXPECT_TRUE(progress.empty()) << "on_started must come before any progress";
    ++started;
  };
  options.on_progress = [&](int64_t done, int64_t total) { progress.emplace_back(done, total); };
  absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, backend.get(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(started, 1);
  ASSERT_EQ(progress.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(progress[i].first, i + 1);
    EXPECT_EQ(progress[i].second, 5);
  }
}

TEST(AttentionTaskTest, CancelStopsBetweenSteps) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD_BACKWARD, 100);
  std::unique_ptr<AttentionBackend> backend = Backend(1);
  int64_t steps = 0;
  AttentionTaskOptions options;
  options.on_progress = [&](int64_t done, int64_t) { steps = done; };
  options.is_cancelled = [&]() { return steps >= 2; };
  absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, backend.get(), options);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(steps, 2);
  EXPECT_NE(result.status().message().find("after 2 of 100 steps"), absl::string_view::npos)
      << result.status();

  // Cancelled before anything runs: no step at all.
  steps = 0;
  options.is_cancelled = []() { return true; };
  result = RunAttentionTask(task, backend.get(), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(steps, 0);
}

TEST(AttentionTaskTest, RejectsBadSpecsWithClearErrors) {
  std::unique_ptr<AttentionBackend> backend = Backend(1);
  AttentionTaskOptions options;
  struct Case {
    const char* what;
    std::function<void(v1::TaskAssignment*)> edit;
    absl::StatusCode code;
    const char* needle;  // Expected in the message.
  };
  std::vector<Case> cases = {
      {"H < G",
       [](v1::TaskAssignment* t) {
         t->mutable_spec()->mutable_attention()->mutable_shape()->set_num_heads(1);
       },
       absl::StatusCode::kInvalidArgument, "1"},
      {"lists of different lengths",
       [](v1::TaskAssignment* t) {
         t->mutable_spec()->mutable_attention()->mutable_attention()->add_dilation_rates(4);
       },
       absl::StatusCode::kInvalidArgument, ""},
      {"zero segment",
       [](v1::TaskAssignment* t) {
         t->mutable_spec()->mutable_attention()->mutable_attention()->set_segment_lengths(0, 0);
       },
       absl::StatusCode::kInvalidArgument, "0"},
      {"no dtype",
       [](v1::TaskAssignment* t) {
         t->mutable_spec()->mutable_attention()->set_dtype(v1::DTYPE_UNSPECIFIED);
       },
       absl::StatusCode::kInvalidArgument, "DTYPE_UNSPECIFIED"},
      {"fp16 on the CPU",
       [](v1::TaskAssignment* t) {
         t->mutable_spec()->mutable_attention()->set_dtype(v1::DTYPE_FP16);
       },
       absl::StatusCode::kInvalidArgument, "fp16"},
      {"bad mode enum",
       [](v1::TaskAssignment* t) {
         t->mutable_spec()->mutable_attention()->mutable_attention()->set_mode(
             static_cast<v1::AttentionMode>(9));
       },
       absl::StatusCode::kInvalidArgument, "9"},
      {"iterations",
       [](v1::TaskAssignment* t) { t->mutable_spec()->mutable_attention()->set_iterations(-3); },
       absl::StatusCode::kInvalidArgument, "-3"},
      {"no attention work", [](v1::TaskAssignment* t) { t->mutable_spec()->clear_attention(); },
       absl::StatusCode::kInvalidArgument, "attention"},
      {"multi-rank ring", [](v1::TaskAssignment* t) { t->mutable_ring()->set_size(2); },
       absl::StatusCode::kUnimplemented, "ring engine"},
      {"multi-rank job",
       [](v1::TaskAssignment* t) { t->mutable_spec()->mutable_attention()->set_num_ranks(4); },
       absl::StatusCode::kUnimplemented, "ring engine"},
      {"output over 64 MiB",
       [](v1::TaskAssignment* t) {
         v1::AttentionJobSpec* job = t->mutable_spec()->mutable_attention();
         job->mutable_shape()->set_seq_len(1 << 20);
         job->mutable_shape()->set_num_heads(16);
         job->mutable_shape()->set_head_dim(64);
         job->set_return_output(true);
       },
       absl::StatusCode::kInvalidArgument, "64.00 MiB"},
  };
  for (const Case& c : cases) {
    v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 1);
    c.edit(&task);
    bool ran = false;
    options.on_started = [&]() { ran = true; };
    absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, backend.get(), options);
    EXPECT_EQ(result.status().code(), c.code) << c.what << ": " << result.status();
    EXPECT_NE(result.status().message().find(c.needle), absl::string_view::npos)
        << c.what << ": " << result.status();
    EXPECT_FALSE(ran) << c.what;
  }
}

TEST(AttentionTaskTest, RefusesAPlanThatDoesNotFit) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 1);
  std::unique_ptr<AttentionBackend> backend = Backend(1);
  AttentionTaskOptions options;
  options.available_memory_bytes = 4096;
  bool ran = false;
  options.on_started = [&]() { ran = true; };
  absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, backend.get(), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_NE(result.status().message().find("workspace"), absl::string_view::npos)
      << "the plan's DebugString belongs in the message: " << result.status();
  EXPECT_NE(result.status().message().find("4.00 KiB"), absl::string_view::npos) << result.status();
  EXPECT_FALSE(ran);

  // The same task fits with the plan's own total.
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(task, backend->caps(), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  options.available_memory_bytes = plan->memory.total_bytes();
  EXPECT_TRUE(RunAttentionTask(task, backend.get(), options).ok());
}

TEST(AttentionTaskTest, DefaultsOfUnspecifiedEnums) {
  v1::AttentionSpec api;
  api.add_segment_lengths(8);
  api.add_dilation_rates(2);
  AttentionSpec spec = *ToEngineSpec(api);
  EXPECT_EQ(spec.mode, AttentionMode::kGrouped);
  EXPECT_EQ(spec.head_offsets, HeadOffsets::kModulo);
  EXPECT_FALSE(spec.scale.has_value());
  api.set_scale(0.5);
  api.set_mode(v1::ATTENTION_MODE_MIXTURE);
  api.set_head_offsets(v1::HEAD_OFFSETS_BLOCKED);
  spec = *ToEngineSpec(api);
  EXPECT_EQ(spec.mode, AttentionMode::kMixture);
  EXPECT_EQ(spec.head_offsets, HeadOffsets::kBlocked);
  EXPECT_EQ(spec.scale, 0.5);

  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_UNSPECIFIED, 0);
  std::unique_ptr<AttentionBackend> backend = Backend(1);
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(task, backend->caps(), 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->backward);
  EXPECT_EQ(plan->iterations, 1);
}

}  // namespace
}  // namespace worker
}  // namespace dattn
