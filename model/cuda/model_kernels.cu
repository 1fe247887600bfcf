// The model's kernels (model_kernels.h states each one's contract, shapes, FLOPs and bytes).
#include "model/cuda/model_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "model/cuda/bf16_vector.cuh"

namespace dattn {
namespace model {
namespace cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr double kInv2Pi = 0.15915494309189533577;
constexpr double k2PiHi = 6.28318530717958623200;      // 2 pi rounded to fp64
constexpr double k2PiLo = 2.44929359829470635445e-16;  // 2 pi - k2PiHi

// --- Element access: 8 consecutive values per thread, 16-byte loads and stores (bf16:
// bf16_vector.cuh's Load8, Unpack8, Store8).
__device__ __forceinline__ void Load8f(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void Store8f(float* p, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// --- Element math, written with explicit roundings so that every instantiation (and the
// recomputation in the backward pass) produces the same bits.
// erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7 for every x, far below the 2^-9 of the
// bf16 values it feeds), branch-free: erf(x) = sign(x) (1 - t P(t) e^(-x^2)), t = 1 / (1 + p |x|).
// About 14 instructions against libdevice's erff's 25-35 with branches: the GELU kernels are
// arithmetic-bound. *e_out := e^(-x^2), which GELU's derivative reuses.
__device__ __forceinline__ float ErfWithExp(float x, float* e_out) {
  const float a = fabsf(x);
  const float t = __fdividef(1.0f, __fmaf_rn(0.3275911f, a, 1.0f));
  float p = __fmaf_rn(t, 1.061405429f, -1.453152027f);
  p = __fmaf_rn(t, p, 1.421413741f);
  p = __fmaf_rn(t, p, -0.284496736f);
  p = __fmaf_rn(t, p, 0.254829592f);
  p = __fmul_rn(t, p);
  const float e = __expf(__fmul_rn(-a, a));
  *e_out = e;
  return copysignf(__fmaf_rn(-p, e, 1.0f), x);
}
// GELU(x) = x/2 (1 + erf(x / sqrt 2)).
__device__ __forceinline__ float Gelu(float x) {
  float e;
  const float erf = ErfWithExp(__fmul_rn(x, kInvSqrt2), &e);
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, erf));
}
// GELU(x) and its derivative Phi(x) + x phi(x) from one erf and one exp; *value has Gelu(x)'s bits
// (phi(x) = e^(-x^2/2) / sqrt(2 pi), the exp of the erf of x / sqrt 2).
__device__ __forceinline__ float GeluAndGrad(float x, float* value) {
  float e;
  const float one_e = __fadd_rn(1.0f, ErfWithExp(__fmul_rn(x, kInvSqrt2), &e));
  *value = __fmul_rn(__fmul_rn(0.5f, x), one_e);
  const float cdf = __fmul_rn(0.5f, one_e);
  return __fadd_rn(cdf, __fmul_rn(x, __fmul_rn(kInvSqrt2Pi, e)));
}
__device__ __forceinline__ float XHat(float v, float mu, float rs) {
  return __fmul_rn(__fsub_rn(v, mu), rs);
}
__device__ __forceinline__ float NormOut(float v, float mu, float rs, float g, float b) {
  return __fadd_rn(__fmul_rn(XHat(v, mu, rs), g), b);
}

// --- Row groups. blockDim.x = groups x group_threads; group_threads a multiple of 32. Sums K
// values over the threads of each group; every thread of the group gets the same bits (lane 0 of
// each warp stores, every thread adds the group's warps in order). All threads of the block call
// it the same number of times.
template <int K>
__device__ __forceinline__ void GroupSum(float (&v)[K], float* red, int group_threads) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = group_threads >> 5;
  const int first = (warp / warps) * warps;
#pragma unroll
  for (int j = 0; j < K; ++j) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], off);
  }
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < K; ++j) red[warp * K + j] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < K; ++j) {
    float s = 0.0f;
    for (int w = 0; w < warps; ++w) s += red[(first + w) * K + j];
    v[j] = s;
  }
  __syncthreads();
}

// A thread's columns: chunk i starts at (i * group_threads + t) * 8.
template <int kVec>
struct Cols {
  int64_t col[kVec];
  bool ok[kVec];
  __device__ __forceinline__ Cols(int t, int group_threads, int64_t n) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      col[i] = (static_cast<int64_t>(i) * group_threads + t) * 8;
      ok[i] = col[i] < n;
    }
  }
};

// The per-thread column accumulators of the backward row kernels live in dynamic shared memory
// (not registers, which the kernels need for their rows: the GELU backward would otherwise hold one
// CTA per multiprocessor), [3][kVec][8][blockDim] floats: a thread's own slots, consecutive
// threads in consecutive words (no bank conflicts), no synchronisation until the flush.
template <int kVec>
__device__ __forceinline__ float& Acc(float* smem, int k, int i, int e) {
  return smem[((k * kVec + i) * 8 + e) * blockDim.x + threadIdx.x];
}
inline size_t AccBytes(int vec, int threads) {
  return static_cast<size_t>(3) * 8 * vec * threads * sizeof(float);
}

// Writes the CTA's partial column sums (3 rows of n) to partials + blockIdx.x * 3 * n: the row
// groups' accumulators added in group order (0, 1, ...) by the threads of group 0.
template <int kVec>
__device__ __forceinline__ void FlushPartials(float* acc, const Cols<kVec>& c, int64_t n, int t,
                                              int group_id, int group_threads, int groups,
                                              float* partials) {
  __syncthreads();
  if (group_id != 0) return;
  float* out = partials + static_cast<int64_t>(blockIdx.x) * 3 * n;
#pragma unroll
  for (int k = 0; k < 3; ++k) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (!c.ok[i]) continue;
      float v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int slot = ((k * kVec + i) * 8 + e) * blockDim.x + t;
        float s = acc[slot];
        for (int g = 1; g < groups; ++g) s += acc[slot + g * group_threads];
        v[e] = s;
      }
      Store8f(out + k * n + c.col[i], v);
    }
  }
}

// --- Parameters.
__global__ void CastPackKernel(const float* __restrict__ master,
                               const PackSegment* __restrict__ segments, int num_segments,
                               int64_t chunks, bf16_t* __restrict__ packed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t dst = i * 8;
    int lo = 0, hi = num_segments - 1;  // last segment with segments[s].dst <= dst
    if (segments[0].dst > dst) continue;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (segments[mid].dst <= dst) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const PackSegment s = segments[lo];
    if (dst >= s.dst + s.n) continue;  // a gap between segments
    float v[8];
    Load8f(master + s.src + (dst - s.dst), v);
    Store8(packed + dst, v);
  }
}

// --- Embedding.
__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ tokens, int64_t m,
                                       const bf16_t* __restrict__ table, int64_t d,
                                       bf16_t* __restrict__ out) {
  const int64_t per_row = d / 8;
  const int64_t total = m * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_row, c = (i % per_row) * 8;
    const int64_t row = tokens[t];
    *reinterpret_cast<uint4*>(out + t * d + c) =
        *reinterpret_cast<const uint4*>(table + row * d + c);
  }
}

// grid (items, column blocks of 1024), block 128: one item's positions summed in order.
__global__ void EmbeddingItemKernel(const int64_t* __restrict__ order,
                                    const EmbeddingItem* __restrict__ items,
                                    const float* __restrict__ dx, int64_t d,
                                    float* __restrict__ partial) {
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  if (col >= d) return;
  const EmbeddingItem it = items[blockIdx.x];
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int32_t p = 0; p < it.count; ++p) {
    float v[8];
    Load8f(dx + order[it.begin + p] * d + col, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += v[e];
  }
  Store8f(partial + static_cast<int64_t>(blockIdx.x) * d + col, acc);
}

// grid (vocab, column blocks), block 128: one id's items added in order into its row.
__global__ void EmbeddingRowKernel(const int64_t* __restrict__ token_items,
                                   const float* __restrict__ partial, int64_t d,
                                   float* __restrict__ dtable) {
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  if (col >= d) return;
  const int64_t v = blockIdx.x;
  const int64_t first = token_items[v], last = token_items[v + 1];
  if (first == last) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t it = first; it < last; ++it) {
    float p[8];
    Load8f(partial + it * d + col, p);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += p[e];
  }
  float row[8];
  Load8f(dtable + v * d + col, row);
#pragma unroll
  for (int e = 0; e < 8; ++e) row[e] += acc[e];
  Store8f(dtable + v * d + col, row);
}

// --- Row prefetch: a thread's raw chunks of one row (8 bf16 in a uint4 each), loaded one row ahead
// so that the next row's loads are in flight while this one is reduced and written.
template <int kVec>
struct RawRow {
  uint4 v[kVec];
};
template <int kVec>
__device__ __forceinline__ void LoadRaw(const bf16_t* base, int64_t r, int64_t rows, int64_t n,
                                        const Cols<kVec>& c, RawRow<kVec>* out) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    out->v[i] = (r < rows && c.ok[i]) ? *reinterpret_cast<const uint4*>(base + r * n + c.col[i])
                                      : make_uint4(0, 0, 0, 0);
  }
}

// --- LayerNorm forward (of x or of GELU(x)).
template <int kVec, bool kGelu, bool kSaved>
__global__ void __launch_bounds__(kMaxRowThreads)
    LayerNormForwardKernel(const bf16_t* __restrict__ x, int64_t rows, int64_t n, int group_threads,
                           const float* __restrict__ gain, const float* __restrict__ shift,
                           float eps, bf16_t* __restrict__ y, float* __restrict__ mean,
                           float* __restrict__ rstd) {
  __shared__ float red[64];
  const int groups = blockDim.x / group_threads;
  const int gid = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const Cols<kVec> c(t, group_threads, n);
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups;
  const float inv_n = 1.0f / static_cast<float>(n);
  int64_t base = static_cast<int64_t>(blockIdx.x) * groups;
  RawRow<kVec> cur;
  LoadRaw(x, base + gid, rows, n, c, &cur);
  float g[kVec][8], b[kVec][8];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (c.ok[i]) {
      Load8f(gain + c.col[i], g[i]);
      Load8f(shift + c.col[i], b[i]);
    }
  }
  for (; base < rows; base += step) {
    const int64_t r = base + gid;
    const bool live = r < rows;
    RawRow<kVec> nxt;
    LoadRaw(x, r + step, rows, n, c, &nxt);
    float mu = 0.0f, rs = 0.0f;
    if (kSaved && live) {
      mu = mean[r];
      rs = rstd[r];
    }
    float v[kVec][8];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      Unpack8(cur.v[i], v[i]);
      if (kGelu) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[i][e] = Gelu(v[i][e]);
      }
    }
    if (!kSaved) {
      float s[1] = {0.0f};
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (!c.ok[i]) continue;
#pragma unroll
        for (int e = 0; e < 8; ++e) s[0] += v[i][e];
      }
      GroupSum<1>(s, red, group_threads);
      mu = s[0] * inv_n;
      float q[1] = {0.0f};
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (!c.ok[i]) continue;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = v[i][e] - mu;
          q[0] += d * d;
        }
      }
      GroupSum<1>(q, red, group_threads);
      rs = rsqrtf(q[0] * inv_n + eps);
      if (live && t == 0) {
        mean[r] = mu;
        rstd[r] = rs;
      }
    }
    if (live) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (!c.ok[i]) continue;
        float out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = NormOut(v[i][e], mu, rs, g[i][e], b[i][e]);
        Store8(y + r * n + c.col[i], out);
      }
    }
    cur = nxt;
  }
}

// --- LayerNorm backward. kOut: 0 bf16 dx, 1 residual := dx, 2 residual += dx (NormGradOut).
// The next row's dy and x are loaded while this row is reduced; with GELU, one erf per element
// gives both the normalised value and the derivative.
// kMinBlocks 2 (CTAs of at most 384 threads): registers capped so that two CTAs fit on a
// multiprocessor; the accumulators are in shared memory, so the rows' values stay in registers.
template <int kVec, bool kGelu, int kOut, bool kBias, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks)
    LayerNormBackwardKernel(const bf16_t* dy, const bf16_t* __restrict__ x,
                            const float* __restrict__ mean, const float* __restrict__ rstd,
                            const float* __restrict__ gain, int64_t rows, int64_t n,
                            int group_threads, bf16_t* out_bf16, float* __restrict__ residual,
                            float* __restrict__ partials) {
  __shared__ float red[64];
  extern __shared__ float acc[];
  const int groups = blockDim.x / group_threads;
  const int gid = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const Cols<kVec> c(t, group_threads, n);
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups;
  const float inv_n = 1.0f / static_cast<float>(n);
  int64_t base = static_cast<int64_t>(blockIdx.x) * groups;
  RawRow<kVec> cur_dy, cur_x;
  LoadRaw(dy, base + gid, rows, n, c, &cur_dy);
  LoadRaw(x, base + gid, rows, n, c, &cur_x);
  float g[kVec][8];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (c.ok[i]) Load8f(gain + c.col[i], g[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      Acc<kVec>(acc, 0, i, e) = 0.0f;
      Acc<kVec>(acc, 1, i, e) = 0.0f;
      Acc<kVec>(acc, 2, i, e) = 0.0f;
    }
  }
  for (; base < rows; base += step) {
    const int64_t r = base + gid;
    const bool live = r < rows;
    RawRow<kVec> nxt_dy, nxt_x;
    LoadRaw(dy, r + step, rows, n, c, &nxt_dy);
    LoadRaw(x, r + step, rows, n, c, &nxt_x);
    float mu = 0.0f, rs = 0.0f;
    if (live) {
      mu = mean[r];
      rs = rstd[r];
    }
    float res[kVec][8];
    if (kOut == 2 && live) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (c.ok[i]) Load8f(residual + r * n + c.col[i], res[i]);
      }
    }
    float xh[kVec][8], gg[kVec][8];
    float sums[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float dyv[8], xin[8];
      Unpack8(cur_dy.v[i], dyv);
      Unpack8(cur_x.v[i], xin);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float v = xin[e];
        if (kGelu) gg[i][e] = GeluAndGrad(xin[e], &v);
        xh[i][e] = XHat(v, mu, rs);
        const float gd = dyv[e] * g[i][e];
        sums[0] += c.ok[i] ? gd : 0.0f;
        sums[1] += c.ok[i] ? gd * xh[i][e] : 0.0f;
      }
    }
    GroupSum<2>(sums, red, group_threads);
    if (live) {
      const float a = sums[0] * inv_n, bb = sums[1] * inv_n;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (!c.ok[i]) continue;
        float dyv[8], out[8];
        Unpack8(cur_dy.v[i], dyv);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float gd = dyv[e] * g[i][e];
          float d = rs * (gd - a - xh[i][e] * bb);
          if (kGelu) d *= gg[i][e];
          Acc<kVec>(acc, 0, i, e) += dyv[e] * xh[i][e];
          Acc<kVec>(acc, 1, i, e) += dyv[e];
          out[e] = d;
        }
        if (kOut != 0) {
          if (kOut == 2) {
#pragma unroll
            for (int e = 0; e < 8; ++e) out[e] += res[i][e];
          }
          Store8f(residual + r * n + c.col[i], out);
        }
        if (kBias) {
#pragma unroll
          for (int e = 0; e < 8; ++e) Acc<kVec>(acc, 2, i, e) += out[e];
        }
        Store8(out_bf16 + r * n + c.col[i], out);
      }
    }
    cur_dy = nxt_dy;
    cur_x = nxt_x;
  }
  FlushPartials<kVec>(acc, c, n, t, gid, group_threads, groups, partials);
}

// --- Rotary positions.
__device__ __forceinline__ double RelativePosition(int64_t p, int64_t block) {
  return static_cast<double>(p - (p / block * block + block / 2));
}

// cos, sin of e theta_j and the XPOS scales of q and k (1 without XPOS).
__device__ __forceinline__ void RotaryFactors(const RotaryConsts* __restrict__ rc, double e, int j,
                                              float* cs, float* sn, float* qs, float* ks) {
  const double angle = e * rc->inv_freq[j];
  const double k = rint(angle * kInv2Pi);
  double r = fma(-k, k2PiHi, angle);
  r = fma(-k, k2PiLo, r);
  __sincosf(static_cast<float>(r), sn, cs);  // |r| <= pi: the fast path is accurate to 1e-6
  if (rc->xpos) {
    const float a = static_cast<float>(e * rc->log2_zeta_over_base[j]);
    *qs = exp2f(a);
    *ks = exp2f(-a);
  } else {
    *qs = 1.0f;
    *ks = 1.0f;
  }
}

// Rotates the 4 pairs of a chunk by (cs, sn) and scales by s: forward sign +1, transpose -1.
__device__ __forceinline__ void RotateChunk(float (&v)[8], const float (&cs)[4],
                                            const float (&sn)[4], const float (&s)[4], float sign) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const float x0 = v[2 * p], x1 = v[2 * p + 1];
    const float sp = sign * sn[p];
    v[2 * p] = s[p] * (x0 * cs[p] - x1 * sp);
    v[2 * p + 1] = s[p] * (x1 * cs[p] + x0 * sp);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kMaxRowThreads)
    RotaryForwardKernel(bf16_t* qkv, int64_t rows, int64_t ld, int64_t seq_len, int64_t offset,
                        const int64_t* __restrict__ positions, int64_t d, int64_t head_dim,
                        int group_threads, const RotaryConsts* __restrict__ rc) {
  const int groups = blockDim.x / group_threads;
  const int gid = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const Cols<kVec> c(t, group_threads, d);
  const int64_t block = rc->block;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * groups; base < rows;
       base += static_cast<int64_t>(gridDim.x) * groups) {
    const int64_t r = base + gid;
    if (r >= rows) continue;
    const int64_t at = positions != nullptr ? positions[r] : offset + r % seq_len;
    const double e = RelativePosition(at, block);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (!c.ok[i]) continue;
      const int j0 = static_cast<int>((c.col[i] % head_dim) / 2);
      float cs[4], sn[4], qs[4], ks[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) RotaryFactors(rc, e, j0 + p, &cs[p], &sn[p], &qs[p], &ks[p]);
      bf16_t* q = qkv + r * ld + c.col[i];
      float v[8];
      Load8(q, v);
      RotateChunk(v, cs, sn, qs, 1.0f);
      Store8(q, v);
      Load8(q + d, v);
      RotateChunk(v, cs, sn, ks, 1.0f);
      Store8(q + d, v);
    }
  }
}

template <int kVec>
__global__ void __launch_bounds__(kMaxRowThreads)
    RotaryBackwardKernel(const bf16_t* __restrict__ dq, const bf16_t* __restrict__ dk,
                         const bf16_t* __restrict__ dv, int64_t rows, int64_t seq_len,
                         int64_t offset, int64_t d, int64_t head_dim, int group_threads,
                         const RotaryConsts* __restrict__ rc, bf16_t* __restrict__ dqkv,
                         float* __restrict__ partials) {
  extern __shared__ float acc[];
  const int groups = blockDim.x / group_threads;
  const int gid = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const Cols<kVec> c(t, group_threads, d);
  const int64_t block = rc->block;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      Acc<kVec>(acc, 0, i, e) = 0.0f;
      Acc<kVec>(acc, 1, i, e) = 0.0f;
      Acc<kVec>(acc, 2, i, e) = 0.0f;
    }
  }
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * groups; base < rows;
       base += static_cast<int64_t>(gridDim.x) * groups) {
    const int64_t r = base + gid;
    if (r >= rows) continue;
    const double e = RelativePosition(offset + r % seq_len, block);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (!c.ok[i]) continue;
      const int j0 = static_cast<int>((c.col[i] % head_dim) / 2);
      float cs[4], sn[4], qs[4], ks[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) RotaryFactors(rc, e, j0 + p, &cs[p], &sn[p], &qs[p], &ks[p]);
      const int64_t src = r * d + c.col[i];
      bf16_t* out = dqkv + r * 3 * d + c.col[i];
      float v[8];
      Load8(dq + src, v);
      RotateChunk(v, cs, sn, qs, -1.0f);
#pragma unroll
      for (int k = 0; k < 8; ++k) Acc<kVec>(acc, 0, i, k) += v[k];
      Store8(out, v);
      Load8(dk + src, v);
      RotateChunk(v, cs, sn, ks, -1.0f);
#pragma unroll
      for (int k = 0; k < 8; ++k) Acc<kVec>(acc, 1, i, k) += v[k];
      Store8(out + d, v);
      Load8(dv + src, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) Acc<kVec>(acc, 2, i, k) += v[k];
      Store8(out + 2 * d, v);
    }
  }
  FlushPartials<kVec>(acc, c, d, t, gid, group_threads, groups, partials);
}

// --- Column sums: grid (column tiles of 32, jobs), block (32, 8).
__global__ void ColumnSumsKernel(const ColumnSumJob* __restrict__ jobs) {
  __shared__ double part[8][33];
  const ColumnSumJob job = jobs[blockIdx.y];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  double s = 0.0;
  if (j < job.n) {
    for (int64_t c = threadIdx.y; c < job.ctas; c += 8) {
      s += static_cast<double>(job.src[c * job.stride + j]);
    }
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < job.n) {
    double total = static_cast<double>(job.dst[j]);
    for (int k = 0; k < 8; ++k) total += part[k][threadIdx.x];
    job.dst[j] = static_cast<float>(total);
  }
}

// --- Cross-entropy: 8 warps per CTA, a warp per row; online max and sum in one pass.
constexpr int kCeWarps = kCrossEntropyWarps;

__global__ void __launch_bounds__(256)
    CrossEntropyForwardKernel(const float* __restrict__ logits, const int32_t* __restrict__ targets,
                              int64_t m, int64_t v, float* __restrict__ row_lse,
                              double* __restrict__ partials) {
  __shared__ double warp_sum[kCeWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double loss = 0.0;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kCeWarps + warp; t < m;
       t += static_cast<int64_t>(gridDim.x) * kCeWarps) {
    const float* l = logits + t * v;
    float mx = -INFINITY, s = 0.0f;
    for (int64_t j = lane; j < v; j += 32) {
      const float x = l[j];
      if (x > mx) {
        s = s * expf(mx - x) + 1.0f;
        mx = x;
      } else {
        s += expf(x - mx);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffu, mx, off);
      const float os = __shfl_xor_sync(0xffffffffu, s, off);
      const float nm = fmaxf(mx, om);
      const float a = mx == -INFINITY ? 0.0f : s * expf(mx - nm);
      const float b = om == -INFINITY ? 0.0f : os * expf(om - nm);
      mx = nm;
      s = a + b;
    }
    mx = __shfl_sync(0xffffffffu, mx, 0);
    s = __shfl_sync(0xffffffffu, s, 0);
    if (lane == 0) {
      const float lse = mx + logf(s);
      row_lse[t] = lse;
      const int32_t target = targets[t];
      if (target >= 0) loss += static_cast<double>(lse) - static_cast<double>(l[target]);
    }
  }
  if (lane == 0) warp_sum[warp] = loss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kCeWarps; ++w) total += warp_sum[w];
    partials[blockIdx.x] = total;
  }
}

__global__ void SumDoublesKernel(const double* __restrict__ partials, int64_t count,
                                 double* __restrict__ out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += partials[i];
  *out = total;
}

__global__ void TargetLogProbsKernel(const float* __restrict__ logits,
                                     const float* __restrict__ row_lse,
                                     const int32_t* __restrict__ targets, int64_t m, int64_t v,
                                     float* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= m) return;
  const int32_t target = targets[t];
  out[t] = target < 0 ? 0.0f : logits[t * v + target] - row_lse[t];
}

__global__ void CrossEntropyBackwardKernel(const float* __restrict__ logits,
                                           const float* __restrict__ row_lse,
                                           const int32_t* __restrict__ targets, int64_t m,
                                           int64_t v, float scale,
                                           __nv_bfloat16* __restrict__ dlogits) {
  const int64_t total = m * v;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / v, j = i % v;
    const int32_t target = targets[t];
    float out = 0.0f;
    if (target >= 0) {
      const float p = expf(logits[i] - row_lse[t]);
      out = scale * (p - (j == target ? 1.0f : 0.0f));
    }
    dlogits[i] = __float2bfloat16_rn(out);
  }
}

// --- AdamW, one element per thread per step, no contraction (explicit roundings).
__global__ void AdamWKernel(AdamWFactors f, int64_t n, int64_t first,
                            const uint32_t* __restrict__ decay_bits, float* __restrict__ p,
                            const float* __restrict__ grad, float* __restrict__ m,
                            float* __restrict__ v) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = first + i;
    const bool decay = decay_bits != nullptr && ((decay_bits[e >> 5] >> (e & 31)) & 1u) != 0;
    const float g = __fmul_rn(grad[i], f.grad_scale);
    float w = p[i];
    if (decay) w = __fmul_rn(w, f.decay_keep);
    const float mi = __fadd_rn(__fmul_rn(f.beta1, m[i]), __fmul_rn(f.one_minus_beta1, g));
    const float vi =
        __fadd_rn(__fmul_rn(f.beta2, v[i]), __fmul_rn(f.one_minus_beta2, __fmul_rn(g, g)));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), f.bc2_sqrt), f.epsilon);
    p[i] = __fsub_rn(w, __fmul_rn(f.step_size, __fdiv_rn(mi, denom)));
  }
}

// --- Sum of squares: 1024 CTAs, each a contiguous chunk, fp64.
constexpr int64_t kSsqCtas = 1024;
__global__ void __launch_bounds__(256)
    SumOfSquaresKernel(const float* __restrict__ x, int64_t n, double* __restrict__ partials) {
  __shared__ double warp_sum[8];
  const int64_t chunk = (n + kSsqCtas - 1) / kSsqCtas;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = begin + chunk < n ? begin + chunk : n;
  double s = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(x[i]);
    s += v * v;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < 8; ++w) total += warp_sum[w];
    partials[blockIdx.x] = total;
  }
}

int GridFor(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 16)));
}

bool RowWidthOk(int64_t n) { return n >= 8 && n % 8 == 0 && n <= kMaxRowWidth; }

}  // namespace

cudaError_t CastPackParams(const float* master, const PackSegment* segments, int num_segments,
                           int64_t packed_size, bf16_t* packed, cudaStream_t stream) {
  if (num_segments < 1 || packed_size % 8 != 0) return cudaErrorInvalidValue;
  const int64_t chunks = packed_size / 8;
  CastPackKernel<<<GridFor(chunks, 256), 256, 0, stream>>>(master, segments, num_segments, chunks,
                                                           packed);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(const int32_t* tokens, int64_t m, const bf16_t* table, int64_t d,
                             bf16_t* out, cudaStream_t stream) {
  if (m < 1 || d < 8 || d % 8 != 0) return cudaErrorInvalidValue;
  EmbeddingForwardKernel<<<GridFor(m * d / 8, 256), 256, 0, stream>>>(tokens, m, table, d, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(const int64_t* order, const EmbeddingItem* items, int64_t num_items,
                              const int64_t* token_items, int64_t vocab, const float* dx, int64_t d,
                              float* partial, float* dtable, cudaStream_t stream) {
  if (d < 8 || d % 8 != 0 || vocab < 1 || num_items < 0 || num_items > 2147483647 ||
      vocab > 2147483647) {
    return cudaErrorInvalidValue;
  }
  if (num_items == 0) return cudaSuccess;
  const unsigned col_blocks = static_cast<unsigned>((d / 8 + 127) / 128);
  EmbeddingItemKernel<<<dim3(static_cast<unsigned>(num_items), col_blocks), 128, 0, stream>>>(
      order, items, dx, d, partial);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  EmbeddingRowKernel<<<dim3(static_cast<unsigned>(vocab), col_blocks), 128, 0, stream>>>(
      token_items, partial, d, dtable);
  return cudaGetLastError();
}

namespace {

template <int kVec>
cudaError_t LaunchNormForward(const RowLaunch& l, const bf16_t* x, int64_t rows, int64_t n,
                              const float* gain, const float* shift, float eps, bool gelu,
                              bool saved, bf16_t* y, float* mean, float* rstd,
                              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.ctas)), block(l.group * l.groups);
#define DATTN_NORM_FWD(G, S)         \
  LayerNormForwardKernel<kVec, G, S> \
      <<<grid, block, 0, stream>>>(x, rows, n, l.group, gain, shift, eps, y, mean, rstd)
  if (gelu) {
    if (saved) {
      DATTN_NORM_FWD(true, true);
    } else {
      DATTN_NORM_FWD(true, false);
    }
  } else {
    if (saved) {
      DATTN_NORM_FWD(false, true);
    } else {
      DATTN_NORM_FWD(false, false);
    }
  }
#undef DATTN_NORM_FWD
  return cudaGetLastError();
}

// Launches `kernel` with the accumulators' dynamic shared memory, raising the kernel's limit first
// where it passes the default 48 KiB (rows wider than 4096).
template <typename Kernel, typename... Args>
cudaError_t LaunchWithAcc(Kernel kernel, const RowLaunch& l, cudaStream_t stream, Args... args) {
  const int threads = l.group * l.groups;
  const size_t smem = AccBytes(l.vec, threads);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<static_cast<unsigned>(l.ctas), threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

template <int kVec, bool kGelu, int kMaxThreads, int kMinBlocks>
cudaError_t LaunchNormBackward(const RowLaunch& l, const LayerNormBackwardArgs& a,
                               cudaStream_t stream) {
#define DATTN_NORM_BWD(O, B)                                                                   \
  return LaunchWithAcc(LayerNormBackwardKernel<kVec, kGelu, O, B, kMaxThreads, kMinBlocks>, l, \
                       stream, a.dy, a.x, a.mean, a.rstd, a.gain, a.rows, a.n, l.group,        \
                       a.out_bf16, a.residual, a.partials)
  switch (a.out) {
    case NormGradOut::kBf16:
      if (a.bias_sums) DATTN_NORM_BWD(0, true);
      DATTN_NORM_BWD(0, false);
    case NormGradOut::kResidualSet:
      if (a.bias_sums) DATTN_NORM_BWD(1, true);
      DATTN_NORM_BWD(1, false);
    case NormGradOut::kResidualAdd:
      if (a.bias_sums) DATTN_NORM_BWD(2, true);
      DATTN_NORM_BWD(2, false);
  }
#undef DATTN_NORM_BWD
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t LayerNormForward(const bf16_t* x, int64_t rows, int64_t n, const float* gain,
                             const float* shift, float eps, bool gelu, bool use_saved_stats,
                             bf16_t* y, float* mean, float* rstd, int num_sms,
                             cudaStream_t stream) {
  if (rows < 1 || !RowWidthOk(n) || num_sms < 1) return cudaErrorInvalidValue;
  const RowLaunch l = RowLaunchFor(rows, n, num_sms, /*ctas_per_sm=*/8);
  switch (l.vec) {
    case 1:
      return LaunchNormForward<1>(l, x, rows, n, gain, shift, eps, gelu, use_saved_stats, y, mean,
                                  rstd, stream);
    case 2:
      return LaunchNormForward<2>(l, x, rows, n, gain, shift, eps, gelu, use_saved_stats, y, mean,
                                  rstd, stream);
    default:
      return LaunchNormForward<4>(l, x, rows, n, gain, shift, eps, gelu, use_saved_stats, y, mean,
                                  rstd, stream);
  }
}

cudaError_t LayerNormBackward(const LayerNormBackwardArgs& a, int num_sms, cudaStream_t stream) {
  if (a.rows < 1 || !RowWidthOk(a.n) || num_sms < 1 || a.partials == nullptr ||
      a.out_bf16 == nullptr || (a.out != NormGradOut::kBf16 && a.residual == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const RowLaunch l = RowLaunchFor(a.rows, a.n, num_sms);
  const bool two_per_sm = l.vec == 1 && l.group * l.groups <= 384;
  if (a.gelu) {
    if (two_per_sm) return LaunchNormBackward<1, true, 384, 2>(l, a, stream);
    switch (l.vec) {
      case 1:
        return LaunchNormBackward<1, true, kMaxRowThreads, 1>(l, a, stream);
      case 2:
        return LaunchNormBackward<2, true, kMaxRowThreads, 1>(l, a, stream);
      default:
        return LaunchNormBackward<4, true, kMaxRowThreads, 1>(l, a, stream);
    }
  }
  if (two_per_sm) return LaunchNormBackward<1, false, 384, 2>(l, a, stream);
  switch (l.vec) {
    case 1:
      return LaunchNormBackward<1, false, kMaxRowThreads, 1>(l, a, stream);
    case 2:
      return LaunchNormBackward<2, false, kMaxRowThreads, 1>(l, a, stream);
    default:
      return LaunchNormBackward<4, false, kMaxRowThreads, 1>(l, a, stream);
  }
}

namespace {
cudaError_t LaunchRotaryForward(bf16_t* qkv, int64_t rows, int64_t ld, int64_t seq_len,
                                int64_t position_offset, const int64_t* positions, int64_t d,
                                int64_t head_dim, const RotaryConsts* consts, int num_sms,
                                cudaStream_t stream) {
  if (rows < 1 || seq_len < 1 || !RowWidthOk(d) || head_dim < 8 || head_dim % 8 != 0 ||
      d % head_dim != 0 || ld < 2 * d || ld % 8 != 0 || num_sms < 1 || position_offset < 0) {
    return cudaErrorInvalidValue;
  }
  const RowLaunch l = RowLaunchFor(rows, d, num_sms, /*ctas_per_sm=*/8);
  const dim3 grid(static_cast<unsigned>(l.ctas)), block(l.group * l.groups);
  switch (l.vec) {
    case 1:
      RotaryForwardKernel<1><<<grid, block, 0, stream>>>(qkv, rows, ld, seq_len, position_offset,
                                                         positions, d, head_dim, l.group, consts);
      break;
    case 2:
      RotaryForwardKernel<2><<<grid, block, 0, stream>>>(qkv, rows, ld, seq_len, position_offset,
                                                         positions, d, head_dim, l.group, consts);
      break;
    default:
      RotaryForwardKernel<4><<<grid, block, 0, stream>>>(qkv, rows, ld, seq_len, position_offset,
                                                         positions, d, head_dim, l.group, consts);
      break;
  }
  return cudaGetLastError();
}
}  // namespace

cudaError_t RotaryForward(bf16_t* qkv, int64_t rows, int64_t ld, int64_t seq_len,
                          int64_t position_offset, int64_t d, int64_t head_dim,
                          const RotaryConsts* consts, int num_sms, cudaStream_t stream) {
  return LaunchRotaryForward(qkv, rows, ld, seq_len, position_offset, nullptr, d, head_dim, consts,
                             num_sms, stream);
}

cudaError_t RotaryForwardAt(bf16_t* qkv, int64_t rows, int64_t ld, const int64_t* positions,
                            int64_t d, int64_t head_dim, const RotaryConsts* consts, int num_sms,
                            cudaStream_t stream) {
  if (positions == nullptr) return cudaErrorInvalidValue;
  return LaunchRotaryForward(qkv, rows, ld, 1, 0, positions, d, head_dim, consts, num_sms, stream);
}

cudaError_t RotaryBackward(const bf16_t* dq, const bf16_t* dk, const bf16_t* dv, int64_t rows,
                           int64_t seq_len, int64_t position_offset, int64_t d, int64_t head_dim,
                           const RotaryConsts* consts, bf16_t* dqkv, float* partials, int num_sms,
                           cudaStream_t stream) {
  if (rows < 1 || seq_len < 1 || !RowWidthOk(d) || head_dim < 8 || head_dim % 8 != 0 ||
      d % head_dim != 0 || num_sms < 1 || position_offset < 0 || partials == nullptr) {
    return cudaErrorInvalidValue;
  }
  const RowLaunch l = RowLaunchFor(rows, d, num_sms);
  switch (l.vec) {
    case 1:
      return LaunchWithAcc(RotaryBackwardKernel<1>, l, stream, dq, dk, dv, rows, seq_len,
                           position_offset, d, head_dim, l.group, consts, dqkv, partials);
    case 2:
      return LaunchWithAcc(RotaryBackwardKernel<2>, l, stream, dq, dk, dv, rows, seq_len,
                           position_offset, d, head_dim, l.group, consts, dqkv, partials);
    default:
      return LaunchWithAcc(RotaryBackwardKernel<4>, l, stream, dq, dk, dv, rows, seq_len,
                           position_offset, d, head_dim, l.group, consts, dqkv, partials);
  }
}

cudaError_t ColumnSums(const ColumnSumJob* jobs, int num_jobs, int64_t max_n, cudaStream_t stream) {
  if (num_jobs < 0 || num_jobs > 65535 || max_n < 0) return cudaErrorInvalidValue;
  if (num_jobs == 0 || max_n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((max_n + 31) / 32), static_cast<unsigned>(num_jobs));
  ColumnSumsKernel<<<grid, dim3(32, 8), 0, stream>>>(jobs);
  return cudaGetLastError();
}

cudaError_t CrossEntropyForward(const float* logits, const int32_t* targets, int64_t m, int64_t v,
                                float* row_lse, double* partials, double* loss_sum,
                                cudaStream_t stream) {
  if (m < 1 || v < 1) return cudaErrorInvalidValue;
  const int64_t ctas = CrossEntropyPartials(m);
  CrossEntropyForwardKernel<<<static_cast<unsigned>(ctas), 32 * kCeWarps, 0, stream>>>(
      logits, targets, m, v, row_lse, partials);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  SumDoublesKernel<<<1, 32, 0, stream>>>(partials, ctas, loss_sum);
  return cudaGetLastError();
}

cudaError_t CrossEntropyBackward(const float* logits, const float* row_lse, const int32_t* targets,
                                 int64_t m, int64_t v, float scale, bf16_t* dlogits,
                                 cudaStream_t stream) {
  if (m < 1 || v < 1) return cudaErrorInvalidValue;
  CrossEntropyBackwardKernel<<<GridFor(m * v, 256), 256, 0, stream>>>(
      logits, row_lse, targets, m, v, scale, reinterpret_cast<__nv_bfloat16*>(dlogits));
  return cudaGetLastError();
}

cudaError_t TargetLogProbs(const float* logits, const float* row_lse, const int32_t* targets,
                           int64_t m, int64_t v, float* out, cudaStream_t stream) {
  if (m < 1 || v < 1) return cudaErrorInvalidValue;
  TargetLogProbsKernel<<<GridFor(m, 256), 256, 0, stream>>>(logits, row_lse, targets, m, v, out);
  return cudaGetLastError();
}

cudaError_t AdamWUpdate(const AdamWFactors& f, int64_t n, int64_t first, const uint32_t* decay_bits,
                        float* p, const float* grad, float* m, float* v, cudaStream_t stream) {
  if (n < 0 || first < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  AdamWKernel<<<GridFor(n, 256), 256, 0, stream>>>(f, n, first, decay_bits, p, grad, m, v);
  return cudaGetLastError();
}

int64_t SumOfSquaresPartials() { return kSsqCtas; }

cudaError_t SumOfSquares(const float* x, int64_t n, double* partials, double* out,
                         cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  SumOfSquaresKernel<<<static_cast<unsigned>(kSsqCtas), 256, 0, stream>>>(x, n, partials);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  SumDoublesKernel<<<1, 32, 0, stream>>>(partials, kSsqCtas, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
