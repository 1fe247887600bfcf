#include "engine/cuda/cuda_memory_plan.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/block_calls.h"

namespace dattn {
namespace cuda {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

bool MulOverflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

absl::StatusOr<CudaMemoryPlan> PlanCudaMemory(const AttentionSpec& spec, int64_t batch,
                                              int64_t seq_len, int64_t num_heads, int64_t head_dim,
                                              DType dtype, bool backward,
                                              int64_t workspace_limit_bytes, bool hopper_kernels) {
  if (batch < 1 || seq_len < 1 || num_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA memory plan needs a non-empty shape, got B=", batch, " N=", seq_len,
                     " H=", num_heads, " D=", head_dim));
  }
  if (dtype == DType::kFloat64) {
    return absl::InvalidArgumentError(
        "CUDA memory plan: the CUDA backend runs fp16, bf16 and fp32, not fp64");
  }
  int64_t rows = 0, elems = 0, tensor = 0, lse = 0;
  if (MulOverflows(batch, seq_len, &rows) || MulOverflows(rows, num_heads, &rows) ||
      MulOverflows(rows, head_dim, &elems) ||
      MulOverflows(elems, static_cast<int64_t>(DTypeSize(dtype)), &tensor) ||
      MulOverflows(rows, 4, &lse) || tensor > kMax / 8) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA memory plan: byte counts of B=", batch,
                                                   " N=", seq_len, " H=", num_heads,
                                                   " D=", head_dim, " overflow int64"));
  }
  const ProblemDims dims{batch, seq_len, num_heads, head_dim};
  if (const int64_t calls = CountBlockCalls(spec, dims, /*fold_batches=*/true);
      calls > kMaxBlockCalls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA memory plan: B=", batch, " N=", seq_len, " H=", num_heads, " would need ", calls,
        " block calls per pass, over the ", kMaxBlockCalls,
        " the planner takes (a segment length that does not divide the shard length unfolds the "
        "batch into one call per batch item): use a smaller batch or segment lengths that divide ",
        seq_len));
  }
  PlanInputs in;
  in.dtype = dtype;
  in.use_cudnn = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  in.fold_batches = true;
  in.workspace_limit = workspace_limit_bytes;
  in.backward = false;
  // What CudaBackendOptions' kAuto picks for both passes.
  in.hopper = hopper_kernels && in.use_cudnn && (head_dim == 64 || head_dim == 128);
  in.overlap_calls = true;  // CudaBackendOptions::overlap_calls's default
  // Each pass's calls after chunking, counted before they are built.
  auto pass_workspace = [&](const PlanInputs& pass) -> absl::StatusOr<int64_t> {
    if (const int64_t calls = CountPlannedCalls(spec, dims, pass); calls > kMaxBlockCalls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA memory plan: B=", batch, " N=", seq_len, " H=", num_heads, " D=", head_dim,
          " would need ", calls, " kernel calls per ", pass.backward ? "backward" : "forward",
          " pass (the segments' blocks, cut to fit the workspace and 2^31 elements per call), "
          "over the ",
          kMaxBlockCalls, " the planner takes: use a shorter sequence or longer segments"));
    }
    return PlanBlockCalls(spec, dims, pass).workspace_bytes;
  };
  absl::StatusOr<int64_t> workspace = pass_workspace(in);
  if (!workspace.ok()) return workspace.status();
  if (backward) {
    in.backward = true;
    absl::StatusOr<int64_t> backward_workspace = pass_workspace(in);
    if (!backward_workspace.ok()) return backward_workspace.status();
    workspace = std::max(*workspace, *backward_workspace);
  }
  CudaMemoryPlan plan;
  plan.inputs_bytes = tensor * (backward ? 4 : 3);
  plan.outputs_bytes = tensor * (backward ? 4 : 1);
  plan.lse_bytes = lse;
  plan.workspace_bytes = *workspace;
  return plan;
}

}  // namespace cuda
}  // namespace dattn
