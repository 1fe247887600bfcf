// The memory planner: how many bytes one engine call needs, before it runs.
//
// The scheduler fits ranks into workers' free memory with these numbers and the out-of-memory recovery
// compares them with what a device reports, so they must be right (the CUDA planner is checked against
// measured peaks on the GPU). Pure functions of their arguments; thread-safe.
#ifndef DATTN_ENGINE_MEMORY_PLAN_H_
#define DATTN_ENGINE_MEMORY_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {

enum class BackendKind { kCpu, kCuda };

struct ProblemShape {
  int64_t batch = 0;
  int64_t seq_len = 0;  // Positions held by this rank (N / P on a ring).
  int64_t num_heads = 0;
  int64_t head_dim = 0;
};

struct MemoryPlan {
  int64_t inputs_bytes = 0;     // q, k, v (and dout for backward).
  int64_t outputs_bytes = 0;    // out (and dq, dk, dv for backward).
  int64_t lse_bytes = 0;        // Per-row log-sum-exp (B, H, N).
  int64_t workspace_bytes = 0;  // Everything else the backend allocates during the call.
  int64_t total_bytes() const { return inputs_bytes + outputs_bytes + lse_bytes + workspace_bytes; }
  std::string DebugString() const;  // "inputs 384 MiB + outputs 128 MiB + lse 4 MiB + workspace 2 MiB"
};

struct PlanOptions {
  BackendKind backend = BackendKind::kCpu;
  DType dtype = DType::kFloat32;
  bool backward = false;  // Plan for forward + backward (all tensors of both live at once).
  int num_threads = 0;    // CPU: threads the backend uses; 0 means hardware concurrency.
  // CUDA: CudaBackendOptions::workspace_limit_bytes of the backend that will run (0: its default).
  int64_t workspace_limit_bytes = 0;
};

// Bytes for one forward (or forward + backward) call of `spec` on `shape`. INVALID_ARGUMENT when the
// shape is empty or a byte count overflows int64. The spec must have passed ValidateSpec.
absl::StatusOr<MemoryPlan> PlanAttentionMemory(const AttentionSpec& spec, const ProblemShape& shape,
                                               const PlanOptions& options);

// Human-readable byte count: "1.50 GiB", "512 B".
std::string FormatBytes(int64_t bytes);

}  // namespace dattn

#endif  // DATTN_ENGINE_MEMORY_PLAN_H_
