#include "engine/ring/cuda_block_kernels.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/attention_kernels.h"
#include "engine/cuda/block_calls.h"
#include "engine/cuda/call_views.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/cudnn_sdpa.h"
#include "engine/cuda/device_scope.h"
#include "engine/cuda/dilated_kernels.h"
#include "engine/cuda/hopper_attention.h"
#include "engine/cuda/hopper_backward.h"
#include "engine/cuda/stream_scratch.h"
#include "engine/ring/cuda_block_kernels_launch.h"

namespace dattn {
namespace ring {
namespace {

using cuda::BlockCall;
using cuda::CallRole;
using cuda::CallRowsOf;
using cuda::CallScratch;
using cuda::CudnnReadable;
using cuda::DeviceScope;
using cuda::ElemType;
using cuda::ElemTypeOf;
using cuda::IsHalfType;
using cuda::KernelTensor;
using cuda::PackedTensor;
using cuda::StridesOf;
using cuda::ViewTensor;
using cudak::RowMap;
using cudak::StatsMap;

constexpr int64_t kMaxSpanElements = (int64_t{1} << 31) - 1;
// The modeled cuDNN plan workspace per call (engine/cuda/block_calls.h), for chunking.
constexpr int64_t kAlign = 256;

// Elements between the first and the last element a [count, heads, rows, D] view touches, + 1.
int64_t Span(const KernelTensor& t, int64_t count, int64_t heads, int64_t rows, int64_t dim) {
  return (count - 1) * t.fold + (heads - 1) * t.head + (rows - 1) * t.seq + (dim - 1) * t.chan + 1;
}

// A view with its base moved by `elements` of `esize` bytes.
KernelTensor Shifted(KernelTensor t, int64_t elements, int64_t esize) {
  t.ptr = static_cast<char*>(t.ptr) + elements * esize;
  return t;
}

// The rows of one (batch item, head) of a tensor: element offset of row i of head k of batch b is
// base + b * sb + k * sk + i * si.
RowMap TensorRows(const TensorView& t, int64_t p0, int64_t head0, int64_t head_step, int64_t rate) {
  RowMap m;
  m.base = p0 * t.strides[1] + head0 * t.strides[2];
  m.sb = t.strides[0];
  m.sk = head_step * t.strides[2];
  m.si = rate * t.strides[1];
  m.sc = t.strides[3];
  return m;
}

RowMap PackedRows(int64_t base, int64_t heads, int64_t rows, int64_t dim) {
  RowMap m;
  m.base = base;
  m.sb = heads * rows * dim;
  m.sk = rows * dim;
  m.si = dim;
  m.sc = 1;
  return m;
}

// Whether the ranks that hold rows of segment m are several (so its rows accumulate).
bool Shared(const RingGeometry& geo, int pattern, int64_t m) {
  return !geo.InsideOneShard(pattern, m) && geo.Members(pattern, m).size() > 1;
}

// Slots of a pattern that one call can take together: grouped mode, all of them (one offset,
// consecutive heads); mixture mode, one slot at a time.
struct SlotGroup {
  int slot0 = 0;
  int slots = 1;
  int64_t head0 = 0;
};
std::vector<SlotGroup> SlotGroups(const RingGeometry& geo, int pattern) {
  const RingGeometry::Pattern& p = geo.pattern(pattern);
  std::vector<SlotGroup> groups;
  const int n = static_cast<int>(p.heads.size());
  bool together = geo.spec().mode == AttentionMode::kGrouped && n > 0;
  for (int s = 1; together && s < n; ++s) {
    together = p.heads[s] == p.heads[0] + s && p.offsets[s] == p.offsets[0];
  }
  if (together) {
    groups.push_back({0, n, p.heads[0]});
  } else {
    for (int s = 0; s < n; ++s) groups.push_back({s, 1, p.heads[s]});
  }
  return groups;
}

using Scratch = cuda::StreamScratch;

// The fields our kernels' forward and backward arguments share, for call c over the views q, k,
// v, o of this rank's shards.
template <typename KernelArgs>
void SetCallFields(const RingGeometry& geo, const BlockCall& c, const KernelTensor& q,
                   const KernelTensor& k, const KernelTensor& v, const KernelTensor& o, float scale,
                   KernelArgs* a) {
  a->type = ElemTypeOf(geo.dtype());
  a->q = q;
  a->k = k;
  a->v = v;
  a->o = o;
  a->count = c.count;
  a->heads = c.group.heads;
  a->rows = c.rows;
  a->head_dim = geo.shape().head_dim;
  a->scale = scale;
  a->causal = geo.spec().causal;
}

class CudaBlockKernelsImpl final : public CudaBlockKernels {
 public:
  CudaBlockKernelsImpl(const CudaBlockKernelOptions& options, cudaStream_t stream, bool owns_stream,
                       cudaMemPool_t pool, cudaEvent_t event, std::unique_ptr<cuda::CudnnSdpa> sdpa,
                       unsigned* item_counter)
      : options_(options),
        caps_(CudaBackendCaps()),
        stream_(stream),
        owns_stream_(owns_stream),
        pool_(pool),
        event_(event),
        sdpa_(std::move(sdpa)),
        item_counter_(item_counter) {}

  ~CudaBlockKernelsImpl() override {
    DeviceScope scope;
    (void)scope.Enter(options_.device);
    // Bounded: a stream stuck behind a dead peer must not hang the destructor (the communicator's
    // abort releases it; the pool is then destroyed once its memory comes back).
    (void)WaitStream("destroying the ring kernels");
    sdpa_.reset();
    cudaMemPoolDestroy(pool_);
    cudaFree(item_counter_);
    cudaEventDestroy(event_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }

  const BackendCaps& caps() const override { return caps_; }
  comm::Stream stream() const override { return comm::Stream{stream_}; }
  cudaStream_t cuda_stream() const override { return stream_; }
  std::string last_fallback_reason() const override { return last_fallback_; }

  CudaBlockKernelStats stats() const override {
    CudaBlockKernelStats s = stats_;
    uint64_t high = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high) == cudaSuccess) {
      s.pool_high_water = static_cast<int64_t>(high);
    }
    return s;
  }

  absl::Status TrimPool() override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    DATTN_RETURN_IF_ERROR(WaitStream("trimming the pool"));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemPoolTrimTo(pool_, 0));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(
        &p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), pool_, stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("ring: cannot allocate ", bytes, " bytes on cuda:", options_.device,
                       " for ring buffers: ", cudaGetErrorString(e)));
    }
    return p;
  }

  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    DeviceScope scope;
    (void)scope.Enter(options_.device);
    cudaFreeAsync(ptr, stream_);
  }

  absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    // A copy from pageable memory may wait for the stream inside CUDA: wait here, with a deadline.
    DATTN_RETURN_IF_ERROR(WaitStream("uploading"));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, host_src, static_cast<size_t>(bytes),
                                               cudaMemcpyHostToDevice, stream_));
    return absl::OkStatus();
  }

  absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    DATTN_RETURN_IF_ERROR(WaitStream("downloading"));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, static_cast<size_t>(bytes),
                                               cudaMemcpyDeviceToHost, stream_));
    return WaitStream("downloading");
  }

  absl::Status PackKv(const RingGeometry& geo, int pattern, int64_t segment, const TensorView& k,
                      const TensorView& v, void* dst) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    return PackOwn(geo, pattern, segment, k, v, dst);
  }

  absl::Status BeginForward(const RingGeometry& geo, const ForwardArgs& args) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    const ElemType et = ElemTypeOf(geo.dtype());
    float* lse = static_cast<float*>(args.lse.data);
    cudak::FillParams params;
    const bool selective = FillParamsOf(geo, &params);
    // Patterns whose rows on this rank all come from local calls get their 1/G per call (in our
    // kernel's epilogue, or a pass over the call's rows); EndForward skips them. Only with the
    // per-pattern EndForward (selective), whose head ranges can leave a pattern out.
    scaled_in_call_.assign(geo.num_patterns(), false);
    if (selective && options_.own_hopper_forward && item_counter_ != nullptr &&
        IsHalfType(geo.dtype()) && geo.num_patterns() > 1) {
      for (int i = 0; i < geo.num_patterns(); ++i) {
        const int64_t first = geo.FirstSegmentOf(i, geo.rank()),
                      last = geo.LastSegmentOf(i, geo.rank());
        scaled_in_call_[i] = !geo.pattern(i).heads.empty() && first <= last &&
                             !Shared(geo, i, first) && !Shared(geo, i, last);
      }
    }
    if (selective) {
      DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchInitRows(args.out.data, et, lse, params, stream_));
      return absl::OkStatus();
    }
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        args.out.data, 0, args.out.NumElements() * DTypeSize(geo.dtype()), stream_));
    DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchFillF32(
        lse, args.lse.NumElements(), -std::numeric_limits<float>::infinity(), stream_));
    return absl::OkStatus();
  }

  absl::Status Forward(const RingGeometry& geo, const ForwardArgs& args,
                       absl::Span<const BlockTask> tasks) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    for (const BlockTask& task : tasks) DATTN_RETURN_IF_ERROR(RunTask(geo, &args, nullptr, task));
    return absl::OkStatus();
  }

  absl::Status EndForward(const RingGeometry& geo, const ForwardArgs& args) override {
    if (geo.spec().mode != AttentionMode::kGrouped || geo.num_patterns() == 1) {
      return absl::OkStatus();
    }
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    const ElemType et = ElemTypeOf(geo.dtype());
    const float scale = 1.0f / static_cast<float>(geo.num_patterns());
    cudak::FillParams params;
    if (FillParamsOf(geo, &params)) {
      bool any = false;
      for (int i = 0; i < geo.num_patterns(); ++i) {
        if (ScaledInCall(i)) {
          params.p[i].head_begin = params.p[i].head_end = 0;  // scaled by its calls already
        } else {
          any = any || params.p[i].head_end > params.p[i].head_begin;
        }
      }
      if (any) {
        DATTN_CUDA_RETURN_IF_ERROR(
            cudak::LaunchScaleSelected(args.out.data, et, params, scale, stream_));
      }
      return absl::OkStatus();
    }
    // Unselected rows are zero: scaling every row is the same.
    RowMap all =
        PackedRows(0, 1, args.out.NumElements() / geo.shape().head_dim, geo.shape().head_dim);
    DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchCopyRows(args.out.data, et, all, args.out.data, et, all,
                                                     1, 1,
                                                     args.out.NumElements() / geo.shape().head_dim,
                                                     geo.shape().head_dim, scale, false, stream_));
    return absl::OkStatus();
  }

  absl::Status BeginBackward(const RingGeometry& geo, const BackwardArgs& args) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    const ElemType et = ElemTypeOf(geo.dtype());
    cudak::FillParams params;
    const bool selective = FillParamsOf(geo, &params);
    for (const TensorView* g : {&args.dq, &args.dk, &args.dv}) {
      if (selective) {
        DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchInitRows(g->data, et, nullptr, params, stream_));
      } else {
        DATTN_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(g->data, 0, g->NumElements() * DTypeSize(geo.dtype()), stream_));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Backward(const RingGeometry& geo, const BackwardArgs& args,
                        absl::Span<const BlockTask> tasks) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    for (const BlockTask& task : tasks) {
      if (task.dkv != nullptr && task.zero_dkv) {
        const int64_t n = geo.BlockElements(task.pattern, task.segment_begin, task.origin);
        DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(task.dkv, 0, n * sizeof(float), stream_));
      }
    }
    for (const BlockTask& task : tasks) DATTN_RETURN_IF_ERROR(RunTask(geo, nullptr, &args, task));
    return absl::OkStatus();
  }

  absl::Status AddPacked(void* dst, const void* src, int64_t elements,
                         const RingGeometry& geo) override {
    (void)geo;
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchAddF32(
        static_cast<float*>(dst), static_cast<const float*>(src), elements, stream_));
    return absl::OkStatus();
  }

  absl::Status AddPackedToOwn(const RingGeometry& geo, int pattern, int64_t segment,
                              const void* src, const BackwardArgs& args) override {
    DeviceScope scope;
    DATTN_RETURN_IF_ERROR(scope.Enter(options_.device));
    const ElemType et = ElemTypeOf(geo.dtype());
    return ForOwnChunkRows(
        geo, pattern, segment,
        [&](int part, const RowMap& packed, int64_t p0, int64_t head, int64_t rows) {
          const TensorView& dst = part == 0 ? args.dk : args.dv;
          return cudak::LaunchCopyRows(src, ElemType::kF32, packed, dst.data, et,
                                       TensorRows(dst, p0, head, 0, geo.pattern(pattern).r),
                                       geo.shape().batch, 1, rows, geo.shape().head_dim, 1.0f, true,
                                       stream_);
        });
  }

 private:
  // Shard-local position of selected row j of `slot` in segment m.
  static int64_t RowPosition(const RingGeometry& geo, int pattern, int64_t m, int slot, int64_t j) {
    const RingGeometry::Pattern& p = geo.pattern(pattern);
    return geo.Segment(pattern, m).begin + p.offsets[slot] + j * p.r -
           static_cast<int64_t>(geo.rank()) * geo.shard_len();
  }

  // Waits for the work queued so far, at most sync_timeout, polling an event.
  absl::Status WaitStream(const char* what) {
    DATTN_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream_));
    const absl::Time deadline = absl::Now() + options_.sync_timeout;
    for (;;) {
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        return cuda::CudaErrorStatus(q, "cudaEventQuery", __FILE__, __LINE__);
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "ring kernels on cuda:", options_.device, ": ", what,
            ": the stream did not drain within ", absl::FormatDuration(options_.sync_timeout),
            " (is a peer of the ring dead or stuck?)"));
      }
      absl::SleepFor(absl::Microseconds(10));
    }
  }

  // Whether pattern i's rows on this rank get grouped mode's 1/G in their local calls (set by
  // BeginForward for the forward under way).
  bool ScaledInCall(int pattern) const {
    return pattern < static_cast<int>(scaled_in_call_.size()) && scaled_in_call_[pattern];
  }

  // Grouped mode's selective fills need every value in 32 bits and few patterns.
  bool FillParamsOf(const RingGeometry& geo, cudak::FillParams* out) const {
    if (geo.spec().mode != AttentionMode::kGrouped) return false;
    const RingShape& s = geo.shape();
    const int64_t limit = std::numeric_limits<int32_t>::max();
    if (geo.num_patterns() > cudak::kMaxFillPatterns || s.seq_len > limit ||
        s.batch * geo.shard_len() * s.num_heads > limit || s.head_dim > limit) {
      return false;
    }
    cudak::FillParams f;
    f.batch = static_cast<int32_t>(s.batch);
    f.shard_len = static_cast<int32_t>(geo.shard_len());
    f.heads = static_cast<int32_t>(s.num_heads);
    f.dim = static_cast<int32_t>(s.head_dim);
    f.shard_begin = static_cast<uint32_t>(geo.rank() * geo.shard_len());
    f.patterns = geo.num_patterns();
    const int self = geo.rank();
    for (int i = 0; i < geo.num_patterns(); ++i) {
      const RingGeometry::Pattern& p = geo.pattern(i);
      cudak::FillPattern& fp = f.p[i];
      if (p.heads.empty()) {
        fp.head_begin = fp.head_end = 0;
        continue;
      }
      for (size_t k = 0; k < p.heads.size(); ++k) {
        if (p.heads[k] != p.heads[0] + static_cast<int64_t>(k) || p.offsets[k] != p.offsets[0]) {
          return false;
        }
      }
      fp.head_begin = static_cast<int32_t>(p.heads.front());
      fp.head_end = static_cast<int32_t>(p.heads.back() + 1);
      fp.w = static_cast<uint32_t>(p.w);
      fp.r = static_cast<uint32_t>(std::min<int64_t>(p.r, s.seq_len));
      fp.o = static_cast<uint32_t>(std::min<int64_t>(p.offsets[0], s.seq_len));
      const int64_t first = geo.FirstSegmentOf(i, self), last = geo.LastSegmentOf(i, self);
      int n = 0;
      for (int64_t m : {first, last}) {
        if (m > last || (n == 1 && m == first)) continue;
        if (!Shared(geo, i, m)) continue;
        const PositionRange c = geo.Chunk(i, m, self);
        fp.chunk_begin[n] = static_cast<int32_t>(c.begin - self * geo.shard_len());
        fp.chunk_end[n] = static_cast<int32_t>(c.end - self * geo.shard_len());
        ++n;
      }
    }
    *out = f;
    return true;
  }

  absl::Status PackOwn(const RingGeometry& geo, int pattern, int64_t segment, const TensorView& k,
                       const TensorView& v, void* dst) {
    const ElemType et = ElemTypeOf(geo.dtype());
    return ForOwnChunkRows(
        geo, pattern, segment,
        [&](int part, const RowMap& packed, int64_t p0, int64_t head, int64_t rows) {
          const TensorView& src = part == 0 ? k : v;
          return cudak::LaunchCopyRows(
              src.data, et, TensorRows(src, p0, head, 0, geo.pattern(pattern).r), dst, et, packed,
              geo.shape().batch, 1, rows, geo.shape().head_dim, 1.0f, false, stream_);
        });
  }

  // This rank's chunk of (pattern, segment) in the packed K/V layout a peer receives: for each
  // head slot with rows and each part (0: K or dK, 1: V or dV), calls
  // copy(part, packed rows, first position, head, row count), which returns a cudaError_t.
  template <typename Copy>
  absl::Status ForOwnChunkRows(const RingGeometry& geo, int pattern, int64_t segment, Copy copy) {
    const int self = geo.rank();
    const RingGeometry::Pattern& p = geo.pattern(pattern);
    const int64_t d = geo.shape().head_dim;
    const int64_t chunk_rows = geo.ChunkRows(pattern, segment, self);
    const int64_t section = geo.shape().batch * chunk_rows * d;
    for (size_t s = 0; s < p.heads.size(); ++s) {
      const RowRange rr = geo.Rows(pattern, segment, self, static_cast<int>(s));
      if (rr.count() == 0) continue;
      const int64_t p0 = RowPosition(geo, pattern, segment, static_cast<int>(s), rr.begin);
      RowMap packed;
      packed.base = geo.SlotRowOffset(pattern, segment, self, static_cast<int>(s)) * d;
      packed.sb = chunk_rows * d;
      packed.si = d;
      for (int part = 0; part < 2; ++part) {
        RowMap map = packed;
        map.base += part * section;
        DATTN_CUDA_RETURN_IF_ERROR(copy(part, map, p0, p.heads[s], rr.count()));
      }
    }
    return absl::OkStatus();
  }

  void NoteFallback(const absl::Status& why) {
    ++stats_.cudnn_fallbacks;
    last_fallback_ = std::string(why.message());
  }

  // One task: its local segments as batched strided calls, its shared segments one by one.
  absl::Status RunTask(const RingGeometry& geo, const ForwardArgs* fwd, const BackwardArgs* bwd,
                       const BlockTask& task) {
    const bool causal = geo.spec().causal;
    const int self = geo.rank();
    if (causal && task.origin > self) return absl::OkStatus();  // every key after every query
    const bool own = task.kv == nullptr;
    std::vector<int64_t> local;  // local segments of an own task, in order
    for (int64_t m = task.segment_begin; m < task.segment_end; ++m) {
      if (own && !Shared(geo, task.pattern, m)) {
        local.push_back(m);
        continue;
      }
      DATTN_RETURN_IF_ERROR(RunShared(geo, fwd, bwd, task, m, /*direct=*/false));
    }
    if (!local.empty()) DATTN_RETURN_IF_ERROR(RunLocal(geo, fwd, bwd, task.pattern, local));
    return absl::OkStatus();
  }

  // ---- Local segments: strided views, as the single-GPU backend computes them.

  absl::Status RunLocal(const RingGeometry& geo, const ForwardArgs* fwd, const BackwardArgs* bwd,
                        int pattern, const std::vector<int64_t>& segments) {
    const RingGeometry::Pattern& p = geo.pattern(pattern);
    const RingShape& s = geo.shape();
    const int64_t l = geo.shard_len();
    const int self = geo.rank();
    const AttentionSpec& spec = geo.spec();
    // Which slot each head group's first head has (the group's rows are that slot's rows).
    auto slot_of = [&](int64_t head) {
      for (size_t k = 0; k < p.heads.size(); ++k) {
        if (p.heads[k] == head) return static_cast<int>(k);
      }
      return -1;
    };
    for (const cuda::HeadGroup& hg : cuda::PatternHeadGroups(spec, pattern, s.num_heads)) {
      const int slot = slot_of(hg.head0);
      if (slot < 0) continue;
      BlockCall base;
      base.pattern = pattern;
      base.segment = p.w;
      base.rate = p.r;
      base.group = hg;
      std::vector<BlockCall> calls;
      // Runs of full segments (length w, inside the shard) become one call each; any other local
      // segment (a partial last segment, or one straddling a boundary whose other side selects
      // nothing) one call over the batch items.
      size_t i = 0;
      while (i < segments.size()) {
        const int64_t m = segments[i];
        const PositionRange seg = geo.Segment(pattern, m);
        const RowRange rr = geo.Rows(pattern, m, self, slot);
        const bool full = seg.end - seg.begin == p.w && geo.InsideOneShard(pattern, m);
        if (rr.count() == 0) {
          ++i;
          continue;
        }
        const int64_t p0 = RowPosition(geo, pattern, m, slot, rr.begin);
        if (!full) {
          BlockCall c = base;
          c.rows = rr.count();
          c.count = s.batch;
          c.first_flat = p0;
          c.block_step = l;
          c.steps_batches = true;
          calls.push_back(c);
          ++i;
          continue;
        }
        size_t j = i + 1;
        while (j < segments.size() && segments[j] == segments[j - 1] + 1) {
          const PositionRange sj = geo.Segment(pattern, segments[j]);
          if (sj.end - sj.begin != p.w || !geo.InsideOneShard(pattern, segments[j])) break;
          ++j;
        }
        const int64_t run = static_cast<int64_t>(j - i);
        BlockCall c = base;
        c.rows = rr.count();
        c.block_step = p.w;
        const bool whole_shard = p0 - hg.offset == 0 && run * p.w == l;
        if (whole_shard && Foldable(fwd, bwd, l)) {
          c.count = s.batch * run;
          c.first_flat = p0;
          calls.push_back(c);
        } else {
          for (int64_t b = 0; b < s.batch; ++b) {
            c.count = run;
            c.first_flat = b * l + p0;
            calls.push_back(c);
          }
        }
        i = j;
      }
      for (const BlockCall& c : calls) DATTN_RETURN_IF_ERROR(RunLocalCall(geo, fwd, bwd, c));
    }
    return absl::OkStatus();
  }

  // Full segments of different batch items share a call only if every tensor's batch stride is L
  // times its position stride.
  static bool Foldable(const ForwardArgs* fwd, const BackwardArgs* bwd, int64_t l) {
    std::vector<const TensorView*> ts;
    if (fwd != nullptr) ts = {&fwd->q, &fwd->k, &fwd->v, &fwd->out};
    if (bwd != nullptr) {
      ts = {&bwd->q, &bwd->k, &bwd->v, &bwd->out, &bwd->dout, &bwd->dq, &bwd->dk, &bwd->dv};
    }
    for (const TensorView* t : ts) {
      if (t->strides[0] != l * t->strides[1]) return false;
    }
    return true;
  }

  // The views of one local call into the tensors a pass reads or writes.
  std::vector<KernelTensor> LocalViews(const ForwardArgs* fwd, const BackwardArgs* bwd,
                                       const BlockCall& c, int64_t l) const {
    std::vector<KernelTensor> v;
    if (fwd != nullptr) {
      for (const TensorView* t : {&fwd->q, &fwd->k, &fwd->v, &fwd->out}) {
        v.push_back(ViewTensor(*t, c, l));
      }
    } else {
      for (const TensorView* t :
           {&bwd->q, &bwd->k, &bwd->v, &bwd->out, &bwd->dout, &bwd->dq, &bwd->dk, &bwd->dv}) {
        v.push_back(ViewTensor(*t, c, l));
      }
    }
    return v;
  }

  // Cuts a local call to the workspace limit and cuDNN's view span, then runs the pieces. A block
  // whose own views exceed the span goes the shared way (packed tiles) instead.
  absl::Status RunLocalCall(const RingGeometry& geo, const ForwardArgs* fwd,
                            const BackwardArgs* bwd, const BlockCall& call) {
    const RingShape& s = geo.shape();
    const int64_t l = geo.shard_len();
    const bool backward = bwd != nullptr;
    const bool grouped = geo.spec().mode == AttentionMode::kGrouped;
    const CallRole role = grouped ? CallRole::kDirect : CallRole::kMerge;
    const bool cudnn = sdpa_ != nullptr && IsHalfType(geo.dtype());
    const bool hopper = backward && OwnBackward(geo);
    const bool scaled_out = cuda::NeedsScaledOut(geo.spec(), backward, cudnn);
    const cuda::ProblemDims dims{s.batch, l, s.num_heads, s.head_dim};
    const int64_t limit = options_.workspace_limit_bytes > 0
                              ? options_.workspace_limit_bytes
                              : cuda::DefaultWorkspaceLimit(dims, geo.dtype(), backward, hopper);
    BlockCall one = call;
    one.count = 1;
    // Chunked for the kernel the calls are expected to run on (a call our backward refuses falls
    // back to cuDNN with its larger scratch, as the CUDA backend's do).
    const cuda::CallScratch one_layout =
        hopper ? cuda::LayoutCallScratch(one, role, true, false, geo.dtype(), s.head_dim, 0, false,
                                         /*hopper=*/true)
               : cuda::LayoutCallScratch(one, role, backward, cudnn, geo.dtype(), s.head_dim,
                                         kAlign, scaled_out);
    const int64_t per_block = std::max<int64_t>(1, one_layout.total);
    int64_t chunk = std::max<int64_t>(1, limit / per_block);
    if (cudnn) {
      const std::vector<KernelTensor> views = LocalViews(fwd, bwd, one, l);
      int64_t block_span = 0, step = 0;
      for (const KernelTensor& t : views) {
        block_span = std::max(block_span, Span(t, 1, call.group.heads, call.rows, s.head_dim));
        step = std::max(step, t.fold);
      }
      if (block_span > kMaxSpanElements) {
        // Even one block is too wide for cuDNN's 32-bit views: packed tiles, segment by segment.
        DATTN_RETURN_IF_ERROR(RunLocalPacked(geo, fwd, bwd, call));
        if (!backward && ScaledInCall(call.pattern)) {
          DATTN_RETURN_IF_ERROR(ScaleCallRows(geo, *fwd, call));
        }
        return absl::OkStatus();
      }
      if (step > 0) chunk = std::min(chunk, 1 + (kMaxSpanElements - block_span) / step);
    }
    for (int64_t j0 = 0; j0 < call.count; j0 += chunk) {
      BlockCall c = call;
      c.count = std::min(chunk, call.count - j0);
      c.first_flat = call.first_flat + j0 * call.block_step;
      DATTN_RETURN_IF_ERROR(backward ? LocalBackward(geo, *bwd, c, role)
                                     : LocalForward(geo, *fwd, c, role));
    }
    return absl::OkStatus();
  }

  // The segments of a local call, through the packed path (direct in grouped mode).
  absl::Status RunLocalPacked(const RingGeometry& geo, const ForwardArgs* fwd,
                              const BackwardArgs* bwd, const BlockCall& call) {
    const int64_t l = geo.shard_len();
    const int self = geo.rank();
    // The segments the call covers, from the first row of each block.
    std::vector<int64_t> segs;
    for (int64_t j = 0; j < call.count; ++j) {
      const int64_t flat = call.first_flat + j * call.block_step;
      const int64_t global = self * l + flat % l;
      const int64_t m = global / geo.pattern(call.pattern).w;
      if (segs.empty() || segs.back() != m) segs.push_back(m);
    }
    std::sort(segs.begin(), segs.end());
    segs.erase(std::unique(segs.begin(), segs.end()), segs.end());
    BlockTask task;
    task.pattern = call.pattern;
    task.origin = self;
    const bool direct = geo.spec().mode == AttentionMode::kGrouped;
    for (int64_t m : segs) {
      DATTN_RETURN_IF_ERROR(RunShared(geo, fwd, bwd, task, m, direct, &call.group));
    }
    return absl::OkStatus();
  }

  // Grouped mode's 1/G on the rows of one local call, in place.
  absl::Status ScaleCallRows(const RingGeometry& geo, const ForwardArgs& args, const BlockCall& c) {
    const RingShape& s = geo.shape();
    const cuda::RowSpace space{s.batch, geo.shard_len(), s.num_heads, s.head_dim};
    DATTN_CUDA_RETURN_IF_ERROR(
        cuda::LaunchScaleRows(args.out.data, 1.0f / static_cast<float>(geo.num_patterns()),
                              ElemTypeOf(geo.dtype()), CallRowsOf(c), space, stream_));
    return absl::OkStatus();
  }

  absl::Status LocalForward(const RingGeometry& geo, const ForwardArgs& args, const BlockCall& c,
                            CallRole role) {
    const RingShape& s = geo.shape();
    const int64_t l = geo.shard_len();
    const DType dtype = geo.dtype();
    const ElemType et = ElemTypeOf(dtype);
    const bool merge = role == CallRole::kMerge;
    const float scale = static_cast<float>(geo.spec().ScaleFor(s.head_dim));
    const KernelTensor q = ViewTensor(args.q, c, l), k = ViewTensor(args.k, c, l),
                       v = ViewTensor(args.v, c, l), o = ViewTensor(args.out, c, l);
    // The merged output's tile is placed later; only its strides matter for the plan.
    cuda::SdpaForwardArgs a = cuda::SdpaForwardOn(
        {dtype, c.count, c.group.heads, c.rows, s.head_dim, geo.spec().causal}, q, k, v,
        merge ? PackedTensor(nullptr, c.group.heads, c.rows, s.head_dim) : o, scale);
    const bool scale_here = !merge && ScaledInCall(c.pattern);
    const float inv_g = 1.0f / static_cast<float>(geo.num_patterns());
    cuda::KernelForwardArgs ka;
    SetCallFields(geo, c, q, k, v, o, scale, &ka);
    bool own = false;
    if (scale_here) {
      ka.stats = reinterpret_cast<float*>(uintptr_t{256});  // placed below; checked for non-null
      own = cuda::HopperForwardSupported(ka);
    }
    bool cudnn = false;
    int64_t library = 0;
    if (!own && sdpa_ != nullptr && IsHalfType(dtype) && CudnnReadable(q) && CudnnReadable(k) &&
        CudnnReadable(v) && (merge || CudnnReadable(o))) {
      absl::StatusOr<int64_t> ws = sdpa_->ForwardWorkspace(a);
      if (ws.ok()) {
        cudnn = true;
        library = *ws;
      } else {
        NoteFallback(ws.status());
      }
    }
    const CallScratch layout = cuda::LayoutCallScratch(c, role, false, cudnn, dtype, s.head_dim,
                                                       cudnn ? std::max<int64_t>(library, 1) : 0);
    Scratch scratch(pool_, stream_);
    absl::StatusOr<char*> ws = scratch.Take(layout.total);
    if (!ws.ok()) return ws.status();
    float* stats = reinterpret_cast<float*>(*ws + layout.stats);
    void* tile = merge ? *ws + layout.tile : nullptr;
    ka.stats = stats;
    if (own) {
      ka.p_scale = inv_g;
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchHopperForward(ka, false, {}, item_counter_, stream_));
      ++stats_.own_hopper_calls;
    } else if (cudnn) {
      a.o = merge ? tile : o.ptr;
      a.stats = stats;
      DATTN_RETURN_IF_ERROR(sdpa_->Forward(a, *ws + layout.library));
      ++stats_.cudnn_calls;
    } else {
      if (merge) ka.o = PackedTensor(tile, c.group.heads, c.rows, s.head_dim);
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAttentionForward(ka, stream_));
      ++stats_.kernel_calls;
    }
    if (scale_here && !own) DATTN_RETURN_IF_ERROR(ScaleCallRows(geo, args, c));
    ++stats_.local_calls;
    const cuda::RowSpace space{s.batch, l, s.num_heads, s.head_dim};
    float* lse = static_cast<float*>(args.lse.data);
    if (merge) {
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchMergeTile(tile, stats, args.out.data, lse, et,
                                                       CallRowsOf(c), space, stream_));
    } else {
      DATTN_CUDA_RETURN_IF_ERROR(
          cuda::LaunchScatterStats(stats, lse, CallRowsOf(c), space, stream_));
    }
    return absl::OkStatus();
  }

  absl::Status LocalBackward(const RingGeometry& geo, const BackwardArgs& args, const BlockCall& c,
                             CallRole role) {
    const RingShape& s = geo.shape();
    const int64_t l = geo.shard_len();
    const DType dtype = geo.dtype();
    const ElemType et = ElemTypeOf(dtype);
    const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
    const bool merge = role == CallRole::kMerge;
    const bool grouped = geo.spec().mode == AttentionMode::kGrouped;
    const int g = geo.num_patterns();
    const float scale = static_cast<float>(geo.spec().ScaleFor(s.head_dim));
    const KernelTensor q = ViewTensor(args.q, c, l), k = ViewTensor(args.k, c, l),
                       v = ViewTensor(args.v, c, l), o = ViewTensor(args.out, c, l),
                       d_o = ViewTensor(args.dout, c, l);
    // The kernels' arguments, gradients in place (a merge call on cuDNN or the CUDA-core kernel
    // writes tiles instead, below). Grouped: P is normalised by lse + log G and the row sums are
    // taken over G * out (delta_scale); mixture: the row's total lse, o = out.
    cuda::KernelBackwardArgs ka;
    SetCallFields(geo, c, q, k, v, o, scale, &ka);
    ka.dout = d_o;
    ka.dq = ViewTensor(args.dq, c, l);
    ka.dk = ViewTensor(args.dk, c, l);
    ka.dv = ViewTensor(args.dv, c, l);
    ka.delta_scale = grouped ? static_cast<float>(g) : 1.0f;
    // Our Hopper backward adds a merge call's gradients in place; grouped mode's other rows were
    // cleared by BeginBackward, so it writes no zeros.
    bool own = false;
    if (OwnBackward(geo)) {
      cuda::KernelBackwardArgs check = ka;  // scratch not placed yet: placeholders for the check
      check.stats = check.delta = reinterpret_cast<float*>(uintptr_t{256});
      own = cuda::HopperBackwardSupported(check);
    }
    const KernelTensor packed = PackedTensor(nullptr, c.group.heads, c.rows, s.head_dim);
    const bool scaled_out_needed = grouped && g > 1;
    cuda::SdpaBackwardArgs a;
    a.shape = {dtype, c.count, c.group.heads, c.rows, s.head_dim, geo.spec().causal};
    a.q_strides = StridesOf(q);
    a.k_strides = StridesOf(k);
    a.v_strides = StridesOf(v);
    a.o_strides = scaled_out_needed ? StridesOf(packed) : StridesOf(o);
    a.do_strides = StridesOf(d_o);
    a.dq_strides = merge ? StridesOf(packed) : StridesOf(ka.dq);
    a.dk_strides = merge ? StridesOf(packed) : StridesOf(ka.dk);
    a.dv_strides = merge ? StridesOf(packed) : StridesOf(ka.dv);
    a.q = q.ptr;
    a.k = k.ptr;
    a.v = v.ptr;
    a.o = o.ptr;
    a.dout = d_o.ptr;
    a.scale = scale;
    bool cudnn = false;
    int64_t library = 0;
    bool readable = !own && sdpa_ != nullptr && IsHalfType(dtype);
    for (const KernelTensor* t : {&q, &k, &v, &o, &d_o}) readable = readable && CudnnReadable(*t);
    if (!merge) {
      for (const KernelTensor* t : {&ka.dq, &ka.dk, &ka.dv}) {
        readable = readable && CudnnReadable(*t);
      }
    }
    if (readable) {
      absl::StatusOr<int64_t> ws = sdpa_->BackwardWorkspace(a);
      if (ws.ok()) {
        cudnn = true;
        library = *ws;
      } else {
        NoteFallback(ws.status());
      }
    }
    const CallScratch layout =
        own ? cuda::LayoutCallScratch(c, role, true, false, dtype, s.head_dim, 0, false,
                                      /*hopper=*/true)
            : cuda::LayoutCallScratch(c, role, true, cudnn, dtype, s.head_dim,
                                      cudnn ? std::max<int64_t>(library, 1) : 0,
                                      cudnn && scaled_out_needed);
    Scratch scratch(pool_, stream_);
    absl::StatusOr<char*> ws = scratch.Take(layout.total);
    if (!ws.ok()) return ws.status();
    const cuda::RowSpace space{s.batch, l, s.num_heads, s.head_dim};
    const cuda::CallRows rows = CallRowsOf(c);
    const int64_t tile_bytes = c.count * c.group.heads * c.rows * s.head_dim * esize;
    const bool tiles = merge && !own;
    if (tiles) {
      KernelTensor* grads[3] = {&ka.dq, &ka.dk, &ka.dv};
      for (int i = 0; i < 3; ++i) {
        *grads[i] =
            PackedTensor(*ws + layout.tile + i * tile_bytes, c.group.heads, c.rows, s.head_dim);
      }
    }
    float* const stats = reinterpret_cast<float*>(*ws + layout.stats);
    float* const delta = reinterpret_cast<float*>(*ws + layout.delta);
    ka.stats = stats;
    ka.delta = delta;
    const float lse_add = grouped ? std::log(static_cast<float>(g)) : 0.0f;
    DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchGatherStats(static_cast<const float*>(args.lse.data),
                                                       stats, lse_add, rows, space, stream_));
    if (own) {
      DATTN_CUDA_RETURN_IF_ERROR(
          cuda::LaunchHopperBackward(ka, /*accumulate=*/merge, {}, item_counter_, stream_));
      ++stats_.own_hopper_backward_calls;
    } else if (cudnn) {
      if (scaled_out_needed) {
        DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchGatherRows(
            args.out.data, *ws + layout.out_tile, static_cast<float>(g), et, rows, space, stream_));
        a.o = *ws + layout.out_tile;
      }
      a.dq = ka.dq.ptr;
      a.dk = ka.dk.ptr;
      a.dv = ka.dv.ptr;
      a.stats = stats;
      a.softmax_sum = delta;
      a.dq_accum = reinterpret_cast<float*>(*ws + layout.dq_accum);
      DATTN_RETURN_IF_ERROR(sdpa_->Backward(a, *ws + layout.library));
      ++stats_.cudnn_calls;
    } else {
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAttentionBackward(ka, stream_));
      ++stats_.kernel_calls;
    }
    ++stats_.local_calls;
    if (tiles) {
      DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAccumulateTiles(
          *ws + layout.tile, args.dq.data, args.dk.data, args.dv.data, et, rows, space, stream_));
    }
    return absl::OkStatus();
  }

  // Whether this rank's local backward calls go to our Hopper backward (option on, a compute
  // capability 9.0 device, a type and head size it runs); each call is still checked.
  bool OwnBackward(const RingGeometry& geo) const {
    return options_.own_hopper_backward && item_counter_ != nullptr && sdpa_ != nullptr &&
           IsHalfType(geo.dtype()) && (geo.shape().head_dim == 64 || geo.shape().head_dim == 128);
  }

  // ---- Shared segments (and local ones too wide for cuDNN's views): packed tiles.

  // Segment m of the task: this rank's query rows of each slot group against the origin's chunk.
  // direct: the rows have no other contribution (grouped mode, local segment): written, not merged
  // or added. `only`, if set, limits the work to the slot groups of that head group's heads.
  absl::Status RunShared(const RingGeometry& geo, const ForwardArgs* fwd, const BackwardArgs* bwd,
                         const BlockTask& task, int64_t m, bool direct,
                         const cuda::HeadGroup* only = nullptr) {
    const int self = geo.rank();
    const RingShape& s = geo.shape();
    const int64_t d = s.head_dim;
    const int64_t esize = static_cast<int64_t>(DTypeSize(geo.dtype()));
    const bool causal = geo.spec().causal;
    const int origin = task.origin;
    Scratch scratch(pool_, stream_);
    const char* kv = static_cast<const char*>(task.kv);
    if (kv == nullptr) {
      // This rank's own chunk, packed as a peer would receive it.
      absl::StatusOr<char*> own = scratch.Take(geo.BlockElements(task.pattern, m, self) * esize);
      if (!own.ok()) return own.status();
      const TensorView& k = fwd != nullptr ? fwd->k : bwd->k;
      const TensorView& v = fwd != nullptr ? fwd->v : bwd->v;
      DATTN_RETURN_IF_ERROR(PackOwn(geo, task.pattern, m, k, v, *own));
      kv = *own;
    }
    const int64_t chunk_rows = geo.ChunkRows(task.pattern, m, origin);
    const int64_t section = s.batch * chunk_rows * d;
    for (const SlotGroup& sg : SlotGroups(geo, task.pattern)) {
      if (only != nullptr) {
        const int64_t rel = sg.head0 - only->head0;
        if (rel < 0 || rel % only->head_step != 0 || rel / only->head_step >= only->heads) continue;
      }
      const RowRange qr = geo.Rows(task.pattern, m, self, sg.slot0);
      const RowRange kr = geo.Rows(task.pattern, m, origin, sg.slot0);
      if (qr.count() == 0 || kr.count() == 0) continue;
      if (causal && kr.begin > qr.end - 1) continue;
      SharedCall c;
      c.pattern = task.pattern;
      c.segment = m;
      c.slots = sg;
      c.nq = qr.count();
      c.nk = kr.count();
      c.masked = causal && origin == self;
      c.p_q = RowPosition(geo, task.pattern, m, sg.slot0, qr.begin);
      c.kv = kv;
      c.kv_base = geo.SlotRowOffset(task.pattern, m, origin, sg.slot0) * d;
      c.kv_batch = chunk_rows * d;
      c.section = section;
      c.direct = direct;
      if (origin == self) c.p_k = RowPosition(geo, task.pattern, m, sg.slot0, kr.begin);
      c.dkv = static_cast<float*>(task.dkv);
      DATTN_RETURN_IF_ERROR(fwd != nullptr ? SharedForward(geo, *fwd, c)
                                           : SharedBackward(geo, *bwd, c));
    }
    return absl::OkStatus();
  }

  struct SharedCall {
    int pattern = 0;
    int64_t segment = 0;
    SlotGroup slots;
    int64_t nq = 0, nk = 0;
    bool masked = false;  // causal own block: top-left mask on the square
    int64_t p_q = 0;      // shard-local position of the first query row
    int64_t p_k = 0;      // own block: shard-local position of the first key row
    const char* kv = nullptr;
    int64_t kv_base = 0;   // elements: the slot group's first row in the K section
    int64_t kv_batch = 0;  // elements between batch items in a section
    int64_t section = 0;   // elements of the K section
    bool direct = false;
    float* dkv = nullptr;  // packed fp32 partial sums (nullptr: the rank's own dk, dv)
    // Derived: square calls of nk rows; the query tile holds `pad` >= nq rows, `chunks` of nk.
    int64_t chunks() const { return nq > nk ? (nq + nk - 1) / nk : 1; }
    int64_t pad() const { return chunks() * nk; }
  };

  // K (part 0) or V (part 1) of the block as a [B, slots, nk, D] view.
  KernelTensor BlockView(const SharedCall& c, int part, int64_t d, int64_t esize) const {
    KernelTensor t;
    t.ptr = const_cast<char*>(c.kv) + (c.kv_base + part * c.section) * esize;
    t.fold = c.kv_batch;
    t.head = c.nk * d;
    t.seq = d;
    t.chan = 1;
    return t;
  }

  // The query-side map of a shard tensor for the call's rows.
  RowMap ShardRows(const RingGeometry& geo, const TensorView& t, const SharedCall& c,
                   int64_t first) const {
    return TensorRows(t, first, c.slots.head0, 1, geo.pattern(c.pattern).r);
  }

  RowMap LseRows(const RingGeometry& geo, const SharedCall& c) const {
    RowMap m;
    const int64_t l = geo.shard_len();
    m.base = c.slots.head0 * l + c.p_q;
    m.sb = geo.shape().num_heads * l;
    m.sk = l;
    m.si = geo.pattern(c.pattern).r;
    return m;
  }

  // Gathers shard rows into a zero-padded [B, slots, pad, D] tile.
  absl::Status GatherTile(const RingGeometry& geo, const TensorView& src, const SharedCall& c,
                          float scale, char* tile) {
    const int64_t d = geo.shape().head_dim;
    const int64_t esize = static_cast<int64_t>(DTypeSize(geo.dtype()));
    const ElemType et = ElemTypeOf(geo.dtype());
    const int64_t b = geo.shape().batch, k = c.slots.slots;
    if (c.pad() > c.nq) {
      DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(tile, 0, b * k * c.pad() * d * esize, stream_));
    }
    DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchCopyRows(src.data, et, ShardRows(geo, src, c, c.p_q),
                                                     tile, et, PackedRows(0, k, c.pad(), d), b, k,
                                                     c.nq, d, scale, false, stream_));
    return absl::OkStatus();
  }

  absl::Status SharedForward(const RingGeometry& geo, const ForwardArgs& args,
                             const SharedCall& c) {
    const RingShape& s = geo.shape();
    const int64_t d = s.head_dim, b = s.batch, k = c.slots.slots;
    const DType dtype = geo.dtype();
    const ElemType et = ElemTypeOf(dtype);
    const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
    const float scale = static_cast<float>(geo.spec().ScaleFor(d));
    const int64_t pad = c.pad(), chunks = c.chunks();
    Scratch scratch(pool_, stream_);
    absl::StatusOr<char*> qt = scratch.Take(b * k * pad * d * esize);
    absl::StatusOr<char*> ot = scratch.Take(b * k * pad * d * esize);
    absl::StatusOr<char*> st = scratch.Take(b * k * pad * 4);
    for (const auto* x : {&qt, &ot, &st}) {
      if (!x->ok()) return x->status();
    }
    DATTN_RETURN_IF_ERROR(GatherTile(geo, args.q, c, 1.0f, *qt));
    const KernelTensor kv_k = BlockView(c, 0, d, esize), kv_v = BlockView(c, 1, d, esize);
    for (int64_t t = 0; t < chunks; ++t) {
      // Query rows [t nk, (t+1) nk) of the tile as a [B, slots, nk, D] view.
      KernelTensor q = PackedTensor(*qt, k, pad, d), o = PackedTensor(*ot, k, pad, d);
      q = Shifted(q, t * c.nk * d, esize);
      o = Shifted(o, t * c.nk * d, esize);
      float* stats = reinterpret_cast<float*>(*st) + t * b * k * c.nk;
      DATTN_RETURN_IF_ERROR(
          AttendForward(dtype, b, k, c.nk, d, c.masked, scale, q, kv_k, kv_v, o, stats, scratch));
    }
    if (pad != c.nq || chunks > 1) ++stats_.padded_calls;
    ++stats_.shared_calls;
    const RowMap out_map = ShardRows(geo, args.out, c, c.p_q);
    DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchMergeRows(
        *ot, PackedRows(0, k, pad, d), reinterpret_cast<float*>(*st), StatsMap{b, k, c.nk},
        args.out.data, out_map, static_cast<float*>(args.lse.data), LseRows(geo, c), et, b, k, c.nq,
        d, c.direct, stream_));
    return absl::OkStatus();
  }

  // One square forward call: cuDNN where it takes the graph, the own kernel otherwise.
  absl::Status AttendForward(DType dtype, int64_t count, int64_t heads, int64_t rows, int64_t d,
                             bool causal, float scale, const KernelTensor& q, const KernelTensor& k,
                             const KernelTensor& v, const KernelTensor& o, float* stats,
                             Scratch& scratch) {
    if (sdpa_ != nullptr && IsHalfType(dtype) && CudnnReadable(q) && CudnnReadable(k) &&
        CudnnReadable(v) && CudnnReadable(o)) {
      cuda::SdpaForwardArgs a =
          cuda::SdpaForwardOn({dtype, count, heads, rows, d, causal}, q, k, v, o, scale);
      a.stats = stats;
      absl::StatusOr<int64_t> ws = sdpa_->ForwardWorkspace(a);
      if (ws.ok()) {
        absl::StatusOr<char*> lib = scratch.Take(*ws);
        if (!lib.ok()) return lib.status();
        DATTN_RETURN_IF_ERROR(sdpa_->Forward(a, *lib));
        ++stats_.cudnn_calls;
        return absl::OkStatus();
      }
      NoteFallback(ws.status());
    }
    cuda::KernelForwardArgs ka;
    ka.type = ElemTypeOf(dtype);
    ka.q = q;
    ka.k = k;
    ka.v = v;
    ka.o = o;
    ka.stats = stats;
    ka.count = count;
    ka.heads = heads;
    ka.rows = rows;
    ka.head_dim = d;
    ka.scale = scale;
    ka.causal = causal;
    DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAttentionForward(ka, stream_));
    ++stats_.kernel_calls;
    return absl::OkStatus();
  }

  absl::Status SharedBackward(const RingGeometry& geo, const BackwardArgs& args,
                              const SharedCall& c) {
    const RingShape& s = geo.shape();
    const int64_t d = s.head_dim, b = s.batch, k = c.slots.slots;
    const DType dtype = geo.dtype();
    const ElemType et = ElemTypeOf(dtype);
    const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
    const float scale = static_cast<float>(geo.spec().ScaleFor(d));
    const bool grouped = geo.spec().mode == AttentionMode::kGrouped;
    const int g = geo.num_patterns();
    const int64_t pad = c.pad(), chunks = c.chunks();
    const int64_t tile = b * k * pad * d * esize;
    const int64_t block_tile = b * k * c.nk * d * esize;
    Scratch scratch(pool_, stream_);
    absl::StatusOr<char*> qt = scratch.Take(tile);
    absl::StatusOr<char*> dot = scratch.Take(tile);
    absl::StatusOr<char*> ot = scratch.Take(tile);
    absl::StatusOr<char*> dqt = scratch.Take(tile);
    absl::StatusOr<char*> dkt = scratch.Take(chunks * block_tile);
    absl::StatusOr<char*> dvt = scratch.Take(chunks * block_tile);
    absl::StatusOr<char*> st = scratch.Take(b * k * pad * 4);
    absl::StatusOr<char*> sum = scratch.Take(b * k * c.nk * 4);
    absl::StatusOr<char*> acc = scratch.Take(b * k * c.nk * d * 4);
    for (const auto* x : {&qt, &dot, &ot, &dqt, &dkt, &dvt, &st, &sum, &acc}) {
      if (!x->ok()) return x->status();
    }
    // P = exp(scale q k - (lse + log G)) and row sums over G * out: the block's share of the
    // gradient of out = A / G (grouped), or of the mixture (c = 1).
    DATTN_RETURN_IF_ERROR(GatherTile(geo, args.q, c, 1.0f, *qt));
    DATTN_RETURN_IF_ERROR(GatherTile(geo, args.dout, c, 1.0f, *dot));
    DATTN_RETURN_IF_ERROR(
        GatherTile(geo, args.out, c, grouped ? static_cast<float>(g) : 1.0f, *ot));
    float* stats = reinterpret_cast<float*>(*st);
    if (pad > c.nq) DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stats, 0, b * k * pad * 4, stream_));
    DATTN_CUDA_RETURN_IF_ERROR(
        cudak::LaunchGatherLse(static_cast<const float*>(args.lse.data), LseRows(geo, c),
                               grouped ? std::log(static_cast<float>(g)) : 0.0f, stats,
                               StatsMap{b, k, c.nk}, b, k, c.nq, stream_));
    const KernelTensor kv_k = BlockView(c, 0, d, esize), kv_v = BlockView(c, 1, d, esize);
    for (int64_t t = 0; t < chunks; ++t) {
      const int64_t shift = t * c.nk * d;
      Views v;
      v.q = Shifted(PackedTensor(*qt, k, pad, d), shift, esize);
      v.k = kv_k;
      v.v = kv_v;
      v.o = Shifted(PackedTensor(*ot, k, pad, d), shift, esize);
      v.dout = Shifted(PackedTensor(*dot, k, pad, d), shift, esize);
      v.dq = Shifted(PackedTensor(*dqt, k, pad, d), shift, esize);
      v.dk = PackedTensor(*dkt + t * block_tile, k, c.nk, d);
      v.dv = PackedTensor(*dvt + t * block_tile, k, c.nk, d);
      DATTN_RETURN_IF_ERROR(AttendBackward(dtype, b, k, c.nk, d, c.masked, scale, v,
                                           stats + t * b * k * c.nk, reinterpret_cast<float*>(*sum),
                                           reinterpret_cast<float*>(*acc), scratch));
    }
    if (pad != c.nq || chunks > 1) ++stats_.padded_calls;
    ++stats_.shared_calls;
    // dq rows of this rank.
    DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchCopyRows(
        *dqt, et, PackedRows(0, k, pad, d), args.dq.data, et, ShardRows(geo, args.dq, c, c.p_q), b,
        k, c.nq, d, 1.0f, !c.direct, stream_));
    // dK/dV of the origin's rows: into the packed partial sums, or this rank's own dk, dv.
    for (int part = 0; part < 2; ++part) {
      char* src = part == 0 ? *dkt : *dvt;
      for (int64_t t = 0; t < chunks; ++t) {
        const bool assign = c.direct && t == 0;
        if (c.dkv != nullptr) {
          RowMap dst;
          dst.base = c.kv_base + part * c.section;
          dst.sb = c.kv_batch;
          dst.sk = c.nk * d;
          dst.si = d;
          DATTN_CUDA_RETURN_IF_ERROR(
              cudak::LaunchCopyRows(src + t * block_tile, et, PackedRows(0, k, c.nk, d), c.dkv,
                                    ElemType::kF32, dst, b, k, c.nk, d, 1.0f, !assign, stream_));
        } else {
          const TensorView& own = part == 0 ? args.dk : args.dv;
          DATTN_CUDA_RETURN_IF_ERROR(cudak::LaunchCopyRows(
              src + t * block_tile, et, PackedRows(0, k, c.nk, d), own.data, et,
              ShardRows(geo, own, c, c.p_k), b, k, c.nk, d, 1.0f, !assign, stream_));
        }
      }
    }
    return absl::OkStatus();
  }

  struct Views {
    KernelTensor q, k, v, o, dout, dq, dk, dv;
  };

  // One square backward call (o already holds G * out in grouped mode: the row sums need no
  // scale).
  absl::Status AttendBackward(DType dtype, int64_t count, int64_t heads, int64_t rows, int64_t d,
                              bool causal, float scale, const Views& v, const float* stats,
                              float* softmax_sum, float* dq_accum, Scratch& scratch) {
    bool readable = sdpa_ != nullptr && IsHalfType(dtype);
    for (const KernelTensor* t : {&v.q, &v.k, &v.v, &v.o, &v.dout, &v.dq, &v.dk, &v.dv}) {
      readable = readable && CudnnReadable(*t);
    }
    if (readable) {
      cuda::SdpaBackwardArgs a;
      a.shape = {dtype, count, heads, rows, d, causal};
      a.q_strides = StridesOf(v.q);
      a.k_strides = StridesOf(v.k);
      a.v_strides = StridesOf(v.v);
      a.o_strides = StridesOf(v.o);
      a.do_strides = StridesOf(v.dout);
      a.dq_strides = StridesOf(v.dq);
      a.dk_strides = StridesOf(v.dk);
      a.dv_strides = StridesOf(v.dv);
      a.q = v.q.ptr;
      a.k = v.k.ptr;
      a.v = v.v.ptr;
      a.o = v.o.ptr;
      a.dout = v.dout.ptr;
      a.dq = v.dq.ptr;
      a.dk = v.dk.ptr;
      a.dv = v.dv.ptr;
      a.stats = stats;
      a.scale = scale;
      a.softmax_sum = softmax_sum;
      a.dq_accum = dq_accum;
      absl::StatusOr<int64_t> ws = sdpa_->BackwardWorkspace(a);
      if (ws.ok()) {
        absl::StatusOr<char*> lib = scratch.Take(*ws);
        if (!lib.ok()) return lib.status();
        DATTN_RETURN_IF_ERROR(sdpa_->Backward(a, *lib));
        ++stats_.cudnn_calls;
        return absl::OkStatus();
      }
      NoteFallback(ws.status());
    }
    cuda::KernelBackwardArgs ka;
    ka.type = ElemTypeOf(dtype);
    ka.q = v.q;
    ka.k = v.k;
    ka.v = v.v;
    ka.o = v.o;
    ka.dout = v.dout;
    ka.dq = v.dq;
    ka.dk = v.dk;
    ka.dv = v.dv;
    ka.stats = stats;
    ka.delta = softmax_sum;
    ka.count = count;
    ka.heads = heads;
    ka.rows = rows;
    ka.head_dim = d;
    ka.scale = scale;
    ka.delta_scale = 1.0f;
    ka.causal = causal;
    DATTN_CUDA_RETURN_IF_ERROR(cuda::LaunchAttentionBackward(ka, stream_));
    ++stats_.kernel_calls;
    return absl::OkStatus();
  }

  const CudaBlockKernelOptions options_;
  const BackendCaps caps_;
  cudaStream_t stream_;
  bool owns_stream_;
  cudaMemPool_t pool_;
  cudaEvent_t event_;
  std::unique_ptr<cuda::CudnnSdpa> sdpa_;
  // Device: our Hopper kernel's work counter; null where that kernel is not used (option off, or
  // not a compute capability 9.0 device).
  unsigned* const item_counter_;
  std::vector<bool> scaled_in_call_;  // per pattern, for the forward under way (BeginForward)
  CudaBlockKernelStats stats_;
  std::string last_fallback_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBlockKernels>> NewCudaBlockKernels(
    const CudaBlockKernelOptions& options) {
  DATTN_RETURN_IF_ERROR(cuda::CheckHopperDevice(options.device, "the ring's CUDA kernels"));
  DeviceScope scope;
  DATTN_RETURN_IF_ERROR(scope.Enter(options.device));
  // Everything made so far is released if a later step fails.
  struct Partial {
    cudaStream_t stream = nullptr;
    bool owns_stream = false;
    cudaMemPool_t pool = nullptr;
    cudaEvent_t event = nullptr;
    unsigned* item_counter = nullptr;
    ~Partial() {
      if (item_counter != nullptr) cudaFree(item_counter);
      if (pool != nullptr) cudaMemPoolDestroy(pool);
      if (event != nullptr) cudaEventDestroy(event);
      if (owns_stream && stream != nullptr) cudaStreamDestroy(stream);
    }
  } r;
  r.stream = options.stream;
  if (r.stream == nullptr) {
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.stream, cudaStreamDefault));
    r.owns_stream = true;
  }
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&r.event, cudaEventDisableTiming));
  absl::StatusOr<cudaMemPool_t> pool = cuda::NewScratchPool(options.device);
  if (!pool.ok()) return pool.status();
  r.pool = *pool;
  std::unique_ptr<cuda::CudnnSdpa> sdpa;
  if (options.use_cudnn) {
    absl::StatusOr<std::unique_ptr<cuda::CudnnSdpa>> made = cuda::CudnnSdpa::Create(r.stream);
    if (!made.ok()) return made.status();
    sdpa = std::move(*made);
  }
  if ((options.own_hopper_forward || options.own_hopper_backward) && options.use_cudnn) {
    DATTN_CUDA_RETURN_IF_ERROR(cuda::NewHopperItemCounter(options.device, &r.item_counter));
  }
  auto kernels = std::make_unique<CudaBlockKernelsImpl>(options, r.stream, r.owns_stream, r.pool,
                                                        r.event, std::move(sdpa), r.item_counter);
  r = Partial();  // now owned by the kernels
  return std::unique_ptr<CudaBlockKernels>(std::move(kernels));
}

}  // namespace ring
}  // namespace dattn
