// Memory-bound kernels of the ring's CUDA block kernels (contracts in cuda_block_kernels_launch.h).
//
// Two kinds. The row movers (CopyRows, MergeRows, GatherLse) serve packed blocks and the query
// tiles of segments shared by several ranks: O((N/P)/r) rows per pattern, a small fraction of the
// shard, so they are plain grid-stride loops with 64-bit index arithmetic. The fills (InitRows,
// ScaleSelected) sweep whole shards (2 GiB per tensor at 2^20 tokens, H = 16, D = 64, bf16), so
// they move rows with 16-byte vectors by lane groups, and one lane per row decides (32-bit
// divisions) and broadcasts the decision with a shuffle.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "engine/cuda/elem_convert.h"
#include "engine/ring/cuda_block_kernels_launch.h"

namespace dattn {
namespace ring {
namespace cudak {
namespace {

using cuda::ElemType;
using cuda::FromF;
using cuda::ToF;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 16384;

int BlocksFor(int64_t work) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (work + kThreads - 1) / kThreads)));
}

__device__ __forceinline__ int64_t Offset(const RowMap& m, int64_t b, int64_t k, int64_t i) {
  return m.base + b * m.sb + k * m.sk + i * m.si;
}

__device__ __forceinline__ int64_t StatsIndex(const StatsMap& s, int64_t b, int64_t k, int64_t i) {
  const int64_t t = i / s.chunk;
  return ((t * s.nb + b) * s.nk + k) * s.chunk + (i - t * s.chunk);
}

// ---------------------------------------------------------------------------------------------
// Row movers.

template <typename S, typename D>
__global__ void __launch_bounds__(kThreads)
    CopyRowsKernel(const S* src, RowMap sm, D* dst, RowMap dm, int64_t nb, int64_t nk, int64_t rows,
                   int64_t dim, float scale, bool accumulate) {
  const int64_t total = nb * nk * rows * dim;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * kThreads) {
    const int64_t d = e % dim;
    const int64_t r1 = e / dim;
    const int64_t i = r1 % rows;
    const int64_t r2 = r1 / rows;
    const int64_t k = r2 % nk;
    const int64_t b = r2 / nk;
    const float v = scale * ToF<S>(src[Offset(sm, b, k, i) + d * sm.sc]);
    D* out = dst + Offset(dm, b, k, i) + d * dm.sc;
    *out = FromF<D>(accumulate ? ToF<D>(*out) + v : v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    MergeRowsKernel(const T* tile, RowMap tm, const float* stats, StatsMap sm, T* out, RowMap om,
                    float* lse, RowMap lm, int64_t nb, int64_t nk, int64_t rows, int64_t dim,
                    bool direct) {
  const int64_t total = nb * nk * rows;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * kThreads) {
    const int64_t i = e % rows;
    const int64_t r = e / rows;
    const int64_t k = r % nk;
    const int64_t b = r / nk;
    const float l = stats[StatsIndex(sm, b, k, i)];
    if (!(l > -INFINITY)) continue;  // no visible key: nothing to merge
    const T* t = tile + Offset(tm, b, k, i);
    T* o = out + Offset(om, b, k, i);
    float* row_lse = lse + Offset(lm, b, k, i);
    if (direct) {
      for (int64_t d = 0; d < dim; ++d) o[d * om.sc] = t[d * tm.sc];
      *row_lse = l;
      continue;
    }
    const float old = *row_lse;
    float keep = 0.0f, add = 1.0f, merged = l;
    if (old > -INFINITY) {
      const float m = fmaxf(old, l);
      merged = m + log1pf(expf(-fabsf(old - l)));
      keep = expf(old - merged);
      add = expf(l - merged);
    }
    for (int64_t d = 0; d < dim; ++d) {
      T* x = o + d * om.sc;
      const float prev = keep == 0.0f ? 0.0f : ToF<T>(*x) * keep;
      *x = FromF<T>(prev + ToF<T>(t[d * tm.sc]) * add);
    }
    *row_lse = merged;
  }
}

__global__ void __launch_bounds__(kThreads)
    GatherLseKernel(const float* lse, RowMap lm, float add, float* stats, StatsMap sm, int64_t nb,
                    int64_t nk, int64_t rows) {
  const int64_t total = nb * nk * rows;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * kThreads) {
    const int64_t i = e % rows;
    const int64_t r = e / rows;
    const int64_t k = r % nk;
    const int64_t b = r / nk;
    stats[StatsIndex(sm, b, k, i)] = lse[Offset(lm, b, k, i)] + add;
  }
}

__global__ void __launch_bounds__(kThreads) AddF32Kernel(float* dst, const float* src, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * kThreads) {
    dst[e] += src[e];
  }
}

__global__ void __launch_bounds__(kThreads) FillF32Kernel(float* dst, int64_t n, float value) {
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * kThreads) {
    dst[e] = value;
  }
}

// ---------------------------------------------------------------------------------------------
// Fills over whole shards.

template <typename T, bool kVec>
struct Unit {
  static constexpr int kElems = kVec ? 16 / sizeof(T) : 1;
  using Raw = typename std::conditional<kVec, uint4, T>::type;
  Raw raw;
  __device__ __forceinline__ T* v() { return reinterpret_cast<T*>(&raw); }
};

// 0: leave the row; 1: the row is selected (written once or accumulated); flags below.
constexpr int kSelected = 1;
constexpr int kInChunk = 2;
constexpr int kNoPattern = 4;

__device__ __forceinline__ int Classify(const FillParams& P, uint32_t p, uint32_t h) {
  for (int i = 0; i < P.patterns; ++i) {
    const FillPattern& f = P.p[i];
    if (static_cast<int32_t>(h) < f.head_begin || static_cast<int32_t>(h) >= f.head_end) continue;
    const uint32_t g = P.shard_begin + p;
    const uint32_t local = g % f.w;
    int c = 0;
    if (local >= f.o && (local - f.o) % f.r == 0) c |= kSelected;
    for (int j = 0; j < 2; ++j) {
      if (static_cast<int32_t>(p) >= f.chunk_begin[j] && static_cast<int32_t>(p) < f.chunk_end[j]) {
        c |= kInChunk;
      }
    }
    return c;
  }
  return kNoPattern;
}

// kScale = false: rows that are unselected or in a chunk := 0, lse := -inf. kScale = true: selected
// rows *= scale. One lane group of `group` lanes per row; the group's first lane classifies.
template <typename T, bool kVec, bool kScale>
__global__ void __launch_bounds__(kThreads)
    RowsKernel(T* x, float* lse, FillParams P, float scale, int group, int64_t total_rows) {
  using U = Unit<T, kVec>;
  const int lane_in = threadIdx.x % group;
  const int64_t groups_per_block = kThreads / group;
  const int64_t step = int64_t{gridDim.x} * groups_per_block;
  const int units = P.dim / U::kElems;
  // The row of the warp's first group: the loop runs the same number of times on every lane of a
  // warp, so that the shuffle sees all of them.
  const int64_t warp_groups = 32 / group;
  const int64_t my_group = blockIdx.x * groups_per_block + threadIdx.x / group;
  const int64_t warp_first = my_group - (threadIdx.x / group) % warp_groups;
  const int64_t offset_in_warp = my_group - warp_first;
  for (int64_t base = warp_first; base < total_rows; base += step) {
    const int64_t row = base + offset_in_warp;
    const bool valid = row < total_rows;
    int cls = 0;
    uint32_t h = 0, p = 0, b = 0;
    if (valid) {
      const uint32_t r32 = static_cast<uint32_t>(row);
      h = r32 % static_cast<uint32_t>(P.heads);
      const uint32_t bp = r32 / static_cast<uint32_t>(P.heads);
      p = bp % static_cast<uint32_t>(P.shard_len);
      b = bp / static_cast<uint32_t>(P.shard_len);
      if (lane_in == 0) cls = Classify(P, p, h);
    }
    cls = __shfl_sync(0xffffffffu, cls, 0, group);
    if (!valid) continue;
    const bool act =
        kScale ? (cls & kSelected) != 0 : ((cls & kSelected) == 0 || (cls & kInChunk) != 0);
    if (!act) continue;
    U* dst = reinterpret_cast<U*>(x + row * static_cast<int64_t>(P.dim));
    for (int u = lane_in; u < units; u += group) {
      U val;
      if (kScale) {
        val = dst[u];
#pragma unroll
        for (int e = 0; e < U::kElems; ++e) val.v()[e] = FromF<T>(ToF<T>(val.v()[e]) * scale);
      } else {
#pragma unroll
        for (int e = 0; e < U::kElems; ++e) val.v()[e] = FromF<T>(0.0f);
      }
      dst[u] = val;
    }
    if (!kScale && lse != nullptr && lane_in == 0) {
      lse[(static_cast<int64_t>(b) * P.heads + h) * P.shard_len + p] = -INFINITY;
    }
  }
}

// The same fills, faster where a position's rows (H x D contiguous elements) split evenly into
// the block's threads: each block takes kFastPositions positions of one batch item, classifies all
// their (position, head) rows first (every lane busy), then moves 16-byte units with consecutive
// threads on consecutive units of a position's rows.
constexpr int kFastPositions = 64;
constexpr int kFastMaxHeads = 256;

template <typename T, bool kScale>
__global__ void __launch_bounds__(kThreads)
    RowsFastKernel(T* x, float* lse, FillParams P, float scale, int64_t chunks) {
  using U = Unit<T, true>;
  __shared__ unsigned char act[kFastPositions * kFastMaxHeads];
  const int64_t b = blockIdx.x / chunks;
  const int64_t p0 = (blockIdx.x - b * chunks) * kFastPositions;
  const int npos =
      static_cast<int>(p0 + kFastPositions <= P.shard_len ? kFastPositions : P.shard_len - p0);
  const int heads = P.heads;
  for (int idx = threadIdx.x; idx < heads * kFastPositions; idx += kThreads) {
    const int h = idx / kFastPositions, pl = idx - h * kFastPositions;
    bool a = false;
    if (pl < npos) {
      const int cls = Classify(P, static_cast<uint32_t>(p0 + pl), static_cast<uint32_t>(h));
      a = kScale ? (cls & kSelected) != 0 : ((cls & kSelected) == 0 || (cls & kInChunk) != 0);
      if (!kScale && a && lse != nullptr) {
        lse[(b * heads + h) * P.shard_len + p0 + pl] = -INFINITY;
      }
    }
    act[idx] = a ? 1 : 0;
  }
  __syncthreads();
  const int units = P.dim / U::kElems;
  const int row_units = heads * units;  // divides kThreads (the launcher checks)
  const int t_unit = threadIdx.x % row_units;
  const int h = t_unit / units;
  for (int pl = threadIdx.x / row_units; pl < npos; pl += kThreads / row_units) {
    if (act[h * kFastPositions + pl] == 0) continue;
    U* dst = reinterpret_cast<U*>(x + (b * P.shard_len + p0 + pl) * heads * P.dim) + t_unit;
    U val;
    if (kScale) {
      val = *dst;
#pragma unroll
      for (int e = 0; e < U::kElems; ++e) val.v()[e] = FromF<T>(ToF<T>(val.v()[e]) * scale);
    } else {
#pragma unroll
      for (int e = 0; e < U::kElems; ++e) val.v()[e] = FromF<T>(0.0f);
    }
    *dst = val;
  }
}

int NextPow2(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <typename T, bool kScale>
cudaError_t LaunchRows(void* x, float* lse, const FillParams& params, float scale,
                       cudaStream_t stream) {
  const int64_t total = int64_t{params.batch} * params.shard_len * params.heads;
  if (total == 0) return cudaSuccess;
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   (static_cast<int64_t>(params.dim) * sizeof(T)) % 16 == 0;
  const int units = vec ? params.dim / static_cast<int>(16 / sizeof(T)) : params.dim;
  if (vec && params.heads <= kFastMaxHeads && kThreads % (params.heads * units) == 0) {
    const int64_t chunks = (params.shard_len + kFastPositions - 1) / kFastPositions;
    RowsFastKernel<T, kScale>
        <<<static_cast<unsigned>(params.batch * chunks), kThreads, 0, stream>>>(
            static_cast<T*>(x), lse, params, scale, chunks);
    return cudaGetLastError();
  }
  const int group = std::min(32, NextPow2(std::max(1, units)));
  const int64_t lanes = total * group;
  const int blocks = BlocksFor(lanes);
  if (vec) {
    RowsKernel<T, true, kScale>
        <<<blocks, kThreads, 0, stream>>>(static_cast<T*>(x), lse, params, scale, group, total);
  } else {
    RowsKernel<T, false, kScale>
        <<<blocks, kThreads, 0, stream>>>(static_cast<T*>(x), lse, params, scale, group, total);
  }
  return cudaGetLastError();
}

template <bool kScale>
cudaError_t DispatchRows(void* x, ElemType type, float* lse, const FillParams& params, float scale,
                         cudaStream_t stream) {
  switch (type) {
    case ElemType::kF16:
      return LaunchRows<__half, kScale>(x, lse, params, scale, stream);
    case ElemType::kBF16:
      return LaunchRows<__nv_bfloat16, kScale>(x, lse, params, scale, stream);
    case ElemType::kF32:
      return LaunchRows<float, kScale>(x, lse, params, scale, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename S>
cudaError_t CopyTo(const S* src, const RowMap& sm, void* dst, ElemType dst_type, const RowMap& dm,
                   int64_t nb, int64_t nk, int64_t rows, int64_t dim, float scale, bool accumulate,
                   cudaStream_t stream) {
  const int blocks = BlocksFor(nb * nk * rows * dim);
  switch (dst_type) {
    case ElemType::kF16:
      CopyRowsKernel<S, __half><<<blocks, kThreads, 0, stream>>>(
          src, sm, static_cast<__half*>(dst), dm, nb, nk, rows, dim, scale, accumulate);
      break;
    case ElemType::kBF16:
      CopyRowsKernel<S, __nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          src, sm, static_cast<__nv_bfloat16*>(dst), dm, nb, nk, rows, dim, scale, accumulate);
      break;
    case ElemType::kF32:
      CopyRowsKernel<S, float><<<blocks, kThreads, 0, stream>>>(
          src, sm, static_cast<float*>(dst), dm, nb, nk, rows, dim, scale, accumulate);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCopyRows(const void* src, ElemType src_type, const RowMap& src_map, void* dst,
                           ElemType dst_type, const RowMap& dst_map, int64_t nb, int64_t nk,
                           int64_t rows, int64_t dim, float scale, bool accumulate,
                           cudaStream_t stream) {
  if (nb * nk * rows * dim == 0) return cudaSuccess;
  switch (src_type) {
    case ElemType::kF16:
      return CopyTo(static_cast<const __half*>(src), src_map, dst, dst_type, dst_map, nb, nk, rows,
                    dim, scale, accumulate, stream);
    case ElemType::kBF16:
      return CopyTo(static_cast<const __nv_bfloat16*>(src), src_map, dst, dst_type, dst_map, nb, nk,
                    rows, dim, scale, accumulate, stream);
    case ElemType::kF32:
      return CopyTo(static_cast<const float*>(src), src_map, dst, dst_type, dst_map, nb, nk, rows,
                    dim, scale, accumulate, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchMergeRows(const void* tile, const RowMap& tile_map, const float* stats,
                            const StatsMap& stats_map, void* out, const RowMap& out_map, float* lse,
                            const RowMap& lse_map, ElemType type, int64_t nb, int64_t nk,
                            int64_t rows, int64_t dim, bool direct, cudaStream_t stream) {
  if (nb * nk * rows == 0) return cudaSuccess;
  const int blocks = BlocksFor(nb * nk * rows);
  switch (type) {
    case ElemType::kF16:
      MergeRowsKernel<__half><<<blocks, kThreads, 0, stream>>>(
          static_cast<const __half*>(tile), tile_map, stats, stats_map, static_cast<__half*>(out),
          out_map, lse, lse_map, nb, nk, rows, dim, direct);
      break;
    case ElemType::kBF16:
      MergeRowsKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(tile), tile_map, stats, stats_map,
          static_cast<__nv_bfloat16*>(out), out_map, lse, lse_map, nb, nk, rows, dim, direct);
      break;
    case ElemType::kF32:
      MergeRowsKernel<float><<<blocks, kThreads, 0, stream>>>(
          static_cast<const float*>(tile), tile_map, stats, stats_map, static_cast<float*>(out),
          out_map, lse, lse_map, nb, nk, rows, dim, direct);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchGatherLse(const float* lse, const RowMap& lse_map, float add, float* stats,
                            const StatsMap& stats_map, int64_t nb, int64_t nk, int64_t rows,
                            cudaStream_t stream) {
  if (nb * nk * rows == 0) return cudaSuccess;
  GatherLseKernel<<<BlocksFor(nb * nk * rows), kThreads, 0, stream>>>(lse, lse_map, add, stats,
                                                                      stats_map, nb, nk, rows);
  return cudaGetLastError();
}

cudaError_t LaunchAddF32(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddF32Kernel<<<BlocksFor(n), kThreads, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

cudaError_t LaunchFillF32(float* dst, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FillF32Kernel<<<BlocksFor(n), kThreads, 0, stream>>>(dst, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchInitRows(void* x, ElemType type, float* lse, const FillParams& params,
                           cudaStream_t stream) {
  return DispatchRows<false>(x, type, lse, params, 1.0f, stream);
}

cudaError_t LaunchScaleSelected(void* x, ElemType type, const FillParams& params, float scale,
                                cudaStream_t stream) {
  return DispatchRows<true>(x, type, nullptr, params, scale, stream);
}

}  // namespace cudak
}  // namespace ring
}  // namespace dattn
