// Device-side conversions between the kernels' element types and float (and from double), for nvcc
// only (.cu files). Every kernel computes in fp32 (the input generator in fp64) and rounds once on
// store (round to nearest even).
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

// From double with one rounding (no detour through float, which would round twice).
template <typename T>
__device__ __forceinline__ T FromD(double v);
template <>
__device__ __forceinline__ float FromD<float>(double v) {
  return __double2float_rn(v);
}
template <>
__device__ __forceinline__ __half FromD<__half>(double v) {
  return __double2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromD<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_ELEM_CONVERT_H_
