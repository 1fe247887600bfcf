// Our own Hopper forward attention (see hopper_attention.h for the contract).
//
// Work: 4 * rows^2 * D FLOPs per (block, head) attention (about half when causal), on the tensor
// cores through wgmma; q read once per 128-row query tile and k, v once per query tile (from L2
// after the first tile of a block) by TMA; o written once, and in grouped mode the zeros of the
// unselected rows between the selected ones (16-byte stores from the epilogue, so that no pass
// rereads the output). Why it exists: cuDNN cannot apply the 1/G or write the zero rows (its
// graph takes a scale only before the softmax; a multiply after P V sends the graph to engines
// that fail to compile), and that pass cost 10-13% beside cuDNN on an H100; CUTLASS, which would
// supply these pieces, is not packaged for the build. Shaped after FlashAttention-3:
//   - persistent CTAs, one per SM, of three warpgroups: a producer whose single thread draws work
//     items (a 128-row query tile of one block and head) from a global counter and issues the TMA
//     loads of q (two buffers for D = 64) and of k/v tiles of 128 keys into a ring of stages (4 for
//     D = 64, 3 for D = 128) with full/empty mbarriers; two consumers of 64 query rows each;
//   - a consumer computes S = q k^T with wgmma from shared memory (both operands K-major, 128-byte
//     swizzled as TMA wrote them) and O += P v with P from registers (the accumulator layout of S
//     is the A-operand layout of P V) and v read N-major; the online softmax stays in registers
//     (row max and sum in the log2 domain, one FFMA and one exp2 per score, reductions over eight
//     partials);
//   - overlap: within a warpgroup, S of the next tile is issued before P V of the current one and
//     its softmax runs while P V is on the tensor cores; between the two, named barriers make them
//     take turns issuing (ping-pong), so one's softmax runs while the other's products run;
//   - the epilogue divides by the row sum, applies out_scale (grouped mode's 1/G, free here),
//     writes o rows in place through their strides and the log-sum-exp of each row, or merges
//     them into the rows' o and lse so far (mixture mode); grouped mode's zeros are written by the
//     producer warpgroup's idle warps (D = 128) or the epilogue (D = 64).
// The producer gives registers back (setmaxnreg 32 / 232) so that a consumer thread holds S (64
// floats), O (D / 2) and P (32 words) without spilling (ptxas -v: no spills, no serialized wgmma).
#include "engine/cuda/hopper_attention.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "engine/cuda/hopper_ptx.cuh"

namespace dattn {
namespace cuda {
namespace {

using namespace hopper;  // NOLINT: the kernel is written in the PTX wrappers' terms

constexpr int kBlockM = 128;   // query rows per CTA (two consumer warpgroups of 64)
constexpr int kBlockN = 128;   // keys per k/v tile
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups

// Shared memory of one CTA for head dimension D: kQBuffers q tiles, then kStages k tiles, then
// kStages v tiles, each [D / 64 column blocks][rows][64] in TMA's 128-byte swizzle (1024-byte
// aligned), then the barriers. As many k/v stages as fit (the loads of later tiles hide behind
// the tensor cores); with D = 64 a second q buffer lets the next item's q arrive early.
template <int D>
struct Smem {
  static constexpr int kStages = D == 64 ? 4 : 3;
  static constexpr int kQBuffers = D == 64 ? 2 : 1;
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kKvBytes = kBlockN * D * 2;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBuffers * kQBytes;
  static constexpr int kV = kK + kStages * kKvBytes;
  static constexpr int kBarriers = kV + kStages * kKvBytes;
  // q_full[q buffers], q_empty[q buffers], k_full[stages], v_full[stages], k_empty[stages],
  // v_empty[stages]
  // then the work item of each q buffer (the producer hands them to the consumers)
  static constexpr int kItems = kBarriers + 8 * (2 * kQBuffers + 4 * kStages);
  static constexpr int kBytes = kItems + 4 * kQBuffers;
  static constexpr int kAlloc = kBytes + 1024;  // room to align the base to 1024 bytes
};

// What a CTA needs besides the tensor maps of q, k, v.
struct Geometry {
  void* o = nullptr;
  int64_t o_fold = 0, o_head = 0, o_seq = 0;  // element strides of o
  float* stats = nullptr;                     // packed [count, heads, rows]
  int rows = 0;
  int heads = 0;
  int count = 0;
  int tiles = 0;                  // query tiles per (block, head)
  int items = 0;                  // tiles * count * heads: the work items
  unsigned* next_item = nullptr;  // zeroed before the launch; the producers draw items from it
  float scale_log2 = 0.f;         // scale * log2(e): scores are kept in the log2 domain
  float out_scale = 1.f;
  int causal = 0;
  // Mixture mode: stats holds the rows' lse so far and o their output so far, which the epilogue
  // combines with this call's result by log-sum-exp weights (both written back).
  int merge = 0;
  // Unselected rows to clear (grouped mode), see UnselectedRows; rate 0: none.
  int zero_rate = 0, zero_lead = 0, zero_span = 0;
  int64_t o_pos = 0;  // element stride of o between consecutive positions
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    HopperForwardKernel(const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const Geometry g) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<D>;
  constexpr int kStages = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (SmemAddr(smem_raw) + 1023) & ~1023u;
  constexpr int kQBuffers = L::kQBuffers;
  const uint32_t bars = base + L::kBarriers;
  auto bar_q_full = [&](int b) { return bars + 8 * b; };
  auto bar_q_empty = [&](int b) { return bars + 8 * (kQBuffers + b); };
  auto bar_k_full = [&](int s) { return bars + 8 * (2 * kQBuffers + s); };
  auto bar_v_full = [&](int s) { return bars + 8 * (2 * kQBuffers + kStages + s); };
  auto bar_k_empty = [&](int s) { return bars + 8 * (2 * kQBuffers + 2 * kStages + s); };
  auto bar_v_empty = [&](int s) { return bars + 8 * (2 * kQBuffers + 3 * kStages + s); };
  const int wg = static_cast<int>(threadIdx.x / 128);

  // Grouped mode at D = 128: warps 1-3 of the producer warpgroup write the zeros around each
  // item's rows while the consumers compute, and release the item's slot like a consumer warp.
  // At D = 64 (items half as long, the same zeros per item) 96 threads fell behind and it ran
  // 1.5% slower than the consumers' epilogue writing them (H100, paired runs).
  constexpr bool kZeroWarpsAtD = D == 128;
  const bool zero_warps = kZeroWarpsAtD && g.zero_rate > 0;
  if (threadIdx.x == 0) {
    for (int b = 0; b < kQBuffers; ++b) {
      BarrierInit(bar_q_full(b), 1);
      // Lane 0 of every consumer warp (and zero warp) releases a buffer.
      BarrierInit(bar_q_empty(b), zero_warps ? 8 + kZeroWarps : 8);
    }
    for (int s = 0; s < kStages; ++s) {
      BarrierInit(bar_k_full(s), 1);
      BarrierInit(bar_v_full(s), 1);
      BarrierInit(bar_k_empty(s), 8);
      BarrierInit(bar_v_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Work item w (drawn in order by the persistent CTAs' producers from a global counter, so that a
  // CTA that finishes early takes more): query tile w % tiles of block (w / tiles) % count, head
  // w / (tiles * count); consecutive items share k and v in L2. Causal tiles are handed out from
  // the last (the most keys) to the first, so that the short ones fill in at the end.
  struct Item {
    int tile, j, head, key_tiles;
  };
  int* const item_slot = reinterpret_cast<int*>(smem_raw + (base - SmemAddr(smem_raw)) + L::kItems);
  auto item_of = [&](int w) {
    Item it;
    it.tile = g.causal ? g.tiles - 1 - w % g.tiles : w % g.tiles;
    const int rest = w / g.tiles;
    it.j = rest % g.count;
    it.head = rest / g.count;
    const int all = (g.rows + kBlockN - 1) / kBlockN;
    // Causal (kBlockM == kBlockN): the tile's rows see keys of tiles 0..tile only.
    it.key_tiles = g.causal ? min(all, it.tile + 1) : all;
    return it;
  };

  if (wg == 0) {
    // Producer: one thread issues every load, running ahead into the next item while the
    // consumers finish the current one; the warpgroup's registers go to the consumers.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n");
    if (threadIdx.x == 0) {
      int kv = 0;  // k/v tiles loaded so far (all items): stage kv % kStages, use kv / kStages
      for (int items = 0;; ++items) {
        const int qb = items % kQBuffers;
        const int w = ClaimItem(g.next_item, g.items, items, kQBuffers, &item_slot[qb],
                                bar_q_empty(qb), bar_q_full(qb));
        if (w == g.items) break;  // the consumers were told
        const Item it = item_of(w);
        BarrierExpectTx(bar_q_full(qb), L::kQBytes);
        for (int c = 0; c < D / kSwizzleCols; ++c) {
          TmaLoad(&tq, base + L::kQ + qb * L::kQBytes + c * kBlockM * 128, bar_q_full(qb),
                  c * kSwizzleCols, it.tile * kBlockM, it.head, it.j);
        }
        for (int n = 0; n < it.key_tiles; ++n, ++kv) {
          const int s = kv % kStages;
          const uint32_t reuse = ((kv / kStages) - 1) & 1;
          if (kv >= kStages) BarrierWait(bar_k_empty(s), reuse);
          BarrierExpectTx(bar_k_full(s), L::kKvBytes);
          for (int c = 0; c < D / kSwizzleCols; ++c) {
            TmaLoad(&tk, base + L::kK + s * L::kKvBytes + c * kBlockN * 128, bar_k_full(s),
                    c * kSwizzleCols, n * kBlockN, it.head, it.j);
          }
          if (kv >= kStages) BarrierWait(bar_v_empty(s), reuse);
          BarrierExpectTx(bar_v_full(s), L::kKvBytes);
          for (int c = 0; c < D / kSwizzleCols; ++c) {
            TmaLoad(&tv, base + L::kV + s * L::kKvBytes + c * kBlockN * 128, bar_v_full(s),
                    c * kSwizzleCols, n * kBlockN, it.head, it.j);
          }
        }
      }
    } else if (zero_warps && threadIdx.x >= 32) {
      // The zeros of the unselected rows between and before each item's rows, which no other
      // item writes: nothing to order against the consumers' stores.
      T* const out = static_cast<T*>(g.o);
      ZeroWarpsLoop(item_slot, kQBuffers, g.items, static_cast<int>(threadIdx.x % 32), bar_q_full,
                    bar_q_empty, [&](int w) {
                      const Item it = item_of(w);
                      ZeroUnselectedRows<D, kZeroWarpThreads>(
                          out + it.j * g.o_fold + it.head * g.o_head, g.zero_rate, g.zero_lead,
                          g.zero_span, g.o_pos, it.tile * kBlockM, g.rows,
                          static_cast<int>(threadIdx.x) - 32);
                    });
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");

  // Consumer warpgroup cw owns query rows 64 cw .. + 63 of the tile. In the accumulator layout a
  // thread holds rows r0 and r0 + 8, columns 8 n + col and + 1 of every 8-column block n.
  const int cw = wg - 1;
  const int t = static_cast<int>(threadIdx.x % 128);
  const int lane = t % 32;
  const int row_in_tile = cw * 64 + (t / 32) * 16 + lane / 4;
  const int col = 2 * (lane % 4);
  uint32_t q_base = 0;  // this warpgroup's 64 rows of the current item's q buffer

  auto release = [&](uint32_t bar) { ReleaseFromWarp(bar, lane); };

  float o[D / 2];
  // Running row max (log2 domain) and this thread's part of the row sum.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float corr[2] = {1.f, 1.f};  // o's rescaling factor for the tile last turned into probabilities
  float sc[64];                // scores of the tile being turned into probabilities
  uint32_t pa[8][4];           // probabilities of the tile whose P V runs

  // Issues S = q k^T from the k tile loaded kv-th (waits for it); the caller waits.
  auto issue_scores = [&](int kv) {
    BarrierWait(bar_k_full(kv % kStages), (kv / kStages) & 1);
    FenceRegs(sc);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t k_base = base + L::kK + (kv % kStages) * L::kKvBytes;
      Mma<T>::S(sc, Desc(q_base + (kk / 4) * kBlockM * 128 + (kk % 4) * 32, 16),
                Desc(k_base + (kk / 4) * kBlockN * 128 + (kk % 4) * 32, 16), kk > 0);
    }
    WgmmaCommit();
  };
  // Issues O += P v from `pa` and the v tile loaded kv-th (waits for it); the caller waits.
  auto issue_pv = [&](int kv) {
    BarrierWait(bar_v_full(kv % kStages), (kv / kStages) & 1);
    FenceRegs(o);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t v_base = base + L::kV + (kv % kStages) * L::kKvBytes;
      Mma<T>::PV(o, pa[kk], Desc(v_base + kk * 16 * 128, kBlockN * 128));
    }
    WgmmaCommit();
    FenceRegs(o);
  };
  // o *= corr row by row. (Skipping it when no row max of the warp moved, decided by a warp vote,
  // measured no faster on H100 and H200, 2026-11-26.)
  auto rescale = [&] {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= corr[(i >> 1) & 1];
  };
  // Online softmax of the scores of key tile n of `it` into `p`; corr := o's rescaling factor.
  auto softmax_exp = [&](const Item& it, int n) {
    // Keys past the block (last tile) and, causal, after the row (the diagonal tile) are -inf.
    const int key0 = n * kBlockN;
    if (key0 + kBlockN > g.rows || (g.causal && n == it.tile)) {
      const int row = it.tile * kBlockM + row_in_tile;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int key = key0 + 8 * (i / 4) + col + (i & 1);
        if (key >= g.rows || (g.causal && key > row + 8 * ((i >> 1) & 1))) sc[i] = -INFINITY;
      }
    }
    // With a positive scale the row max of the raw scores gives the max of the scaled ones, and
    // each probability is one FFMA and one exp2 (FlashAttention's trick); otherwise the scores are
    // scaled first.
    const bool raw = g.scale_log2 > 0.f;
    if (!raw) {
#pragma unroll
      for (int i = 0; i < 64; ++i) sc[i] *= g.scale_log2;
    }
    const float mul = raw ? g.scale_log2 : 1.f;
    // Row max and row sum over eight independent partials each, partial c holding 8-column blocks
    // c and c + 8 (a single running value would be a 32-long chain of dependent instructions per
    // row, stalling on their latency).
    float part[2][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < 8; ++c) part[h][c] = fmaxf(sc[4 * c + 2 * h], sc[4 * c + 2 * h + 1]);
    }
#pragma unroll
    for (int i = 32; i < 64; ++i) {
      part[(i >> 1) & 1][(i >> 2) & 7] = fmaxf(part[(i >> 1) & 1][(i >> 2) & 7], sc[i]);
    }
    float ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3])),
                       fmaxf(fmaxf(part[h][4], part[h][5]), fmaxf(part[h][6], part[h][7])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(m_run[h], mx * mul);       // log2 domain
      ref[h] = mx == -INFINITY ? 0.f : mx;  // a row with every key masked so far
      corr[h] = Exp2(m_run[h] - ref[h]);
      m_run[h] = mx;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) sc[i] = Exp2(fmaf(sc[i], mul, -ref[(i >> 1) & 1]));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < 8; ++c) part[h][c] = sc[4 * c + 2 * h] + sc[4 * c + 2 * h + 1];
    }
#pragma unroll
    for (int i = 32; i < 64; ++i) part[(i >> 1) & 1][(i >> 2) & 7] += sc[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_run[h] = l_run[h] * corr[h] + (((part[h][0] + part[h][1]) + (part[h][2] + part[h][3])) +
                                       ((part[h][4] + part[h][5]) + (part[h][6] + part[h][7])));
    }
  };
  // The probabilities in `sc` packed into the A-operand registers `pa`.
  auto pack = [&] {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      pa[kk][0] = Mma<T>::Pack(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = Mma<T>::Pack(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = Mma<T>::Pack(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = Mma<T>::Pack(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };

  // Ping-pong (as in FlashAttention-3): the two warpgroups take turns issuing their matrix
  // products, so that one's softmax runs on the ALUs and special-function units while the other's
  // products run on the tensor cores. Both pass through the same number of turns per item.
  auto take_turn = [&] { NamedSync(1 + cw); };
  auto pass_turn = [&] { NamedArrive(2 - cw); };
  if (cw == 1) pass_turn();  // warpgroup 0 goes first

  int kv = 0;  // k/v tiles consumed so far, as the producer counts them
  for (int items = 0;; ++items) {
    const int qb = items % kQBuffers;
    BarrierWait(bar_q_full(qb), (items / kQBuffers) & 1);
    const int w = item_slot[qb];
    if (w == g.items) break;
    const Item it = item_of(w);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.f;
    q_base = base + L::kQ + qb * L::kQBytes + cw * 64 * 128;
    take_turn();
    issue_scores(kv);
    pass_turn();
    WgmmaWait<0>();
    FenceRegs(sc);
    release(bar_k_empty(kv % kStages));
    if (it.key_tiles == 1) release(bar_q_empty(qb));
    softmax_exp(it, 0);
    pack();
    FenceRegs(o);
    FenceRegs(pa);
    // Software pipeline: while P V of tile n runs on the tensor cores, the scores of tile n + 1
    // are computed and turned into probabilities, kept in `sc` as floats; once P V is done, o is
    // rescaled and they are packed into `pa` (a second set of P registers would spill at
    // D = 128, and copying between two sets made ptxas serialize every wgmma).
    auto step = [&](int n) {
      take_turn();
      issue_scores(kv + n + 1);
      issue_pv(kv + n);
      pass_turn();
      WgmmaWait<1>();  // the scores of tile n + 1; P V of tile n may still run
      FenceRegs(sc);
      release(bar_k_empty((kv + n + 1) % kStages));
      if (n + 2 == it.key_tiles) release(bar_q_empty(qb));  // q is read no more
      softmax_exp(it, n + 1);
      WgmmaWait<0>();
      FenceRegs(o);
      FenceRegs(pa);
      release(bar_v_empty((kv + n) % kStages));
      rescale();
      pack();
      FenceRegs(o);  // rescaled and packed here, not sunk between the next two issues
      FenceRegs(pa);
    };
    // The last tile is peeled off so that every step commits the same groups.
    for (int n = 0; n + 1 < it.key_tiles; ++n) step(n);
    take_turn();
    issue_pv(kv + it.key_tiles - 1);
    pass_turn();
    // Merging: the rows' output and lse so far are loaded while the last P V runs, so that the
    // epilogue waits for one round trip at most (loaded one by one after it, they cost mixture
    // mode several percent).
    T* const first = static_cast<T*>(g.o) + it.j * g.o_fold + it.head * g.o_head + col;
    const int row0 = it.tile * kBlockM + row_in_tile;
    const int64_t stat0 = (static_cast<int64_t>(it.j) * g.heads + it.head) * g.rows + row0;
    uint32_t old_o[2][D / 8] = {};
    float lse_old[2] = {-INFINITY, -INFINITY};
    if (g.merge) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row0 + 8 * h >= g.rows) continue;
        lse_old[h] = g.stats[stat0 + 8 * h];
        const T* src = first + (row0 + 8 * h) * g.o_seq;
#pragma unroll
        for (int b = 0; b < D / 8; ++b) {
          old_o[h][b] = *reinterpret_cast<const uint32_t*>(src + 8 * b);
        }
      }
    }
    WgmmaWait<0>();
    FenceRegs(o);
    release(bar_v_empty((kv + it.key_tiles - 1) % kStages));
    kv += it.key_tiles;

    // Epilogue: o / rowsum * out_scale in place, and the row's log-sum-exp (natural log); when
    // merging, with L = logaddexp(lse_old, lse), o := o_old exp(lse_old - L) + o exp(lse - L) and
    // lse := L (a row nothing reached before, lse_old = -inf, takes this call's values alone).
    float lse_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row0 + 8 * h;
      float lse = l > 0.f ? m_run[h] * 0.69314718055994531f + logf(l) : -INFINITY;
      float inv = l > 0.f ? g.out_scale / l : 0.f;
      float w_old = 0.f;
      if (lse_old[h] != -INFINITY) {
        if (lse == -INFINITY) {
          lse = lse_old[h];
          w_old = 1.f;
        } else {
          const float hi = fmaxf(lse_old[h], lse);
          const float total = hi + log1pf(expf(fminf(lse_old[h], lse) - hi));
          w_old = expf(lse_old[h] - total);
          inv *= expf(lse - total);
          lse = total;
        }
      }
      lse_row[h] = lse;
      if (row >= g.rows) continue;
      T* dst = first + row * g.o_seq;
#pragma unroll
      for (int b = 0; b < D / 8; ++b) {
        float lo = o[4 * b + 2 * h] * inv, hi = o[4 * b + 2 * h + 1] * inv;
        if (w_old != 0.f) {
          const T* two = reinterpret_cast<const T*>(&old_o[h][b]);
          lo += static_cast<float>(two[0]) * w_old;
          hi += static_cast<float>(two[1]) * w_old;
        }
        *reinterpret_cast<uint32_t*>(dst + 8 * b) = Mma<T>::Pack(lo, hi);
      }
    }
    // The four lanes of a row all read its old lse above; one writes the new one.
    __syncwarp();
    if (lane % 4 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row0 + 8 * h < g.rows) g.stats[stat0 + 8 * h] = lse_row[h];
      }
    }
    if (!kZeroWarpsAtD && g.zero_rate > 0) {
      ZeroUnselectedRows<D, 256>(static_cast<T*>(g.o) + it.j * g.o_fold + it.head * g.o_head,
                                 g.zero_rate, g.zero_lead, g.zero_span, g.o_pos, it.tile * kBlockM,
                                 g.rows, cw * 128 + t);
    }
  }
#else
  __trap();  // built without sm_90a: HopperForwardSupported() keeps such devices away
#endif
}

template <typename T, int D>
cudaError_t Launch(const KernelForwardArgs& a, const UnselectedRows& zeros, bool merge,
                   unsigned* item_counter, cudaStream_t stream) {
  CUtensorMap mq, mk, mv;
  if (!EncodeView(&mq, a.q, a.type, a.count, a.heads, a.rows, D, kBlockM) ||
      !EncodeView(&mk, a.k, a.type, a.count, a.heads, a.rows, D, kBlockN) ||
      !EncodeView(&mv, a.v, a.type, a.count, a.heads, a.rows, D, kBlockN)) {
    return cudaErrorInvalidValue;
  }
  Geometry g;
  g.o = a.o.ptr;
  g.o_fold = a.o.fold;
  g.o_head = a.o.head;
  g.o_seq = a.o.seq;
  g.stats = a.stats;
  g.rows = static_cast<int>(a.rows);
  g.heads = static_cast<int>(a.heads);
  g.count = static_cast<int>(a.count);
  g.tiles = static_cast<int>((a.rows + kBlockM - 1) / kBlockM);
  g.items = g.tiles * g.count * g.heads;
  g.scale_log2 = a.scale * 1.4426950408889634f;
  g.out_scale = a.p_scale;
  g.causal = a.causal ? 1 : 0;
  g.merge = merge ? 1 : 0;
  g.zero_rate = static_cast<int>(zeros.rate);
  g.zero_lead = static_cast<int>(zeros.lead);
  g.zero_span = static_cast<int>(zeros.span);
  g.o_pos = zeros.pos_stride;
  g.next_item = item_counter;
  auto kernel = HopperForwardKernel<T, D>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem<D>::kAlloc);
  if (e != cudaSuccess) return e;
  // Persistent: one CTA per SM (at most one fits); the items are drawn through item_counter.
  int device = 0, sms = 0;
  e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const unsigned grid = static_cast<unsigned>(std::min(g.items, sms));
  e = cudaMemsetAsync(item_counter, 0, sizeof(unsigned), stream);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kThreads, Smem<D>::kAlloc, stream>>>(mq, mk, mv, g);
  return cudaGetLastError();
}

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool HopperForwardSupported(const KernelForwardArgs& a, const UnselectedRows& zeros) {
  if (a.type != ElemType::kBF16 && a.type != ElemType::kF16) return false;
  if (a.head_dim != 64 && a.head_dim != 128) return false;
  if (a.count < 1 || a.heads < 1 || a.rows < 1 || a.stats == nullptr) return false;
  if (a.heads > 65535 || a.rows > INT_MAX / 2) return false;
  const int64_t tiles = (a.rows + kBlockM - 1) / kBlockM;
  if (a.count > INT_MAX / tiles / a.heads) return false;  // work items fit an int
  for (const KernelTensor* t : {&a.q, &a.k, &a.v}) {
    // TMA: 16-byte aligned base, strides multiples of 16 bytes below 2^40.
    if (t->ptr == nullptr || t->chan != 1 || !Aligned(t->ptr, 16)) return false;
    for (int64_t s : {t->seq, t->head, t->fold}) {
      if (s < 0 || (s * 2) % 16 != 0 || s * 2 >= (int64_t{1} << 40)) return false;
    }
    if (t->seq == 0 || (a.heads > 1 && t->head == 0) || (a.count > 1 && t->fold == 0)) return false;
  }
  // o is written two elements (4 bytes) at a time.
  if (a.o.ptr == nullptr || a.o.chan != 1 || !Aligned(a.o.ptr, 4)) return false;
  for (int64_t s : {a.o.seq, a.o.head, a.o.fold}) {
    if (s % 2 != 0) return false;
  }
  if (zeros.rate > 0) {
    // 16-byte stores of whole rows; positions addressed with 32-bit offsets.
    if (zeros.rate == 1 || zeros.rate > INT_MAX / kBlockM || zeros.lead < 0 ||
        zeros.lead >= zeros.rate || zeros.span < 1 || zeros.span > INT_MAX ||
        zeros.pos_stride < 1 || zeros.pos_stride * 2 % 16 != 0 || !Aligned(a.o.ptr, 16) ||
        a.o.fold * 2 % 16 != 0 || a.o.head * 2 % 16 != 0) {
      return false;
    }
  }
  return true;
}

cudaError_t NewHopperItemCounter(int device, unsigned** counter) {
  *counter = nullptr;
  int major = 0, minor = 0;
  cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (e != cudaSuccess || major != 9 || minor != 0) return e;
  return cudaMalloc(reinterpret_cast<void**>(counter), sizeof(unsigned));
}

cudaError_t LaunchHopperForward(const KernelForwardArgs& a, bool merge, const UnselectedRows& zeros,
                                unsigned* item_counter, cudaStream_t stream) {
  if (!HopperForwardSupported(a, zeros) || item_counter == nullptr || (merge && zeros.rate > 0)) {
    return cudaErrorInvalidValue;
  }
  if (a.type == ElemType::kBF16) {
    return a.head_dim == 64 ? Launch<__nv_bfloat16, 64>(a, zeros, merge, item_counter, stream)
                            : Launch<__nv_bfloat16, 128>(a, zeros, merge, item_counter, stream);
  }
  return a.head_dim == 64 ? Launch<__half, 64>(a, zeros, merge, item_counter, stream)
                          : Launch<__half, 128>(a, zeros, merge, item_counter, stream);
}

}  // namespace cuda
}  // namespace dattn
