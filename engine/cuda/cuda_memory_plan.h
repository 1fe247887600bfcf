// The CUDA backend's memory plan: the device bytes one forward (or forward + backward) call of the
// CUDA backend allocates, computed from the same call plan the backend executes (block_calls.h), so
// that the workspace figure is the workspace the backend asks its pool for.
//
// What it cannot know without a GPU: the execution-plan workspace cuDNN reports for each fused call
// (modeled by ModeledLibraryWorkspace, calibrated on an H100 with cuDNN 9.19), cuDNN's own handle
// and kernel memory (per backend instance, not per call), and the pool's rounding of allocations.
// Pure function; thread-safe; no CUDA calls (it links without the CUDA runtime).
#ifndef DATTN_ENGINE_CUDA_CUDA_MEMORY_PLAN_H_
#define DATTN_ENGINE_CUDA_CUDA_MEMORY_PLAN_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/attention_spec.h"
#include "engine/tensor.h"

namespace dattn {
namespace cuda {

// Field for field what engine/memory_plan.h's MemoryPlan holds (kept separate so that this library
// does not depend on the planner that calls it).
struct CudaMemoryPlan {
  int64_t inputs_bytes = 0;     // q, k, v (+ dout for backward)
  int64_t outputs_bytes = 0;    // out (+ dq, dk, dv for backward)
  int64_t lse_bytes = 0;        // (B, H, N) fp32
  int64_t workspace_bytes = 0;  // the largest per-call scratch (the forward's or the backward's)
};

// INVALID_ARGUMENT for an empty shape, a dtype the CUDA backend does not run (fp64), or byte counts
// overflowing int64. workspace_limit_bytes as in CudaBackendOptions (0: the default).
// hopper_kernels: the backend runs our own Hopper kernels, forward and backward (the default
// options on a compute capability 9.0 device: H100, H200); false plans cuDNN's (other devices,
// ForwardKernel / BackwardKernel::kCudnn), whose workspace is far larger (mixture mode's merge
// tiles, the backward's fp32 dQ accumulator).
absl::StatusOr<CudaMemoryPlan> PlanCudaMemory(const AttentionSpec& spec, int64_t batch,
                                              int64_t seq_len, int64_t num_heads, int64_t head_dim,
                                              DType dtype, bool backward,
                                              int64_t workspace_limit_bytes = 0,
                                              bool hopper_kernels = true);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_CUDA_MEMORY_PLAN_H_
