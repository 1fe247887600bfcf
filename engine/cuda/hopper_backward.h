// Our own backward attention for Hopper (sm_90a), the counterpart of hopper_attention.h: dq, dk, dv
// of o = softmax(scale q k^T) v per (block, head), on the tensor cores through wgmma, every tile
// loaded by TMA straight from the strided views of the dilated rows, and no scratch beyond two
// floats per row (the log-sum-exp in the log2 domain and the row sum of dout * o).
//
// Why it exists: cuDNN's backward accumulates dq in an fp32 buffer of 4 bytes per element of the
// call's rows (plus, in grouped mode, a G * out copy), 76-200% of one input at N = 2^16 by default;
// cut to 5% of an input it runs 1.3-1.9x slower (docs/PERFORMANCE_HISTORY.md). This one computes dq
// in its own pass over the key tiles of each query tile (two extra matrix products) instead of
// accumulating it, so it needs no such buffer at any size.
//
// It computes what LaunchAttentionBackward (attention_kernels.h) computes, for bf16 and fp16 with
// D = 64 or 128, from the same arguments:
//   P = exp(scale q k^T - stats), dv = P^T dout, ds = P * (dout v^T - delta_scale rowsum(dout *
//   o)), dq = scale ds k, dk = scale ds^T q, causal optional;
// `stats` is the packed [count, heads, rows] natural-log lse the forward saved (plus grouped mode's
// log G, as for LaunchAttentionBackward) and `delta` is scratch of HopperRowTermsFloats(count,
// heads, rows) floats (kernel_types.h), 16-byte aligned. With `accumulate` the gradients are added
// to what dq, dk, dv hold (in fp32, rounded once per element) instead of overwriting them: mixture
// mode's patterns share rows.
//
// Launch: enqueues on `stream` (a pass over the rows that fills `delta`, then for each of the two
// kernels a 4-byte memset of item_counter and the kernel), never synchronizes. Carried for sm_90a
// only, like the forward: call it on a device of compute capability 9.0 (NewHopperItemCounter says
// which). Not thread-safe per item_counter or `delta`.
#ifndef DATTN_ENGINE_CUDA_HOPPER_BACKWARD_H_
#define DATTN_ENGINE_CUDA_HOPPER_BACKWARD_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/attention_kernels.h"
#include "engine/cuda/hopper_attention.h"

namespace dattn {
namespace cuda {

// Whether the kernels take these arguments: bf16 or fp16, D in {64, 128}, unit channel strides;
// q, k, v, dout, o 16-byte aligned with strides that are multiples of 16 bytes (what TMA and the
// row pass read);
// dq, dk, dv 4-byte aligned with even strides; stats and a 16-byte aligned delta given; sizes
// within the launch grid; with zeros, 1 < rate, 0 <= lead < rate, and dq, dk, dv 16-byte aligned
// with fold and head strides that are multiples of 16 bytes and a row stride `rate` times a
// position stride that is. Host-only; no device needed.
bool HopperBackwardSupported(const KernelBackwardArgs& args, const UnselectedRows& zeros = {});

// zeros: grouped mode's unselected rows around the call's rows (UnselectedRows, as for the
// forward; each gradient's position stride is its own seq / rate, pos_stride is not read), which
// the kernels clear in dq, dk and dv next to the rows they write; rate 0: none. item_counter: 4
// bytes of device memory from NewHopperItemCounter (hopper_attention.h), not shared with
// concurrent launches. cudaErrorInvalidValue when !HopperBackwardSupported(args, zeros), zeros
// come with `accumulate`, item_counter is null or the driver cannot describe a view as a tensor
// map; otherwise the first launch error.
cudaError_t LaunchHopperBackward(const KernelBackwardArgs& args, bool accumulate,
                                 const UnselectedRows& zeros, unsigned* item_counter,
                                 cudaStream_t stream);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_HOPPER_BACKWARD_H_
