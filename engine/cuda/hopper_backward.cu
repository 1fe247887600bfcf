// Our own Hopper backward attention (see hopper_backward.h for the contract).
//
// Work, per (block, head) attention of n rows: a row pass reads o and dout once (4 n D bytes) and
// writes two floats per row; then two kernels, each built like the forward kernel (persistent CTAs
// of a producer warpgroup whose single thread issues every TMA load, and two consumer warpgroups of
// 64 rows each, wgmma on the tensor cores):
//   - dk/dv: a CTA holds 128 keys (k and v tiles) and streams the query tiles (q, dout and the two
//     row terms; 128 rows at D = 64, 64 at D = 128): S^T = k q^T and dP^T = v dout^T from shared
//     memory, P^T and dS^T = P^T (dP^T - delta) in registers (the accumulator layout is the
//     A-operand layout of the next products, as in the forward), dv += P^T dout and
//     dk += dS^T q: 4 products, 8 n^2 D FLOPs;
//   - dq: a CTA holds 128 query rows (q and dout) and streams the key tiles (k, v, 128 rows):
//     S = q k^T, dP = dout v^T, dS = P (dP - delta), dq += dS k: 3 products, 6 n^2 D FLOPs.
// 14 n^2 D FLOPs in all against the 10 n^2 D of a backward that accumulates dq across key tiles
// (FlashAttention-2/3, cuDNN): the price of needing no fp32 dq buffer. Causal halves both.
// Each gradient row is written once, by the CTA that owns it, 4-byte stores in place through its
// strides (added to the old value under `accumulate`): no atomics, deterministic. In grouped mode
// the zeros of the unselected rows around an item's rows are written too (as the forward does),
// so that no fill pass competes with the kernels for the SMs: by the producer warpgroup's idle
// warps while the consumers compute at D = 128, by the epilogues at D = 64.
// Tried and measured slower on an H200 (docs/PERFORMANCE_HISTORY.md): 64-row streamed tiles at
// D = 64 (10%); the two warpgroups taking turns on the tensor cores (3%); dq software-pipelined
// like the forward (10%); dk/dv with one warpgroup per gradient on 64 keys, P handed over in shared
// memory (2% at D = 128, 9% at D = 64).
#include "engine/cuda/hopper_backward.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "engine/cuda/hopper_ptx.cuh"

namespace dattn {
namespace cuda {
namespace {

using namespace hopper;  // NOLINT: the kernels are written in the PTX wrappers' terms

// dq: fixed q and dout, streamed k and v. dk/dv: fixed k and v, streamed q, dout and row terms.
enum class Pass { kDq, kDkDv };

// Rows of each streamed tile: 128 (wider products use shared memory's bandwidth better, measured
// 10% faster at D = 64 than 64-row tiles), except 64 for dk/dv at D = 128, where a consumer thread
// holds dk and dv (128 floats) besides the scores.
template <int D, Pass P>
constexpr int StreamRows() {
  return D == 128 && P == Pass::kDkDv ? 64 : 128;
}
constexpr int kFixedRows = 128;  // rows of an item's fixed tiles: two consumer warpgroups of 64
constexpr int kThreads = 384;    // producer warpgroup + two consumer warpgroups
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory of one CTA: two buffers of the two fixed tiles (the next item's arrive while the
// current one runs; one for dq at D = 128, where they would leave room for one stage), then kStages
// pairs of streamed tiles, each [D / 64 column blocks][rows][64]
// in TMA's 128-byte swizzle (1024-byte aligned), then (dk/dv) the row terms of each stage, then
// the barriers. As many stages as fit in 227 KiB.
template <int D, Pass P>
struct BackwardSmem {
  static constexpr int kStreamRows = StreamRows<D, P>();
  static constexpr bool kWide = D == 128 && kStreamRows == 128;  // dq at D = 128
  static constexpr int kFixedBuffers = kWide ? 1 : 2;
  static constexpr int kStages = D == 64 ? 4 : kWide ? 2 : 3;
  static constexpr int kFixedTile = kFixedRows * D * 2;
  static constexpr int kStreamTile = kStreamRows * D * 2;
  // lse2 and delta of each streamed row
  static constexpr int kTerms = P == Pass::kDkDv ? 2 * kStreamRows * 4 : 0;
  static constexpr int kFixed = 0;
  static constexpr int kStream = kFixed + kFixedBuffers * 2 * kFixedTile;
  static constexpr int kTermsAt = kStream + kStages * 2 * kStreamTile;
  static constexpr int kBarriers = kTermsAt + kStages * kTerms;
  // fixed_full[buffers], fixed_empty[buffers], full[stages], empty[stages], then the work item of
  // each fixed buffer (the producer hands them to the consumers)
  static constexpr int kItems = kBarriers + 8 * (2 * kFixedBuffers + 2 * kStages);
  static constexpr int kBytes = kItems + 4 * kFixedBuffers;
  static constexpr int kAlloc = kBytes + 1024;  // room to align the base to 1024 bytes
  static_assert(kAlloc <= 227 * 1024, "shared memory of one CTA");
};

// A gradient the epilogue writes: element (j, k, s, d) at ptr + j * fold + k * head + s * seq + d.
struct GradView {
  void* ptr = nullptr;
  int64_t fold = 0, head = 0, seq = 0;
  int64_t pos = 0;  // element stride between consecutive positions (seq / rate; grouped zeros)
  float scale = 1.f;
};

// What a CTA needs besides the tensor maps.
struct BackwardGeometry {
  GradView out0;                 // dq (kDq) or dk (kDkDv)
  GradView out1;                 // dv (kDkDv)
  const float* lse2 = nullptr;   // [count * heads][pitch]: lse * log2(e), +inf past `rows`
  const float* delta = nullptr;  // [count * heads][pitch]: the row terms, 0 past `rows`
  int pitch = 0;
  int rows = 0;
  int heads = 0;
  int count = 0;
  int fixed_tiles = 0;  // fixed tiles per (block, head)
  int items = 0;        // fixed_tiles * count * heads
  unsigned* next_item = nullptr;
  float scale_log2 = 0.f;  // scale * log2(e)
  int causal = 0;
  int accumulate = 0;
  // Unselected rows to clear in every gradient (grouped mode), see UnselectedRows; rate 0: none.
  int zero_rate = 0, zero_lead = 0, zero_span = 0;
};

// lse2 := stats * log2(e) and delta := delta_scale * sum_d dout * o for every row of the call, in
// the padded layout the kernels read (+inf and 0 on the padding rows, which make their
// probabilities 0). D / 8 lanes per row, 16-byte loads; bytes: 4 D read and 8 written per row.
template <typename T, int D>
__global__ void __launch_bounds__(256)
    RowTermsKernel(KernelTensor o, KernelTensor dout, const float* stats, float* lse2, float* delta,
                   int64_t heads, int64_t rows, int64_t pitch, int64_t total, float delta_scale) {
  constexpr int kLanes = D / 8;  // lanes per row
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int lane = threadIdx.x % 32;
  const int part = lane % kLanes;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32) * kRowsPerWarp;
  for (int64_t first = warp * kRowsPerWarp; first < total; first += stride) {
    const int64_t idx = first + lane / kLanes;
    const int64_t jk = idx / pitch;
    const int64_t s = idx % pitch;
    const bool valid = idx < total && s < rows;
    float sum = 0.f;
    if (valid) {
      const int64_t j = jk / heads, k = jk % heads;
      const uint4 vo = *reinterpret_cast<const uint4*>(static_cast<const T*>(o.ptr) + j * o.fold +
                                                       k * o.head + s * o.seq + 8 * part);
      const uint4 vd =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(dout.ptr) + j * dout.fold +
                                          k * dout.head + s * dout.seq + 8 * part);
      const T* eo = reinterpret_cast<const T*>(&vo);
      const T* ed = reinterpret_cast<const T*>(&vd);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        sum = fmaf(static_cast<float>(eo[e]), static_cast<float>(ed[e]), sum);
    }
#pragma unroll
    for (int m = kLanes / 2; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (part == 0 && idx < total) {
      lse2[idx] = valid ? stats[jk * rows + s] * kLog2e : INFINITY;
      delta[idx] = valid ? delta_scale * sum : 0.f;
    }
  }
}

template <typename T, int D, Pass P>
__global__ void __launch_bounds__(kThreads, 1)
    HopperBackwardKernel(const __grid_constant__ CUtensorMap tf0,
                         const __grid_constant__ CUtensorMap tf1,
                         const __grid_constant__ CUtensorMap ts0,
                         const __grid_constant__ CUtensorMap ts1, const BackwardGeometry g) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = BackwardSmem<D, P>;
  constexpr int kStages = L::kStages;
  constexpr int kBuffers = L::kFixedBuffers;
  constexpr bool kKeys = P == Pass::kDkDv;
  // dk/dv at D = 128: dv's product is issued as soon as P is packed, before dS exists (at D = 64,
  // whose 128-query score tiles fill more registers, that spills).
  constexpr bool kEarlyDv = kKeys && D == 128;
  // setmaxnreg draws on the registers the CTA was launched with (168 x 384 = 64,512, ptxas's cap
  // for 384 threads), not on the SM's 65,536: 240-register consumers leave the producer
  // warpgroup 24 (a request beyond the pool blocks for ever).
  constexpr int kConsumerRegs = kEarlyDv ? 240 : 232;
  constexpr int kProducerRegs = (168 * kThreads - 2 * 128 * kConsumerRegs) / 128;
  static_assert(kProducerRegs >= 24 && kProducerRegs % 8 == 0, "setmaxnreg takes 24..256, by 8");
  constexpr int kStreamRows = L::kStreamRows;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (SmemAddr(smem_raw) + 1023) & ~1023u;
  uint8_t* const base_ptr = smem_raw + (base - SmemAddr(smem_raw));
  const uint32_t bars = base + L::kBarriers;
  auto bar_fixed_full = [&](int b) { return bars + 8 * b; };
  auto bar_fixed_empty = [&](int b) { return bars + 8 * (kBuffers + b); };
  auto bar_full = [&](int s) { return bars + 8 * (2 * kBuffers + s); };
  auto bar_empty = [&](int s) { return bars + 8 * (2 * kBuffers + kStages + s); };
  const int wg = static_cast<int>(threadIdx.x / 128);

  // Grouped mode at D = 128: warps 1-3 of the producer warpgroup write the zeros around each
  // item's rows while the consumers compute, and release the item's slot like a consumer warp (at
  // D = 64 the consumers' epilogue writes them, as in the forward kernel, which says why).
  constexpr bool kZeroWarpsAtD = D == 128;
  const bool zero_warps = kZeroWarpsAtD && g.zero_rate > 0;
  if (threadIdx.x == 0) {
    for (int b = 0; b < kBuffers; ++b) {
      BarrierInit(bar_fixed_full(b), 1);
      // Lane 0 of every consumer warp (and zero warp) releases a buffer.
      BarrierInit(bar_fixed_empty(b), zero_warps ? 8 + kZeroWarps : 8);
    }
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(bar_full(s), 1);
      BarrierInit(bar_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Work item w: fixed tile w % fixed_tiles of block (w / fixed_tiles) % count, head
  // w / (fixed_tiles * count); consecutive items share their streamed tiles in L2. Causal items are
  // handed out heaviest first (dq: the last query tile sees the most keys; dk/dv: the first key
  // tile is seen by the most queries), so that the short ones fill in at the end.
  struct Item {
    int tile, j, head, first, end;  // streamed tiles [first, end)
  };
  int* const item_slot = reinterpret_cast<int*>(base_ptr + L::kItems);
  auto item_of = [&](int w) {
    Item it;
    const int n = w % g.fixed_tiles;
    it.tile = (!kKeys && g.causal) ? g.fixed_tiles - 1 - n : n;
    const int rest = w / g.fixed_tiles;
    it.j = rest % g.count;
    it.head = rest / g.count;
    // Causal: keys see the queries from their own row on; fixed tile t holds rows
    // [F t, F t + F), streamed tile n rows [S n, S n + S).
    it.first = (kKeys && g.causal) ? it.tile * kFixedRows / kStreamRows : 0;
    const int stream_tiles = (g.rows + kStreamRows - 1) / kStreamRows;
    it.end = (!kKeys && g.causal)
                 ? min(stream_tiles, ((it.tile + 1) * kFixedRows + kStreamRows - 1) / kStreamRows)
                 : stream_tiles;
    return it;
  };

  if (wg == 0) {
    // Producer: one thread issues every load, running ahead into the next item while the
    // consumers finish the current one; the warpgroup's registers go to the consumers.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (threadIdx.x == 0) {
      int st = 0;  // streamed stages filled so far (all items)
      for (int items = 0;; ++items) {
        const int fb = items % kBuffers;
        const int w = ClaimItem(g.next_item, g.items, items, kBuffers, &item_slot[fb],
                                bar_fixed_empty(fb), bar_fixed_full(fb));
        if (w == g.items) break;  // the consumers were told
        const Item it = item_of(w);
        BarrierExpectTx(bar_fixed_full(fb), 2 * L::kFixedTile);
        const uint32_t fixed = base + L::kFixed + fb * 2 * L::kFixedTile;
        for (int c = 0; c < D / kSwizzleCols; ++c) {
          TmaLoad(&tf0, fixed + c * kFixedRows * 128, bar_fixed_full(fb), c * kSwizzleCols,
                  it.tile * kFixedRows, it.head, it.j);
          TmaLoad(&tf1, fixed + L::kFixedTile + c * kFixedRows * 128, bar_fixed_full(fb),
                  c * kSwizzleCols, it.tile * kFixedRows, it.head, it.j);
        }
        const int64_t terms = (static_cast<int64_t>(it.j) * g.heads + it.head) * g.pitch;
        for (int n = it.first; n < it.end; ++n, ++st) {
          const int s = st % kStages;
          if (st >= kStages) BarrierWait(bar_empty(s), ((st / kStages) - 1) & 1);
          BarrierExpectTx(bar_full(s), 2 * L::kStreamTile + L::kTerms);
          const uint32_t stream = base + L::kStream + s * 2 * L::kStreamTile;
          for (int c = 0; c < D / kSwizzleCols; ++c) {
            TmaLoad(&ts0, stream + c * kStreamRows * 128, bar_full(s), c * kSwizzleCols,
                    n * kStreamRows, it.head, it.j);
            TmaLoad(&ts1, stream + L::kStreamTile + c * kStreamRows * 128, bar_full(s),
                    c * kSwizzleCols, n * kStreamRows, it.head, it.j);
          }
          if constexpr (kKeys) {
            const uint32_t at = base + L::kTermsAt + s * L::kTerms;
            BulkLoad(at, g.lse2 + terms + n * kStreamRows, kStreamRows * 4, bar_full(s));
            BulkLoad(at + kStreamRows * 4, g.delta + terms + n * kStreamRows, kStreamRows * 4,
                     bar_full(s));
          }
        }
      }
    } else if (zero_warps && threadIdx.x >= 32) {
      // The zeros of the unselected rows between and before each item's rows (dq; dk and dv),
      // which no other item writes: nothing to order against the consumers' stores.
      ZeroWarpsLoop(item_slot, kBuffers, g.items, static_cast<int>(threadIdx.x % 32),
                    bar_fixed_full, bar_fixed_empty, [&](int w) {
                      const Item it = item_of(w);
                      auto zeros = [&](const GradView& v) {
                        ZeroUnselectedRows<D, kZeroWarpThreads>(
                            static_cast<T*>(v.ptr) + it.j * v.fold + it.head * v.head, g.zero_rate,
                            g.zero_lead, g.zero_span, v.pos, it.tile * kFixedRows, g.rows,
                            static_cast<int>(threadIdx.x) - 32);
                      };
                      zeros(g.out0);
                      if constexpr (kKeys) zeros(g.out1);
                    });
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));

  // Consumer warpgroup cw owns fixed rows 64 cw .. + 63 of the item. In the accumulator layout a
  // thread holds rows r0 and r0 + 8, columns 8 n + col and + 1 of every 8-column block n.
  const int cw = wg - 1;
  const int t = static_cast<int>(threadIdx.x % 128);
  const int lane = t % 32;
  const int row_in_tile = cw * 64 + (t / 32) * 16 + lane / 4;
  const int col = 2 * (lane % 4);

  auto release = [&](uint32_t bar) { ReleaseFromWarp(bar, lane); };
  // Epilogue: rows first_row + r0 (+ 8) of a gradient, scaled, in place (or added to it).
  auto store = [&](const GradView& v, const float(&acc)[D / 2], const Item& it, int first_row) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row + (t / 32) * 16 + lane / 4 + 8 * h;
      if (row >= g.rows) continue;
      T* dst = static_cast<T*>(v.ptr) + it.j * v.fold + it.head * v.head + row * v.seq + col;
#pragma unroll
      for (int b = 0; b < D / 8; ++b) {
        float lo = acc[4 * b + 2 * h] * v.scale, hi = acc[4 * b + 2 * h + 1] * v.scale;
        uint32_t* p = reinterpret_cast<uint32_t*>(dst + 8 * b);
        if (g.accumulate) {
          const uint32_t old = *p;
          const T* two = reinterpret_cast<const T*>(&old);
          lo += static_cast<float>(two[0]);
          hi += static_cast<float>(two[1]);
        }
        *p = Mma<T>::Pack(lo, hi);
      }
    }
  };

  float acc0[D / 2];                             // dq (kDq) or dk (kDkDv), rows of this warpgroup
  float acc1[kKeys ? D / 2 : 1];                 // dv (kDkDv)
  float x[kStreamRows / 2], y[kStreamRows / 2];  // scores and dP of one streamed tile
  uint32_t pa[kStreamRows / 16][4], da[kStreamRows / 16][4];  // P and dS packed as A operands

  // The fixed tiles of this warpgroup's rows in the current item's buffer.
  uint32_t f0 = 0, f1 = 0;
  // Issues x = fixed0 stream0^T (scores) and y = fixed1 stream1^T (dP) from stage s, both K-major
  // in shared memory; the caller waits.
  auto issue_scores = [&](int s) {
    const uint32_t s0 = base + L::kStream + s * 2 * L::kStreamTile;
    const uint32_t s1 = s0 + L::kStreamTile;
    FenceRegs(x);
    FenceRegs(y);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      Mma<T>::S(x, Desc(f0 + (kk / 4) * kFixedRows * 128 + (kk % 4) * 32, 16),
                Desc(s0 + (kk / 4) * kStreamRows * 128 + (kk % 4) * 32, 16), kk > 0);
    }
    WgmmaCommit();  // its own group: the exponentials start while dP is computed
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      Mma<T>::S(y, Desc(f1 + (kk / 4) * kFixedRows * 128 + (kk % 4) * 32, 16),
                Desc(s1 + (kk / 4) * kStreamRows * 128 + (kk % 4) * 32, 16), kk > 0);
    }
    WgmmaCommit();
  };
  // acc += ops tile: the register A operands (P or dS packed) against a streamed tile read
  // N-major (its rows are the contraction), one wgmma per 16 rows; uncommitted.
  auto add_products = [&](auto& acc, const auto& ops, uint32_t tile) {
#pragma unroll
    for (int kk = 0; kk < kStreamRows / 16; ++kk) {
      Mma<T>::PV(acc, ops[kk], Desc(tile + kk * 16 * 128, kStreamRows * 128));
    }
  };
  // Issues acc0 += dS stream0 (dq += dS k; dk += dS^T q) and, unless issued early, acc1 += P^T
  // stream1 (dv += P^T dout) from stage s; the caller waits.
  auto issue_grads = [&](int s) {
    const uint32_t s0 = base + L::kStream + s * 2 * L::kStreamTile;
    const uint32_t s1 = s0 + L::kStreamTile;
    FenceRegs(acc0);
    FenceRegs(da);
    if constexpr (kKeys && !kEarlyDv) {
      FenceRegs(acc1);
      FenceRegs(pa);
    }
    WgmmaFence();
    add_products(acc0, da, s0);
    if constexpr (kKeys && !kEarlyDv) add_products(acc1, pa, s1);
    WgmmaCommit();
    FenceRegs(acc0);
    if constexpr (kKeys && !kEarlyDv) FenceRegs(acc1);
  };
  // kEarlyDv: issues acc1 += P^T stream1 (dv += P^T dout) from stage s as its own group as soon
  // as P is packed, so that it runs while dS is computed. The caller waits.
  auto issue_dv = [&](int s) {
    if constexpr (kEarlyDv) {
      const uint32_t s1 = base + L::kStream + s * 2 * L::kStreamTile + L::kStreamTile;
      FenceRegs(acc1);
      FenceRegs(pa);
      WgmmaFence();
      add_products(acc1, pa, s1);
      WgmmaCommit();
      FenceRegs(acc1);
    }
  };
  // P = exp2(scale_log2 x - lse2) of streamed tile n (stage s) in place, 0 where masked. dq: the
  // row terms belong to this thread's rows; dk/dv: to the columns (queries), from the stage's copy.
  float row_lse[2] = {0.f, 0.f}, row_delta[2] = {0.f, 0.f};
  auto probabilities = [&](const Item& it, int n, int s, int fixed_row) {
    const float* stage_terms =
        reinterpret_cast<const float*>(base_ptr + L::kTermsAt + s * L::kTerms);
    const bool edge = kKeys ? (g.causal && n * kStreamRows < (it.tile + 1) * kFixedRows)
                            : ((n + 1) * kStreamRows > g.rows ||
                               (g.causal && (n + 1) * kStreamRows > it.tile * kFixedRows));
#pragma unroll
    for (int b = 0; b < kStreamRows / 8; ++b) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * b + col + e;  // column within the streamed tile
        const float c_lse = kKeys ? stage_terms[c] : 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = 4 * b + 2 * h + e;
          float p = Exp2(fmaf(x[i], g.scale_log2, kKeys ? -c_lse : -row_lse[h]));
          if (edge) {
            const int other = n * kStreamRows + c;  // key (kDq) or query (kDkDv)
            const int fixed = fixed_row + 8 * h;    // query (kDq) or key (kDkDv)
            const bool masked =
                kKeys ? fixed > other : (other >= g.rows || (g.causal && other > fixed));
            if (masked) p = 0.f;
          }
          x[i] = p;
        }
      }
    }
  };
  // kEarlyDv: P^T packed into the A operand of dv's product (A register r of 16-column block kk
  // holds elements 8 kk + 2 r and + 1).
  auto pack_probabilities = [&]() {
#pragma unroll
    for (int b = 0; b < kStreamRows / 8; ++b) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * b + 2 * h;
        pa[b / 2][2 * (b % 2) + h] = Mma<T>::Pack(x[i], x[i + 1]);
      }
    }
  };
  // dS = P (dP - delta), packed into the A operand of the next product pair by pair (and P with
  // it, unless packed early), so that the floats die early.
  auto grads_of_scores = [&](int s) {
    const float* stage_terms =
        reinterpret_cast<const float*>(base_ptr + L::kTermsAt + s * L::kTerms);
#pragma unroll
    for (int b = 0; b < kStreamRows / 8; ++b) {
      float c_delta[2] = {0.f, 0.f};
      if constexpr (kKeys) {
#pragma unroll
        for (int e = 0; e < 2; ++e) c_delta[e] = stage_terms[kStreamRows + 8 * b + col + e];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * b + 2 * h;
        const float d0 = kKeys ? c_delta[0] : row_delta[h];
        const float d1 = kKeys ? c_delta[1] : row_delta[h];
        da[b / 2][2 * (b % 2) + h] = Mma<T>::Pack(x[i] * (y[i] - d0), x[i + 1] * (y[i + 1] - d1));
        if constexpr (kKeys && !kEarlyDv) pa[b / 2][2 * (b % 2) + h] = Mma<T>::Pack(x[i], x[i + 1]);
      }
    }
  };
  int st = 0;  // streamed stages consumed so far, as the producer counts them
  for (int items = 0;; ++items) {
    const int fb = items % kBuffers;
    BarrierWait(bar_fixed_full(fb), (items / kBuffers) & 1);
    const int w = item_slot[fb];
    if (w == g.items) break;
    const Item it = item_of(w);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) acc0[i] = 0.f;
    if constexpr (kKeys) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) acc1[i] = 0.f;
    }
    f0 = base + L::kFixed + fb * 2 * L::kFixedTile + cw * 64 * 128;
    f1 = f0 + L::kFixedTile;
    const int fixed_row = it.tile * kFixedRows + row_in_tile;  // + 8 h
    // One streamed tile after the other: a thread's accumulators and the scores of one tile
    // fill its registers; the other warpgroup keeps the tensor cores busy meanwhile. (Issuing the
    // next tile's scores before this one's gradient products, as the forward does, measured 10%
    // slower for dq; taking turns between the warpgroups, as the forward does, 3% slower.)
    if constexpr (!kKeys) {
      // dq: the row terms of this thread's two query rows.
      const int64_t terms = (static_cast<int64_t>(it.j) * g.heads + it.head) * g.pitch;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = fixed_row + 8 * h;
        row_lse[h] = row < g.rows ? g.lse2[terms + row] : INFINITY;
        row_delta[h] = row < g.rows ? g.delta[terms + row] : 0.f;
      }
    }
    for (int n = it.first; n < it.end; ++n, ++st) {
      const int s = st % kStages;
      BarrierWait(bar_full(s), (st / kStages) & 1);
      issue_scores(s);
      WgmmaWait<1>();  // the scores; dP may still run
      FenceRegs(x);
      probabilities(it, n, s, fixed_row);
      if constexpr (kEarlyDv) {
        pack_probabilities();
        issue_dv(s);
        WgmmaWait<1>();  // dP; dv may still run
      } else {
        WgmmaWait<0>();
      }
      FenceRegs(y);
      grads_of_scores(s);
      issue_grads(s);
      WgmmaWait<0>();
      FenceRegs(acc0);
      if constexpr (kKeys) FenceRegs(acc1);
      release(bar_empty(s));
    }
    release(bar_fixed_empty(fb));

    // Epilogue: this warpgroup's rows of the gradient(s), then (grouped mode at D = 64; the zero
    // warps do it at D = 128) the zeros between the tile's rows, written by both warpgroups.
    store(g.out0, acc0, it, it.tile * kFixedRows + cw * 64);
    if constexpr (kKeys) store(g.out1, acc1, it, it.tile * kFixedRows + cw * 64);
    if (!kZeroWarpsAtD && g.zero_rate > 0) {
      auto zeros = [&](const GradView& v) {
        ZeroUnselectedRows<D, 256>(static_cast<T*>(v.ptr) + it.j * v.fold + it.head * v.head,
                                   g.zero_rate, g.zero_lead, g.zero_span, v.pos,
                                   it.tile * kFixedRows, g.rows, cw * 128 + t);
      };
      zeros(g.out0);
      if constexpr (kKeys) zeros(g.out1);
    }
  }
#else
  __trap();  // built without sm_90a: the backend keeps such devices away
#endif
}

// The row terms of each (block, head) start at a multiple of 128 rows (HopperRowTermsFloats: two
// arrays of count * heads * pitch floats), so that a streamed tile's terms are one aligned bulk
// copy.
int64_t PitchOf(int64_t rows) { return HopperRowTermsFloats(1, 1, rows) / 2; }
static_assert(128 % StreamRows<64, Pass::kDkDv>() == 0 && 128 % StreamRows<128, Pass::kDkDv>() == 0,
              "the row terms are padded to whole streamed tiles");

GradView GradOf(const KernelTensor& t, float scale, const UnselectedRows& zeros) {
  GradView v;
  v.ptr = t.ptr;
  v.fold = t.fold;
  v.head = t.head;
  v.seq = t.seq;
  v.pos = zeros.rate > 0 ? t.seq / zeros.rate : 0;
  v.scale = scale;
  return v;
}

template <typename T, int D, Pass P>
cudaError_t LaunchPass(const CUtensorMap& f0, const CUtensorMap& f1, const CUtensorMap& s0,
                       const CUtensorMap& s1, BackwardGeometry g, int sms, unsigned* item_counter,
                       cudaStream_t stream) {
  g.fixed_tiles = (g.rows + kFixedRows - 1) / kFixedRows;
  g.items = g.fixed_tiles * g.count * g.heads;
  auto kernel = HopperBackwardKernel<T, D, P>;
  constexpr int kAlloc = BackwardSmem<D, P>::kAlloc;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kAlloc);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(item_counter, 0, sizeof(unsigned), stream);
  if (e != cudaSuccess) return e;
  // Persistent: one CTA per SM (at most one fits); the items are drawn through item_counter.
  const unsigned grid = static_cast<unsigned>(std::min(g.items, sms));
  kernel<<<grid, kThreads, kAlloc, stream>>>(f0, f1, s0, s1, g);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t Launch(const KernelBackwardArgs& a, bool accumulate, const UnselectedRows& zeros,
                   unsigned* item_counter, cudaStream_t stream) {
  // Tensor maps: boxes of the fixed and streamed rows of each pass.
  constexpr int kQueryRows = StreamRows<D, Pass::kDkDv>();  // q, dout streamed by dk/dv
  constexpr int kKeyRows = StreamRows<D, Pass::kDq>();      // k, v streamed by dq
  CUtensorMap q_fixed, do_fixed, k_fixed, v_fixed, q_stream, do_stream, k_stream, v_stream;
  if (!EncodeView(&q_fixed, a.q, a.type, a.count, a.heads, a.rows, D, kFixedRows) ||
      !EncodeView(&do_fixed, a.dout, a.type, a.count, a.heads, a.rows, D, kFixedRows) ||
      !EncodeView(&k_fixed, a.k, a.type, a.count, a.heads, a.rows, D, kFixedRows) ||
      !EncodeView(&v_fixed, a.v, a.type, a.count, a.heads, a.rows, D, kFixedRows) ||
      !EncodeView(&q_stream, a.q, a.type, a.count, a.heads, a.rows, D, kQueryRows) ||
      !EncodeView(&do_stream, a.dout, a.type, a.count, a.heads, a.rows, D, kQueryRows) ||
      !EncodeView(&k_stream, a.k, a.type, a.count, a.heads, a.rows, D, kKeyRows) ||
      !EncodeView(&v_stream, a.v, a.type, a.count, a.heads, a.rows, D, kKeyRows)) {
    return cudaErrorInvalidValue;
  }
  const int64_t pitch = PitchOf(a.rows);
  const int64_t padded = a.count * a.heads * pitch;
  float* lse2 = a.delta;
  float* delta = a.delta + padded;
  {
    constexpr int64_t kRowsPerBlock = 8 * 32 / (D / 8);
    const int64_t blocks = std::min<int64_t>((padded + kRowsPerBlock - 1) / kRowsPerBlock, 65536);
    RowTermsKernel<T, D><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        a.o, a.dout, a.stats, lse2, delta, a.heads, a.rows, pitch, padded, a.delta_scale);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;

  BackwardGeometry g;
  g.lse2 = lse2;
  g.delta = delta;
  g.pitch = static_cast<int>(pitch);
  g.rows = static_cast<int>(a.rows);
  g.heads = static_cast<int>(a.heads);
  g.count = static_cast<int>(a.count);
  g.next_item = item_counter;
  g.scale_log2 = a.scale * kLog2e;
  g.causal = a.causal ? 1 : 0;
  g.accumulate = accumulate ? 1 : 0;
  g.zero_rate = static_cast<int>(zeros.rate);
  g.zero_lead = static_cast<int>(zeros.lead);
  g.zero_span = static_cast<int>(zeros.span);

  g.out0 = GradOf(a.dk, a.scale, zeros);
  g.out1 = GradOf(a.dv, 1.f, zeros);
  e = LaunchPass<T, D, Pass::kDkDv>(k_fixed, v_fixed, q_stream, do_stream, g, sms, item_counter,
                                    stream);
  if (e != cudaSuccess) return e;
  g.out0 = GradOf(a.dq, a.scale, zeros);
  g.out1 = GradView();
  return LaunchPass<T, D, Pass::kDq>(q_fixed, do_fixed, k_stream, v_stream, g, sms, item_counter,
                                     stream);
}

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool HopperBackwardSupported(const KernelBackwardArgs& a, const UnselectedRows& zeros) {
  if (a.type != ElemType::kBF16 && a.type != ElemType::kF16) return false;
  if (a.head_dim != 64 && a.head_dim != 128) return false;
  if (a.count < 1 || a.heads < 1 || a.rows < 1 || a.stats == nullptr || a.delta == nullptr) {
    return false;
  }
  if (!Aligned(a.delta, 16)) return false;
  if (a.heads > 65535 || a.rows > INT_MAX / 2) return false;
  const int64_t tiles = (a.rows + kFixedRows - 1) / kFixedRows;
  if (a.count > INT_MAX / tiles / a.heads) return false;  // work items fit an int
  for (const KernelTensor* t : {&a.q, &a.k, &a.v, &a.dout}) {
    // TMA: 16-byte aligned base, strides multiples of 16 bytes below 2^40.
    if (t->ptr == nullptr || t->chan != 1 || !Aligned(t->ptr, 16)) return false;
    for (int64_t s : {t->seq, t->head, t->fold}) {
      if (s < 0 || (s * 2) % 16 != 0 || s * 2 >= (int64_t{1} << 40)) return false;
    }
    if (t->seq == 0 || (a.heads > 1 && t->head == 0) || (a.count > 1 && t->fold == 0)) return false;
  }
  // o is read 16 bytes at a time.
  if (a.o.ptr == nullptr || a.o.chan != 1 || !Aligned(a.o.ptr, 16)) return false;
  for (int64_t s : {a.o.seq, a.o.head, a.o.fold}) {
    if (s % 8 != 0) return false;
  }
  // dq, dk, dv are written two elements (4 bytes) at a time.
  for (const KernelTensor* t : {&a.dq, &a.dk, &a.dv}) {
    if (t->ptr == nullptr || t->chan != 1 || !Aligned(t->ptr, 4)) return false;
    for (int64_t s : {t->seq, t->head, t->fold}) {
      if (s % 2 != 0) return false;
    }
  }
  if (zeros.rate > 0) {
    // 16-byte stores of whole rows, positions seq / rate apart, addressed with 32-bit offsets.
    if (zeros.rate == 1 || zeros.rate > INT_MAX / kFixedRows || zeros.lead < 0 ||
        zeros.lead >= zeros.rate || zeros.span < 1 || zeros.span > INT_MAX) {
      return false;
    }
    for (const KernelTensor* t : {&a.dq, &a.dk, &a.dv}) {
      if (!Aligned(t->ptr, 16) || t->fold * 2 % 16 != 0 || t->head * 2 % 16 != 0 ||
          t->seq % zeros.rate != 0 || t->seq / zeros.rate * 2 % 16 != 0) {
        return false;
      }
    }
  }
  return true;
}

cudaError_t LaunchHopperBackward(const KernelBackwardArgs& a, bool accumulate,
                                 const UnselectedRows& zeros, unsigned* item_counter,
                                 cudaStream_t stream) {
  if (!HopperBackwardSupported(a, zeros) || item_counter == nullptr ||
      (accumulate && zeros.rate > 0)) {
    return cudaErrorInvalidValue;
  }
  if (a.type == ElemType::kBF16) {
    return a.head_dim == 64
               ? Launch<__nv_bfloat16, 64>(a, accumulate, zeros, item_counter, stream)
               : Launch<__nv_bfloat16, 128>(a, accumulate, zeros, item_counter, stream);
  }
  return a.head_dim == 64 ? Launch<__half, 64>(a, accumulate, zeros, item_counter, stream)
                          : Launch<__half, 128>(a, accumulate, zeros, item_counter, stream);
}

}  // namespace cuda
}  // namespace dattn
