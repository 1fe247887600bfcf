// Our own forward attention for Hopper (sm_90a): tensor cores through wgmma, tiles loaded by TMA
// straight from the strided views of the dilated rows, flash-style online softmax, the output
// scale (grouped mode's 1/G) applied and the zeros of unselected rows written in its epilogue.
//
// It computes what LaunchAttentionForward (attention_kernels.h) computes, for bf16 and fp16 with
// D = 64 or 128: o = p_scale * softmax(scale q k^T) v per (block, head), causal optional, and the
// packed log-sum-exp of every row in `stats`. The CUDA backend uses it instead of cuDNN where
// CudaBackendOptions::forward_kernel says so (by default for grouped mode) and
// HopperForwardSupported() holds.
//
// Launch: enqueues on `stream` (a 4-byte memset of item_counter, then the kernel), never
// synchronizes, needs no other scratch. The binary carries this kernel for sm_90a only: call it on
// a device of compute capability 9.0 (the backend checks). Not thread-safe per item_counter.
#ifndef DATTN_ENGINE_CUDA_HOPPER_ATTENTION_H_
#define DATTN_ENGINE_CUDA_HOPPER_ATTENTION_H_

#include <cuda_runtime_api.h>

#include "engine/cuda/attention_kernels.h"
#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace cuda {

// Grouped mode's zeros, written by the kernel next to the rows it computes: for each block, the
// `rate` - 1 positions after every selected row that lie within the segment (`span` positions from
// the block's first selected row on), and the `lead` positions before the first selected row.
// pos_stride: element stride of o between consecutive positions (o.seq / rate). rate 0: none.
struct UnselectedRows {
  int64_t rate = 0;
  int64_t lead = 0;
  int64_t span = 0;
  int64_t pos_stride = 0;
};

// Whether the kernel takes these arguments: bf16 or fp16, D in {64, 128}, unit channel stride,
// q/k/v 16-byte aligned with strides that are multiples of 16 bytes (what TMA reads), o 4-byte
// aligned with even strides, stats given, sizes within the launch grid; with zeros, 1 < rate,
// 0 <= lead < rate, o 16-byte aligned with strides (pos_stride too) that are multiples of 16
// bytes. Host-only; no device needed.
bool HopperForwardSupported(const KernelForwardArgs& args, const UnselectedRows& zeros = {});

// The work counter LaunchHopperForward needs, for the current device `device`: *counter := 4
// bytes from cudaMalloc (the caller frees them with cudaFree) when the device runs this kernel
// (compute capability 9.0), nullptr on any other device. Errors: the CUDA calls'.
cudaError_t NewHopperItemCounter(int device, unsigned** counter);

// merge (mixture mode): o and stats already hold the rows' output and log-sum-exp so far (from
// the patterns before; -inf where none reached a row, whose o is then not read), and the call's
// result is combined into them by log-sum-exp weights in the epilogue: with L = logaddexp(stats,
// lse), o := o exp(stats - L) + o_call exp(lse - L), stats := L. That takes no tile and no merge
// pass; o is read and written once per row.
// item_counter: 4 bytes of device memory (not shared with concurrent launches) through which the
// persistent CTAs draw work items; the launch zeroes it on `stream` first. cudaErrorInvalidValue
// when !HopperForwardSupported(args, zeros), zeros come with `merge`, item_counter is null or the
// driver cannot describe a view as a tensor map; otherwise the launch's error.
cudaError_t LaunchHopperForward(const KernelForwardArgs& args, bool merge,
                                const UnselectedRows& zeros, unsigned* item_counter,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_HOPPER_ATTENTION_H_
