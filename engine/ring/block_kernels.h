// What the ring driver needs from a device: block attention with log-sum-exp merging, its backward,
// and packing of dilated rows. One implementation per device (CPU: cpu_block_kernels.h; CUDA:
// cuda_block_kernels.h, on top of engine/cuda's kernels), so the ring driver (ring_attention.h) is
// device-agnostic.
//
// The ring keeps the running result in the caller's own output tensors: `out` holds the merged,
// normalised attention rows and `lse` their log-sum-exp, starting from 0 / -inf. Merging a block's
// partial result (O_b, l_b) into a row is out := out e^(lse - l') + O_b e^(l_b - l'), lse := l' =
// log(e^lse + e^l_b). Since mixture mode is exactly that merge over patterns, and grouped mode is
// that merge over one pattern's blocks, both modes share the code; grouped mode's 1/G is applied at
// the end. Backward is flash style from the final lse (recomputing scores), with Delta =
// rowsum(dout * out).
//
// Tensors are this rank's shards: q, k, v, out, dout, dq, dk, dv (B, L, H, D) and lse (B, H, L) as
// in attention.h (outputs row-major contiguous). Packed blocks follow ring_geometry.h's layout;
// packed dK/dV partial sums use RingGeometry::dkv_dtype().
//
// Ordering: every call is queued on stream() (CPU: runs on the calling thread and returns when
// done). Threads: one thread drives an instance at a time.
#ifndef DATTN_ENGINE_RING_BLOCK_KERNELS_H_
#define DATTN_ENGINE_RING_BLOCK_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/attention.h"
#include "engine/comm/communicator.h"
#include "engine/ring/ring_geometry.h"

namespace dattn {
namespace ring {

// Attention of this rank's query rows in segments [segment_begin, segment_end) of `pattern` against
// the K/V rows of `origin`'s chunk of each segment (causal: only keys whose selected index is at or
// before the query's). kv == nullptr reads the rank's own k and v tensors (then origin must be this
// rank); otherwise kv is a packed block of exactly one segment's chunk of `origin`.
struct BlockTask {
  int pattern = 0;
  int64_t segment_begin = 0;
  int64_t segment_end = 0;
  int origin = 0;
  const void* kv = nullptr;
  // Backward only: where dK/dV of the origin's rows accumulate; nullptr = the rank's own dk, dv
  // (origin must be this rank). zero_dkv clears the packed buffer first.
  void* dkv = nullptr;
  bool zero_dkv = false;
};

class BlockKernels {
 public:
  virtual ~BlockKernels() = default;

  virtual const BackendCaps& caps() const = 0;
  // The stream all calls are queued on (null on CPU), handed to the communicator for ordering.
  virtual comm::Stream stream() const = 0;

  // Memory for packed blocks on the device (host memory on CPU). RESOURCE_EXHAUSTED naming the size
  // if it cannot be had. Free accepts what Allocate returned (and nullptr); it is stream-ordered:
  // the memory is reused only after the work queued so far (CUDA: cudaFreeAsync on stream()).
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  virtual void Free(void* ptr) = 0;

  // Copies between host memory and memory from Allocate, in stream order; Download returns once the
  // host copy is complete.
  virtual absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) = 0;

  // Packs the rank's own chunk of segment `segment` of `pattern` (K then V) into `dst`.
  virtual absl::Status PackKv(const RingGeometry& geo, int pattern, int64_t segment,
                              const TensorView& k, const TensorView& v, void* dst) = 0;

  // out := 0, lse := -inf.
  virtual absl::Status BeginForward(const RingGeometry& geo, const ForwardArgs& args) = 0;
  // Merges every task's partial attention into out/lse. Tasks of one call may write the same rows.
  virtual absl::Status Forward(const RingGeometry& geo, const ForwardArgs& args,
                               absl::Span<const BlockTask> tasks) = 0;
  // Grouped mode: out *= 1/G. Mixture: nothing.
  virtual absl::Status EndForward(const RingGeometry& geo, const ForwardArgs& args) = 0;

  // dq, dk, dv := 0.
  virtual absl::Status BeginBackward(const RingGeometry& geo, const BackwardArgs& args) = 0;
  // Accumulates every task's contribution into dq and into the task's dK/dV destination.
  virtual absl::Status Backward(const RingGeometry& geo, const BackwardArgs& args,
                                absl::Span<const BlockTask> tasks) = 0;
  // dst += src, both packed dK/dV blocks of `elements` elements.
  virtual absl::Status AddPacked(void* dst, const void* src, int64_t elements,
                                 const RingGeometry& geo) = 0;
  // The rank's own dk, dv rows of its chunk of (pattern, segment) += the packed partial sums `src`.
  virtual absl::Status AddPackedToOwn(const RingGeometry& geo, int pattern, int64_t segment,
                                      const void* src, const BackwardArgs& args) = 0;
};

}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_BLOCK_KERNELS_H_
