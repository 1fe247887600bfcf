// The one kernel of the GPU collective (nccl_collective.h): the owner's sum of a gradient shard's
// W copies, in rank order. In the style of model_kernels.h: the launcher states its shapes, FLOPs
// and bytes, enqueues on `stream`, never synchronizes, and returns the launch's cudaError_t
// (cudaErrorInvalidValue for arguments outside what it states).
#ifndef DATTN_MODEL_CUDA_COLLECTIVE_KERNELS_H_
#define DATTN_MODEL_CUDA_COLLECTIVE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dattn {
namespace model {
namespace cuda {

// dst[i] := ((src_0[i] + src_1[i]) + src_2[i]) + ... + src_{world-1}[i] for i in [0, n), every
// addition an fp32 add rounded to nearest even (no contraction, no reassociation: the bits equal a
// host loop that adds in the same order), where src_me = own and, for p != me, src_p = received +
// slot(p) * slot_stride with slot(p) = p < me ? p : p - 1 (the world - 1 copies received from the
// other ranks, packed without a slot for `me`). dst may be `own` (in place); it must not overlap
// `received`. 0 <= me < world, n >= 0, slot_stride >= n. FLOPs: (world - 1) n; bytes: 4 (world + 1)
// n.
cudaError_t SumInRankOrder(const float* received, int64_t slot_stride, const float* own, int me,
                           int world, int64_t n, float* dst, cudaStream_t stream);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_COLLECTIVE_KERNELS_H_
