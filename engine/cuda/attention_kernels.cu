// Flash-style attention on CUDA cores for strided [count, heads, rows, D] views, any element type.
//
// Purpose: the fp32 path (TF32 off: plain fp32 FMAs, expf/logf) and the fallback where cuDNN cannot
// run a call. Correctness first; speed is a non-goal beyond not storing score matrices.
// FLOPs per forward: 4 * count * heads * rows^2 * D (causal: half). Bytes: q and o once; k and v
// once per 8-row query tile (mostly from L2).
//
// Layout of work: a block of 4 warps owns 8 query rows (forward, dq) or 8 key rows (dk/dv) of one
// (block j, head k); it streams the other side in tiles of 32 rows through shared memory. A warp
// keeps 2 rows; lane l owns channels l, l+32, ... (D <= 256 -> 8 registers per row), and for scores
// lane l owns key (or query) l of the tile. Shared tiles that lanes read by row are padded to D + 1
// floats so that 32 lanes reading the same channel of 32 rows hit 32 banks. All indices are 64-bit.
#include "engine/cuda/attention_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

namespace dattn {
namespace cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kTileRows = kWarps * kRowsPerWarp;
constexpr int kTileKeys = 32;
constexpr int kPerLane = static_cast<int>(kKernelMaxHeadDim / 32);
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <typename T>
__device__ __forceinline__ float Load(const T* p);
template <>
__device__ __forceinline__ float Load<float>(const float* p) {
  return *p;
}
template <>
__device__ __forceinline__ float Load<__half>(const __half* p) {
  return __half2float(*p);
}
template <>
__device__ __forceinline__ float Load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

template <typename T>
__device__ __forceinline__ void Store(T* p, float v);
template <>
__device__ __forceinline__ void Store<float>(float* p, float v) {
  *p = v;
}
template <>
__device__ __forceinline__ void Store<__half>(__half* p, float v) {
  *p = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void Store<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Element (j, k, s, d) of a strided view.
template <typename T>
__device__ __forceinline__ T* At(const KernelTensor& t, int64_t j, int64_t k, int64_t s,
                                 int64_t d) {
  return static_cast<T*>(t.ptr) + j * t.fold + k * t.head + s * t.seq + d * t.chan;
}

// Loads `nrows` rows [row0, row0 + nrows) of (j, k) into shared memory with row pitch `pitch`;
// rows past `rows` read as 0.
template <typename T>
__device__ void LoadRows(float* dst, int pitch, const KernelTensor& t, int64_t j, int64_t k,
                         int64_t row0, int nrows, int64_t rows, int d_count) {
  for (int e = threadIdx.x; e < nrows * d_count; e += blockDim.x) {
    const int r = e / d_count;
    const int d = e - r * d_count;
    const int64_t row = row0 + r;
    dst[r * pitch + d] = row < rows ? Load<T>(At<T>(t, j, k, row, d)) : 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) ForwardKernel(KernelForwardArgs a, int64_t row_tiles) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(a.head_dim);
  float* q_s = smem;                         // [kTileRows][dim]
  float* k_s = q_s + kTileRows * dim;        // [kTileKeys][dim + 1]
  float* v_s = k_s + kTileKeys * (dim + 1);  // [kTileKeys][dim]
  const int64_t j = blockIdx.x / row_tiles;
  const int64_t row0 = (blockIdx.x - j * row_tiles) * kTileRows;
  const int64_t k = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  LoadRows<T>(q_s, dim, a.q, j, k, row0, kTileRows, a.rows, dim);

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[rr][t] = 0.0f;
  }

  const int64_t key_end = a.causal ? Min64(a.rows, row0 + kTileRows) : a.rows;
  for (int64_t key0 = 0; key0 < key_end; key0 += kTileKeys) {
    __syncthreads();
    LoadRows<T>(k_s, dim + 1, a.k, j, k, key0, kTileKeys, a.rows, dim);
    LoadRows<T>(v_s, dim, a.v, j, k, key0, kTileKeys, a.rows, dim);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t row = row0 + r;
      if (row >= a.rows) continue;  // warp-uniform
      const int64_t key = key0 + lane;
      const bool valid = key < a.rows && (!a.causal || key <= row);
      float s = -INFINITY;
      if (valid) {
        const float* qr = q_s + r * dim;
        const float* kr = k_s + lane * (dim + 1);
        float dot = 0.0f;
        for (int d = 0; d < dim; ++d) dot = fmaf(qr[d], kr[d], dot);
        s = dot * a.scale;
      }
      const float m_new = fmaxf(m[rr], WarpMax(s));
      if (m_new == -INFINITY) continue;  // warp-uniform: nothing visible yet
      const float alpha = expf(m[rr] - m_new);
      const float p = valid ? expf(s - m_new) : 0.0f;
      l[rr] = l[rr] * alpha + WarpSum(p);
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) acc[rr][t] *= alpha;
      for (int kk = 0; kk < kTileKeys; ++kk) {
        const float pk = __shfl_sync(kFull, p, kk);
        const float* vr = v_s + kk * dim;
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          const int d = lane + 32 * t;
          if (d < dim) acc[rr][t] = fmaf(pk, vr[d], acc[rr][t]);
        }
      }
      m[rr] = m_new;
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t row = row0 + warp * kRowsPerWarp + rr;
    if (row >= a.rows) continue;
    const float inv = a.p_scale / l[rr];
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < dim) Store<T>(At<T>(a.o, j, k, row, d), acc[rr][t] * inv);
    }
    if (lane == 0) a.stats[(j * a.heads + k) * a.rows + row] = m[rr] + logf(l[rr]);
  }
}

// delta[j, k, s] = delta_scale * sum_d dout * o; one warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads) DeltaKernel(KernelBackwardArgs a) {
  const int64_t total = a.count * a.heads * a.rows;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); idx < total;
       idx += warps) {
    const int64_t s = idx % a.rows;
    const int64_t jk = idx / a.rows;
    const int64_t k = jk % a.heads;
    const int64_t j = jk / a.heads;
    float sum = 0.0f;
    for (int64_t d = lane; d < a.head_dim; d += 32) {
      sum = fmaf(Load<T>(At<T>(a.dout, j, k, s, d)), Load<T>(At<T>(a.o, j, k, s, d)), sum);
    }
    sum = WarpSum(sum);
    if (lane == 0) a.delta[idx] = a.delta_scale * sum;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) DqKernel(KernelBackwardArgs a, int64_t row_tiles) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(a.head_dim);
  float* q_s = smem;                         // [kTileRows][dim]
  float* do_s = q_s + kTileRows * dim;       // [kTileRows][dim]
  float* k_s = do_s + kTileRows * dim;       // [kTileKeys][dim + 1]
  float* v_s = k_s + kTileKeys * (dim + 1);  // [kTileKeys][dim + 1]
  const int64_t j = blockIdx.x / row_tiles;
  const int64_t row0 = (blockIdx.x - j * row_tiles) * kTileRows;
  const int64_t k = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t row_base = (j * a.heads + k) * a.rows;

  LoadRows<T>(q_s, dim, a.q, j, k, row0, kTileRows, a.rows, dim);
  LoadRows<T>(do_s, dim, a.dout, j, k, row0, kTileRows, a.rows, dim);

  float lse[kRowsPerWarp], delta[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t row = row0 + warp * kRowsPerWarp + rr;
    lse[rr] = row < a.rows ? a.stats[row_base + row] : 0.0f;
    delta[rr] = row < a.rows ? a.delta[row_base + row] : 0.0f;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[rr][t] = 0.0f;
  }

  const int64_t key_end = a.causal ? Min64(a.rows, row0 + kTileRows) : a.rows;
  for (int64_t key0 = 0; key0 < key_end; key0 += kTileKeys) {
    __syncthreads();
    LoadRows<T>(k_s, dim + 1, a.k, j, k, key0, kTileKeys, a.rows, dim);
    LoadRows<T>(v_s, dim + 1, a.v, j, k, key0, kTileKeys, a.rows, dim);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t row = row0 + r;
      if (row >= a.rows) continue;
      const int64_t key = key0 + lane;
      const bool valid = key < a.rows && (!a.causal || key <= row);
      float ds = 0.0f;
      if (valid) {
        const float* qr = q_s + r * dim;
        const float* dor = do_s + r * dim;
        const float* kr = k_s + lane * (dim + 1);
        const float* vr = v_s + lane * (dim + 1);
        float dot = 0.0f, dp = 0.0f;
        for (int d = 0; d < dim; ++d) {
          dot = fmaf(qr[d], kr[d], dot);
          dp = fmaf(dor[d], vr[d], dp);
        }
        const float p = expf(dot * a.scale - lse[rr]);
        ds = p * (dp - delta[rr]);
      }
      for (int kk = 0; kk < kTileKeys; ++kk) {
        const float dsk = __shfl_sync(kFull, ds, kk);
        const float* kr = k_s + kk * (dim + 1);
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          const int d = lane + 32 * t;
          if (d < dim) acc[rr][t] = fmaf(dsk, kr[d], acc[rr][t]);
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t row = row0 + warp * kRowsPerWarp + rr;
    if (row >= a.rows) continue;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < dim) Store<T>(At<T>(a.dq, j, k, row, d), acc[rr][t] * a.scale);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) DkdvKernel(KernelBackwardArgs a, int64_t key_tiles) {
  extern __shared__ float smem[];
  const int dim = static_cast<int>(a.head_dim);
  float* k_s = smem;                            // [kTileRows][dim]
  float* v_s = k_s + kTileRows * dim;           // [kTileRows][dim]
  float* q_s = v_s + kTileRows * dim;           // [kTileKeys][dim + 1]
  float* do_s = q_s + kTileKeys * (dim + 1);    // [kTileKeys][dim + 1]
  float* lse_s = do_s + kTileKeys * (dim + 1);  // [kTileKeys]
  float* delta_s = lse_s + kTileKeys;           // [kTileKeys]
  const int64_t j = blockIdx.x / key_tiles;
  const int64_t key0 = (blockIdx.x - j * key_tiles) * kTileRows;
  const int64_t k = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t row_base = (j * a.heads + k) * a.rows;

  LoadRows<T>(k_s, dim, a.k, j, k, key0, kTileRows, a.rows, dim);
  LoadRows<T>(v_s, dim, a.v, j, k, key0, kTileRows, a.rows, dim);

  float dk[kRowsPerWarp][kPerLane], dv[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) dk[rr][t] = dv[rr][t] = 0.0f;
  }

  // Causal: only queries at or after the block's first key see any of its keys.
  for (int64_t q0 = a.causal ? key0 : 0; q0 < a.rows; q0 += kTileKeys) {
    __syncthreads();
    LoadRows<T>(q_s, dim + 1, a.q, j, k, q0, kTileKeys, a.rows, dim);
    LoadRows<T>(do_s, dim + 1, a.dout, j, k, q0, kTileKeys, a.rows, dim);
    if (threadIdx.x < kTileKeys) {
      const int64_t i = q0 + threadIdx.x;
      lse_s[threadIdx.x] = i < a.rows ? a.stats[row_base + i] : 0.0f;
      delta_s[threadIdx.x] = i < a.rows ? a.delta[row_base + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t key = key0 + r;
      if (key >= a.rows) continue;
      const int64_t i = q0 + lane;
      const bool valid = i < a.rows && (!a.causal || i >= key);
      float p = 0.0f, ds = 0.0f;
      if (valid) {
        const float* qr = q_s + lane * (dim + 1);
        const float* dor = do_s + lane * (dim + 1);
        const float* kr = k_s + r * dim;
        const float* vr = v_s + r * dim;
        float dot = 0.0f, dp = 0.0f;
        for (int d = 0; d < dim; ++d) {
          dot = fmaf(qr[d], kr[d], dot);
          dp = fmaf(dor[d], vr[d], dp);
        }
        p = expf(dot * a.scale - lse_s[lane]);
        ds = p * (dp - delta_s[lane]);
      }
      for (int ii = 0; ii < kTileKeys; ++ii) {
        const float pi = __shfl_sync(kFull, p, ii);
        const float dsi = __shfl_sync(kFull, ds, ii);
        const float* qr = q_s + ii * (dim + 1);
        const float* dor = do_s + ii * (dim + 1);
#pragma unroll
        for (int t = 0; t < kPerLane; ++t) {
          const int d = lane + 32 * t;
          if (d < dim) {
            dv[rr][t] = fmaf(pi, dor[d], dv[rr][t]);
            dk[rr][t] = fmaf(dsi, qr[d], dk[rr][t]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t key = key0 + warp * kRowsPerWarp + rr;
    if (key >= a.rows) continue;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int d = lane + 32 * t;
      if (d < dim) {
        Store<T>(At<T>(a.dk, j, k, key, d), dk[rr][t] * a.scale);
        Store<T>(At<T>(a.dv, j, k, key, d), dv[rr][t]);
      }
    }
  }
}

template <typename Kernel>
cudaError_t AllowSharedMemory(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

template <typename T>
cudaError_t Forward(const KernelForwardArgs& a, cudaStream_t stream) {
  const int64_t row_tiles = (a.rows + kTileRows - 1) / kTileRows;
  const int dim = static_cast<int>(a.head_dim);
  const size_t smem = sizeof(float) * (kTileRows * dim + kTileKeys * (dim + 1) + kTileKeys * dim);
  if (cudaError_t e = AllowSharedMemory(ForwardKernel<T>, smem); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.count * row_tiles), static_cast<unsigned>(a.heads));
  ForwardKernel<T><<<grid, kThreads, smem, stream>>>(a, row_tiles);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Backward(const KernelBackwardArgs& a, cudaStream_t stream) {
  const int dim = static_cast<int>(a.head_dim);
  const int64_t total_rows = a.count * a.heads * a.rows;
  const int64_t delta_blocks = std::min<int64_t>((total_rows + kWarps - 1) / kWarps, 65536);
  DeltaKernel<T><<<static_cast<unsigned>(delta_blocks), kThreads, 0, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  const int64_t tiles = (a.rows + kTileRows - 1) / kTileRows;
  const dim3 grid(static_cast<unsigned>(a.count * tiles), static_cast<unsigned>(a.heads));
  const size_t dq_smem = sizeof(float) * (2 * kTileRows * dim + 2 * kTileKeys * (dim + 1));
  if (cudaError_t e = AllowSharedMemory(DqKernel<T>, dq_smem); e != cudaSuccess) return e;
  DqKernel<T><<<grid, kThreads, dq_smem, stream>>>(a, tiles);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  const size_t kv_smem =
      sizeof(float) * (2 * kTileRows * dim + 2 * kTileKeys * (dim + 1) + 2 * kTileKeys);
  if (cudaError_t e = AllowSharedMemory(DkdvKernel<T>, kv_smem); e != cudaSuccess) return e;
  DkdvKernel<T><<<grid, kThreads, kv_smem, stream>>>(a, tiles);
  return cudaGetLastError();
}

// Whether a call's grid can be launched: an unsupported head dim or a grid past CUDA's limits is an
// error; a call with nothing to compute sets *empty.
cudaError_t CheckGeometry(int64_t head_dim, int64_t count, int64_t heads, int64_t rows,
                          bool* empty) {
  if (head_dim < 1 || head_dim > kKernelMaxHeadDim) return cudaErrorInvalidValue;
  *empty = count == 0 || heads == 0 || rows == 0;
  if (*empty) return cudaSuccess;
  if (count * ((rows + kTileRows - 1) / kTileRows) > INT_MAX || heads > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchAttentionForward(const KernelForwardArgs& args, cudaStream_t stream) {
  bool empty = false;
  if (cudaError_t e = CheckGeometry(args.head_dim, args.count, args.heads, args.rows, &empty);
      e != cudaSuccess || empty) {
    return e;
  }
  switch (args.type) {
    case ElemType::kF32:
      return Forward<float>(args, stream);
    case ElemType::kF16:
      return Forward<__half>(args, stream);
    case ElemType::kBF16:
      return Forward<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchAttentionBackward(const KernelBackwardArgs& args, cudaStream_t stream) {
  bool empty = false;
  if (cudaError_t e = CheckGeometry(args.head_dim, args.count, args.heads, args.rows, &empty);
      e != cudaSuccess || empty) {
    return e;
  }
  switch (args.type) {
    case ElemType::kF32:
      return Backward<float>(args, stream);
    case ElemType::kF16:
      return Backward<__half>(args, stream);
    case ElemType::kBF16:
      return Backward<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace dattn
