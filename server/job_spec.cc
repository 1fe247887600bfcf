#include "server/job_spec.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/attention.h"
#include "engine/memory_plan.h"
#include "engine/validate.h"
#include "worker/rank_memory_plan.h"

namespace dattn {
namespace server {
namespace {

absl::Status Invalid(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// A string for messages: quoted, cut to 40 characters, control bytes escaped.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  const size_t n = std::min<size_t>(s.size(), 40);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (s.size() > n) absl::StrAppend(&out, "...");
  out.push_back('"');
  return out;
}

bool TenantChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
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

absl::Status ValidateTenantName(const std::string& tenant, const std::string& path) {
  if (tenant.size() > kMaxTenantLength) {
    return Invalid(path, absl::StrCat("must be at most ", kMaxTenantLength, " characters, got ",
                                      tenant.size(), " (", Quote(tenant), ")"));
  }
  for (size_t i = 0; i < tenant.size(); ++i) {
    if (!TenantChar(tenant[i])) {
      return Invalid(path, absl::StrCat("character ", i, " of ", Quote(tenant),
                                        " is not one of [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
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
  worker::RankProblem rank_problem;
  rank_problem.spec = info.spec;
  rank_problem.batch = info.batch;
  rank_problem.seq_len = info.seq_len;
  rank_problem.num_heads = info.num_heads;
  rank_problem.head_dim = info.head_dim;
  rank_problem.ranks = info.num_ranks;
  rank_problem.dtype = info.dtype;
  rank_problem.backward = info.backward;
  absl::StatusOr<worker::RankMemoryPlan> plan = worker::PlanLargestRankMemory(
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

absl::StatusOr<AttentionJobInfo> AnalyzeAttention(const v1::AttentionJobSpec& job,
                                                  const std::string& path) {
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
  if (info.seq_len % job.num_ranks() != 0) {
    return Invalid(path + ".num_ranks", absl::StrCat("must divide shape.seq_len = ", info.seq_len,
                                                     ", got ", job.num_ranks()));
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
  if (job.return_output() && info.output_bytes > kMaxReturnedOutputBytes) {
    return Invalid(path + ".return_output",
                   absl::StrCat("the output is ", FormatBytes(info.output_bytes), " (", info.batch,
                                "*", info.seq_len, "*", info.num_heads, "*", info.head_dim, " ",
                                DTypeName(info.dtype), " elements), more than the ",
                                FormatBytes(kMaxReturnedOutputBytes),
                                " a job may return; set return_output = false"));
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

absl::StatusOr<AttentionJobInfo> AnalyzeSpecAt(const v1::JobSpec& spec, const std::string& path) {
  if (spec.name().size() > kMaxJobNameLength) {
    return Invalid(path + ".name",
                   absl::StrCat("must be at most ", kMaxJobNameLength, " characters, got ",
                                spec.name().size(), " (", Quote(spec.name()), ")"));
  }
  if (absl::Status s = ValidateTenantName(spec.tenant(), path + ".tenant"); !s.ok()) return s;
  if (spec.priority() < kMinPriority || spec.priority() > kMaxPriority) {
    return Invalid(path + ".priority", absl::StrCat("must be ", kMinPriority, " .. ", kMaxPriority,
                                                    ", got ", spec.priority()));
  }
  if (spec.work_case() != v1::JobSpec::kAttention) {
    return Invalid(path + ".attention",
                   "required: a job must say its work, and attention is the only kind in v1");
  }
  absl::StatusOr<AttentionJobInfo> info = AnalyzeAttention(spec.attention(), path + ".attention");
  if (!info.ok()) return info.status();
  // The known fields are within their bounds by now: what is left is fields this coordinator does
  // not know, kept (and stored) with the spec.
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxSpecBytes) {
    return Invalid(path,
                   absl::StrCat("is ", bytes, " bytes serialized, more than the ", kMaxSpecBytes,
                                " a job spec may have (fields this coordinator does not know "
                                "count too)"));
  }
  return info;
}

}  // namespace

v1::AttentionJobResult CombineRankResults(const AttentionJobInfo& info,
                                          std::vector<v1::RankResult> ranks, v1::Tensor output,
                                          bool return_output) {
  std::sort(ranks.begin(), ranks.end(),
            [](const v1::RankResult& a, const v1::RankResult& b) { return a.rank() < b.rank(); });
  v1::AttentionJobResult result;
  for (v1::RankResult& rank : ranks) {
    result.set_seconds_per_step(std::max(result.seconds_per_step(), rank.seconds_per_step()));
    result.set_out_sum(result.out_sum() + rank.out_sum());
    result.set_out_sum_squares(result.out_sum_squares() + rank.out_sum_squares());
    result.set_grad_sum(result.grad_sum() + rank.grad_sum());
    result.set_grad_sum_squares(result.grad_sum_squares() + rank.grad_sum_squares());
    *result.add_ranks() = std::move(rank);
  }
  result.set_flops_per_step(info.flops_per_step);
  // The job's rate is the whole problem's FLOPs over the slowest rank's step: ranks run in
  // parallel.
  if (result.seconds_per_step() > 0) {
    result.set_tflops(info.flops_per_step / result.seconds_per_step() / 1e12);
  }
  if (return_output) *result.mutable_output() = std::move(output);
  return result;
}

absl::StatusOr<v1::Tensor> AssembleOutput(const AttentionJobInfo& info,
                                          const std::map<int, v1::Tensor>& shards) {
  const int p = info.num_ranks;
  const int64_t shard_len = info.seq_len / p;
  const int64_t row_bytes =
      info.num_heads * info.head_dim * static_cast<int64_t>(DTypeSize(info.dtype));
  const int64_t shard_bytes = info.batch * shard_len * row_bytes;
  const std::vector<int64_t> shard_shape = {info.batch, shard_len, info.num_heads, info.head_dim};
  for (int r = 0; r < p; ++r) {
    auto it = shards.find(r);
    if (it == shards.end()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " returned no output shard"));
    }
    const v1::Tensor& t = it->second;
    absl::StatusOr<DType> dtype =
        ToEngineDType(t.dtype(), absl::StrCat("rank ", r, " output dtype"));
    if (!dtype.ok()) return dtype.status();
    if (*dtype != info.dtype ||
        std::vector<int64_t>(t.shape().begin(), t.shape().end()) != shard_shape ||
        static_cast<int64_t>(t.data().size()) != shard_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " returned a ", DTypeName(*dtype), " shard of shape [",
                       absl::StrJoin(t.shape(), ", "), "] and ", t.data().size(),
                       " bytes; expected ", DTypeName(info.dtype), " [",
                       absl::StrJoin(shard_shape, ", "), "] and ", shard_bytes, " bytes"));
    }
  }
  v1::Tensor out;
  out.set_dtype(shards.begin()->second.dtype());
  for (int64_t d : {info.batch, info.seq_len, info.num_heads, info.head_dim}) out.add_shape(d);
  std::string* data = out.mutable_data();
  data->reserve(static_cast<size_t>(shard_bytes * p));
  // Row-major (B, N, H, D): batch item b holds rank 0's rows, then rank 1's, and so on.
  const size_t chunk = static_cast<size_t>(shard_len * row_bytes);
  for (int64_t b = 0; b < info.batch; ++b) {
    for (int r = 0; r < p; ++r) {
      data->append(shards.at(r).data(), static_cast<size_t>(b) * chunk, chunk);
    }
  }
  return out;
}

absl::StatusOr<AttentionJobInfo> ValidateSubmitJobRequest(const v1::SubmitJobRequest& request) {
  const std::string& key = request.idempotency_key();
  if (key.empty() || key.size() > kMaxIdempotencyKeyLength) {
    return Invalid("idempotency_key",
                   absl::StrCat("must be 1 .. ", kMaxIdempotencyKeyLength, " characters, got ",
                                key.size(), key.empty() ? "" : " (" + Quote(key) + ")"));
  }
  if (!request.has_spec()) return Invalid("spec", "required");
  return AnalyzeSpecAt(request.spec(), "spec");
}

absl::StatusOr<AttentionJobInfo> AnalyzeJobSpec(const v1::JobSpec& spec) {
  return AnalyzeSpecAt(spec, "spec");
}

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty()) return Invalid("job_id", "required");
  if (job_id.size() > 64) {
    return Invalid("job_id", absl::StrCat("must be at most 64 characters, got ", job_id.size(),
                                          " (", Quote(job_id), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateListJobsRequest(const v1::ListJobsRequest& request) {
  for (int i = 0; i < request.states_size(); ++i) {
    const int state = request.states(i);
    if (state == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(state)) {
      return Invalid(absl::StrCat("states[", i, "]"),
                     absl::StrCat("must be a job state (QUEUED .. CANCELLED), got ", state));
    }
  }
  if (absl::Status s = ValidateTenantName(request.tenant(), "tenant"); !s.ok()) return s;
  if (!request.kind().empty() && request.kind() != "attention") {
    return Invalid("kind",
                   absl::StrCat("must be \"attention\" or empty, got ", Quote(request.kind())));
  }
  if (request.page_size() < 0 || request.page_size() > kMaxPageSize) {
    return Invalid("page_size", absl::StrCat("must be 1 .. ", kMaxPageSize, " (0 means ",
                                             kDefaultPageSize, "), got ", request.page_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidateCancelJobRequest(const v1::CancelJobRequest& request) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.reason().size() > kMaxCancelReasonLength) {
    return Invalid("reason", absl::StrCat("must be at most ", kMaxCancelReasonLength,
                                          " characters, got ", request.reason().size()));
  }
  return absl::OkStatus();
}

}  // namespace server
}  // namespace dattn
