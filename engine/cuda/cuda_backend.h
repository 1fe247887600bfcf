// The CUDA backend: dilated attention on one GPU, behind the same AttentionBackend API as the CPU
// backend (engine/attention.h, docs/ENGINE.md).
//
// fp16 and bf16 run on strided views of the dilated rows (no gather, no copy of q, k, v; out, lse
// and the gradients are written in place): by default on our own Hopper kernels where they take the
// call (D = 64 or 128: hopper_attention.h, hopper_backward.h; ForwardKernel and BackwardKernel
// below), otherwise through cuDNN's fused flash attention; fp32 runs through our own tiled kernel
// with TF32 off. D must be a multiple of 8, at most 256 (BackendCaps lists them). A call that cuDNN
// cannot run (a layout it cannot read, a graph no engine takes) falls back to our own kernel for
// that call, which is correct but slow; CudaBackendStats counts it.
//
// Context: a backend instance owns its cuDNN handle, a plan cache, a stream-ordered memory pool for
// workspace, a second stream for fills that overlap the fused calls, a third for calls on our
// Hopper kernels that overlap each other (overlap_calls; both always joined back into the main
// stream with events) and (unless given one) its main CUDA stream. There is no global state: one
// instance per thread is safe; one instance must not be used by two threads at once.
//
// Asynchrony: Forward and Backward validate, then enqueue their work on the instance's stream and
// return without synchronizing the device (unless CudaBackendOptions::synchronize). The caller
// keeps every tensor alive and unmodified until the stream has passed the work (Synchronize(), or
// an event or a stream the caller orders after stream()). A device error can therefore surface at a
// later call or at Synchronize(). Workspace is taken from the pool on the stream and returned on
// the stream; the pool keeps freed memory for the next call (TrimPool() returns it to the device).
// A call's device memory beyond its tensors is what PlanCudaMemory (cuda_memory_plan.h) reports,
// within the cuDNN plan workspace it can only model before the plan exists.
//
// Errors: validation first (validate.h, INVALID_ARGUMENT naming the value; nothing is written),
// then INVALID_ARGUMENT for tensors on another device than the backend's; CUDA and cuDNN errors as
// cuda_status.h maps them (RESOURCE_EXHAUSTED for out of memory). After a device error the outputs
// are unspecified.
#ifndef DATTN_ENGINE_CUDA_CUDA_BACKEND_H_
#define DATTN_ENGINE_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/attention.h"

namespace dattn {

struct CudaBackendOptions {
  int device = 0;  // CUDA ordinal every tensor of a call must live on
  // Not owned. nullptr: the backend creates and owns a blocking stream (ordered after the legacy
  // default stream, like cudaMemcpy). A caller's non-blocking stream orders nothing implicitly:
  // the caller then orders its producers of q, k, v before the call.
  cudaStream_t stream = nullptr;
  // Bytes of scratch one fused call may use; calls are cut into chunks to fit. 0: the default,
  // max(5% of one (B, N, H, D) input tensor, 4 MiB) forward; backward max(5%, 1 MiB) on our own
  // Hopper kernels (two floats per row) and max(5%, 256 MiB) on cuDNN (its backward accumulates
  // dQ in fp32; cutting it finer costs more time than the memory is worth).
  int64_t workspace_limit_bytes = 0;
  bool use_cudnn = true;  // false: our own kernel for every dtype (tests, fallback)
  // Grouped mode's 1/G: a pass over each pattern's rows after its fused calls (kPass, which also
  // writes the zeros of the unselected rows), or inside the fused call's graph, scaling the
  // probability tile before P V (kProbabilities; falls back to kPass where cuDNN does not take the
  // graph). kPass is the default: on an H100 with cuDNN 9.19 the scaled graph runs about 6%
  // slower, which costs more than the pass (docs/PERFORMANCE_HISTORY.md, first session).
  enum class GroupScale { kPass, kProbabilities };
  GroupScale group_scale = GroupScale::kPass;
  // The forward fused calls of bf16/fp16: cuDNN (kCudnn), or our own wgmma + TMA kernel
  // (kOwnHopper, hopper_attention.h: D = 64 or 128 on a compute capability 9.0 device), which
  // applies grouped mode's 1/G and writes the zeros of unselected rows in its epilogue, so that no
  // pass rereads the output, and in mixture mode merges each pattern into the output by
  // log-sum-exp weights there too (cuDNN writes a tile per call that a pass merges; the tiles must
  // fit the workspace limit, so its calls are cut small). kAuto (the default) takes our kernel in
  // both modes, as measured on an H100 (docs/PERFORMANCE_HISTORY.md, sixth session); with
  // use_cudnn false it leaves everything to the CUDA-core kernel. Calls our kernel cannot take run
  // as under kCudnn (grouped mode's 1/G as a pass over their own rows).
  enum class ForwardKernel { kAuto, kCudnn, kOwnHopper };
  ForwardKernel forward_kernel = ForwardKernel::kAuto;
  // The backward calls of bf16/fp16: cuDNN (kCudnn), whose fp32 dQ accumulator takes 4 bytes per
  // element of a call's rows (76% of an input beyond the tensors in grouped mode at N = 2^16, 200%
  // in mixture mode, where the merges also need tiles; cut to 5% of an input it runs 1.3-1.9x the
  // floor), or our own wgmma + TMA kernels (kOwnHopper, hopper_backward.h: D = 64 or 128 on a
  // compute capability 9.0 device), which need two floats per row (1-2% of an input), add mixture
  // mode's patterns into dq, dk, dv in place and write grouped mode's zero rows themselves, but
  // compute dq in a pass of its own (40% more products). On an H100 (docs/PERFORMANCE_HISTORY.md,
  // sixth session) a grouped forward + backward at N = 2^16 took 1.08x (D = 64) and 1.12x (D = 128)
  // the floor on ours, 1.12x / 1.16x with both passes on cuDNN; mixture mode 1.14x / 1.12x on ours,
  // 1.10x / 1.15x on cuDNN. kAuto (the default) takes our kernels: memory is what decides whether a
  // long step fits at all, and they are as fast or faster but for the mixture at D = 64. With
  // use_cudnn false everything goes to the CUDA-core kernel. Calls our kernels cannot read run as
  // under kCudnn.
  enum class BackwardKernel { kAuto, kCudnn, kOwnHopper };
  BackwardKernel backward_kernel = BackwardKernel::kAuto;
  // Run the fills and passes on a second stream of the backend, concurrently with later fused calls
  // where the GPU has room (they touch disjoint rows); joined back into stream() before the call's
  // work ends.
  bool overlap_fills = true;
  // Calls on our own Hopper kernels: consecutive calls (patterns, head groups, chunks) go to two
  // streams in turn, each with its own item counter and scratch slot (two slots within the
  // workspace limit), so that the next call's CTAs take the SMs the current call's last work
  // items leave idle instead of waiting for its whole grid (every kernel's tail, 5-12% of its SM
  // time on an H100). Grouped mode's calls write disjoint rows, so nothing orders them; in mixture
  // mode a pattern's calls (head groups, blocks) do too, but the next pattern adds into the same
  // rows, so both streams wait for each other between patterns. Joined back into stream() before
  // the call's work ends.
  bool overlap_calls = true;
  bool synchronize = false;  // true: each call waits for its work and reports device errors
};

struct CudaBackendStats {
  int64_t cudnn_calls = 0;      // fused attention calls run by cuDNN
  int64_t kernel_calls = 0;     // fused attention calls run by our own kernel
  int64_t cudnn_fallbacks = 0;  // calls cuDNN could not take that our kernel ran instead
  int64_t cudnn_plans_built = 0;
  int64_t own_hopper_calls = 0;           // forward calls run by our own Hopper kernel
  int64_t own_hopper_backward_calls = 0;  // backward calls run by our own Hopper kernels
  int64_t second_stream_calls = 0;        // calls that ran on the second stream (overlap_calls)
  int64_t p_scale_passes = 0;         // grouped forwards whose 1/G was a pass (not in the graph)
  int64_t max_library_workspace = 0;  // the largest workspace a cuDNN plan asked for
  int64_t last_workspace_bytes = 0;   // the workspace the last call allocated
};

class CudaAttentionBackend : public AttentionBackend {
 public:
  // The stream every call enqueues on.
  virtual cudaStream_t stream() const = 0;
  // Waits for the work enqueued so far; returns the first device error.
  virtual absl::Status Synchronize() = 0;
  // Returns the memory the workspace pool keeps between calls to the device (synchronizes).
  virtual absl::Status TrimPool() = 0;
  // The workspace pool (for measurement: cudaMemPoolAttrReservedMemHigh and friends).
  virtual cudaMemPool_t pool() const = 0;
  virtual CudaBackendStats stats() const = 0;
  // A note of the last failure that made a call fall back to our kernel ("" if none).
  virtual std::string last_fallback_reason() const = 0;
};

// Errors: UNAVAILABLE when there is no CUDA device or `device` does not exist (the message carries
// cudaGetDeviceCount's answer); FAILED_PRECONDITION for a device older than compute capability 9.0
// (the kernels are built for Hopper) or a cuDNN older than 9; INTERNAL for other CUDA/cuDNN errors.
absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> NewCudaBackend(
    const CudaBackendOptions& options = {});

// The capabilities NewCudaBackend's backends report (no device needed): fp16, bf16, fp32;
// D in {8, 16, ..., 256}.
BackendCaps CudaBackendCaps();

}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_CUDA_BACKEND_H_
