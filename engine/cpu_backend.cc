// The CPU backend. Per pattern i, the selected rows of segment m with offset o are positions
// m*w + o + j*r, j = 0, 1, ...: a matrix with row stride r*stride_N. Attention of one (b, head,
// segment) is computed in tiles of kTileQ query rows x kTileK key rows with an online softmax
// (forward) or from the saved log-sum-exp (backward, flash style), so scratch is O(threads x tile).
//
// Products: the fp32 forward pass uses the AVX-512 micro-kernels of cpu_attention_kernels.h where
// they apply (D a multiple of 16 up to 128); everything else (fp64, other D, CPUs without AVX-512,
// the backward pass) hands the strided rows to OpenBLAS as they lie, with lda = r*stride_N, and
// gathers a tile only when the channel stride is not 1 or the row stride does not fit BLAS's int.
//
// Parallelism: work items are (pattern, b, head, segment, query tile) in the forward pass and
// (pattern, b, head, segment) in the backward pass, so that every output row (and every dk/dv row
// of a segment) has a single writer; short segments are batched into one item. Grouped-mode
// patterns touch disjoint heads and run as one loop; mixture-mode patterns overlap and run one
// loop each, merged into out/lse (forward) or accumulated into dq/dk/dv (backward) in turn.
#include "engine/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu_attention_kernels.h"
#include "engine/cpu_strided_blas.h"
#include "engine/cpu_thread_pool.h"
#include "engine/cpu_tiling.h"
#include "engine/cpu_vector_math.h"
#include "engine/validate.h"

namespace dattn {
namespace {

// Tile sizes (rows), measured on the 2-core dev machine (docs/PERFORMANCE_HISTORY.md, "CPU
// engine"): a tall query tile amortises the packing of each key block (by OpenBLAS or by the
// backend), and 512 x 256 fp32 scores (512 KiB) still sit in L2. With OpenBLAS, 128 x 512 ran 10%
// slower and 1024 x 256 no faster; with the micro-kernels, 256 x 256, 512 x 128, 512 x 512 and
// 1024 x 256 all ran 5-7% slower.
constexpr int64_t kTileQ = 512;
constexpr int64_t kTileK = 256;
// Scratch per thread is bounded even for a huge head dim: the query tile shrinks instead.
constexpr int64_t kMaxTileElements = int64_t{1} << 22;

using cpu::Blas;
using cpu::GemmAccumulateRows;
using cpu::LogAddExp;
using cpu::Mat;
using cpu::Rows;
using cpu::View4;

// One pattern's geometry for this call.
struct PatternGeo {
  int index = 0;
  int64_t w = 0;         // Segment length, capped at N.
  int64_t r = 0;         // Dilation rate as given (offsets use it).
  int64_t step = 0;      // Row step: min(r, w); a segment selects one row when r >= w.
  int64_t segments = 0;  // NumSegments(N, w).
  int64_t max_sel = 0;   // Most rows a segment can select: ceil(w / r).
  int64_t head_begin = 0, head_end = 0;
  int64_t tiles = 0;  // Query tiles per segment (at least 1: tile 0 also zero-fills).
  // Segments per work item: short segments are batched so that one item is about a tile of rows.
  int64_t segments_per_item = 1;
  double factor = 1;  // Output factor: 1/G in grouped mode, 1 in mixture mode.
};

// Rows per tile for head dim d.
struct Tiles {
  int64_t q, k;
};
Tiles TilesFor(int64_t head_dim) {
  return {std::max<int64_t>(1, std::min(kTileQ, kMaxTileElements / head_dim)),
          std::max<int64_t>(1, std::min(kTileK, kMaxTileElements / head_dim))};
}

// Per-thread scratch of one call. Elements, by buffer (tq x tk tiles, tq or tk rows of d):
//   s: scores / probabilities (tq x tk); p2: dP then dS (backward, tq x tk); acc: output or dQ
//   accumulator (tq x d); m, l: row max and sum, or lse and Delta (tq each); alpha: each row's
//   rescale in one block (tq); gq, gk, gv, gdo: gathered rows when a view cannot go to BLAS as is,
//   or Q^T and packed V for the micro-kernels (tq x d, tk x d, tk x d, tq x d backward); tmp: a
//   dk/dv block whose row stride exceeds BLAS's int (tk x d, backward).
template <typename T>
struct Scratch {
  std::vector<T> s, p2, acc, m, l, alpha, gq, gk, gv, gdo, tmp;

  static int64_t Elements(Tiles t, int64_t d, bool backward) {
    const int64_t fwd = t.q * t.k + t.q * d + 3 * t.q + t.q * d + 2 * t.k * d;
    return backward ? fwd + t.q * t.k + t.q * d + t.k * d : fwd;
  }

  void Resize(Tiles t, int64_t d, bool backward) {
    s.resize(t.q * t.k);
    acc.resize(t.q * d);
    m.resize(t.q);
    l.resize(t.q);
    alpha.resize(t.q);
    gq.resize(t.q * d);
    gk.resize(t.k * d);
    gv.resize(t.k * d);
    if (backward) {
      p2.resize(t.q * t.k);
      gdo.resize(t.q * d);
      tmp.resize(t.k * d);
    }
  }
};

template <typename T>
class Kernel {
 public:
  Kernel(const AttentionSpec& spec, const TensorView& q, std::vector<Scratch<T>>& scratch)
      : spec_(spec),
        batch_(q.shape[0]),
        n_(q.shape[1]),
        heads_(q.shape[2]),
        d_(q.shape[3]),
        scale_(static_cast<T>(spec.ScaleFor(q.shape[3]))),
        tile_q_(TilesFor(q.shape[3]).q),
        tile_k_(TilesFor(q.shape[3]).k),
        // The micro-kernels need key blocks in whole chunks of scratch (tile_k_ is 256 there).
        // The micro-kernels write whole chunks of queries: tile_q_ must be a multiple (it is 512
        // whenever they apply).
        kernels_(std::is_same<T, float>::value && cpu::AttentionKernelsFor(q.shape[3]) &&
                 tile_q_ % cpu::kQueryChunk == 0),
        scratch_(scratch) {
    const int g = spec.num_patterns();
    for (int i = 0; i < g; ++i) {
      PatternGeo p;
      p.index = i;
      p.w = std::min(spec.segment_lengths[i], n_);
      p.r = spec.dilation_rates[i];
      p.step = std::min(p.r, p.w);
      p.segments = dilation::NumSegments(n_, p.w);
      p.max_sel = dilation::SelectedCount(p.w, 0, p.r);
      if (spec.mode == AttentionMode::kGrouped) {
        const dilation::HeadRange range = dilation::GroupHeads(heads_, g, i);
        p.head_begin = range.begin;
        p.head_end = range.end;
        p.factor = 1.0 / g;
      } else {
        p.head_begin = 0;
        p.head_end = heads_;
        p.factor = 1.0;
      }
      p.tiles = std::max<int64_t>(1, dilation::NumSegments(p.max_sel, tile_q_));
      if (p.tiles == 1) p.segments_per_item = std::max<int64_t>(1, tile_q_ / p.max_sel);
      patterns_.push_back(p);
    }
  }

  void Forward(const ForwardArgs& args, cpu::ThreadPool& pool) {
    q_ = View4<const T>(args.q);
    k_ = View4<const T>(args.k);
    v_ = View4<const T>(args.v);
    out_ = static_cast<T*>(args.out.data);
    lse_ = static_cast<T*>(args.lse.data);
    for (auto& s : scratch_) s.Resize({tile_q_, tile_k_}, d_, /*backward=*/false);
    if (spec_.mode == AttentionMode::kGrouped) {
      // Disjoint heads: one loop over every pattern, the costliest items first.
      RunItems(SortedByCost(patterns_), pool, /*backward=*/false, /*merge=*/false);
    } else {
      for (size_t i = 0; i < patterns_.size(); ++i) {
        RunItems({patterns_[i]}, pool, /*backward=*/false, /*merge=*/i > 0);
      }
    }
  }

  void Backward(const BackwardArgs& args, cpu::ThreadPool& pool) {
    q_ = View4<const T>(args.q);
    k_ = View4<const T>(args.k);
    v_ = View4<const T>(args.v);
    o_ = View4<const T>(args.out);
    do_ = View4<const T>(args.dout);
    lse_ = static_cast<T*>(args.lse.data);
    dq_ = static_cast<T*>(args.dq.data);
    dk_ = static_cast<T*>(args.dk.data);
    dv_ = static_cast<T*>(args.dv.data);
    for (auto& s : scratch_) s.Resize({tile_q_, tile_k_}, d_, /*backward=*/true);
    // Rows that no pattern touches must read 0, and patterns accumulate: start from zeros.
    const int64_t total = batch_ * n_ * heads_ * d_;
    constexpr int64_t kChunk = int64_t{1} << 16;
    pool.ParallelFor(dilation::NumSegments(total, kChunk), [&](int64_t c, int) {
      const int64_t begin = c * kChunk;
      const int64_t count = std::min(kChunk, total - begin);
      std::memset(dq_ + begin, 0, count * sizeof(T));
      std::memset(dk_ + begin, 0, count * sizeof(T));
      std::memset(dv_ + begin, 0, count * sizeof(T));
    });
    if (spec_.mode == AttentionMode::kGrouped) {
      RunItems(SortedByCost(patterns_), pool, /*backward=*/true, /*merge=*/false);
    } else {
      for (const PatternGeo& p : patterns_) RunItems({p}, pool, /*backward=*/true, false);
    }
  }

 private:
  // Work per item (forward: one query tile; backward: one segment), largest first.
  std::vector<PatternGeo> SortedByCost(std::vector<PatternGeo> patterns) const {
    std::stable_sort(
        patterns.begin(), patterns.end(),
        [&](const PatternGeo& a, const PatternGeo& b) { return a.max_sel > b.max_sel; });
    return patterns;
  }

  void RunItems(const std::vector<PatternGeo>& patterns, cpu::ThreadPool& pool, bool backward,
                bool merge) {
    // Items of pattern k are [first[k], first[k+1]); inside a pattern the order is
    // (b, head, segment chunk[, tile]) with the tile index fastest.
    std::vector<int64_t> first = {0};
    for (const PatternGeo& p : patterns) {
      const int64_t per_chunk = backward ? 1 : p.tiles;
      const int64_t chunks = dilation::NumSegments(p.segments, p.segments_per_item);
      first.push_back(first.back() + batch_ * (p.head_end - p.head_begin) * chunks * per_chunk);
    }
    pool.ParallelFor(first.back(), [&](int64_t item, int thread) {
      size_t k = 0;
      while (item >= first[k + 1]) ++k;
      const PatternGeo& p = patterns[k];
      int64_t rest = item - first[k];
      const int64_t per_chunk = backward ? 1 : p.tiles;
      const int64_t chunks = dilation::NumSegments(p.segments, p.segments_per_item);
      int64_t tile = rest % per_chunk;
      rest /= per_chunk;
      const int64_t chunk = rest % chunks;
      rest /= chunks;
      const int64_t nh = p.head_end - p.head_begin;
      const int64_t head = p.head_begin + rest % nh;
      const int64_t b = rest / nh;
      // Causal tiles grow with their index; hand out the big ones first.
      if (spec_.causal) tile = per_chunk - 1 - tile;
      const int64_t seg_end = std::min(p.segments, (chunk + 1) * p.segments_per_item);
      for (int64_t segment = chunk * p.segments_per_item; segment < seg_end; ++segment) {
        if (backward) {
          BackwardSegment(p, b, head, segment, scratch_[thread]);
        } else {
          ForwardTile(p, b, head, segment, tile, merge, scratch_[thread]);
        }
      }
    });
  }

  T* OutRow(T* base, int64_t b, int64_t p, int64_t h) const {
    return base + ((b * n_ + p) * heads_ + h) * d_;
  }
  T& Lse(int64_t b, int64_t h, int64_t p) const { return lse_[(b * heads_ + h) * n_ + p]; }

  // Row limit of query row jq against the key block starting at kb (nk keys): causal rows see keys
  // <= jq only. Returns a count in [0, nk].
  int64_t KeyLimit(int64_t jq, int64_t kb, int64_t nk) const {
    if (!spec_.causal) return nk;
    return std::max<int64_t>(0, std::min(nk, jq - kb + 1));
  }

  void ForwardTile(const PatternGeo& p, int64_t b, int64_t h, int64_t segment, int64_t tile,
                   bool merge, Scratch<T>& s) {
    const int64_t s0 = segment * p.w;
    const int64_t len = std::min(p.w, n_ - s0);
    const int64_t o = dilation::PatternOffset(spec_, p.index, h, heads_);
    const int64_t sel = dilation::SelectedCount(len, o, p.r);
    const int64_t j0 = tile * tile_q_;
    const int64_t j1 = std::min(sel, j0 + tile_q_);
    const T neg_inf = -std::numeric_limits<T>::infinity();

    if (!merge) {
      // This tile owns the unselected positions from its first row up to the next tile's first row
      // (tile 0 from the segment start, the last tile to the segment end).
      if (tile > 0 && j0 >= sel) return;
      const int64_t z0 = tile == 0 ? s0 : s0 + o + j0 * p.step;
      const int64_t z1 = j1 >= sel ? s0 + len : s0 + o + j1 * p.step;
      for (int64_t pos = z0; pos < z1; ++pos) {
        const int64_t rel = pos - s0 - o;
        if (rel >= 0 && rel % p.step == 0 && rel / p.step < sel) continue;
        std::memset(OutRow(out_, b, pos, h), 0, d_ * sizeof(T));
        Lse(b, h, pos) = neg_inf;
      }
    }
    if (j0 >= j1) return;

    const int64_t nq = j1 - j0;
    const int64_t base = s0 + o;
    T* acc = s.acc.data();
    T* m = s.m.data();
    T* l = s.l.data();
    std::fill(acc, acc + nq * d_, T(0));
    std::fill(m, m + tile_q_, neg_inf);
    std::fill(l, l + tile_q_, T(0));
    if constexpr (std::is_same<T, float>::value) {
      if (kernels_) ForwardTileKernels(p, b, h, base, j0, j1, sel, s);
    }
    if (!kernels_) ForwardTileBlas(p, b, h, base, j0, j1, sel, s);

    for (int64_t i = 0; i < nq; ++i) {
      const int64_t pos = base + (j0 + i) * p.step;
      T* dst = OutRow(out_, b, pos, h);
      const T* a = acc + i * d_;
      T& lse_out = Lse(b, h, pos);
      // l is 0 only if no key was visible, which a selected row cannot be (it sees itself); the
      // guard keeps such a row at "no contribution" rather than 0/0. A NaN l (NaN inputs) is not
      // empty: it propagates into the row as ordinary attention would.
      const bool empty = l[i] == T(0);
      const double row_lse = empty
                                 ? -std::numeric_limits<double>::infinity()
                                 : static_cast<double>(m[i]) + std::log(static_cast<double>(l[i]));
      if (!merge) {
        const T f = empty ? T(0) : static_cast<T>(p.factor / static_cast<double>(l[i]));
        for (int64_t x = 0; x < d_; ++x) dst[x] = a[x] * f;
        lse_out = static_cast<T>(row_lse);
        continue;
      }
      if (empty) continue;
      const double old_lse = static_cast<double>(lse_out);
      const double new_lse = LogAddExp(old_lse, row_lse);
      const T keep = static_cast<T>(std::exp(old_lse - new_lse));
      const T add = static_cast<T>(std::exp(row_lse - new_lse) / static_cast<double>(l[i]));
      for (int64_t x = 0; x < d_; ++x) dst[x] = dst[x] * keep + a[x] * add;
      lse_out = static_cast<T>(new_lse);
    }
  }

  // dst (n x d, contiguous) := rows p0, p0 + r, ... of head h, batch b.
  void PackRows(const View4<const T>& v, int64_t b, int64_t h, int64_t p0, int64_t r, int64_t n,
                T* dst) const {
    for (int64_t i = 0; i < n; ++i) {
      const T* src = v.At(b, p0 + i * r, h);
      T* out = dst + i * d_;
      if (v.sd == 1) {
        std::memcpy(out, src, d_ * sizeof(T));
      } else {
        for (int64_t x = 0; x < d_; ++x) out[x] = src[x * v.sd];
      }
    }
  }

  // The products of query rows [j0, j1) of one dilated segment (rows base + j*step) against its
  // keys: on return m, l and acc hold each row's running max, sum and unnormalised output.
  void ForwardTileBlas(const PatternGeo& p, int64_t b, int64_t h, int64_t base, int64_t j0,
                       int64_t j1, int64_t sel, Scratch<T>& s) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const int64_t nq = j1 - j0;
    const Mat<T> qm = Rows(q_, b, h, base + j0 * p.step, p.step, nq, d_, s.gq.data());
    T* acc = s.acc.data();
    T* m = s.m.data();
    T* l = s.l.data();
    const int64_t kend = spec_.causal ? j1 : sel;
    for (int64_t kb = 0; kb < kend; kb += tile_k_) {
      const int64_t nk = std::min(tile_k_, kend - kb);
      const int64_t kpos = base + kb * p.step;
      const Mat<T> km = Rows(k_, b, h, kpos, p.step, nk, d_, s.gk.data());
      const Mat<T> vm = Rows(v_, b, h, kpos, p.step, nk, d_, s.gv.data());
      T* sc = s.s.data();
      Blas<T>::Gemm(CblasNoTrans, CblasTrans, nq, nk, d_, scale_, qm.ptr, qm.ld, km.ptr, km.ld,
                    T(0), sc, nk);
      for (int64_t i = 0; i < nq; ++i) {
        T* row = sc + i * nk;
        const int64_t lim = KeyLimit(j0 + i, kb, nk);
        // NaN must stick (std::max would drop it): a NaN score makes the row NaN.
        const T block_max = lim > 0 ? cpu::RowMax(row, lim) : neg_inf;
        const T m_new = std::isnan(block_max) ? block_max : std::max(m[i], block_max);
        if (m_new == neg_inf) {
          // Nothing visible yet (or every score is -inf): this block adds nothing to the row.
          std::fill(row, row + nk, T(0));
          continue;
        }
        const T sum = cpu::ExpShiftSum(row, lim, m_new);
        std::fill(row + lim, row + nk, T(0));
        const T alpha = std::exp(m[i] - m_new);
        l[i] = l[i] * alpha + sum;
        m[i] = m_new;
        if (alpha != T(1)) {
          T* a = acc + i * d_;
          for (int64_t x = 0; x < d_; ++x) a[x] *= alpha;
        }
      }
      Blas<T>::Gemm(CblasNoTrans, CblasNoTrans, nq, d_, nk, T(1), sc, nk, vm.ptr, vm.ld, T(1), acc,
                    d_);
    }
  }

  // As ForwardTileBlas, with cpu_attention_kernels.h: scores kept transposed (keys x queries), keys
  // read in place, the query tile packed once.
  void ForwardTileKernels(const PatternGeo& p, int64_t b, int64_t h, int64_t base, int64_t j0,
                          int64_t j1, int64_t sel, Scratch<float>& s) {
    const int64_t nq = j1 - j0;
    // The kernels compute whole chunks of queries; the column softmax takes 16 at a time.
    const int64_t ldst = dilation::NumSegments(nq, cpu::kQueryChunk) * cpu::kQueryChunk;
    const int64_t cols = dilation::NumSegments(nq, 16) * 16;
    float* qt = s.gq.data();
    cpu::PackQueriesTransposed(q_.At(b, base + j0 * p.step, h), p.step * q_.sn, q_.sd, nq, d_,
                               scale_, qt);
    float* acc = s.acc.data();
    float* alpha = s.alpha.data();
    const int64_t kend = spec_.causal ? j1 : sel;
    for (int64_t kb = 0; kb < kend; kb += tile_k_) {
      const int64_t nk = std::min(tile_k_, kend - kb);
      const int64_t kpos = base + kb * p.step;
      // Keys and values are copied into contiguous blocks first: the kernels then read them with
      // unit stride from L1/L2 instead of one scattered row (a page apart) at a time.
      float* kp = s.gk.data();
      float* vp = s.gv.data();
      PackRows(k_, b, h, kpos, p.step, nk, kp);
      PackRows(v_, b, h, kpos, p.step, nk, vp);
      float* st = s.s.data();
      cpu::ScoresTransposed(qt, nq, d_, kp, d_, 1, nk, st, ldst);
      if (spec_.causal) {
        // Key kb + j is visible to query j0 + i iff i >= kb + j - j0.
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t hidden = std::min(cols, kb + j - j0);
          if (hidden > 0) {
            std::fill(st + j * ldst, st + j * ldst + hidden,
                      -std::numeric_limits<float>::infinity());
          }
        }
      }
      cpu::SoftmaxColumnsStep(st, ldst, nk, cols, s.m.data(), s.l.data(), alpha);
      for (int64_t i = 0; i < nq; ++i) {
        if (alpha[i] == 1.0f) continue;
        float* a = acc + i * d_;
        for (int64_t x = 0; x < d_; ++x) a[x] *= alpha[i];
      }
      cpu::AccumulatePVTransposed(st, ldst, nq, nk, vp, d_, d_, acc);
    }
  }

  void BackwardSegment(const PatternGeo& p, int64_t b, int64_t h, int64_t segment, Scratch<T>& s) {
    const int64_t s0 = segment * p.w;
    const int64_t len = std::min(p.w, n_ - s0);
    const int64_t o = dilation::PatternOffset(spec_, p.index, h, heads_);
    const int64_t sel = dilation::SelectedCount(len, o, p.r);
    const int64_t base = s0 + o;
    const T c = static_cast<T>(p.factor);
    const int64_t row_stride = p.step * heads_ * d_;  // Of dq, dk, dv (contiguous).
    const T neg_inf = -std::numeric_limits<T>::infinity();

    for (int64_t j0 = 0; j0 < sel; j0 += tile_q_) {
      const int64_t j1 = std::min(sel, j0 + tile_q_);
      const int64_t nq = j1 - j0;
      const Mat<T> qm = Rows(q_, b, h, base + j0 * p.step, p.step, nq, d_, s.gq.data());
      const Mat<T> dom = Rows(do_, b, h, base + j0 * p.step, p.step, nq, d_, s.gdo.data());
      T* lse = s.m.data();
      T* delta = s.l.data();
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t pos = base + (j0 + i) * p.step;
        lse[i] = Lse(b, h, pos);
        // Delta = dO . out: the row sum of P * dP, since out is c * P V.
        const T* orow = o_.At(b, pos, h);
        const T* drow = do_.At(b, pos, h);
        T dot = 0;
        for (int64_t x = 0; x < d_; ++x) dot += orow[x * o_.sd] * drow[x * do_.sd];
        delta[i] = dot;
      }
      T* dq_acc = s.acc.data();
      std::fill(dq_acc, dq_acc + nq * d_, T(0));

      const int64_t kend = spec_.causal ? j1 : sel;
      for (int64_t kb = 0; kb < kend; kb += tile_k_) {
        const int64_t nk = std::min(tile_k_, kend - kb);
        const int64_t kpos = base + kb * p.step;
        const Mat<T> km = Rows(k_, b, h, kpos, p.step, nk, d_, s.gk.data());
        const Mat<T> vm = Rows(v_, b, h, kpos, p.step, nk, d_, s.gv.data());
        T* pm = s.s.data();
        T* dp = s.p2.data();
        Blas<T>::Gemm(CblasNoTrans, CblasTrans, nq, nk, d_, scale_, qm.ptr, qm.ld, km.ptr, km.ld,
                      T(0), pm, nk);
        for (int64_t i = 0; i < nq; ++i) {
          T* row = pm + i * nk;
          const int64_t lim = KeyLimit(j0 + i, kb, nk);
          if (lse[i] == neg_inf) {
            // Only an unselected row holds -inf; it has no probabilities to differentiate.
            std::fill(row, row + nk, T(0));
            continue;
          }
          cpu::ExpShiftSum(row, lim, lse[i]);
          std::fill(row + lim, row + nk, T(0));
        }
        // dV += c P^T dO.
        GemmAccumulateRows<T>(CblasTrans, CblasNoTrans, nk, d_, nq, c, {pm, nk}, dom,
                              OutRow(dv_, b, kpos, h), row_stride, s.tmp.data());
        // dP = c dO V^T; dS = P (dP - Delta), in place.
        Blas<T>::Gemm(CblasNoTrans, CblasTrans, nq, nk, d_, c, dom.ptr, dom.ld, vm.ptr, vm.ld, T(0),
                      dp, nk);
        for (int64_t i = 0; i < nq; ++i) {
          const T* prow = pm + i * nk;
          T* drow = dp + i * nk;
          const T di = delta[i];
          for (int64_t x = 0; x < nk; ++x) drow[x] = prow[x] * (drow[x] - di);
        }
        // dQ += scale dS K; dK += scale dS^T Q.
        Blas<T>::Gemm(CblasNoTrans, CblasNoTrans, nq, d_, nk, scale_, dp, nk, km.ptr, km.ld, T(1),
                      dq_acc, d_);
        GemmAccumulateRows<T>(CblasTrans, CblasNoTrans, nk, d_, nq, scale_, {dp, nk}, qm,
                              OutRow(dk_, b, kpos, h), row_stride, s.tmp.data());
      }
      for (int64_t i = 0; i < nq; ++i) {
        T* dst = OutRow(dq_, b, base + (j0 + i) * p.step, h);
        const T* src = dq_acc + i * d_;
        for (int64_t x = 0; x < d_; ++x) dst[x] += src[x];
      }
    }
  }

  const AttentionSpec& spec_;
  const int64_t batch_, n_, heads_, d_;
  const T scale_;
  const int64_t tile_q_, tile_k_;
  const bool kernels_;  // fp32 forward products by cpu_attention_kernels.h instead of BLAS.
  std::vector<PatternGeo> patterns_;
  std::vector<Scratch<T>>& scratch_;  // One per pool thread; owned by the backend.

  View4<const T> q_, k_, v_, o_, do_;
  T* out_ = nullptr;
  T* lse_ = nullptr;
  T *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr;
};

class CpuBackend final : public AttentionBackend {
 public:
  explicit CpuBackend(int num_threads)
      : pool_(num_threads), scratch_f32_(num_threads), scratch_f64_(num_threads) {
    caps_.name = "cpu";
    caps_.device = Device::kCpu;
    caps_.dtypes = {DType::kFloat32, DType::kFloat64};
  }

  const BackendCaps& caps() const override { return caps_; }

  absl::Status Forward(const AttentionSpec& spec, const ForwardArgs& args) override {
    if (absl::Status s = ValidateForward(spec, args, caps_); !s.ok()) return s;
    if (absl::Status s = CheckBlasLimits(args.q); !s.ok()) return s;
    openblas_set_num_threads(1);
    if (args.q.dtype == DType::kFloat64) {
      Kernel<double>(spec, args.q, scratch_f64_).Forward(args, pool_);
    } else {
      Kernel<float>(spec, args.q, scratch_f32_).Forward(args, pool_);
    }
    return absl::OkStatus();
  }

  absl::Status Backward(const AttentionSpec& spec, const BackwardArgs& args) override {
    if (absl::Status s = ValidateBackward(spec, args, caps_); !s.ok()) return s;
    if (absl::Status s = CheckBlasLimits(args.q); !s.ok()) return s;
    openblas_set_num_threads(1);
    if (args.q.dtype == DType::kFloat64) {
      Kernel<double>(spec, args.q, scratch_f64_).Backward(args, pool_);
    } else {
      Kernel<float>(spec, args.q, scratch_f32_).Backward(args, pool_);
    }
    return absl::OkStatus();
  }

 private:
  // BLAS dimensions are int: D is one of them.
  static absl::Status CheckBlasLimits(const TensorView& q) {
    if (q.shape[3] > INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("head dim D = ", q.shape[3],
                                                     " exceeds the cpu backend's limit of ",
                                                     INT_MAX, " (BLAS dimensions are int)"));
    }
    return absl::OkStatus();
  }

  BackendCaps caps_;
  cpu::ThreadPool pool_;
  // Kept between calls so that repeated calls reuse warm pages.
  std::vector<Scratch<float>> scratch_f32_;
  std::vector<Scratch<double>> scratch_f64_;
};

}  // namespace

int64_t CpuTileScratchBytes(DType dtype, int64_t head_dim, bool backward) {
  const Tiles t = TilesFor(std::max<int64_t>(1, head_dim));
  if (dtype == DType::kFloat64) {
    return Scratch<double>::Elements(t, head_dim, backward) * static_cast<int64_t>(sizeof(double));
  }
  return Scratch<float>::Elements(t, head_dim, backward) * static_cast<int64_t>(sizeof(float));
}

std::unique_ptr<AttentionBackend> NewCpuBackend(const CpuBackendOptions& options) {
  int threads = options.num_threads;
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  return std::make_unique<CpuBackend>(std::max(1, threads));
}

}  // namespace dattn
