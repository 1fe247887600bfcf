// GPU checksums of a task's outputs (checksum_cuda.h). Memory-bound: a 2 GiB bf16 output is read
// once at the card's bandwidth (about a millisecond on an H100), where the host took seconds.
#include "worker/checksum_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/cuda/elem_convert.h"

namespace dattn {
namespace worker {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ChecksumKernel(const T* data, int64_t count, double* partial) {
  __shared__ double sums[kThreads];
  __shared__ double squares[kThreads];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  double sum = 0, sum_squares = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    const double x = static_cast<double>(cuda::ToF<T>(data[i]));
    sum += x;
    sum_squares += x * x;
  }
  sums[threadIdx.x] = sum;
  squares[threadIdx.x] = sum_squares;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      squares[threadIdx.x] += squares[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = sums[0];
    partial[2 * blockIdx.x + 1] = squares[0];
  }
}

template <typename T>
cudaError_t Launch(const void* data, int64_t count, double* partial, cudaStream_t stream) {
  ChecksumKernel<T>
      <<<kChecksumBlocks, kThreads, 0, stream>>>(static_cast<const T*>(data), count, partial);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchChecksum(const void* data, int64_t count, GpuElem type, double* partial,
                           cudaStream_t stream) {
  switch (type) {
    case GpuElem::kF32:
      return Launch<float>(data, count, partial, stream);
    case GpuElem::kF16:
      return Launch<__half>(data, count, partial, stream);
    case GpuElem::kBF16:
      return Launch<__nv_bfloat16>(data, count, partial, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace worker
}  // namespace dattn
