// Device helpers the model's CUDA files share (model_kernels.cu, decode_kernels.cu): 8
// consecutive bf16 values per thread through one 16-byte access. The pointer must be 16-byte
// aligned. Device code only (nvcc).
#ifndef DATTN_MODEL_CUDA_BF16_VECTOR_CUH_
#define DATTN_MODEL_CUDA_BF16_VECTOR_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace dattn {
namespace model {
namespace cuda {

// v[0..8) := the fp32 values of the 8 bf16 values packed in `raw` (already loaded).
__device__ __forceinline__ void Unpack8(const uint4& raw, float (&v)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// v[0..8) := the fp32 values of p[0..8).
__device__ __forceinline__ void Load8(const uint16_t* p, float (&v)[8]) {
  Unpack8(*reinterpret_cast<const uint4*>(p), v);
}

// p[0..8) := v[0..8) rounded to bf16 (to nearest even).
__device__ __forceinline__ void Store8(uint16_t* p, const float (&v)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_BF16_VECTOR_CUH_
