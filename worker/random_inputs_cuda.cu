// GPU fill of the job inputs (random_inputs_cuda.h). One thread per element, grid-stride: the work
// is fp64 arithmetic (the H100 does about 60 TFLOP/s of it, so a 2^26-element tensor takes a few
// milliseconds, against seconds on the host), and each warp writes 32 consecutive elements.
#include "worker/random_inputs_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "engine/cuda/elem_convert.h"
#include "worker/normal_generator.h"

namespace dattn {
namespace worker {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    FillNormalKernel(uint64_t key, int64_t seq_len, int64_t begin, int64_t local_n,
                     int64_t row_elems, int64_t total, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / row_elems;
    const int64_t e = i - row * row_elems;
    const int64_t b = row / local_n;
    const int64_t n = row - b * local_n;
    const uint64_t global = static_cast<uint64_t>((b * seq_len + begin + n) * row_elems + e);
    out[i] = cuda::FromD<T>(normal_generator::NormalFromKey(key, global));
  }
}

template <typename T>
cudaError_t Launch(uint64_t key, int64_t batch, int64_t seq_len, int64_t begin, int64_t local_n,
                   int64_t row_elems, void* out, cudaStream_t stream) {
  const int64_t total = batch * local_n * row_elems;
  if (total == 0) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{sms} * 16);
  FillNormalKernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      key, seq_len, begin, local_n, row_elems, total, static_cast<T*>(out));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFillStandardNormal(uint64_t key, int64_t batch, int64_t seq_len, int64_t begin,
                                     int64_t local_n, int64_t row_elems, GpuElem type, void* out,
                                     cudaStream_t stream) {
  if (batch < 0 || local_n < 0 || row_elems < 1 || begin < 0 || begin + local_n > seq_len) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case GpuElem::kF32:
      return Launch<float>(key, batch, seq_len, begin, local_n, row_elems, out, stream);
    case GpuElem::kF16:
      return Launch<__half>(key, batch, seq_len, begin, local_n, row_elems, out, stream);
    case GpuElem::kBF16:
      return Launch<__nv_bfloat16>(key, batch, seq_len, begin, local_n, row_elems, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace worker
}  // namespace dattn
