// How one planned block call (block_calls.h) sees device tensors, for the CUDA backend and the
// ring's CUDA kernels: the strided view of a (B, N, H, D) tensor, a packed scratch tile, the rows
// the small kernels walk, and whether cuDNN can read a view. Pure host arithmetic; thread-safe.
#ifndef DATTN_ENGINE_CUDA_CALL_VIEWS_H_
#define DATTN_ENGINE_CUDA_CALL_VIEWS_H_

#include <cstdint>

#include "engine/cuda/block_calls.h"
#include "engine/cuda/cudnn_sdpa.h"
#include "engine/cuda/kernel_types.h"
#include "engine/tensor.h"

namespace dattn {
namespace cuda {

// The [count, heads, rows, D] view of `call` into the (B, seq_len, H, D) tensor `t`.
KernelTensor ViewTensor(const TensorView& t, const BlockCall& call, int64_t seq_len);

// A packed [count, heads, rows, dim] tile at `ptr` (count is whatever the caller puts there).
KernelTensor PackedTensor(void* ptr, int64_t heads, int64_t rows, int64_t dim);

// Whether cuDNN reads the view: channels contiguous and every row 16-byte aligned.
bool CudnnReadable(const KernelTensor& t);

// The view's batch, head and sequence strides, as cuDNN takes them (channel stride 1).
SdpaStrides StridesOf(const KernelTensor& t);

// A cuDNN forward call on these views: shape, strides, pointers and scale (stats, p_scale and the
// workspace are the caller's).
SdpaForwardArgs SdpaForwardOn(const SdpaShape& shape, const KernelTensor& q, const KernelTensor& k,
                              const KernelTensor& v, const KernelTensor& o, float scale);

// The rows of `call` in the (B, N, H) row space, as the small kernels walk them.
CallRows CallRowsOf(const BlockCall& call);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_CALL_VIEWS_H_
