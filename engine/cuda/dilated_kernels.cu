// Memory-bound helpers of the dilated attention CUDA backend (see dilated_kernels.h for contracts).
//
// FLOPs: negligible (a few per element). Bytes: stated per launcher in the header; every kernel
// touches each byte it needs once. Indexing avoids per-row integer division: a block owns one
// (block j, head k) tile of a call, or one chunk of one segment, so that positions and rows follow
// from loop counters by multiply-adds (one division per thread block). Rows are moved by groups of
// lanes with 16-byte vectors (a row of D = 64 bf16 channels is 8 lanes x 16 bytes, so a warp moves
// 4 rows at a time). 64-bit indices throughout.
#include "engine/cuda/dilated_kernels.h"
#include "engine/cuda/elem_convert.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

namespace dattn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowIters = 4;  // rows per lane group per block

// The unit a lane moves: 16 bytes of T (vectorized) or one T.
template <typename T, bool kVec>
struct Unit {
  static constexpr int kElems = kVec ? 16 / sizeof(T) : 1;
  using Raw = typename std::conditional<kVec, uint4, T>::type;
  Raw raw;
  __device__ __forceinline__ T* v() { return reinterpret_cast<T*>(&raw); }
};

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Whether in-segment position `local` is selected with this offset and rate. Positions fit 32 bits
// (N < 2^31 for any tensor a GPU holds), so the remainder is a 32-bit one; a rate past 2^31 selects
// only the offset itself.
__device__ __forceinline__ bool Selected(int64_t local, int64_t offset, int64_t rate) {
  if (local < offset) return false;
  const int64_t d = local - offset;
  if (rate > INT_MAX) return d == 0;
  return static_cast<uint32_t>(d) % static_cast<uint32_t>(rate) == 0;
}

__device__ __forceinline__ int64_t HeadOffset(const HeadRule& rule, int64_t h) {
  switch (rule.kind) {
    case HeadRule::kFixed:
      return rule.fixed_offset;
    case HeadRule::kModulo:
      return h % rule.rate;
    case HeadRule::kBlocked:
      return h / rule.block;
  }
  return 0;
}

int NextPow2(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Lane-group geometry for rows of `units` units: `group` lanes (a power of two <= 32) per row.
struct Groups {
  int group = 32;
  int rows_per_block = 0;
};
Groups GroupsFor(int64_t units_per_row) {
  Groups g;
  g.group = NextPow2(static_cast<int>(std::min<int64_t>(32, std::max<int64_t>(1, units_per_row))));
  g.rows_per_block = (kThreads / g.group) * kRowIters;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Rows the pattern does not select.

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    FillRowsKernel(T* x, RowSpace sp, HeadRule rule, int64_t segments, int64_t chunks,
                   int64_t unit_heads, int group, int rows_per_block, bool scale_selected,
                   float scale) {
  using U = Unit<T, kVec>;
  const int64_t seg = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x - seg * chunks;
  const int64_t b = seg / segments;
  const int64_t start = (seg - b * segments) * rule.segment;
  const int64_t seg_len = Min64(rule.segment, sp.seq_len - start);
  const int64_t heads = rule.head_end - rule.head_begin;
  const int64_t units_per_head_run = unit_heads * sp.dim / U::kElems;  // units of one row unit
  const int64_t row_units = heads / unit_heads;                        // row units per position
  const int lane_in = threadIdx.x % group;
  const int gid = threadIdx.x / group;
  const int groups = kThreads / group;
  const int64_t l0 = chunk * rows_per_block;
  const int64_t l_end = Min64(seg_len, l0 + rows_per_block);
  if (l_end <= l0) return;  // a chunk past the end of a partial segment
  // Work items: (position l, row unit u) pairs of this chunk, one per lane group at a time; fewer
  // than 2^31 per block, so 32-bit arithmetic.
  const uint32_t units = static_cast<uint32_t>(row_units);
  const uint32_t items = static_cast<uint32_t>((l_end - l0) * row_units);
  for (uint32_t it = gid; it < items; it += groups) {
    const uint32_t lq = it / units;
    const int64_t l = l0 + lq;
    const int64_t u = it - lq * units;
    const int64_t h = rule.head_begin + u * unit_heads;
    const bool sel = Selected(l, HeadOffset(rule, h), rule.rate);
    if (sel && !scale_selected) continue;
    U* row = reinterpret_cast<U*>(x + ((b * sp.seq_len + start + l) * sp.heads + h) * sp.dim);
    for (int64_t e = lane_in; e < units_per_head_run; e += group) {
      if (!sel) {
        U zero;
#pragma unroll
        for (int i = 0; i < U::kElems; ++i) zero.v()[i] = FromF<T>(0.0f);
        row[e] = zero;
      } else {
        U val = row[e];
#pragma unroll
        for (int i = 0; i < U::kElems; ++i) val.v()[i] = FromF<T>(ToF<T>(val.v()[i]) * scale);
        row[e] = val;
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    FillLseKernel(float* lse, RowSpace sp, HeadRule rule, int64_t p_chunks) {
  const int64_t bh = blockIdx.x / p_chunks;
  const int64_t pc = blockIdx.x - bh * p_chunks;
  const int64_t heads = rule.head_end - rule.head_begin;
  const int64_t b = bh / heads;
  const int64_t h = rule.head_begin + (bh - b * heads);
  const int64_t offset = HeadOffset(rule, h);
  const int64_t p = pc * kThreads + threadIdx.x;
  if (p >= sp.seq_len) return;
  if (!Selected(p % rule.segment, offset, rule.rate)) {
    lse[(b * sp.heads + h) * sp.seq_len + p] = -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// Per-call row kernels: grid.x = count * tiles, grid.y = heads.

struct CallBlock {
  int64_t j, k, tile;
  int64_t flat_j;  // flat position of the block's first row
  int64_t lse_j;   // lse index of the block's first row
  int64_t head;    // the head
};

__device__ __forceinline__ CallBlock BlockOf(const CallRows& c, const RowSpace& sp, int64_t tiles) {
  CallBlock cb;
  cb.j = blockIdx.x / tiles;
  cb.tile = blockIdx.x - cb.j * tiles;
  cb.k = blockIdx.y;
  cb.flat_j = c.first_flat + cb.j * c.block_step;
  const int64_t b = cb.flat_j / sp.seq_len;
  cb.head = c.head0 + cb.k * c.head_step;
  cb.lse_j = (b * sp.heads + cb.head) * sp.seq_len + (cb.flat_j - b * sp.seq_len);
  return cb;
}

__global__ void __launch_bounds__(kThreads)
    MoveStatsKernel(const float* src, float* dst, float add, CallRows c, RowSpace sp, int64_t tiles,
                    bool scatter) {
  const CallBlock cb = BlockOf(c, sp, tiles);
  const int64_t s = cb.tile * kThreads + threadIdx.x;
  if (s >= c.rows) return;
  const int64_t packed = (cb.j * c.heads + cb.k) * c.rows + s;
  const int64_t li = cb.lse_j + s * c.rate;
  if (scatter) {
    dst[li] = src[packed];
  } else {
    dst[packed] = src[li] + add;
  }
}

enum class RowOp { kGather, kScale, kMerge, kAccumulate };

template <typename T, bool kVec, RowOp kOp>
__global__ void __launch_bounds__(kThreads)
    RowKernel(const T* tile, T* x, T* x1, T* x2, const float* stats, float* lse, float scale,
              CallRows c, RowSpace sp, int64_t tiles, int group, int rows_per_block) {
  using U = Unit<T, kVec>;
  const CallBlock cb = BlockOf(c, sp, tiles);
  const int lane_in = threadIdx.x % group;
  const int gid = threadIdx.x / group;
  const int groups = kThreads / group;
  const int64_t units = sp.dim / U::kElems;
  const int64_t tile_elems = c.count * c.heads * c.rows * sp.dim;
  for (int i = 0; i < kRowIters; ++i) {
    const int64_t s = cb.tile * rows_per_block + i * groups + gid;
    if (s >= c.rows) break;
    const int64_t packed = (cb.j * c.heads + cb.k) * c.rows + s;
    const int64_t row = (cb.flat_j + s * c.rate) * sp.heads + cb.head;
    const U* tr = reinterpret_cast<const U*>(tile + packed * sp.dim);
    if (kOp == RowOp::kGather) {
      U* out = reinterpret_cast<U*>(const_cast<T*>(tile) + packed * sp.dim);
      const U* in = reinterpret_cast<const U*>(x + row * sp.dim);
      for (int64_t e = lane_in; e < units; e += group) {
        U val = in[e];
#pragma unroll
        for (int q = 0; q < U::kElems; ++q) val.v()[q] = FromF<T>(ToF<T>(val.v()[q]) * scale);
        out[e] = val;
      }
    } else if (kOp == RowOp::kScale) {
      U* xr = reinterpret_cast<U*>(x + row * sp.dim);
      for (int64_t e = lane_in; e < units; e += group) {
        U val = xr[e];
#pragma unroll
        for (int q = 0; q < U::kElems; ++q) val.v()[q] = FromF<T>(ToF<T>(val.v()[q]) * scale);
        xr[e] = val;
      }
    } else if (kOp == RowOp::kMerge) {
      const int64_t li = cb.lse_j + s * c.rate;
      const float old_l = lse[li];
      const float new_l = stats[packed];
      float total_l, w_old, w_new;
      if (old_l == -INFINITY) {
        total_l = new_l;
        w_old = 0.0f;
        w_new = 1.0f;
      } else if (new_l == -INFINITY) {
        total_l = old_l;
        w_old = 1.0f;
        w_new = 0.0f;
      } else {
        const float hi = fmaxf(old_l, new_l);
        total_l = hi + log1pf(expf(fminf(old_l, new_l) - hi));
        w_old = expf(old_l - total_l);
        w_new = expf(new_l - total_l);
      }
      U* xr = reinterpret_cast<U*>(x + row * sp.dim);
      for (int64_t e = lane_in; e < units; e += group) {
        U a = xr[e];
        U t = tr[e];
#pragma unroll
        for (int q = 0; q < U::kElems; ++q) {
          a.v()[q] = FromF<T>(ToF<T>(a.v()[q]) * w_old + ToF<T>(t.v()[q]) * w_new);
        }
        xr[e] = a;
      }
      // Every lane of the group has read lse before its leader writes it. The group's lanes share
      // s, so they all reach this point.
      const unsigned lane = threadIdx.x & 31;
      const unsigned mask =
          group == 32 ? 0xffffffffu : (((1u << group) - 1u) << (lane / group * group));
      __syncwarp(mask);
      if (lane_in == 0) lse[li] = total_l;
    } else {
      T* outs[3] = {x, x1, x2};
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        U* xr = reinterpret_cast<U*>(outs[g] + row * sp.dim);
        const U* tg = reinterpret_cast<const U*>(tile + g * tile_elems + packed * sp.dim);
        for (int64_t e = lane_in; e < units; e += group) {
          U a = xr[e];
          U t = tg[e];
#pragma unroll
          for (int q = 0; q < U::kElems; ++q) {
            a.v()[q] = FromF<T>(ToF<T>(a.v()[q]) + ToF<T>(t.v()[q]));
          }
          xr[e] = a;
        }
      }
    }
  }
}

template <typename T>
bool CanVectorize(int64_t dim, std::initializer_list<const void*> ptrs) {
  if ((dim * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && !Aligned16(p)) return false;
  }
  return true;
}

template <typename T, bool kVec>
cudaError_t FillRowsT(void* x, const RowSpace& sp, const HeadRule& rule, bool scale_selected,
                      float scale, cudaStream_t stream) {
  const int64_t heads = rule.head_end - rule.head_begin;
  // A fixed offset makes a position's heads one contiguous run; otherwise each head is a unit.
  const int64_t unit_heads = rule.kind == HeadRule::kFixed ? heads : 1;
  const int64_t units_per_run = unit_heads * sp.dim / Unit<T, kVec>::kElems;
  const Groups g = GroupsFor(units_per_run);
  const int64_t row_units = heads / unit_heads;
  // Rows per block so that each lane group gets about kRowIters items.
  const int64_t rows_per_block =
      std::max<int64_t>(1, static_cast<int64_t>(kThreads / g.group) * kRowIters / row_units);
  const int64_t segments = (sp.seq_len + rule.segment - 1) / rule.segment;
  const int64_t seg_rows = std::min(rule.segment, sp.seq_len);
  const int64_t chunks = (seg_rows + rows_per_block - 1) / rows_per_block;
  const int64_t blocks = sp.batch * segments * chunks;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  FillRowsKernel<T, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<T*>(x), sp, rule, segments, chunks, unit_heads, g.group,
      static_cast<int>(rows_per_block), scale_selected, scale);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FillRows(void* x, const RowSpace& sp, const HeadRule& rule, bool scale_selected,
                     float scale, cudaStream_t stream) {
  if (CanVectorize<T>(sp.dim, {x})) {
    return FillRowsT<T, true>(x, sp, rule, scale_selected, scale, stream);
  }
  return FillRowsT<T, false>(x, sp, rule, scale_selected, scale, stream);
}

bool GridFits(const CallRows& c, int64_t tiles) {
  return c.count * tiles <= INT_MAX && c.heads <= 65535;
}

template <typename T, bool kVec, RowOp kOp>
cudaError_t RowsT(const void* tile, void* x, void* x1, void* x2, const float* stats, float* lse,
                  float scale, const CallRows& c, const RowSpace& sp, cudaStream_t stream) {
  const Groups g = GroupsFor(sp.dim / Unit<T, kVec>::kElems);
  const int64_t tiles = (c.rows + g.rows_per_block - 1) / g.rows_per_block;
  if (!GridFits(c, tiles)) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(c.count * tiles), static_cast<unsigned>(c.heads));
  RowKernel<T, kVec, kOp><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(tile), static_cast<T*>(x), static_cast<T*>(x1), static_cast<T*>(x2),
      stats, lse, scale, c, sp, tiles, g.group, g.rows_per_block);
  return cudaGetLastError();
}

template <typename T, RowOp kOp>
cudaError_t Rows(const void* tile, void* x, void* x1, void* x2, const float* stats, float* lse,
                 float scale, const CallRows& c, const RowSpace& sp, cudaStream_t stream) {
  const int64_t tile_bytes = c.count * c.heads * c.rows * sp.dim * static_cast<int64_t>(sizeof(T));
  if (CanVectorize<T>(sp.dim, {tile, x, x1, x2}) && tile_bytes % 16 == 0) {
    return RowsT<T, true, kOp>(tile, x, x1, x2, stats, lse, scale, c, sp, stream);
  }
  return RowsT<T, false, kOp>(tile, x, x1, x2, stats, lse, scale, c, sp, stream);
}

template <RowOp kOp>
cudaError_t RowsByType(ElemType type, const void* tile, void* x, void* x1, void* x2,
                       const float* stats, float* lse, float scale, const CallRows& c,
                       const RowSpace& sp, cudaStream_t stream) {
  if (c.count * c.heads * c.rows == 0) return cudaSuccess;
  switch (type) {
    case ElemType::kF32:
      return Rows<float, kOp>(tile, x, x1, x2, stats, lse, scale, c, sp, stream);
    case ElemType::kF16:
      return Rows<__half, kOp>(tile, x, x1, x2, stats, lse, scale, c, sp, stream);
    case ElemType::kBF16:
      return Rows<__nv_bfloat16, kOp>(tile, x, x1, x2, stats, lse, scale, c, sp, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t MoveStats(const float* src, float* dst, float add, const CallRows& c,
                      const RowSpace& sp, bool scatter, cudaStream_t stream) {
  if (c.count * c.heads * c.rows == 0) return cudaSuccess;
  const int64_t tiles = (c.rows + kThreads - 1) / kThreads;
  if (!GridFits(c, tiles)) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(c.count * tiles), static_cast<unsigned>(c.heads));
  MoveStatsKernel<<<grid, kThreads, 0, stream>>>(src, dst, add, c, sp, tiles, scatter);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchFillRows(void* x, ElemType type, const RowSpace& space, const HeadRule& rule,
                           bool scale_selected, float selected_scale, cudaStream_t stream) {
  if (space.batch * space.seq_len == 0 || rule.head_end <= rule.head_begin) return cudaSuccess;
  switch (type) {
    case ElemType::kF32:
      return FillRows<float>(x, space, rule, scale_selected, selected_scale, stream);
    case ElemType::kF16:
      return FillRows<__half>(x, space, rule, scale_selected, selected_scale, stream);
    case ElemType::kBF16:
      return FillRows<__nv_bfloat16>(x, space, rule, scale_selected, selected_scale, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchFillLse(float* lse, const RowSpace& space, const HeadRule& rule,
                          cudaStream_t stream) {
  const int64_t heads = rule.head_end - rule.head_begin;
  if (space.batch * heads * space.seq_len <= 0) return cudaSuccess;
  const int64_t p_chunks = (space.seq_len + kThreads - 1) / kThreads;
  const int64_t blocks = space.batch * heads * p_chunks;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  FillLseKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(lse, space, rule, p_chunks);
  return cudaGetLastError();
}

cudaError_t LaunchScatterStats(const float* stats, float* lse, const CallRows& rows,
                               const RowSpace& space, cudaStream_t stream) {
  return MoveStats(stats, lse, 0.0f, rows, space, /*scatter=*/true, stream);
}

cudaError_t LaunchGatherStats(const float* lse, float* stats, float add, const CallRows& rows,
                              const RowSpace& space, cudaStream_t stream) {
  return MoveStats(lse, stats, add, rows, space, /*scatter=*/false, stream);
}

cudaError_t LaunchGatherRows(const void* x, void* tile, float scale, ElemType type,
                             const CallRows& rows, const RowSpace& space, cudaStream_t stream) {
  return RowsByType<RowOp::kGather>(type, tile, const_cast<void*>(x), nullptr, nullptr, nullptr,
                                    nullptr, scale, rows, space, stream);
}

cudaError_t LaunchScaleRows(void* x, float scale, ElemType type, const CallRows& rows,
                            const RowSpace& space, cudaStream_t stream) {
  return RowsByType<RowOp::kScale>(type, nullptr, x, nullptr, nullptr, nullptr, nullptr, scale,
                                   rows, space, stream);
}

cudaError_t LaunchMergeTile(const void* tile, const float* stats, void* x, float* lse,
                            ElemType type, const CallRows& rows, const RowSpace& space,
                            cudaStream_t stream) {
  return RowsByType<RowOp::kMerge>(type, tile, x, nullptr, nullptr, stats, lse, 1.0f, rows, space,
                                   stream);
}

cudaError_t LaunchAccumulateTiles(const void* tiles, void* dq, void* dk, void* dv, ElemType type,
                                  const CallRows& rows, const RowSpace& space,
                                  cudaStream_t stream) {
  return RowsByType<RowOp::kAccumulate>(type, tiles, dq, dk, dv, nullptr, nullptr, 1.0f, rows,
                                        space, stream);
}

}  // namespace cuda
}  // namespace dattn
