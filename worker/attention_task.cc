#include "worker/attention_task.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/validate.h"
#include "worker/host_info.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "returned tensors are copied as raw bytes, which the API defines as little-endian"
#endif

namespace dattn {
namespace worker {
namespace {

// Host storage for one tensor, 64-byte aligned for the backend's vector loads.
class HostBuffer {
 public:
  static absl::StatusOr<HostBuffer> Allocate(int64_t bytes, const char* what) {
    const size_t rounded = (static_cast<size_t>(bytes) + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, std::max<size_t>(rounded, 64));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating ", what, " (", FormatBytes(bytes), ") failed"));
    }
    return HostBuffer(p);
  }
  void* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  explicit HostBuffer(void* p) : data_(p) {}
  std::unique_ptr<void, Free> data_;
};

struct Checksum {
  double sum = 0;
  double sum_squares = 0;
};

void Accumulate(const TensorView& view, Checksum* acc) {
  const int64_t n = view.NumElements();
  if (view.dtype == DType::kFloat32) {
    const float* p = static_cast<const float*>(view.data);
    for (int64_t i = 0; i < n; ++i) {
      const double x = p[i];
      acc->sum += x;
      acc->sum_squares += x * x;
    }
  } else {
    const double* p = static_cast<const double*>(view.data);
    for (int64_t i = 0; i < n; ++i) {
      acc->sum += p[i];
      acc->sum_squares += p[i] * p[i];
    }
  }
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

absl::StatusOr<AttentionSpec> ToEngineSpec(const v1::AttentionSpec& api) {
  AttentionSpec spec;
  spec.segment_lengths.assign(api.segment_lengths().begin(), api.segment_lengths().end());
  spec.dilation_rates.assign(api.dilation_rates().begin(), api.dilation_rates().end());
  if (api.has_scale()) spec.scale = api.scale();
  spec.causal = api.causal();
  switch (api.mode()) {
    case v1::ATTENTION_MODE_UNSPECIFIED:
    case v1::ATTENTION_MODE_GROUPED:
      spec.mode = AttentionMode::kGrouped;
      break;
    case v1::ATTENTION_MODE_MIXTURE:
      spec.mode = AttentionMode::kMixture;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("attention.mode ", static_cast<int>(api.mode()),
                       " is not a dattn.v1 AttentionMode (GROUPED=1, MIXTURE=2)"));
  }
  switch (api.head_offsets()) {
    case v1::HEAD_OFFSETS_UNSPECIFIED:
    case v1::HEAD_OFFSETS_MODULO:
      spec.head_offsets = HeadOffsets::kModulo;
      break;
    case v1::HEAD_OFFSETS_BLOCKED:
      spec.head_offsets = HeadOffsets::kBlocked;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("attention.head_offsets ", static_cast<int>(api.head_offsets()),
                       " is not a dattn.v1 HeadOffsets (MODULO=1, BLOCKED=2)"));
  }
  return spec;
}

absl::StatusOr<DType> ToEngineDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    case v1::DTYPE_FP32:
      return DType::kFloat32;
    case v1::DTYPE_FP64:
      return DType::kFloat64;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError("dtype is DTYPE_UNSPECIFIED: a job must say its precision");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype), " is not a dattn.v1 DType"));
  }
}

v1::DType ToApiDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return v1::DTYPE_FP16;
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
    case DType::kFloat32:
      return v1::DTYPE_FP32;
    case DType::kFloat64:
      return v1::DTYPE_FP64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<AttentionTaskPlan> PlanAttentionTask(const v1::TaskAssignment& task,
                                                    const BackendCaps& caps, int num_threads) {
  if (!task.spec().has_attention()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", task.task_id(), " has no attention work in its JobSpec"));
  }
  const v1::AttentionJobSpec& job = task.spec().attention();
  if (task.ring().size() > 1 || job.num_ranks() > 1) {
    return absl::UnimplementedError(
        absl::StrCat("multi-rank tasks need the ring engine (task ", task.task_id(), " has ",
                     std::max(task.ring().size(), job.num_ranks()), " ranks)"));
  }
  if (caps.device != Device::kCpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "attention task runner allocates host memory; backend ", caps.name, " is not on the host"));
  }
  AttentionTaskPlan plan;
  absl::StatusOr<AttentionSpec> spec = ToEngineSpec(job.attention());
  if (!spec.ok()) return spec.status();
  plan.spec = *std::move(spec);
  absl::StatusOr<DType> dtype = ToEngineDType(job.dtype());
  if (!dtype.ok()) return dtype.status();
  plan.dtype = *dtype;
  switch (job.pass()) {
    case v1::PASS_UNSPECIFIED:
    case v1::PASS_FORWARD:
      plan.backward = false;
      break;
    case v1::PASS_FORWARD_BACKWARD:
      plan.backward = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("pass ", static_cast<int>(job.pass()), " is not a dattn.v1 Pass"));
  }
  if (job.iterations() < 0 || job.iterations() > kMaxIterations) {
    return absl::InvalidArgumentError(
        absl::StrCat("iterations ", job.iterations(), " outside 1 .. ", kMaxIterations));
  }
  plan.iterations = job.iterations() == 0 ? 1 : job.iterations();
  plan.seed = job.seed();
  plan.full = FullShape{job.shape().batch(), job.shape().seq_len(), job.shape().num_heads(),
                        job.shape().head_dim()};

  absl::Status valid = ValidateSpec(plan.spec);
  if (valid.ok()) {
    valid = ValidateProblem(plan.spec, plan.full.batch, plan.full.seq_len, plan.full.num_heads,
                            plan.full.head_dim, plan.dtype, caps);
  }
  if (!valid.ok()) return valid;

  plan.rank = 0;
  plan.num_ranks = 1;
  plan.positions = RankPositions(plan.full.seq_len, plan.rank, plan.num_ranks);
  ProblemShape shape{plan.full.batch, plan.positions.size(), plan.full.num_heads,
                     plan.full.head_dim};
  PlanOptions options;
  options.backend = BackendKind::kCpu;
  options.dtype = plan.dtype;
  options.backward = plan.backward;
  options.num_threads = num_threads;
  absl::StatusOr<MemoryPlan> memory = PlanAttentionMemory(plan.spec, shape, options);
  if (!memory.ok()) return memory.status();
  plan.memory = *memory;
  // The planner has checked that the byte counts of these tensors fit in int64.
  plan.tensor_bytes = plan.full.batch * plan.positions.size() * plan.full.num_heads *
                      plan.full.head_dim * static_cast<int64_t>(DTypeSize(plan.dtype));

  plan.return_output = job.return_output() && plan.rank == 0;
  if (plan.return_output) {
    if (plan.tensor_bytes > kMaxReturnedOutputBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("return_output: the output is ", FormatBytes(plan.tensor_bytes),
                       ", over the limit of ", FormatBytes(kMaxReturnedOutputBytes)));
    }
  }
  plan.flops_per_step =
      dilation::NominalForwardFlops(plan.spec, plan.full.batch, plan.positions.size(),
                                    plan.full.num_heads, plan.full.head_dim) *
      (plan.backward ? 3.5 : 1.0);
  return plan;
}

absl::StatusOr<AttentionTaskResult> RunAttentionTask(const v1::TaskAssignment& task,
                                                     AttentionBackend* backend,
                                                     const AttentionTaskOptions& options) {
  absl::StatusOr<AttentionTaskPlan> planned =
      PlanAttentionTask(task, backend->caps(), options.num_threads);
  if (!planned.ok()) return planned.status();
  const AttentionTaskPlan& plan = *planned;

  int64_t available = options.available_memory_bytes;
  if (available < 0) {
    absl::StatusOr<int64_t> free_bytes = ReadMeminfoBytes("MemAvailable");
    if (!free_bytes.ok()) return free_bytes.status();
    available = *free_bytes;
  }
  if (plan.memory.total_bytes() > available) {
    return absl::ResourceExhaustedError(
        absl::StrCat("task ", task.task_id(), " needs ", plan.memory.DebugString(), " but only ",
                     FormatBytes(available), " of host memory is free"));
  }

  const std::vector<int64_t> shape = {plan.full.batch, plan.positions.size(), plan.full.num_heads,
                                      plan.full.head_dim};
  const int64_t tensor_bytes = plan.tensor_bytes;
  std::vector<HostBuffer> buffers;
  auto make_view = [&](DType dtype, std::vector<int64_t> dims, int64_t bytes,
                       const char* what) -> absl::StatusOr<TensorView> {
    absl::StatusOr<HostBuffer> buffer = HostBuffer::Allocate(bytes, what);
    if (!buffer.ok()) return buffer.status();
    buffers.push_back(*std::move(buffer));
    return TensorView::Contiguous(buffers.back().data(), dtype, std::move(dims));
  };
  const char* kNames[] = {"q", "k", "v", "dout"};
  const int num_inputs = plan.backward ? 4 : 3;
  TensorView inputs[4];
  for (int t = 0; t < num_inputs; ++t) {
    if (options.is_cancelled && options.is_cancelled()) {
      return absl::CancelledError(
          absl::StrCat("task ", task.task_id(), " cancelled before its first step"));
    }
    absl::StatusOr<TensorView> view = make_view(plan.dtype, shape, tensor_bytes, kNames[t]);
    if (!view.ok()) return view.status();
    inputs[t] = *view;
    absl::Status filled = FillStandardNormal(plan.seed, static_cast<InputTensor>(t), plan.full,
                                             plan.positions, inputs[t], options.num_threads);
    if (!filled.ok()) return filled;
  }
  const std::vector<int64_t> lse_shape = {plan.full.batch, plan.full.num_heads,
                                          plan.positions.size()};
  const int64_t out_count = plan.backward ? 4 : 1;
  TensorView outputs[4];  // out, dq, dk, dv
  const char* kOutNames[] = {"out", "dq", "dk", "dv"};
  for (int t = 0; t < out_count; ++t) {
    absl::StatusOr<TensorView> view = make_view(plan.dtype, shape, tensor_bytes, kOutNames[t]);
    if (!view.ok()) return view.status();
    outputs[t] = *view;
  }
  absl::StatusOr<TensorView> lse =
      make_view(LseDType(plan.dtype), lse_shape, plan.memory.lse_bytes, "lse");
  if (!lse.ok()) return lse.status();

  ForwardArgs fwd;
  fwd.q = inputs[0];
  fwd.k = inputs[1];
  fwd.v = inputs[2];
  fwd.out = outputs[0];
  fwd.lse = *lse;
  BackwardArgs bwd;
  if (plan.backward) {
    bwd.q = inputs[0];
    bwd.k = inputs[1];
    bwd.v = inputs[2];
    bwd.out = outputs[0];
    bwd.lse = *lse;
    bwd.dout = inputs[3];
    bwd.dq = outputs[1];
    bwd.dk = outputs[2];
    bwd.dv = outputs[3];
  }

  if (options.on_started) options.on_started();
  std::vector<double> step_seconds;
  step_seconds.reserve(static_cast<size_t>(plan.iterations));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point first = Clock::now();
  Clock::time_point last = first;
  for (int64_t step = 0; step < plan.iterations; ++step) {
    if (options.is_cancelled && options.is_cancelled()) {
      return absl::CancelledError(absl::StrCat("task ", task.task_id(), " cancelled after ", step,
                                               " of ", plan.iterations, " steps"));
    }
    const Clock::time_point begin = Clock::now();
    absl::Status status = backend->Forward(plan.spec, fwd);
    if (status.ok() && plan.backward) status = backend->Backward(plan.spec, bwd);
    last = Clock::now();
    if (!status.ok()) return status;
    step_seconds.push_back(std::chrono::duration<double>(last - begin).count());
    if (options.on_progress) options.on_progress(step + 1, plan.iterations);
  }

  AttentionTaskResult result;
  result.steps_done = plan.iterations;
  result.flops_per_step = plan.flops_per_step;
  v1::RankResult& rank = result.rank_result;
  rank.set_rank(plan.rank);
  rank.set_seconds_total(std::chrono::duration<double>(last - first).count());
  const double median = Median(step_seconds);
  rank.set_seconds_per_step(median);
  rank.set_tflops(median > 0 ? plan.flops_per_step / median / 1e12 : 0.0);
  Checksum out_sum;
  Accumulate(outputs[0], &out_sum);
  rank.set_out_sum(out_sum.sum);
  rank.set_out_sum_squares(out_sum.sum_squares);
  if (plan.backward) {
    Checksum grad_sum;
    for (int t = 1; t < 4; ++t) Accumulate(outputs[t], &grad_sum);
    rank.set_grad_sum(grad_sum.sum);
    rank.set_grad_sum_squares(grad_sum.sum_squares);
  }
  rank.set_peak_memory_bytes(plan.memory.outputs_bytes + plan.memory.lse_bytes +
                             plan.memory.workspace_bytes);
  if (plan.return_output) {
    result.has_output = true;
    result.output.set_dtype(ToApiDType(plan.dtype));
    for (int64_t d : shape) result.output.add_shape(d);
    result.output.set_data(static_cast<const char*>(outputs[0].data),
                           static_cast<size_t>(tensor_bytes));
  }
  return result;
}

}  // namespace worker
}  // namespace dattn
