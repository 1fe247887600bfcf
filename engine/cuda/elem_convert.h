// Device-side conversions between the kernels' element types and float, for nvcc only (.cu files).
// Every kernel computes in fp32 and rounds once on store (round to nearest even).
#ifndef DATTN_ENGINE_CUDA_ELEM_CONVERT_H_
#define DATTN_ENGINE_CUDA_ELEM_CONVERT_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dattn {
namespace cuda {

template <typename T>
__device__ __forceinline__ float ToF(T v);
template <>
__device__ __forceinline__ float ToF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToF<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToF<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromF<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_ELEM_CONVERT_H_
