#include "engine/memory_plan.h"

#include <cstdio>
#include <limits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/cpu_tiling.h"
#include "engine/cuda/cuda_memory_plan.h"

namespace dattn {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// a * b, or an error naming what overflowed.
absl::StatusOr<int64_t> Mul(int64_t a, int64_t b, const char* what) {
  if (a != 0 && b > kMax / a) {
    return absl::InvalidArgumentError(absl::StrCat("byte count of ", what, " overflows int64"));
  }
  return a * b;
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", value, kUnits[unit]);
  }
  return buf;
}

std::string MemoryPlan::DebugString() const {
  return absl::StrCat("inputs ", FormatBytes(inputs_bytes), " + outputs ", FormatBytes(outputs_bytes),
                      " + lse ", FormatBytes(lse_bytes), " + workspace ",
                      FormatBytes(workspace_bytes), " = ", FormatBytes(total_bytes()));
}

absl::StatusOr<MemoryPlan> PlanAttentionMemory(const AttentionSpec& spec, const ProblemShape& shape,
                                               const PlanOptions& options) {
  if (shape.batch < 1 || shape.seq_len < 1 || shape.num_heads < 1 || shape.head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory plan needs a non-empty shape, got B=", shape.batch,
                     " N=", shape.seq_len, " H=", shape.num_heads, " D=", shape.head_dim));
  }
  if (options.backend == BackendKind::kCuda) {
    // The CUDA planner derives the workspace from the same call plan the backend executes.
    absl::StatusOr<cuda::CudaMemoryPlan> p =
        cuda::PlanCudaMemory(spec, shape.batch, shape.seq_len, shape.num_heads, shape.head_dim,
                             options.dtype, options.backward, options.workspace_limit_bytes);
    if (!p.ok()) return p.status();
    MemoryPlan plan;
    plan.inputs_bytes = p->inputs_bytes;
    plan.outputs_bytes = p->outputs_bytes;
    plan.lse_bytes = p->lse_bytes;
    plan.workspace_bytes = p->workspace_bytes;
    return plan;
  }
  const int64_t elem = static_cast<int64_t>(DTypeSize(options.dtype));
  absl::StatusOr<int64_t> rows = Mul(shape.batch, shape.seq_len, "B*N");
  if (!rows.ok()) return rows.status();
  absl::StatusOr<int64_t> row_elems = Mul(*rows, shape.num_heads, "B*N*H");
  if (!row_elems.ok()) return row_elems.status();
  absl::StatusOr<int64_t> tensor_elems = Mul(*row_elems, shape.head_dim, "B*N*H*D");
  if (!tensor_elems.ok()) return tensor_elems.status();
  absl::StatusOr<int64_t> tensor_bytes = Mul(*tensor_elems, elem, "one tensor");
  if (!tensor_bytes.ok()) return tensor_bytes.status();
  const int64_t lse_elem = static_cast<int64_t>(DTypeSize(
      options.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32));

  MemoryPlan plan;
  const int64_t num_inputs = options.backward ? 4 : 3;   // q, k, v (+ dout)
  const int64_t num_outputs = options.backward ? 4 : 1;  // out (+ dq, dk, dv)
  absl::StatusOr<int64_t> in = Mul(*tensor_bytes, num_inputs, "inputs");
  if (!in.ok()) return in.status();
  absl::StatusOr<int64_t> out = Mul(*tensor_bytes, num_outputs, "outputs");
  if (!out.ok()) return out.status();
  absl::StatusOr<int64_t> lse = Mul(*row_elems, lse_elem, "lse");
  if (!lse.ok()) return lse.status();
  plan.inputs_bytes = *in;
  plan.outputs_bytes = *out;
  plan.lse_bytes = *lse;
  int threads = options.num_threads > 0 ? options.num_threads
                                        : static_cast<int>(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  plan.workspace_bytes =
      threads * CpuTileScratchBytes(options.dtype, shape.head_dim, options.backward);
  return plan;
}

}  // namespace dattn
