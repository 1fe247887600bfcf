// The CUDA implementation of BlockKernels (block_kernels.h): one GPU per ring rank, fp16 / bf16 /
// fp32, D a multiple of 8 up to 256 (the CUDA backend's list).
//
// Attention is the CUDA backend's: cuDNN fused attention through engine/cuda/cudnn_sdpa.h (16-bit
// types), and engine/cuda/attention_kernels.h's own kernel for fp32 and for anything cuDNN will not
// take. Two ways in:
//   - Segments whose selected rows all lie on this rank ("local") are batched attentions over
//     strided views of the shards, exactly as the single-GPU backend cuts them (full segments
//     folded into one call, chunked to a workspace limit and to cuDNN's 2^31-element views).
//     Grouped mode writes out / lse (backward: dq, dk, dv) in place, since such a row has no other
//     contribution; mixture mode writes a tile that is merged by log-sum-exp (backward: added).
//   - Segments shared with other ranks: this rank's query rows of the chunk are gathered into a
//     packed tile (dO and G * out too, backward) and attend the packed K/V block (the received one,
//     or this rank's own chunk packed on the spot) as one square call: cuDNN's graphs take one
//     sequence length, so a tile with fewer rows than the block is padded with zero rows, and one
//     with more is cut into chunks of the block's length. The partial result is merged into
//     out / lse by log-sum-exp; backward, dq rows are added, and the block's dK/dV (io type) are
//     added into the fp32 packed partial sums (or the rank's own dk, dv).
// Backward follows the CUDA backend: P is normalised by the row's total lse (+ log G in grouped
// mode, with the row sums taken over a G * out tile), so every block's gradient is exact with
// c = 1/G or 1.
//
// Grouped mode does not clear whole outputs: BeginForward writes zeros (lse -inf) to the rows no
// pattern selects and to the rows of shared segments (which accumulate), EndForward scales the
// selected rows by 1/G, BeginBackward clears the same rows of dq, dk, dv. Mixture mode clears
// everything. This relies on the ring plan computing every local segment exactly once, which
// PlanRing does.
//
// Streams and memory: every call is queued on one CUDA stream (the caller's, or a blocking stream
// the instance owns); scratch and packed buffers come from a stream-ordered pool the instance
// owns (freed memory is kept for the next call). Nothing synchronizes the device except Download
// and TrimPool, which wait for the stream with a deadline (`sync_timeout`) instead of blocking, so
// that a stream stuck behind a dead NCCL peer becomes DEADLINE_EXCEEDED, not a hang.
// Errors: CUDA / cuDNN failures as engine/cuda/cuda_status.h maps them (RESOURCE_EXHAUSTED for
// out of memory). One thread drives an instance at a time.
#ifndef DATTN_ENGINE_RING_CUDA_BLOCK_KERNELS_H_
#define DATTN_ENGINE_RING_CUDA_BLOCK_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/ring/block_kernels.h"

namespace dattn {
namespace ring {

struct CudaBlockKernelOptions {
  int device = 0;  // CUDA ordinal; the shards must live there.
  // Not owned. nullptr: the instance creates a blocking stream (ordered after the legacy default
  // stream, as cudaMemcpy callers expect).
  cudaStream_t stream = nullptr;
  bool use_cudnn = true;  // false: the own kernel for every call (tests).
  // Grouped mode: the forward's local blocks of a pattern with no shared segment on this rank run
  // on our own Hopper kernel (engine/cuda/hopper_attention.h) where it takes them, with the 1/G in
  // its epilogue, and EndForward leaves those patterns alone (their 1/G is then applied per call);
  // false (or use_cudnn false, or not a compute capability 9.0 device): cuDNN and the EndForward
  // pass, as before.
  bool own_hopper_forward = true;
  // Local backward calls (both modes) run on our own Hopper backward
  // (engine/cuda/hopper_backward.h) where it takes them (bf16 / fp16, D = 64 or 128, a compute
  // capability 9.0 device): two floats of scratch per row instead of cuDNN's fp32 dQ accumulator,
  // and mixture mode's gradients added in place (no tiles). Shared segments' packed calls stay on
  // cuDNN. false (or use_cudnn false): cuDNN, as before.
  bool own_hopper_backward = true;
  // Scratch one local call may use (calls are chunked to fit); 0: the CUDA backend's default for
  // the shard (engine/cuda/block_calls.h DefaultWorkspaceLimit).
  int64_t workspace_limit_bytes = 0;
  // The longest Download or TrimPool waits for the stream.
  absl::Duration sync_timeout = absl::Seconds(60);
};

struct CudaBlockKernelStats {
  int64_t cudnn_calls = 0;                // fused attention calls run by cuDNN
  int64_t kernel_calls = 0;               // calls run by the own kernel (fp32, or cuDNN fallbacks)
  int64_t own_hopper_calls = 0;           // local forward calls run by our own Hopper kernel
  int64_t own_hopper_backward_calls = 0;  // local backward calls run by our own Hopper backward
  int64_t cudnn_fallbacks = 0;            // calls cuDNN would not take
  int64_t local_calls = 0;                // calls over strided views of local segments
  int64_t shared_calls = 0;               // calls over packed tiles of shared segments
  int64_t padded_calls = 0;     // shared calls whose query tile was padded or cut to the block
  int64_t pool_high_water = 0;  // bytes: cudaMemPoolAttrReservedMemHigh of the instance's pool
};

class CudaBlockKernels : public BlockKernels {
 public:
  virtual cudaStream_t cuda_stream() const = 0;
  virtual CudaBlockKernelStats stats() const = 0;
  // Waits for the stream (at most sync_timeout), then returns the pool's free memory to the device.
  virtual absl::Status TrimPool() = 0;
  // The last reason cuDNN gave for refusing a call ("" if none).
  virtual std::string last_fallback_reason() const = 0;
};

// Errors: UNAVAILABLE when CUDA finds no such device; FAILED_PRECONDITION for a device older than
// compute capability 9.0 or a cuDNN older than 9 (when use_cudnn).
absl::StatusOr<std::unique_ptr<CudaBlockKernels>> NewCudaBlockKernels(
    const CudaBlockKernelOptions& options = {});

}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_CUDA_BLOCK_KERNELS_H_
