#include "worker/attention_task.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "api/attention_job.h"
#include "api/rendezvous.h"
#include "engine/attention_spec.h"
#include "engine/comm/tcp_store.h"
#include "engine/cpu_backend.h"
#include "engine/rank_memory_plan.h"
#include "engine/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cpu_device.h"
#include "worker/memory_limit_device.h"
#include "worker/oom_retry.h"
#include "worker/random_inputs.h"
#include "worker/ring_join.h"
#include "worker/test_plans.h"

namespace dattn {
namespace worker {
namespace {

using ::testing::HasSubstr;

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

// The coordinator plans every rank and its assignment carries the plan: these tests plan theirs
// the same way, from the spec as it is when the task runs.
absl::StatusOr<AttentionTaskResult> RunPlanned(const v1::TaskAssignment& task, TaskDevice* device,
                                               const AttentionTaskOptions& options) {
  return RunAttentionTask(Planned(task), device, options);
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

// The host device (tasks make their own backends with the options' thread count).
std::unique_ptr<TaskDevice> Host() {
  absl::StatusOr<std::unique_ptr<TaskDevice>> device = NewCpuDevice();
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *std::move(device) : nullptr;
}

void ExpectRelNear(double got, double want, double tol, const char* what) {
  EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want)))
      << what << ": got " << got << " want " << want;
}

TEST(AttentionTaskTest, ForwardChecksumsAndOutputMatchADirectEngineCall) {
  for (v1::DType dtype : {v1::DTYPE_FP32, v1::DTYPE_FP64}) {
    v1::TaskAssignment task = SmallTask(dtype, v1::PASS_FORWARD, 3);
    task.mutable_spec()->mutable_attention()->set_return_output(true);
    std::unique_ptr<TaskDevice> host = Host();
    AttentionTaskOptions options;
    options.num_threads = 2;
    absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
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
  std::unique_ptr<TaskDevice> host = Host();
  AttentionTaskOptions options;
  options.num_threads = 2;
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
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

// A POSIX shared-memory object of `bytes` bytes for the test, removed when destroyed.
class TestRegion {
 public:
  explicit TestRegion(int64_t bytes)
      : name_(absl::StrCat("/dattn-attention-task-test-", getpid())), bytes_(bytes) {
    shm_unlink(name_.c_str());
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    data_ = static_cast<char*>(
        mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    EXPECT_NE(data_, MAP_FAILED);
  }
  ~TestRegion() {
    munmap(data_, static_cast<size_t>(bytes_));
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  char* data() { return data_; }

 private:
  std::string name_;
  int64_t bytes_;
  char* data_ = nullptr;
};

TEST(AttentionTaskTest, SharedMemoryTasksReadTheirInputsAndWriteTheirOutputsInTheRegion) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 1);
  v1::AttentionJobSpec* job = task.mutable_spec()->mutable_attention();
  job->set_streamed(true);
  const Direct d = RunDirect(task, 2);  // Inputs from the seed, and the engine's answer.
  const int64_t bytes = static_cast<int64_t>(d.q.size());
  // The tensors in an order of their own, 64 bytes apart, after a 100-byte header.
  const v1::AttendTensor order[] = {
      v1::ATTEND_TENSOR_DV, v1::ATTEND_TENSOR_Q, v1::ATTEND_TENSOR_OUT, v1::ATTEND_TENSOR_K,
      v1::ATTEND_TENSOR_DQ, v1::ATTEND_TENSOR_V, v1::ATTEND_TENSOR_DK,  v1::ATTEND_TENSOR_DOUT};
  TestRegion region(100 + 8 * (bytes + 64));
  v1::SharedMemoryRegion* sm = job->mutable_shared_memory();
  sm->set_name(region.name());
  sm->set_byte_size(100 + 8 * (bytes + 64));
  const std::vector<char>* inputs[] = {nullptr, &d.q, &d.k, &d.v, &d.dout};
  std::vector<int64_t> at(9, -1);
  for (int i = 0; i < 8; ++i) {
    at[order[i]] = 100 + i * (bytes + 64);
    sm->add_tensors()->set_tensor(order[i]);
    sm->mutable_tensors(i)->set_offset(static_cast<uint64_t>(at[order[i]]));
    if (order[i] <= v1::ATTEND_TENSOR_DOUT) {
      std::memcpy(region.data() + at[order[i]], inputs[order[i]]->data(), bytes);
    } else {
      std::memset(region.data() + at[order[i]], 0x7f, bytes);
    }
  }
  std::unique_ptr<TaskDevice> host = Host();
  AttentionTaskOptions options;  // No read_inputs / upload_output: nothing is streamed.
  options.num_threads = 2;
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::pair<v1::AttendTensor, const std::vector<char>*> outputs[] = {
      {v1::ATTEND_TENSOR_OUT, &d.out},
      {v1::ATTEND_TENSOR_DQ, &d.dq},
      {v1::ATTEND_TENSOR_DK, &d.dk},
      {v1::ATTEND_TENSOR_DV, &d.dv}};
  for (const auto& [tensor, want] : outputs) {
    EXPECT_EQ(0, std::memcmp(region.data() + at[tensor], want->data(), bytes))
        << v1::AttendTensor_Name(tensor) << " in the region differs from the engine's";
  }
  for (const auto& [tensor, input] : {std::make_pair(v1::ATTEND_TENSOR_Q, &d.q),
                                      std::make_pair(v1::ATTEND_TENSOR_DOUT, &d.dout)}) {
    EXPECT_EQ(0, std::memcmp(region.data() + at[tensor], input->data(), bytes))
        << v1::AttendTensor_Name(tensor) << " was changed";
  }

  // The region's object must exist here and be as large as the call says.
  sm->set_name("/dattn-attention-task-test-absent");
  absl::StatusOr<AttentionTaskResult> absent = RunPlanned(task, host.get(), options);
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(absent.status().message(),
              ::testing::HasSubstr("shared memory /dattn-attention-task-test-absent does not "
                                   "exist on host"));
  sm->set_name(region.name());
  sm->set_byte_size(100 + 8 * (bytes + 64) + 1);
  sm->mutable_tensors(7)->set_offset(100 + 8 * (bytes + 64) + 1 - bytes);
  absl::StatusOr<AttentionTaskResult> small = RunPlanned(task, host.get(), options);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      small.status().message(),
      ::testing::HasSubstr("in " + std::to_string(100 + 8 * (bytes + 64) + 1) + " bytes of it"));
  // The worker checks the layout again: a region that is not the call's is refused at once.
  v1::TaskAssignment planned = Planned(task);
  planned.mutable_spec()
      ->mutable_attention()
      ->mutable_shared_memory()
      ->mutable_tensors(7)
      ->set_tensor(v1::ATTEND_TENSOR_Q);
  absl::StatusOr<AttentionTaskResult> twice = RunAttentionTask(planned, host.get(), options);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), ::testing::HasSubstr("q is placed twice"));
}

TEST(AttentionTaskTest, ReportsStartAndProgressAfterEveryStep) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 5);
  std::unique_ptr<TaskDevice> host = Host();
  std::vector<std::pair<int64_t, int64_t>> progress;
  int started = 0;
  AttentionTaskOptions options;
  options.on_started = [&]() {
    EXPECT_TRUE(progress.empty()) << "on_started must come before any progress";
    ++started;
  };
  options.on_progress = [&](int64_t done, int64_t total) { progress.emplace_back(done, total); };
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
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
  std::unique_ptr<TaskDevice> host = Host();
  int64_t steps = 0;
  AttentionTaskOptions options;
  options.on_progress = [&](int64_t done, int64_t) { steps = done; };
  options.is_cancelled = [&]() { return steps >= 2; };
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(steps, 2);
  EXPECT_NE(result.status().message().find("after 2 of 100 steps"), absl::string_view::npos)
      << result.status();

  // Cancelled before anything runs: no step at all.
  steps = 0;
  options.is_cancelled = []() { return true; };
  result = RunPlanned(task, host.get(), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(steps, 0);
}

TEST(AttentionTaskTest, RejectsBadSpecsWithClearErrors) {
  std::unique_ptr<TaskDevice> host = Host();
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
      {"iterations", [](v1::TaskAssignment* t) { t->mutable_attention_plan()->set_iterations(0); },
       absl::StatusCode::kInvalidArgument, "iterations 0 outside 1 .. 1000000"},
      {"no attention work", [](v1::TaskAssignment* t) { t->mutable_spec()->clear_attention(); },
       absl::StatusCode::kInvalidArgument, "attention"},
      {"no plan", [](v1::TaskAssignment* t) { t->clear_attention_plan(); },
       absl::StatusCode::kInvalidArgument, "carries no attention_plan"},
      {"no memory in the plan",
       [](v1::TaskAssignment* t) { t->mutable_attention_plan()->set_memory_bytes(0); },
       absl::StatusCode::kInvalidArgument, "planned memory 0 must be > 0"},
      {"ring larger than the job", [](v1::TaskAssignment* t) { t->mutable_ring()->set_size(2); },
       absl::StatusCode::kInvalidArgument, "must agree"},
      {"a plan of other positions",
       [](v1::TaskAssignment* t) { t->mutable_attention_plan()->set_position_begin(8); },
       absl::StatusCode::kInvalidArgument, "is not a rank's share of N = 80"},
      {"ranks not dividing N",
       [](v1::TaskAssignment* t) {
         t->mutable_attention_plan()->set_num_ranks(3);
         t->mutable_ring()->set_size(3);
       },
       absl::StatusCode::kInvalidArgument, "is not a rank's share of N = 80"},
      {"rank outside the ring",
       [](v1::TaskAssignment* t) {
         t->mutable_attention_plan()->set_num_ranks(2);
         t->set_rank(2);
         t->mutable_ring()->set_rank(2);
         t->mutable_ring()->set_size(2);
       },
       absl::StatusCode::kInvalidArgument, "rank 2 of 2"},
      {"a ring that is not the plan's",
       [](v1::TaskAssignment* t) {
         t->mutable_attention_plan()->set_num_ranks(2);
         t->mutable_attention_plan()->set_position_end(40);
         t->mutable_ring()->set_size(2);
         t->mutable_ring()->set_rank(1);
       },
       absl::StatusCode::kInvalidArgument, "must agree"},
  };
  for (const Case& c : cases) {
    // The plan of the valid task, then the edit: what the worker itself must catch.
    v1::TaskAssignment task = Planned(SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 1));
    c.edit(&task);
    bool ran = false;
    options.on_started = [&]() { ran = true; };
    absl::StatusOr<AttentionTaskResult> result = RunAttentionTask(task, host.get(), options);
    EXPECT_EQ(result.status().code(), c.code) << c.what << ": " << result.status();
    EXPECT_NE(result.status().message().find(c.needle), absl::string_view::npos)
        << c.what << ": " << result.status();
    EXPECT_FALSE(ran) << c.what;
  }
}

TEST(AttentionTaskTest, RefusesAPlanThatDoesNotFit) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 1);
  std::unique_ptr<TaskDevice> host = Host();
  AttentionTaskOptions options;
  options.available_memory_bytes = 4096;
  bool ran = false;
  options.on_started = [&]() { ran = true; };
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_NE(result.status().message().find("workspace"), absl::string_view::npos)
      << "the plan's breakdown belongs in the message: " << result.status();
  EXPECT_NE(result.status().message().find("4.00 KiB"), absl::string_view::npos) << result.status();
  EXPECT_FALSE(ran);

  // The same task fits with the plan's own total.
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(Planned(task), host->caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  options.available_memory_bytes = plan->memory_bytes;
  EXPECT_TRUE(RunPlanned(task, host.get(), options).ok());
}

// Without a fixed budget, the caller's reserve_memory decides what is free: it is asked once, with
// the plan's total, before anything is allocated; on_allocated then reports every tensor.
TEST(AttentionTaskTest, ReserveMemoryDecidesAndAllocationsAreReported) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 1);
  std::unique_ptr<TaskDevice> host = Host();
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(Planned(task), host->caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t planned = plan->memory_bytes;

  AttentionTaskOptions options;
  std::vector<int64_t> asked;
  int64_t allocated = 0;
  options.reserve_memory = [&](int64_t bytes) -> absl::StatusOr<int64_t> {
    asked.push_back(bytes);
    EXPECT_EQ(allocated, 0) << "asked after allocating";
    return planned - 1;
  };
  options.on_allocated = [&](int64_t bytes) { allocated += bytes; };
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_NE(result.status().message().find(plan->memory_plan), absl::string_view::npos)
      << result.status();
  EXPECT_NE(result.status().message().find(FormatBytes(planned - 1)), absl::string_view::npos)
      << result.status();
  EXPECT_EQ(asked, std::vector<int64_t>{planned});
  EXPECT_EQ(allocated, 0);

  // Its errors end the task unchanged.
  options.reserve_memory = [](int64_t) -> absl::StatusOr<int64_t> {
    return absl::UnavailableError("free memory unreadable");
  };
  result = RunPlanned(task, host.get(), options);
  EXPECT_EQ(result.status(), absl::UnavailableError("free memory unreadable"));

  asked.clear();
  options.reserve_memory = [&](int64_t bytes) -> absl::StatusOr<int64_t> {
    asked.push_back(bytes);
    return bytes;
  };
  result = RunPlanned(task, host.get(), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(asked, std::vector<int64_t>{planned});
  // q, k, v, dout and out, dq, dk, dv, and lse.
  EXPECT_EQ(allocated, 8 * plan->tensor_bytes + plan->lse_bytes);
}

// The worker's own step, at every allocation site (q, k, v, dout, out, dq, dk, dv, lse: the
// fault-injecting device fails the K-th): the tensors allocated so far go back (claimed again),
// the caches are released and the set-up retried once. One failure: the same result as an
// undisturbed run, out_of_memory_retries 1. A second failure (the retry's first allocation):
// RESOURCE_EXHAUSTED saying it was retried, with both messages. Other errors are not retried.
TEST(AttentionTaskTest, OutOfMemoryAtEachAllocationIsRetriedOnceAfterReleasingCaches) {
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 1);
  std::shared_ptr<TaskDevice> host = Host();
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(Planned(task), host->caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<AttentionTaskResult> clean = RunPlanned(task, host.get(), AttentionTaskOptions());
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->rank_result.out_of_memory_retries(), 0);
  constexpr int kSites = 9;
  for (int site = 1; site <= kSites; ++site) {
    SCOPED_TRACE(absl::StrCat("allocation ", site));
    std::unique_ptr<TaskDevice> flaky = NewFailingAllocationsDevice(host, site, 1);
    AttentionTaskOptions options;
    int64_t claimed = plan->memory_bytes;  // As the worker's reserve does.
    options.reserve_memory = [&](int64_t bytes) -> absl::StatusOr<int64_t> { return bytes; };
    options.on_allocated = [&](int64_t bytes) { claimed -= bytes; };
    std::vector<OomRetry> retries;
    options.on_out_of_memory_retry = [&](const OomRetry& r) { retries.push_back(r); };
    absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, flaky.get(), options);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->rank_result.out_of_memory_retries(), 1);
    EXPECT_EQ(result->rank_result.out_sum(), clean->rank_result.out_sum());
    EXPECT_EQ(result->rank_result.grad_sum_squares(), clean->rank_result.grad_sum_squares());
    ASSERT_EQ(retries.size(), 1u);
    EXPECT_TRUE(retries[0].recovered);
    EXPECT_THAT(retries[0].first_error, HasSubstr(absl::StrCat("allocation ", site, " of")));
    // Every tensor counted once in the end: what was freed for the retry was claimed again.
    EXPECT_EQ(claimed, plan->memory_bytes - 8 * plan->tensor_bytes - plan->lse_bytes);

    std::unique_ptr<TaskDevice> twice = NewFailingAllocationsDevice(host, site, 2);
    retries.clear();
    result = RunPlanned(task, twice.get(), options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
    EXPECT_THAT(result.status().message(),
                HasSubstr("retried once after releasing the device's caches, which gave back "));
    EXPECT_THAT(result.status().message(),
                HasSubstr(absl::StrCat("the first attempt: allocating ")));
    ASSERT_EQ(retries.size(), 1u);
    EXPECT_FALSE(retries[0].recovered);
  }
  // Past the last site: nothing fails, nothing is retried.
  std::unique_ptr<TaskDevice> late = NewFailingAllocationsDevice(host, kSites + 1, 1);
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, late.get(), AttentionTaskOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->rank_result.out_of_memory_retries(), 0);
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
  std::unique_ptr<TaskDevice> host = Host();
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(Planned(task), host->caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->backward);
  EXPECT_EQ(plan->iterations, 1);
}

// -------------------------------------------------------------------------------------------------
// Ranks of a ring: threads of this process, each a rank with its own Gloo communicator, meeting
// through a rendezvous store as the coordinator would host it.

// Rank `rank` of the Gloo ring `ring_id` of `size` ranks whose rendezvous store is `store`.
v1::RingInfo GlooRing(const std::string& ring_id, const std::string& store, int rank, int size,
                      int64_t formation_ms, int64_t comm_ms) {
  v1::RingInfo ring;
  ring.set_ring_id(ring_id);
  ring.set_rank(rank);
  ring.set_size(size);
  ring.set_backend("gloo");
  ring.set_store_address(store);
  ring.set_formation_timeout_ms(formation_ms);
  ring.set_comm_timeout_ms(comm_ms);
  return ring;
}

v1::TaskAssignment RingTask(v1::TaskAssignment task, const std::string& store, int rank, int size,
                            int64_t formation_ms = 20000) {
  // Every ring attempt needs an id of its own: its keys in the store must not meet another's.
  const std::string ring_id = absl::StrCat(task.job_id(), "/1");
  task.set_task_id(absl::StrCat(ring_id, "/", rank));
  task.set_rank(rank);
  task.mutable_spec()->mutable_attention()->set_num_ranks(size);
  *task.mutable_ring() = GlooRing(ring_id, store, rank, size, formation_ms, 20000);
  return task;
}

// Runs ranks `ranks` of a ring of `size` on threads; results by rank (absent ranks never run).
std::vector<absl::StatusOr<AttentionTaskResult>> RunRing(
    const v1::TaskAssignment& base, int size, const std::vector<int>& ranks,
    const std::string& store, int64_t formation_ms = 20000,
    const std::function<void(int, AttentionTaskOptions*)>& edit = nullptr) {
  std::vector<absl::StatusOr<AttentionTaskResult>> results(
      size, absl::UnknownError("this rank did not run"));
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      std::unique_ptr<TaskDevice> host = Host();
      AttentionTaskOptions options;
      options.num_threads = 1;
      options.member_name = absl::StrCat("thread-", r);
      if (edit) edit(r, &options);
      results[r] = RunPlanned(RingTask(base, store, r, size, formation_ms), host.get(), options);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

double RelativeError(const std::string& got, const std::string& want) {
  const double* g = reinterpret_cast<const double*>(got.data());
  const double* w = reinterpret_cast<const double*>(want.data());
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size() / sizeof(double); ++i) {
    err += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(err / norm);
}

// Every rank's output shard is the single-rank output's slice (fp64: to 1e-12), and the ranks'
// checksums add up to the single-rank checksums, for patterns whose segments span shards, both
// modes, causal or not, with backward.
TEST(AttentionTaskRingTest, RanksReproduceTheSingleRankRun) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  struct Case {
    v1::AttentionMode mode;
    bool causal;
    int ranks;
  };
  int run = 0;
  for (const Case& c :
       {Case{v1::ATTENTION_MODE_GROUPED, false, 2}, Case{v1::ATTENTION_MODE_MIXTURE, true, 2},
        Case{v1::ATTENTION_MODE_GROUPED, true, 4}, Case{v1::ATTENTION_MODE_MIXTURE, false, 4}}) {
    SCOPED_TRACE(absl::StrCat("mode ", c.mode, " causal ", c.causal, " ranks ", c.ranks));
    // N = 96, w = [16, 64]: the 64-segments cross the shard boundaries at 48 (P = 2) and 24, 72
    // (P = 4), and so do the 16-segments at 24 and 72.
    v1::TaskAssignment task = SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 2);
    v1::AttentionJobSpec* job = task.mutable_spec()->mutable_attention();
    job->mutable_shape()->set_seq_len(96);
    job->mutable_attention()->set_segment_lengths(1, 64);
    job->mutable_attention()->set_mode(c.mode);
    job->mutable_attention()->set_causal(c.causal);
    job->set_return_output(true);
    std::unique_ptr<TaskDevice> host = Host();
    AttentionTaskOptions single_options;
    absl::StatusOr<AttentionTaskResult> single = RunPlanned(task, host.get(), single_options);
    ASSERT_TRUE(single.ok()) << single.status();

    // Each case is a ring attempt of its own, as the coordinator would make it.
    task.set_job_id(absl::StrCat("j-ring-", run++));
    std::vector<int> all(c.ranks);
    for (int r = 0; r < c.ranks; ++r) all[r] = r;
    std::vector<absl::StatusOr<AttentionTaskResult>> ranks =
        RunRing(task, c.ranks, all, (*server)->address());
    double out_sum = 0, out_sq = 0, grad_sum = 0, grad_sq = 0;
    const int64_t b = 2, n = 96, l = n / c.ranks, row = 3 * 8 * 8;  // H * D * sizeof(double)
    for (int r = 0; r < c.ranks; ++r) {
      ASSERT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r].status();
      const AttentionTaskResult& got = *ranks[r];
      EXPECT_EQ(got.rank_result.rank(), r);
      EXPECT_GT(got.ring_formation_seconds, 0.0);
      EXPECT_EQ(got.rank_result.ring_formation_seconds(), got.ring_formation_seconds);
      EXPECT_DOUBLE_EQ(got.flops_per_step, single->flops_per_step / c.ranks);
      ASSERT_TRUE(got.has_output);
      EXPECT_EQ(std::vector<int64_t>(got.output.shape().begin(), got.output.shape().end()),
                (std::vector<int64_t>{b, l, 3, 8}));
      // The shard of batch item bi is rows [r l, (r+1) l) of that item in the single output.
      std::string want;
      for (int64_t bi = 0; bi < b; ++bi) {
        want += single->output.data().substr((bi * n + r * l) * row, l * row);
      }
      EXPECT_LE(RelativeError(got.output.data(), want), 1e-12) << "rank " << r;
      out_sum += got.rank_result.out_sum();
      out_sq += got.rank_result.out_sum_squares();
      grad_sum += got.rank_result.grad_sum();
      grad_sq += got.rank_result.grad_sum_squares();
    }
    const v1::RankResult& one = single->rank_result;
    ExpectRelNear(out_sq, one.out_sum_squares(), 1e-12, "out_sum_squares");
    ExpectRelNear(grad_sq, one.grad_sum_squares(), 1e-12, "grad_sum_squares");
    EXPECT_LE(std::fabs(out_sum - one.out_sum()), 1e-10 * std::sqrt(one.out_sum_squares()));
    EXPECT_LE(std::fabs(grad_sum - one.grad_sum()), 1e-10 * std::sqrt(one.grad_sum_squares()));
  }
}

TEST(AttentionTaskRingTest, ARankThatNeverArrivesFailsTheFormationNamingIt) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 1);
  task.mutable_spec()->mutable_attention()->mutable_shape()->set_seq_len(96);
  const absl::Time start = absl::Now();
  std::vector<absl::StatusOr<AttentionTaskResult>> ranks =
      RunRing(task, 3, {0, 1}, (*server)->address(), /*formation_ms=*/400);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int r : {0, 1}) {
    EXPECT_EQ(ranks[r].status().code(), absl::StatusCode::kDeadlineExceeded) << ranks[r].status();
    EXPECT_NE(ranks[r].status().message().find("rank 2 of 3 never arrived"), std::string::npos)
        << ranks[r].status();
    EXPECT_NE(ranks[r].status().message().find("ring j-test/1 rank"), std::string::npos)
        << ranks[r].status();
  }
}

TEST(AttentionTaskRingTest, ACancelIsSeenWhileWaitingForPeers) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 1);
  const absl::Time start = absl::Now();
  std::vector<v1::RankPhase> phases;
  std::vector<absl::StatusOr<AttentionTaskResult>> ranks =
      RunRing(task, 2, {0}, (*server)->address(), /*formation_ms=*/30000,
              [&](int, AttentionTaskOptions* o) {
                o->is_cancelled = [start] { return absl::Now() - start > absl::Milliseconds(300); };
                o->on_phase = [&](v1::RankPhase p) { phases.push_back(p); };
              });
  EXPECT_EQ(ranks[0].status().code(), absl::StatusCode::kCancelled) << ranks[0].status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(phases,
            (std::vector<v1::RankPhase>{v1::RANK_PHASE_PREPARING, v1::RANK_PHASE_FORMING_RING}));
}

// A peer that passed the arrival barrier and then died leaves this rank inside the communicator's
// own rendezvous (Gloo waits for the peer's address in the store, up to the communicator timeout):
// a cancel still ends the rank promptly.
TEST(AttentionTaskRingTest, ACancelIsSeenWhileFormingTheCommunicator) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> peer =
      comm::TcpStore::Connect((*server)->address());
  ASSERT_TRUE(peer.ok()) << peer.status();
  // Rank 1 "arrives" and is never heard of again.
  ASSERT_TRUE((*peer)->Set(api::JoinedKey("r-dead", 1), "a peer that died after arriving").ok());
  absl::StatusOr<std::unique_ptr<TaskDevice>> device = NewCpuDevice();
  ASSERT_TRUE(device.ok()) << device.status();
  v1::RingInfo ring = GlooRing("r-dead", (*server)->address(), 0, 2, 10000, 60000);
  RingJoinOptions options;
  options.member_name = "rank 0";
  const absl::Time start = absl::Now();
  options.is_cancelled = [start] { return absl::Now() - start > absl::Milliseconds(500); };
  absl::StatusOr<RingMembership> joined = JoinRing(ring, device->get(), options);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kCancelled) << joined.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "waited for the communicator timeout";
}

// A ring's store that requires the attempt's secret: a rank with the RingInfo's secret gets in (and
// gets as far as forming the communicator, where the test cancels it); a rank with another secret,
// or none, is refused at once with PERMISSION_DENIED, not retried until the formation timeout.
TEST(AttentionTaskRingTest, JoiningNeedsTheRingSecret) {
  const std::string secret(32, '\x42');
  comm::TcpStoreServerOptions store_options;
  store_options.secret = secret;
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server =
      comm::TcpStoreServer::Start(store_options);
  ASSERT_TRUE(server.ok()) << server.status();
  comm::TcpStoreOptions peer_options;
  peer_options.secret = secret;
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> peer =
      comm::TcpStore::Connect((*server)->address(), peer_options);
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE((*peer)->Set(api::JoinedKey("r-secret", 1), "rank 1").ok());
  absl::StatusOr<std::unique_ptr<TaskDevice>> device = NewCpuDevice();
  ASSERT_TRUE(device.ok()) << device.status();
  v1::RingInfo ring = GlooRing("r-secret", (*server)->address(), 0, 2, 10000, 60000);
  for (const std::string& wrong : {std::string(), std::string(32, '\x43')}) {
    ring.set_store_secret(wrong);
    RingJoinOptions options;
    options.member_name = "rank 0";
    const absl::Time start = absl::Now();
    absl::StatusOr<RingMembership> joined = JoinRing(ring, device->get(), options);
    EXPECT_EQ(joined.status().code(), absl::StatusCode::kPermissionDenied) << joined.status();
    EXPECT_THAT(std::string(joined.status().message()),
                ::testing::HasSubstr("ring r-secret rank 0 of 2: "));
    EXPECT_THAT(std::string(joined.status().message()),
                ::testing::HasSubstr("wrong or missing ring secret"));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  }
  ring.set_store_secret(secret);
  RingJoinOptions options;
  options.member_name = "rank 0";
  const absl::Time start = absl::Now();
  options.is_cancelled = [start] { return absl::Now() - start > absl::Milliseconds(300); };
  absl::StatusOr<RingMembership> joined = JoinRing(ring, device->get(), options);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kCancelled) << joined.status();
  EXPECT_TRUE((*peer)->Get(api::JoinedKey("r-secret", 0), absl::ZeroDuration()).ok())
      << "rank 0 never arrived in the store";
}

// A cancel aborts the rank's communicator mid-step (the worker does it from another thread); its
// peer then fails with an error that names the aborted rank.
TEST(AttentionTaskRingTest, AbortingOneRankFailsItsPeerNamingIt) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> server = comm::TcpStoreServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  v1::TaskAssignment task = SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD_BACKWARD, 1000000);
  task.mutable_spec()->mutable_attention()->mutable_shape()->set_seq_len(96);
  std::atomic<bool> cancel{false};
  std::atomic<int64_t> rank0_steps{0};
  absl::Mutex mu;
  comm::Communicator* rank0_comm = nullptr;
  std::thread canceller([&] {
    while (rank0_steps.load() < 3) absl::SleepFor(absl::Milliseconds(5));
    cancel = true;
    absl::MutexLock lock(&mu);
    if (rank0_comm != nullptr) rank0_comm->Abort("test cancels rank 0");
  });
  std::vector<absl::StatusOr<AttentionTaskResult>> ranks =
      RunRing(task, 2, {0, 1}, (*server)->address(), 20000, [&](int r, AttentionTaskOptions* o) {
        if (r != 0) return;
        o->is_cancelled = [&] { return cancel.load(); };
        o->on_progress = [&](int64_t done, int64_t) { rank0_steps = done; };
        o->on_communicator = [&](comm::Communicator* c, double) {
          absl::MutexLock lock(&mu);
          rank0_comm = c;
        };
      });
  canceller.join();
  EXPECT_EQ(ranks[0].status().code(), absl::StatusCode::kCancelled) << ranks[0].status();
  const absl::Status& peer = ranks[1].status();
  EXPECT_TRUE(absl::IsUnavailable(peer) || absl::IsDeadlineExceeded(peer) || absl::IsAborted(peer))
      << peer;
  EXPECT_NE(peer.message().find("ring j-test/1 rank 1 of 2, step"), std::string::npos) << peer;
  EXPECT_NE(peer.message().find("rank 0"), std::string::npos) << peer;
}

TEST(AttentionTaskRingTest, RingsThisDeviceCannotFormAreRefused) {
  v1::TaskAssignment task =
      RingTask(SmallTask(v1::DTYPE_FP32, v1::PASS_FORWARD, 1), "127.0.0.1:1", 0, 2);
  task.mutable_ring()->set_backend("nccl");
  std::unique_ptr<TaskDevice> host = Host();
  absl::StatusOr<AttentionTaskResult> result = RunPlanned(task, host.get(), AttentionTaskOptions());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("forms gloo rings, not \"nccl\""), std::string::npos)
      << result.status();
}

// A ring rank takes its shard from the coordinator's plan, whose memory is the ring's largest rank:
// its shard, the ring kernels' scratch (for up to api::kCpuPlanThreads threads) and its exchange
// buffers.
TEST(AttentionTaskRingTest, TakesTheRanksShareFromThePlan) {
  v1::TaskAssignment task =
      RingTask(SmallTask(v1::DTYPE_FP64, v1::PASS_FORWARD_BACKWARD, 1), "127.0.0.1:1", 3, 4);
  std::unique_ptr<TaskDevice> host = Host();
  absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(Planned(task), host->caps());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->rank, 3);
  EXPECT_EQ(plan->num_ranks, 4);
  EXPECT_EQ(plan->positions.begin, 60);
  EXPECT_EQ(plan->positions.end, 80);
  EXPECT_EQ(plan->tensor_bytes, 2 * 20 * 3 * 8 * 8);
  EXPECT_EQ(plan->lse_bytes, 2 * 3 * 20 * 8);
  absl::StatusOr<api::AttentionJobInfo> info =
      api::AnalyzeAttentionJob(task.spec().attention(), "spec.attention");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(plan->memory_bytes, info->variants.back().memory_per_rank_bytes);
  EXPECT_GT(plan->memory_bytes,
            8 * plan->tensor_bytes + plan->lse_bytes +
                api::kCpuPlanThreads * CpuRingKernelScratchBytes(DType::kFloat64, 8));
  EXPECT_NE(plan->memory_plan.find("ring buffers"), std::string::npos) << plan->memory_plan;
}

}  // namespace
}  // namespace worker
}  // namespace dattn
