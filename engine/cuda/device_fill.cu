// Fills and checks for tests and benchmarks (see device_fill.h). Memory-bound, grid-stride loops,
// 64-bit indices; FLOPs negligible (a 64-bit mix per element for random fills).
#include "engine/cuda/elem_convert.h"
#include "engine/cuda/device_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

namespace dattn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// SplitMix64 finalizer of seed + index: independent uniform bits per element.
__device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void FillRandomKernel(T* x, int64_t n, uint64_t seed, float magnitude) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint64_t bits = Mix(seed ^ Mix(static_cast<uint64_t>(i)));
    // 24 bits of magnitude in [0.001, 1), one sign bit.
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
    const float mag = magnitude * (0.001f + 0.999f * u);
    x[i] = FromF<T>((bits & 1) ? -mag : mag);
  }
}

template <typename T>
__global__ void FillValueKernel(T* x, int64_t n, float value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = FromF<T>(value);
  }
}

template <typename T>
__global__ void CountNonFiniteKernel(const T* x, int64_t n, unsigned long long* count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (!isfinite(ToF<T>(x[i]))) ++local;
  }
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(count, local);
}

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

}  // namespace

cudaError_t LaunchFillRandom(void* x, ElemType type, int64_t n, uint64_t seed, float magnitude,
                             cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (type) {
    case ElemType::kF32:
      FillRandomKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<float*>(x), n, seed,
                                                           magnitude);
      break;
    case ElemType::kF16:
      FillRandomKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<__half*>(x), n, seed,
                                                           magnitude);
      break;
    case ElemType::kBF16:
      FillRandomKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(x), n, seed,
                                                           magnitude);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchFillValue(void* x, ElemType type, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (type) {
    case ElemType::kF32:
      FillValueKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<float*>(x), n, value);
      break;
    case ElemType::kF16:
      FillValueKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<__half*>(x), n, value);
      break;
    case ElemType::kBF16:
      FillValueKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(x), n, value);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchCountNonFinite(const void* x, ElemType type, int64_t n, unsigned long long* count,
                                 cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (type) {
    case ElemType::kF32:
      CountNonFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const float*>(x), n,
                                                               count);
      break;
    case ElemType::kF16:
      CountNonFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(x), n,
                                                               count);
      break;
    case ElemType::kBF16:
      CountNonFiniteKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                               n, count);
      break;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace dattn
