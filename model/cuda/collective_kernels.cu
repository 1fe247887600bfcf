#include "model/cuda/collective_kernels.h"

#include <algorithm>

namespace dattn {
namespace model {
namespace cuda {
namespace {

// One thread per element (grid-stride): the element's W copies read in rank order and added with
// explicit round-to-nearest adds, so that nvcc can neither fuse nor reorder them.
__global__ void __launch_bounds__(256)
    SumInRankOrderKernel(const float* received, int64_t slot_stride, const float* own, int me,
                         int world, int64_t n, float* dst) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float acc = me == 0 ? own[i] : received[i];
    for (int p = 1; p < world; ++p) {
      const float x =
          p == me ? own[i] : received[static_cast<int64_t>(p < me ? p : p - 1) * slot_stride + i];
      acc = __fadd_rn(acc, x);
    }
    dst[i] = acc;
  }
}

}  // namespace

cudaError_t SumInRankOrder(const float* received, int64_t slot_stride, const float* own, int me,
                           int world, int64_t n, float* dst, cudaStream_t stream) {
  if (n < 0 || world < 1 || me < 0 || me >= world || slot_stride < n) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (own == nullptr || dst == nullptr || (world > 1 && received == nullptr)) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 16);
  SumInRankOrderKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      received, slot_stride, own, me, world, n, dst);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
