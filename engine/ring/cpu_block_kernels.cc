#include "engine/ring/cpu_block_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu_strided_blas.h"
#include "engine/cpu_thread_pool.h"

namespace dattn {
namespace ring {
namespace {

// Tiles (rows). Smaller than the single-device backend's: ring blocks are (N/P)/r rows per head.
constexpr int64_t kTileQ = 128;
constexpr int64_t kTileK = 128;
constexpr int64_t kMaxTileElements = int64_t{1} << 20;

using cpu::LogAddExp;
using cpu::Mat;
using cpu::View4;

template <typename T>
struct Scratch {
  std::vector<T> s, p2, acc, m, l, gq, gdo, gk, gv, tmp;
  void Size(int64_t tq, int64_t tk, int64_t d) {
    s.resize(tq * tk);
    p2.resize(tq * tk);
    acc.resize(tq * d);
    m.resize(tq);
    l.resize(tq);
    gq.resize(tq * d);
    gdo.resize(tq * d);
    gk.resize(tk * d);
    gv.resize(tk * d);
    tmp.resize(std::max(tq, tk) * d);
  }
};

// Where one (task, batch item, head) finds its rows.
struct PairGeo {
  int64_t q_local0 = 0;        // Shard-local position of the first query row.
  int64_t k_local0 = 0;        // Own K/V: shard-local position of the first key row.
  int64_t step = 1;            // Positions between consecutive rows (the rate r).
  RowRange qr, kr;             // Selected indices of the query and key rows.
  int64_t packed_row0 = 0;     // Packed K/V: row of the first key row within the K section.
  int64_t packed_section = 0;  // Packed: elements of the K section (the V section follows).
};

template <typename T>
class Kernel {
 public:
  Kernel(const RingGeometry& geo, std::vector<Scratch<T>>& scratch)
      : geo_(geo),
        batch_(geo.shape().batch),
        l_(geo.shard_len()),
        heads_(geo.shape().num_heads),
        d_(geo.shape().head_dim),
        scale_(static_cast<T>(geo.spec().ScaleFor(geo.shape().head_dim))),
        causal_(geo.spec().causal),
        tq_(std::max<int64_t>(1, std::min(kTileQ, kMaxTileElements / d_))),
        tk_(std::max<int64_t>(1, std::min(kTileK, kMaxTileElements / d_))),
        scratch_(scratch) {
    slot_of_.assign(geo.num_patterns(), std::vector<int>(heads_, -1));
    for (int i = 0; i < geo.num_patterns(); ++i) {
      const auto& heads = geo.pattern(i).heads;
      for (size_t s = 0; s < heads.size(); ++s) slot_of_[i][heads[s]] = static_cast<int>(s);
    }
    for (auto& s : scratch_) s.Size(tq_, tk_, d_);
  }

  void Forward(const ForwardArgs& args, absl::Span<const BlockTask> tasks, cpu::ThreadPool& pool) {
    q_ = View4<const T>(args.q);
    k_ = View4<const T>(args.k);
    v_ = View4<const T>(args.v);
    out_ = static_cast<T*>(args.out.data);
    lse_ = static_cast<T*>(args.lse.data);
    pool.ParallelFor(batch_ * heads_, [&](int64_t item, int t) {
      const int64_t b = item / heads_, h = item % heads_;
      for (const BlockTask& task : tasks) {
        const int slot = slot_of_[task.pattern][h];
        if (slot < 0) continue;
        for (int64_t m = task.segment_begin; m < task.segment_end; ++m) {
          PairGeo pg;
          if (!Locate(task, m, b, slot, &pg)) continue;
          ForwardPair(task, pg, b, h, scratch_[t]);
        }
      }
    });
  }

  void Backward(const BackwardArgs& args, absl::Span<const BlockTask> tasks,
                cpu::ThreadPool& pool) {
    q_ = View4<const T>(args.q);
    k_ = View4<const T>(args.k);
    v_ = View4<const T>(args.v);
    o_ = View4<const T>(args.out);
    do_ = View4<const T>(args.dout);
    lse_ = static_cast<T*>(args.lse.data);
    dq_ = static_cast<T*>(args.dq.data);
    dk_ = static_cast<T*>(args.dk.data);
    dv_ = static_cast<T*>(args.dv.data);
    for (const BlockTask& task : tasks) {
      if (task.dkv != nullptr && task.zero_dkv) {
        const int64_t n = geo_.BlockElements(task.pattern, task.segment_begin, task.origin);
        std::memset(task.dkv, 0, n * sizeof(T));
      }
    }
    pool.ParallelFor(batch_ * heads_, [&](int64_t item, int t) {
      const int64_t b = item / heads_, h = item % heads_;
      for (const BlockTask& task : tasks) {
        const int slot = slot_of_[task.pattern][h];
        if (slot < 0) continue;
        for (int64_t m = task.segment_begin; m < task.segment_end; ++m) {
          PairGeo pg;
          if (!Locate(task, m, b, slot, &pg)) continue;
          BackwardPair(task, pg, b, h, scratch_[t]);
        }
      }
    });
  }

 private:
  // False when the pair has no work (no query rows here, no key rows there, or causal with every
  // key after every query).
  bool Locate(const BlockTask& task, int64_t m, int64_t b, int slot, PairGeo* pg) const {
    const int self = geo_.rank();
    pg->qr = geo_.Rows(task.pattern, m, self, slot);
    pg->kr = geo_.Rows(task.pattern, m, task.origin, slot);
    if (pg->qr.count() == 0 || pg->kr.count() == 0) return false;
    if (causal_ && pg->kr.begin > pg->qr.end - 1) return false;
    const RingGeometry::Pattern& p = geo_.pattern(task.pattern);
    const int64_t base = geo_.Segment(task.pattern, m).begin + p.offsets[slot];
    pg->step = p.r;
    pg->q_local0 = base + pg->qr.begin * p.r - self * l_;
    pg->k_local0 = base + pg->kr.begin * p.r - self * l_;
    if (task.kv != nullptr || task.dkv != nullptr) {
      const int64_t rows = geo_.ChunkRows(task.pattern, m, task.origin);
      pg->packed_row0 = b * rows + geo_.SlotRowOffset(task.pattern, m, task.origin, slot);
      pg->packed_section = batch_ * rows * d_;
    }
    return true;
  }

  // Key rows [kb, kb + nk) of the pair (indices relative to kr.begin), K and V.
  void KeyRows(const BlockTask& task, const PairGeo& pg, int64_t b, int64_t h, int64_t kb,
               int64_t nk, Scratch<T>& s, Mat<T>* km, Mat<T>* vm) const {
    if (task.kv == nullptr) {
      const int64_t p0 = pg.k_local0 + kb * pg.step;
      *km = cpu::Rows(k_, b, h, p0, pg.step, nk, d_, s.gk.data());
      *vm = cpu::Rows(v_, b, h, p0, pg.step, nk, d_, s.gv.data());
      return;
    }
    const T* base = static_cast<const T*>(task.kv) + (pg.packed_row0 + kb) * d_;
    *km = {base, d_};
    *vm = {base + pg.packed_section, d_};
  }

  // Visible keys of query row jq (absolute index) in a key tile starting at absolute index kb.
  int64_t KeyLimit(int64_t jq, int64_t kb, int64_t nk) const {
    if (!causal_) return nk;
    return std::max<int64_t>(0, std::min(nk, jq - kb + 1));
  }

  T* OutRow(T* base, int64_t b, int64_t p, int64_t h) const {
    return base + ((b * l_ + p) * heads_ + h) * d_;
  }
  T& Lse(int64_t b, int64_t h, int64_t p) const { return lse_[(b * heads_ + h) * l_ + p]; }

  void ForwardPair(const BlockTask& task, const PairGeo& pg, int64_t b, int64_t h, Scratch<T>& s) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const int64_t nq_all = pg.qr.count();
    for (int64_t i0 = 0; i0 < nq_all; i0 += tq_) {
      const int64_t nq = std::min(tq_, nq_all - i0);
      const int64_t jq0 = pg.qr.begin + i0;  // Absolute index of the tile's first query.
      const Mat<T> qm =
          cpu::Rows(q_, b, h, pg.q_local0 + i0 * pg.step, pg.step, nq, d_, s.gq.data());
      T* acc = s.acc.data();
      T* mx = s.m.data();
      T* l = s.l.data();
      std::fill(acc, acc + nq * d_, T(0));
      std::fill(mx, mx + nq, neg_inf);
      std::fill(l, l + nq, T(0));
      // Keys past the tile's last query are invisible when causal.
      const int64_t kend_abs = causal_ ? std::min(pg.kr.end, jq0 + nq) : pg.kr.end;
      for (int64_t kb_abs = pg.kr.begin; kb_abs < kend_abs; kb_abs += tk_) {
        const int64_t nk = std::min(tk_, kend_abs - kb_abs);
        Mat<T> km, vm;
        KeyRows(task, pg, b, h, kb_abs - pg.kr.begin, nk, s, &km, &vm);
        T* sc = s.s.data();
        cpu::Blas<T>::Gemm(CblasNoTrans, CblasTrans, nq, nk, d_, scale_, qm.ptr, qm.ld, km.ptr,
                           km.ld, T(0), sc, nk);
        for (int64_t i = 0; i < nq; ++i) {
          T* row = sc + i * nk;
          const int64_t lim = KeyLimit(jq0 + i, kb_abs, nk);
          T row_max = mx[i];
          // std::max drops a NaN argument; a NaN score must reach the row instead.
          for (int64_t x = 0; x < lim; ++x) {
            row_max = std::isnan(row[x]) ? row[x] : std::max(row_max, row[x]);
          }
          if (row_max == neg_inf) {
            std::fill(row, row + nk, T(0));
            continue;
          }
          T sum = 0;
          for (int64_t x = 0; x < lim; ++x) {
            row[x] = std::exp(row[x] - row_max);
            sum += row[x];
          }
          std::fill(row + lim, row + nk, T(0));
          const T alpha = std::exp(mx[i] - row_max);
          l[i] = l[i] * alpha + sum;
          mx[i] = row_max;
          if (alpha != T(1)) {
            T* a = acc + i * d_;
            for (int64_t x = 0; x < d_; ++x) a[x] *= alpha;
          }
        }
        cpu::Blas<T>::Gemm(CblasNoTrans, CblasNoTrans, nq, d_, nk, T(1), sc, nk, vm.ptr, vm.ld,
                           T(1), acc, d_);
      }
      // Merge the tile's rows into out/lse.
      for (int64_t i = 0; i < nq; ++i) {
        if (l[i] == T(0)) continue;  // No visible key: contributes nothing (NaN sums merge).
        const int64_t p = pg.q_local0 + (i0 + i) * pg.step;
        T* dst = OutRow(out_, b, p, h);
        T& lse = Lse(b, h, p);
        const double blk = static_cast<double>(mx[i]) + std::log(static_cast<double>(l[i]));
        const double old = static_cast<double>(lse);
        const double merged = LogAddExp(old, blk);
        const T keep = static_cast<T>(std::exp(old - merged));
        const T add = static_cast<T>(std::exp(static_cast<double>(mx[i]) - merged));
        const T* a = acc + i * d_;
        for (int64_t x = 0; x < d_; ++x) dst[x] = dst[x] * keep + a[x] * add;
        lse = static_cast<T>(merged);
      }
    }
  }

  void BackwardPair(const BlockTask& task, const PairGeo& pg, int64_t b, int64_t h, Scratch<T>& s) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const T c = static_cast<T>(geo_.pattern(task.pattern).factor);
    // Where dK/dV rows of this pair accumulate.
    T* dk0;
    T* dv0;
    int64_t dld;
    if (task.dkv == nullptr) {
      dk0 = OutRow(dk_, b, pg.k_local0, h);
      dv0 = OutRow(dv_, b, pg.k_local0, h);
      dld = pg.step * heads_ * d_;
    } else {
      dk0 = static_cast<T*>(task.dkv) + pg.packed_row0 * d_;
      dv0 = dk0 + pg.packed_section;
      dld = d_;
    }
    const int64_t nq_all = pg.qr.count();
    for (int64_t i0 = 0; i0 < nq_all; i0 += tq_) {
      const int64_t nq = std::min(tq_, nq_all - i0);
      const int64_t jq0 = pg.qr.begin + i0;
      const int64_t p0 = pg.q_local0 + i0 * pg.step;
      const Mat<T> qm = cpu::Rows(q_, b, h, p0, pg.step, nq, d_, s.gq.data());
      const Mat<T> dom = cpu::Rows(do_, b, h, p0, pg.step, nq, d_, s.gdo.data());
      T* lse = s.m.data();
      T* delta = s.l.data();
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t p = p0 + i * pg.step;
        lse[i] = Lse(b, h, p);
        const T* orow = o_.At(b, p, h);
        const T* drow = do_.At(b, p, h);
        T dot = 0;
        for (int64_t x = 0; x < d_; ++x) dot += orow[x * o_.sd] * drow[x * do_.sd];
        delta[i] = dot;
      }
      T* dq_acc = s.acc.data();
      std::fill(dq_acc, dq_acc + nq * d_, T(0));
      const int64_t kend_abs = causal_ ? std::min(pg.kr.end, jq0 + nq) : pg.kr.end;
      for (int64_t kb_abs = pg.kr.begin; kb_abs < kend_abs; kb_abs += tk_) {
        const int64_t nk = std::min(tk_, kend_abs - kb_abs);
        const int64_t kb = kb_abs - pg.kr.begin;
        Mat<T> km, vm;
        KeyRows(task, pg, b, h, kb, nk, s, &km, &vm);
        T* pm = s.s.data();
        T* dp = s.p2.data();
        cpu::Blas<T>::Gemm(CblasNoTrans, CblasTrans, nq, nk, d_, scale_, qm.ptr, qm.ld, km.ptr,
                           km.ld, T(0), pm, nk);
        for (int64_t i = 0; i < nq; ++i) {
          T* row = pm + i * nk;
          const int64_t lim = KeyLimit(jq0 + i, kb_abs, nk);
          if (lse[i] == neg_inf) {
            std::fill(row, row + nk, T(0));
            continue;
          }
          for (int64_t x = 0; x < lim; ++x) row[x] = std::exp(row[x] - lse[i]);
          std::fill(row + lim, row + nk, T(0));
        }
        // dV += c P^T dO.
        cpu::GemmAccumulateRows<T>(CblasTrans, CblasNoTrans, nk, d_, nq, c, {pm, nk}, dom,
                                   dv0 + kb * dld, dld, s.tmp.data());
        // dP = c dO V^T; dS = P (dP - Delta), in place.
        cpu::Blas<T>::Gemm(CblasNoTrans, CblasTrans, nq, nk, d_, c, dom.ptr, dom.ld, vm.ptr, vm.ld,
                           T(0), dp, nk);
        for (int64_t i = 0; i < nq; ++i) {
          const T* prow = pm + i * nk;
          T* drow = dp + i * nk;
          for (int64_t x = 0; x < nk; ++x) drow[x] = prow[x] * (drow[x] - delta[i]);
        }
        // dQ += scale dS K; dK += scale dS^T Q.
        cpu::Blas<T>::Gemm(CblasNoTrans, CblasNoTrans, nq, d_, nk, scale_, dp, nk, km.ptr, km.ld,
                           T(1), dq_acc, d_);
        cpu::GemmAccumulateRows<T>(CblasTrans, CblasNoTrans, nk, d_, nq, scale_, {dp, nk}, qm,
                                   dk0 + kb * dld, dld, s.tmp.data());
      }
      for (int64_t i = 0; i < nq; ++i) {
        T* dst = OutRow(dq_, b, p0 + i * pg.step, h);
        const T* src = dq_acc + i * d_;
        for (int64_t x = 0; x < d_; ++x) dst[x] += src[x];
      }
    }
  }

  const RingGeometry& geo_;
  const int64_t batch_, l_, heads_, d_;
  const T scale_;
  const bool causal_;
  const int64_t tq_, tk_;
  std::vector<Scratch<T>>& scratch_;
  std::vector<std::vector<int>> slot_of_;  // [pattern][head] -> slot, -1 if unused.

  View4<const T> q_, k_, v_, o_, do_;
  T* out_ = nullptr;
  T* lse_ = nullptr;
  T *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr;
};

class CpuBlockKernels final : public BlockKernels {
 public:
  explicit CpuBlockKernels(int threads) : pool_(threads), f32_(threads), f64_(threads) {
    caps_.name = "cpu";
    caps_.device = Device::kCpu;
    caps_.dtypes = {DType::kFloat32, DType::kFloat64};
  }

  const BackendCaps& caps() const override { return caps_; }
  comm::Stream stream() const override { return comm::Stream{}; }

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    void* p = std::malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of host memory for ring buffers"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }

  absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) override {
    std::memcpy(device_dst, host_src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) override {
    std::memcpy(host_dst, device_src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status PackKv(const RingGeometry& geo, int pattern, int64_t segment, const TensorView& k,
                      const TensorView& v, void* dst) override {
    if (geo.dtype() == DType::kFloat64) return Pack<double>(geo, pattern, segment, k, v, dst);
    return Pack<float>(geo, pattern, segment, k, v, dst);
  }

  absl::Status BeginForward(const RingGeometry& geo, const ForwardArgs& args) override {
    const int64_t n = args.out.NumElements(), nl = args.lse.NumElements();
    if (geo.dtype() == DType::kFloat64) {
      Fill(static_cast<double*>(args.out.data), n, 0.0);
      Fill(static_cast<double*>(args.lse.data), nl, -std::numeric_limits<double>::infinity());
    } else {
      Fill(static_cast<float*>(args.out.data), n, 0.0f);
      Fill(static_cast<float*>(args.lse.data), nl, -std::numeric_limits<float>::infinity());
    }
    return absl::OkStatus();
  }

  absl::Status Forward(const RingGeometry& geo, const ForwardArgs& args,
                       absl::Span<const BlockTask> tasks) override {
    openblas_set_num_threads(1);
    if (geo.dtype() == DType::kFloat64) {
      Kernel<double>(geo, f64_).Forward(args, tasks, pool_);
    } else {
      Kernel<float>(geo, f32_).Forward(args, tasks, pool_);
    }
    return absl::OkStatus();
  }

  absl::Status EndForward(const RingGeometry& geo, const ForwardArgs& args) override {
    if (geo.spec().mode != AttentionMode::kGrouped) return absl::OkStatus();
    const double f = 1.0 / geo.num_patterns();
    const int64_t n = args.out.NumElements();
    if (geo.dtype() == DType::kFloat64) {
      double* o = static_cast<double*>(args.out.data);
      for (int64_t i = 0; i < n; ++i) o[i] *= f;
    } else {
      float* o = static_cast<float*>(args.out.data);
      for (int64_t i = 0; i < n; ++i) o[i] *= static_cast<float>(f);
    }
    return absl::OkStatus();
  }

  absl::Status BeginBackward(const RingGeometry& geo, const BackwardArgs& args) override {
    const size_t bytes = args.dq.NumElements() * DTypeSize(geo.dtype());
    std::memset(args.dq.data, 0, bytes);
    std::memset(args.dk.data, 0, bytes);
    std::memset(args.dv.data, 0, bytes);
    return absl::OkStatus();
  }

  absl::Status Backward(const RingGeometry& geo, const BackwardArgs& args,
                        absl::Span<const BlockTask> tasks) override {
    openblas_set_num_threads(1);
    if (geo.dtype() == DType::kFloat64) {
      Kernel<double>(geo, f64_).Backward(args, tasks, pool_);
    } else {
      Kernel<float>(geo, f32_).Backward(args, tasks, pool_);
    }
    return absl::OkStatus();
  }

  absl::Status AddPacked(void* dst, const void* src, int64_t elements,
                         const RingGeometry& geo) override {
    if (geo.dkv_dtype() == DType::kFloat64) {
      AddN(static_cast<double*>(dst), static_cast<const double*>(src), elements);
    } else {
      AddN(static_cast<float*>(dst), static_cast<const float*>(src), elements);
    }
    return absl::OkStatus();
  }

  absl::Status AddPackedToOwn(const RingGeometry& geo, int pattern, int64_t segment,
                              const void* src, const BackwardArgs& args) override {
    if (geo.dtype() == DType::kFloat64) {
      Unpack<double>(geo, pattern, segment, src, args.dk, args.dv);
    } else {
      Unpack<float>(geo, pattern, segment, src, args.dk, args.dv);
    }
    return absl::OkStatus();
  }

 private:
  template <typename T>
  static void Fill(T* p, int64_t n, T value) {
    std::fill(p, p + n, value);
  }

  template <typename T>
  static void AddN(T* dst, const T* src, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  // Calls fn(b, slot, first local position, rate, rows, packed element offset) for every (batch
  // item, slot) of the rank's own chunk of (pattern, segment); K section offsets (V adds
  // `section`).
  template <typename Fn>
  static void ForEachOwnRun(const RingGeometry& geo, int pattern, int64_t segment, Fn fn) {
    const int self = geo.rank();
    const RingGeometry::Pattern& p = geo.pattern(pattern);
    const int64_t rows = geo.ChunkRows(pattern, segment, self);
    const int64_t d = geo.shape().head_dim;
    const int64_t base = geo.Segment(pattern, segment).begin;
    for (int64_t b = 0; b < geo.shape().batch; ++b) {
      int64_t row = b * rows;
      for (size_t s = 0; s < p.heads.size(); ++s) {
        const RowRange rr = geo.Rows(pattern, segment, self, static_cast<int>(s));
        const int64_t p0 = base + p.offsets[s] + rr.begin * p.r - self * geo.shard_len();
        fn(b, p.heads[s], p0, p.r, rr.count(), row * d);
        row += rr.count();
      }
    }
  }

  template <typename T>
  absl::Status Pack(const RingGeometry& geo, int pattern, int64_t segment, const TensorView& k,
                    const TensorView& v, void* dst) {
    const View4<const T> kv(k), vv(v);
    T* out = static_cast<T*>(dst);
    const int64_t d = geo.shape().head_dim;
    const int64_t section = geo.BlockElements(pattern, segment, geo.rank()) / 2;
    ForEachOwnRun(geo, pattern, segment,
                  [&](int64_t b, int64_t h, int64_t p0, int64_t r, int64_t n, int64_t off) {
                    for (int64_t i = 0; i < n; ++i) {
                      const T* ks = kv.At(b, p0 + i * r, h);
                      const T* vs = vv.At(b, p0 + i * r, h);
                      T* kd = out + off + i * d;
                      T* vd = kd + section;
                      for (int64_t x = 0; x < d; ++x) {
                        kd[x] = ks[x * kv.sd];
                        vd[x] = vs[x * vv.sd];
                      }
                    }
                  });
    return absl::OkStatus();
  }

  template <typename T>
  void Unpack(const RingGeometry& geo, int pattern, int64_t segment, const void* src,
              const TensorView& dk, const TensorView& dv) {
    const View4<T> dkv(dk), dvv(dv);
    const T* in = static_cast<const T*>(src);
    const int64_t d = geo.shape().head_dim;
    const int64_t section = geo.BlockElements(pattern, segment, geo.rank()) / 2;
    ForEachOwnRun(geo, pattern, segment,
                  [&](int64_t b, int64_t h, int64_t p0, int64_t r, int64_t n, int64_t off) {
                    for (int64_t i = 0; i < n; ++i) {
                      T* kd = dkv.At(b, p0 + i * r, h);
                      T* vd = dvv.At(b, p0 + i * r, h);
                      const T* ks = in + off + i * d;
                      const T* vs = ks + section;
                      for (int64_t x = 0; x < d; ++x) {
                        kd[x] += ks[x];
                        vd[x] += vs[x];
                      }
                    }
                  });
  }

  BackendCaps caps_;
  cpu::ThreadPool pool_;  // the (batch, head) pairs of a call; per-thread scratch below
  std::vector<Scratch<float>> f32_;
  std::vector<Scratch<double>> f64_;
};

}  // namespace

std::unique_ptr<BlockKernels> NewCpuBlockKernels(const CpuBlockKernelOptions& options) {
  int threads = options.num_threads;
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  return std::make_unique<CpuBlockKernels>(std::max(1, threads));
}

}  // namespace ring
}  // namespace dattn
