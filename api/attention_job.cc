#include "api/attention_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/attend_tensors.h"
#include "api/engine_convert.h"
#include "api/limits.h"
#include "engine/attention.h"
#include "engine/memory_plan.h"
#include "engine/rank_memory_plan.h"
#include "engine/validate.h"

namespace dattn {
namespace api {
namespace {

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// Backend capabilities the coordinator validates against. The CPU backend runs fp32 and fp64 at any
// D; GPU workers run fp16, bf16 and fp32 (attention.proto); a GPU worker's own head_dims list is
// honoured at placement time.
BackendCaps CpuCaps() {
  return BackendCaps{"cpu", Device::kCpu, {DType::kFloat32, DType::kFloat64}, {}};
}
BackendCaps GpuCaps() {
  return BackendCaps{
      "cuda", Device::kCuda, {DType::kFloat16, DType::kBFloat16, DType::kFloat32}, {}};
}

bool Supports(const BackendCaps& caps, DType dtype) {
  for (DType d : caps.dtypes) {
    if (d == dtype) return true;
  }
  return false;
}

std::string DTypeNames(const BackendCaps& caps) {
  std::vector<std::string> names;
  for (DType d : caps.dtypes) names.push_back(DTypeName(d));
  return absl::StrJoin(names, ", ");
}

// One device kind for the job: checks the dtype against its capabilities, then the problem, then
// plans one rank's memory.
absl::StatusOr<DeviceVariant> PlanVariant(const AttentionJobInfo& info, bool gpu,
                                          const std::string& path) {
  const BackendCaps caps = gpu ? GpuCaps() : CpuCaps();
  if (!Supports(caps, info.dtype)) {
    return Invalid(path + ".dtype",
                   absl::StrCat(DTypeName(info.dtype), " does not run on ", gpu ? "GPU" : "CPU",
                                " workers (they run ", DTypeNames(caps), ")"));
  }
  absl::Status problem = ValidateProblem(info.spec, info.batch, info.seq_len, info.num_heads,
                                         info.head_dim, info.dtype, caps);
  if (!problem.ok()) return Invalid(path, std::string(problem.message()));
  RankProblem rank_problem;
  rank_problem.spec = info.spec;
  rank_problem.batch = info.batch;
  rank_problem.seq_len = info.seq_len;
  rank_problem.num_heads = info.num_heads;
  rank_problem.head_dim = info.head_dim;
  rank_problem.ranks = info.num_ranks;
  rank_problem.dtype = info.dtype;
  rank_problem.backward = info.backward;
  absl::StatusOr<RankMemoryPlan> plan = PlanLargestRankMemory(
      rank_problem, gpu ? BackendKind::kCuda : BackendKind::kCpu, gpu ? 0 : kCpuPlanThreads);
  if (!plan.ok()) {
    if (absl::IsUnimplemented(plan.status())) {
      return absl::UnimplementedError(absl::StrCat(path, ".device: ", gpu ? "GPU" : "CPU",
                                                   " jobs cannot be planned yet (",
                                                   plan.status().message(), ")"));
    }
    return Invalid(path + ".shape", std::string(plan.status().message()));
  }
  DeviceVariant variant;
  variant.gpu = gpu;
  variant.memory_per_rank_bytes = plan->total_bytes();
  variant.memory_plan = plan->DebugString();
  if (info.num_ranks > 1) {
    absl::StrAppend(&variant.memory_plan, ", the most of any rank (rank ", plan->rank, " of ",
                    info.num_ranks, ")");
  }
  variant.ring_backend = gpu ? "nccl" : "gloo";
  return variant;
}

absl::StatusOr<AttentionJobInfo> Analyze(const v1::AttentionJobSpec& job, const std::string& path) {
  AttentionJobInfo info;
  if (!job.has_attention()) {
    return Invalid(path + ".attention",
                   "required (segment_lengths and dilation_rates of the dilated attention)");
  }
  absl::StatusOr<AttentionSpec> spec = ToEngineSpec(job.attention(), path + ".attention");
  if (!spec.ok()) return spec.status();
  if (absl::Status s = ValidateSpec(*spec); !s.ok()) {
    // The engine names the field ("segment_lengths[1] = 0; ..."): prefix the path to it.
    return absl::InvalidArgumentError(absl::StrCat(path, ".attention.", s.message()));
  }
  info.spec = *std::move(spec);

  if (!job.has_shape())
    return Invalid(path + ".shape", "required (batch, seq_len, num_heads, head_dim)");
  const v1::TensorShape& shape = job.shape();
  const std::pair<const char*, int64_t> dims[] = {{"batch", shape.batch()},
                                                  {"seq_len", shape.seq_len()},
                                                  {"num_heads", shape.num_heads()},
                                                  {"head_dim", shape.head_dim()}};
  for (const auto& [name, value] : dims) {
    if (value < 1) {
      return Invalid(absl::StrCat(path, ".shape.", name),
                     absl::StrCat("must be >= 1, got ", value));
    }
  }
  info.batch = shape.batch();
  info.seq_len = shape.seq_len();
  info.num_heads = shape.num_heads();
  info.head_dim = shape.head_dim();

  if (job.dtype() == v1::DTYPE_UNSPECIFIED) {
    return Invalid(path + ".dtype",
                   "required, got DTYPE_UNSPECIFIED (choose fp16, bf16, fp32 or fp64)");
  }
  absl::StatusOr<DType> dtype = ToEngineDType(job.dtype(), path + ".dtype");
  if (!dtype.ok()) return dtype.status();
  info.dtype = *dtype;

  if (job.num_ranks() < 1) {
    return Invalid(path + ".num_ranks", absl::StrCat("must be >= 1, got ", job.num_ranks()));
  }
  if (job.num_ranks() > kMaxRingRanks) {
    return Invalid(path + ".num_ranks", absl::StrCat("at most ", kMaxRingRanks,
                                                     " ranks per ring, got ", job.num_ranks()));
  }
  if (info.seq_len % job.num_ranks() != 0) {
    return Invalid(path + ".num_ranks", absl::StrCat("must divide shape.seq_len = ", info.seq_len,
                                                     ", got ", job.num_ranks()));
  }
  if (const int64_t ranks = job.num_ranks();
      ranks > 1 && info.num_heads > kMaxRingPlanWork / (ranks * ranks)) {
    return Invalid(path + ".num_ranks", absl::StrCat(ranks, " ranks with ", info.num_heads,
                                                     " heads: num_ranks^2 x "
                                                     "num_heads is over ",
                                                     kMaxRingPlanWork,
                                                     ", the largest ring the coordinator plans "
                                                     "(api/limits.h); use fewer ranks or heads"));
  }
  info.num_ranks = job.num_ranks();

  if (!v1::Pass_IsValid(job.pass())) {
    return Invalid(path + ".pass", absl::StrCat("unknown value ", job.pass()));
  }
  info.backward = job.pass() == v1::PASS_FORWARD_BACKWARD;

  if (job.iterations() < 0 || job.iterations() > kMaxIterations) {
    return Invalid(path + ".iterations", absl::StrCat("must be 1 .. ", kMaxIterations,
                                                      " (0 means 1), got ", job.iterations()));
  }
  info.iterations = job.iterations() == 0 ? 1 : job.iterations();

  if (!v1::DevicePreference_IsValid(job.device())) {
    return Invalid(path + ".device", absl::StrCat("unknown value ", job.device()));
  }

  // Overflow and the grouped-mode head count are checked by ValidateProblem below; the output size
  // needs the element count first.
  int64_t elements = 0;
  const bool overflow =
      __builtin_mul_overflow(info.batch, info.seq_len, &elements) ||
      __builtin_mul_overflow(elements, info.num_heads, &elements) ||
      __builtin_mul_overflow(elements, info.head_dim, &elements) ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(DTypeSize(info.dtype)),
                             &info.output_bytes);
  if (overflow) {
    return Invalid(path + ".shape",
                   absl::StrCat("B*N*H*D*sizeof(", DTypeName(info.dtype), ") = ", info.batch, "*",
                                info.seq_len, "*", info.num_heads, "*", info.head_dim, "*",
                                DTypeSize(info.dtype), " bytes overflows int64"));
  }
  info.return_output = job.return_output();
  info.streamed = job.streamed();
  if (job.streamed() && info.iterations != 1) {
    return Invalid(path + ".iterations",
                   absl::StrCat("a streamed job runs one step, got ", job.iterations()));
  }
  if (job.streamed() && job.return_output()) {
    return Invalid(path + ".return_output",
                   "a streamed job sends its outputs back on its call; nothing is stored");
  }
  if (job.has_shared_memory()) {
    if (!job.streamed()) {
      return Invalid(path + ".shared_memory",
                     "only the job of a JobService.Attend call (streamed) reads shared memory");
    }
    absl::StatusOr<SharedMemoryLayout> layout = CheckSharedMemory(
        job.shared_memory(), info.output_bytes, info.backward, path + ".shared_memory");
    if (!layout.ok()) return layout.status();
    info.shared_memory = true;
  }
  if (job.return_output() && info.output_bytes > kMaxReturnedOutputBytes) {
    return Invalid(path + ".return_output",
                   absl::StrCat("the output is ", FormatBytes(info.output_bytes), " (", info.batch,
                                "*", info.seq_len, "*", info.num_heads, "*", info.head_dim, " ",
                                DTypeName(info.dtype), " elements), more than the ",
                                FormatBytes(kMaxReturnedOutputBytes),
                                " a job may return (it is stored on the coordinator); set "
                                "return_output = false"));
  }

  std::vector<bool> kinds;
  switch (job.device()) {
    case v1::DEVICE_PREFERENCE_CPU:
      kinds = {false};
      break;
    case v1::DEVICE_PREFERENCE_GPU:
      kinds = {true};
      break;
    default:
      kinds = {true, false};
      break;
  }
  // For DEVICE_PREFERENCE_ANY a kind that cannot run the job is dropped; the job fails only if no
  // kind can run it. The error reported then is the first kind's whose capabilities accept the
  // dtype (the informative one), else the first kind's.
  absl::Status first_error;
  absl::Status dtype_ok_error;
  for (bool gpu : kinds) {
    absl::StatusOr<DeviceVariant> variant = PlanVariant(info, gpu, path);
    if (variant.ok()) {
      info.variants.push_back(*std::move(variant));
      continue;
    }
    if (first_error.ok()) first_error = variant.status();
    if (dtype_ok_error.ok() && Supports(gpu ? GpuCaps() : CpuCaps(), info.dtype)) {
      dtype_ok_error = variant.status();
    }
  }
  if (info.variants.empty()) return dtype_ok_error.ok() ? first_error : dtype_ok_error;

  info.flops_per_step = dilation::NominalForwardFlops(info.spec, info.batch, info.seq_len,
                                                      info.num_heads, info.head_dim) *
                        (info.backward ? 3.5 : 1.0);
  info.tokens = static_cast<double>(info.batch) * static_cast<double>(info.seq_len) *
                static_cast<double>(info.iterations);
  return info;
}

}  // namespace

absl::StatusOr<AttentionJobInfo> AnalyzeAttentionJob(const v1::AttentionJobSpec& job,
                                                     const std::string& path) {
  return Analyze(job, path);
}

v1::AttentionRankPlan PlanAttentionRank(const AttentionJobInfo& info, const DeviceVariant& variant,
                                        int rank) {
  const int64_t shard = info.seq_len / info.num_ranks;
  v1::AttentionRankPlan plan;
  plan.set_num_ranks(info.num_ranks);
  plan.set_position_begin(shard * rank);
  plan.set_position_end(shard * (rank + 1));
  plan.set_iterations(info.iterations);
  plan.set_backward(info.backward);
  plan.set_memory_bytes(variant.memory_per_rank_bytes);
  plan.set_memory_plan(variant.memory_plan);
  plan.set_flops_per_step(info.flops_per_step / info.num_ranks);
  return plan;
}

}  // namespace api
}  // namespace dattn
