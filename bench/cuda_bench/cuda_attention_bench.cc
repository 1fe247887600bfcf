// Benchmark of the CUDA backend on one GPU: dattn against its floor, with the memory planner's
// prediction against the measured peak.
//
// For each row: the dattn call (strided views, in-place outputs, all of its small kernels), the
// floor: the same cuDNN fused attention (our own graph, same plans' shapes) run on the same blocks
// already gathered into contiguous tensors, i.e. exactly the attention work with no dilation
// overhead, and dattn with its fused calls forced onto cuDNN and onto our own Hopper kernels
// (CudaBackendOptions::forward_kernel and backward_kernel; the default picks per mode). The four
// are timed in turn, five rounds, each a median of CUDA-event timings of single calls after
// warm-up; times are medians over rounds and ratios medians of per-round ratios (clocks drift by
// several percent between seconds on these cards). Memory: the planner's predicted total (inputs +
// outputs + lse + workspace) against the measured peak (tensor allocations + the workspace pool's
// high-water mark + any other device memory the call left taken).
//
// Usage: cuda_attention_bench [--suite=issue|quick|grouped-fwd|fwd-bwd|parity|none] [--longest]
//        [--only=substring of a row's name] [--csv=path]
// Prints one line per row and a table last. Exit status 0 unless a CUDA/cuDNN error occurred.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/attention_spec.h"
#include "engine/cuda/block_calls.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/cuda/cudnn_sdpa.h"
#include "engine/cuda/device_fill.h"

namespace dattn {
namespace {

#define BENCH_CUDA(expr)                                                             \
  do {                                                                               \
    cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
    }                                                                                \
  } while (0)

#define BENCH_OK(expr)        \
  do {                        \
    absl::Status s_ = (expr); \
    if (!s_.ok()) return s_;  \
  } while (0)

struct RowConfig {
  std::string name;
  AttentionMode mode = AttentionMode::kGrouped;
  int64_t n = 0;
  int64_t heads = 16;
  int64_t dim = 64;
  bool backward = false;
  bool causal = false;
  int iters = 20;
  bool breakdown = false;  // also time the parts (fused calls alone, variants of the backend)
};

struct RowResult {
  RowConfig config;
  bool ran = false;
  std::string error;
  double dattn_ms = 0, floor_ms = 0;
  double tflops = 0;
  int64_t planned_total = 0, measured_total = 0, tensor_bytes = 0;
  int64_t planned_workspace = 0, pool_used_high = 0, pool_reserved_high = 0, other_growth = 0;
  int64_t one_input = 0;
  int64_t cudnn_calls = 0, fallbacks = 0, p_scale_passes = 0, library_ws = 0;
  // Breakdown: the fused calls alone on dattn's strided views (same chunks), with and without the
  // 1/G inside; dattn with the 1/G fused into cuDNN's graph, without overlapped fills, without
  // chunking.
  double strided_ms = 0, strided_plain_ms = 0, nooverlap_ms = 0, unchunked_ms = 0;
  double prob_ms = 0;
  double ratio = 0;        // median over paired rounds of dattn / floor
  double cudnn_ms = 0;     // dattn with every forward fused call on cuDNN
  double cudnn_ratio = 0;  // median over paired rounds of that / floor
  double own_ms = 0;       // dattn with our own Hopper forward kernel wherever it runs
  double own_ratio = 0;    // median over paired rounds of that / floor
  int64_t own_calls = 0;
  // Backward rows at a workspace limit of 5% of an input, and the workspace that took.
  double ws5_ms = 0;
  int64_t ws5_workspace = 0;
};

AttentionSpec IssueSpec(AttentionMode mode, bool causal) {
  AttentionSpec spec;
  spec.segment_lengths = {2048, 4096, 8192, 16384};
  spec.dilation_rates = {1, 2, 4, 8};
  spec.mode = mode;
  spec.causal = causal;
  return spec;
}

class DeviceMemory {
 public:
  ~DeviceMemory() {
    for (void* p : ptrs_) cudaFree(p);
  }
  absl::StatusOr<void*> Alloc(int64_t bytes) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc(", bytes, "): ", cudaGetErrorString(e)));
    }
    ptrs_.push_back(p);
    total_ += bytes;
    return p;
  }
  int64_t total() const { return total_; }

 private:
  std::vector<void*> ptrs_;
  int64_t total_ = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median milliseconds of `iters` timed runs of `fn` after `warmup` untimed ones.
template <typename Fn>
absl::StatusOr<double> TimeIt(cudaStream_t stream, int warmup, int iters, Fn fn) {
  for (int i = 0; i < warmup; ++i) BENCH_OK(fn());
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    BENCH_OK(fn());
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return Median(ms);
}

// The plan's fused calls alone, ready to run again and again: it owns its cuDNN handle, plans,
// tensors and workspace.
struct FusedRunner {
  struct Call {
    cuda::SdpaForwardArgs fwd;
    cuda::SdpaBackwardArgs bwd;
  };
  std::unique_ptr<cuda::CudnnSdpa> sdpa;
  DeviceMemory mem;
  std::vector<Call> calls;
  void* ws = nullptr;
  bool backward = false;
  absl::Status Run() {
    for (const Call& call : calls) {
      BENCH_OK(sdpa->Forward(call.fwd, ws));
      if (backward) BENCH_OK(sdpa->Backward(call.bwd, ws));
    }
    return absl::OkStatus();
  }
};

// tensors == nullptr: the floor, on contiguous copies of the blocks (contents random; timing does
// not depend on them beyond not being zero), unchunked. Otherwise dattn's own tensors (q, k, v,
// out, dout, dq, dk, dv of shape (1, N, H, D)) read through the same strided views and chunks
// dattn uses, with the probabilities scaled by p_scale.
absl::StatusOr<std::unique_ptr<FusedRunner>> PrepareFused(const AttentionSpec& spec,
                                                          const RowConfig& c, DType dtype,
                                                          cudaStream_t stream,
                                                          const std::vector<void*>* tensors,
                                                          float p_scale) {
  auto runner = std::make_unique<FusedRunner>();
  runner->backward = c.backward;
  {
    absl::StatusOr<std::unique_ptr<cuda::CudnnSdpa>> sdpa = cuda::CudnnSdpa::Create(stream);
    if (!sdpa.ok()) return sdpa.status();
    runner->sdpa = std::move(*sdpa);
  }
  cuda::CudnnSdpa* sdpa = runner->sdpa.get();
  const cuda::ProblemDims dims{1, c.n, c.heads, c.dim};
  cuda::PlanInputs in;
  in.dtype = dtype;
  in.backward = c.backward;
  // The floor runs unchunked (its best); the strided variant chunks as dattn does.
  in.workspace_limit = tensors == nullptr ? std::numeric_limits<int64_t>::max() / 4 : 0;
  const cuda::CallPlan plan = cuda::PlanBlockCalls(spec, dims, in);
  DeviceMemory& mem = runner->mem;
  int64_t max_ws = 0;
  const float scale = static_cast<float>(spec.ScaleFor(c.dim));
  for (const cuda::PlannedCall& pc : plan.calls) {
    const cuda::BlockCall& b = pc.call;
    const int64_t elems = b.count * b.group.heads * b.rows * c.dim;
    const int64_t bytes = elems * static_cast<int64_t>(DTypeSize(dtype));
    cuda::SdpaStrides packed{b.group.heads * b.rows * c.dim, b.rows * c.dim, c.dim};
    std::vector<void*> t;
    if (tensors != nullptr) {
      const cuda::CallView v = cuda::ViewOf(b, c.n, c.n * c.heads * c.dim, c.heads * c.dim, c.dim);
      packed = {v.fold, v.head, v.seq};
      for (void* base : *tensors) t.push_back(static_cast<char*>(base) + v.base * 2);
    } else {
      for (int i = 0; i < (c.backward ? 8 : 4); ++i) {
        absl::StatusOr<void*> p = mem.Alloc(bytes);
        if (!p.ok()) return p.status();
        BENCH_CUDA(cuda::LaunchFillRandom(
            *p, dtype == DType::kFloat16 ? cuda::ElemType::kF16 : cuda::ElemType::kBF16, elems,
            1234 + i, 1.0f, stream));
        t.push_back(*p);
      }
    }
    FusedRunner::Call call;
    call.fwd.shape = {dtype, b.count, b.group.heads, b.rows, c.dim, c.causal};
    call.fwd.q_strides = call.fwd.k_strides = call.fwd.v_strides = call.fwd.o_strides = packed;
    call.fwd.p_scale = p_scale;
    absl::StatusOr<void*> stats = mem.Alloc(b.count * b.group.heads * b.rows * 4);
    if (!stats.ok()) return stats.status();
    call.fwd.q = t[0];
    call.fwd.k = t[1];
    call.fwd.v = t[2];
    call.fwd.o = t[3];
    call.fwd.stats = static_cast<float*>(*stats);
    call.fwd.scale = scale;
    absl::StatusOr<int64_t> ws = sdpa->ForwardWorkspace(call.fwd);
    if (!ws.ok()) return ws.status();
    max_ws = std::max(max_ws, *ws);
    if (c.backward) {
      cuda::SdpaBackwardArgs& a = call.bwd;
      a.shape = call.fwd.shape;
      a.q_strides = a.k_strides = a.v_strides = a.o_strides = a.do_strides = packed;
      a.dq_strides = a.dk_strides = a.dv_strides = packed;
      a.q = t[0];
      a.k = t[1];
      a.v = t[2];
      a.o = t[3];
      a.dout = t[4];
      a.dq = t[5];
      a.dk = t[6];
      a.dv = t[7];
      a.stats = call.fwd.stats;
      a.scale = scale;
      absl::StatusOr<void*> sum = mem.Alloc(b.count * b.group.heads * b.rows * 4);
      absl::StatusOr<void*> acc = mem.Alloc(elems * 4);
      if (!sum.ok() || !acc.ok()) return absl::ResourceExhaustedError("floor scratch");
      a.softmax_sum = static_cast<float*>(*sum);
      a.dq_accum = static_cast<float*>(*acc);
      absl::StatusOr<int64_t> bws = sdpa->BackwardWorkspace(a);
      if (!bws.ok()) return bws.status();
      max_ws = std::max(max_ws, *bws);
    }
    runner->calls.push_back(call);
  }
  if (max_ws > 0) {
    absl::StatusOr<void*> p = mem.Alloc(max_ws);
    if (!p.ok()) return p.status();
    runner->ws = *p;
  }
  return runner;
}

absl::StatusOr<double> TimeFused(const AttentionSpec& spec, const RowConfig& c, DType dtype,
                                 cudaStream_t stream, const std::vector<void*>* tensors,
                                 float p_scale) {
  absl::StatusOr<std::unique_ptr<FusedRunner>> runner =
      PrepareFused(spec, c, dtype, stream, tensors, p_scale);
  if (!runner.ok()) return runner.status();
  return TimeIt(stream, 3, c.iters, [&] { return (*runner)->Run(); });
}

absl::Status RunRow(RowResult& r, bool with_floor, const CudaBackendOptions& options = {},
                    double* time_only = nullptr, int64_t* workspace_only = nullptr) {
  const RowConfig& c = r.config;
  const DType dtype = DType::kBFloat16;
  const AttentionSpec spec = IssueSpec(c.mode, c.causal);
  absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> made = NewCudaBackend(options);
  if (!made.ok()) return made.status();
  CudaAttentionBackend& be = **made;
  cudaStream_t stream = be.stream();
  size_t free0 = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free0, &total));

  const int64_t elems = c.n * c.heads * c.dim;
  const int64_t bytes = elems * 2;
  r.one_input = bytes;
  DeviceMemory mem;
  std::vector<void*> t;
  for (int i = 0; i < (c.backward ? 8 : 4); ++i) {
    absl::StatusOr<void*> p = mem.Alloc(bytes);
    if (!p.ok()) return p.status();
    t.push_back(*p);
  }
  absl::StatusOr<void*> lse = mem.Alloc(c.heads * c.n * 4);
  if (!lse.ok()) return lse.status();
  r.tensor_bytes = mem.total();
  for (int i = 0; i < static_cast<int>(t.size()); ++i) {
    BENCH_CUDA(cuda::LaunchFillRandom(t[i], cuda::ElemType::kBF16, elems, 77 + i, 1.0f, stream));
  }
  const std::vector<int64_t> shape = {1, c.n, c.heads, c.dim};
  auto view = [&](void* p) { return TensorView::Contiguous(p, dtype, shape, Device::kCuda, 0); };
  const TensorView lse_view =
      TensorView::Contiguous(*lse, DType::kFloat32, {1, c.heads, c.n}, Device::kCuda, 0);
  const ForwardArgs fa{view(t[0]), view(t[1]), view(t[2]), view(t[3]), lse_view};
  BackwardArgs ba;
  if (c.backward) {
    ba = BackwardArgs{view(t[0]), view(t[1]), view(t[2]), view(t[3]), lse_view,
                      view(t[4]), view(t[5]), view(t[6]), view(t[7])};
  }
  auto call = [&]() -> absl::Status {
    BENCH_OK(be.Forward(spec, fa));
    if (c.backward) BENCH_OK(be.Backward(spec, ba));
    return absl::OkStatus();
  };
  constexpr int kRounds = 5;
  const int iters = std::max(5, c.iters / 2);
  std::unique_ptr<FusedRunner> floor;
  if (with_floor) {
    absl::StatusOr<std::unique_ptr<FusedRunner>> made_floor =
        PrepareFused(spec, c, dtype, stream, nullptr, 1.0f);
    if (!made_floor.ok()) return made_floor.status();
    floor = std::move(*made_floor);
  }
  // The same call with the fused calls (forward and backward) forced onto cuDNN and onto our own
  // kernels.
  std::unique_ptr<CudaAttentionBackend> cudnn_be, own_be;
  if (with_floor) {
    for (auto [own, dst] :
         {std::pair<bool, std::unique_ptr<CudaAttentionBackend>*>{false, &cudnn_be},
          {true, &own_be}}) {
      CudaBackendOptions o = options;
      o.stream = stream;
      o.forward_kernel = own ? CudaBackendOptions::ForwardKernel::kOwnHopper
                             : CudaBackendOptions::ForwardKernel::kCudnn;
      o.backward_kernel = own ? CudaBackendOptions::BackwardKernel::kOwnHopper
                              : CudaBackendOptions::BackwardKernel::kCudnn;
      absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> made_other = NewCudaBackend(o);
      if (!made_other.ok()) return made_other.status();
      *dst = std::move(*made_other);
    }
  }
  auto call_on = [&](CudaAttentionBackend* b) -> absl::Status {
    BENCH_OK(b->Forward(spec, fa));
    if (c.backward) BENCH_OK(b->Backward(spec, ba));
    return absl::OkStatus();
  };
  // Warm-up builds the plans (and the floor's and other backends' memory is taken before the
  // memory snapshot below, which is dattn's alone); then measure the steady state.
  if (with_floor) {
    BENCH_OK(call_on(cudnn_be.get()));
    BENCH_OK(call_on(own_be.get()));
  }
  BENCH_OK(call());
  BENCH_OK(be.Synchronize());
  uint64_t zero = 0;
  BENCH_CUDA(cudaMemPoolSetAttribute(be.pool(), cudaMemPoolAttrUsedMemHigh, &zero));
  BENCH_CUDA(cudaMemPoolSetAttribute(be.pool(), cudaMemPoolAttrReservedMemHigh, &zero));
  size_t free1 = 0;
  BENCH_CUDA(cudaMemGetInfo(&free1, &total));
  uint64_t reserved1 = 0;
  BENCH_CUDA(cudaMemPoolGetAttribute(be.pool(), cudaMemPoolAttrReservedMemCurrent, &reserved1));
  if (time_only != nullptr) {  // a variant of the backend: its time (and workspace) is all we want
    absl::StatusOr<double> ms = TimeIt(stream, 2, c.iters, call);
    if (!ms.ok()) return ms.status();
    *time_only = *ms;
    if (workspace_only != nullptr) {
      uint64_t high = 0;
      BENCH_CUDA(cudaMemPoolGetAttribute(be.pool(), cudaMemPoolAttrUsedMemHigh, &high));
      *workspace_only = static_cast<int64_t>(high);
    }
    return absl::OkStatus();
  }
  // Paired rounds: dattn, the floor, and dattn forced onto cuDNN and onto our own kernel, one
  // after the other, kRounds times; each figure is the median over rounds of per-round medians,
  // and each ratio the median of the per-round ratios. Clocks drift by several percent over
  // seconds on these cards (power and temperature), so only figures taken side by side are
  // compared.
  std::vector<double> t_dattn, t_floor, t_cudnn, t_own, q_dattn, q_cudnn, q_own;
  for (int round = 0; round < kRounds; ++round) {
    absl::StatusOr<double> ms = TimeIt(stream, 2, iters, call);
    if (!ms.ok()) return ms.status();
    t_dattn.push_back(*ms);
    if (!with_floor) continue;
    absl::StatusOr<double> fl = TimeIt(stream, 2, iters, [&] { return floor->Run(); });
    if (!fl.ok()) return fl.status();
    t_floor.push_back(*fl);
    absl::StatusOr<double> cu = TimeIt(stream, 2, iters, [&] { return call_on(cudnn_be.get()); });
    if (!cu.ok()) return cu.status();
    t_cudnn.push_back(*cu);
    absl::StatusOr<double> ow = TimeIt(stream, 2, iters, [&] { return call_on(own_be.get()); });
    if (!ow.ok()) return ow.status();
    t_own.push_back(*ow);
    q_dattn.push_back(*ms / *fl);
    q_cudnn.push_back(*cu / *fl);
    q_own.push_back(*ow / *fl);
  }
  r.dattn_ms = Median(t_dattn);
  if (with_floor) {
    r.floor_ms = Median(t_floor);
    r.cudnn_ms = Median(t_cudnn);
    r.own_ms = Median(t_own);
    r.ratio = Median(q_dattn);
    r.cudnn_ratio = Median(q_cudnn);
    r.own_ratio = Median(q_own);
    r.own_calls = own_be->stats().own_hopper_calls;
  }
  floor.reset();
  if (c.breakdown) {
    const float inv_g = c.mode == AttentionMode::kGrouped ? 1.0f / 4 : 1.0f;
    absl::StatusOr<double> strided = TimeFused(spec, c, dtype, stream, &t, inv_g);
    if (!strided.ok()) return strided.status();
    r.strided_ms = *strided;
    absl::StatusOr<double> plain = TimeFused(spec, c, dtype, stream, &t, 1.0f);
    if (!plain.ok()) return plain.status();
    r.strided_plain_ms = *plain;
  }
  BENCH_OK(be.Synchronize());
  size_t free2 = 0;
  BENCH_CUDA(cudaMemGetInfo(&free2, &total));
  uint64_t used_high = 0, reserved_high = 0, reserved2 = 0;
  BENCH_CUDA(cudaMemPoolGetAttribute(be.pool(), cudaMemPoolAttrUsedMemHigh, &used_high));
  BENCH_CUDA(cudaMemPoolGetAttribute(be.pool(), cudaMemPoolAttrReservedMemHigh, &reserved_high));
  BENCH_CUDA(cudaMemPoolGetAttribute(be.pool(), cudaMemPoolAttrReservedMemCurrent, &reserved2));
  // Output sanity: nothing left poisoned or non-finite.
  unsigned long long* bad = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(*bad)));
  BENCH_CUDA(cudaMemset(bad, 0, sizeof(*bad)));
  BENCH_CUDA(cuda::LaunchCountNonFinite(t[3], cuda::ElemType::kBF16, elems, bad, stream));
  if (c.backward) {
    for (int i = 5; i < 8; ++i) {
      BENCH_CUDA(cuda::LaunchCountNonFinite(t[i], cuda::ElemType::kBF16, elems, bad, stream));
    }
  }
  unsigned long long host_bad = 0;
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaMemcpy(&host_bad, bad, sizeof(host_bad), cudaMemcpyDeviceToHost));
  cudaFree(bad);
  if (host_bad != 0) {
    return absl::InternalError(absl::StrCat(host_bad, " non-finite output elements"));
  }

  r.pool_used_high = static_cast<int64_t>(used_high);
  r.pool_reserved_high = static_cast<int64_t>(reserved_high);
  // Device memory the timed calls took outside the pool (cuDNN, module loads): normally none.
  r.other_growth =
      std::max<int64_t>(0, (static_cast<int64_t>(free1) - static_cast<int64_t>(free2)) -
                               (static_cast<int64_t>(reserved2) - static_cast<int64_t>(reserved1)));
  // The peak the call needs: tensors + the workspace it allocated (the pool's used high-water
  // mark); the pool's reservation (rounded up to its granularity) is reported beside it.
  r.measured_total = r.tensor_bytes + r.pool_used_high + r.other_growth;
  absl::StatusOr<cuda::CudaMemoryPlan> plan =
      cuda::PlanCudaMemory(spec, 1, c.n, c.heads, c.dim, dtype, c.backward);
  if (!plan.ok()) return plan.status();
  r.planned_workspace = plan->workspace_bytes;
  r.planned_total =
      plan->inputs_bytes + plan->outputs_bytes + plan->lse_bytes + plan->workspace_bytes;
  const CudaBackendStats st = be.stats();
  r.cudnn_calls = st.cudnn_calls;
  r.fallbacks = st.cudnn_fallbacks;
  r.p_scale_passes = st.p_scale_passes;
  r.library_ws = st.max_library_workspace;
  if (st.cudnn_fallbacks > 0) {
    std::printf("  note: %lld calls fell back to the own kernel: %s\n",
                static_cast<long long>(st.cudnn_fallbacks), be.last_fallback_reason().c_str());
  }
  const double flops =
      dilation::NominalForwardFlops(spec, 1, c.n, c.heads, c.dim) * (c.backward ? 3.5 : 1.0);
  r.tflops = flops / (r.dattn_ms * 1e-3) / 1e12;
  r.ran = true;
  (void)free0;
  return absl::OkStatus();
}

std::string Mib(int64_t b) { return absl::StrFormat("%.1f", b / 1048576.0); }

}  // namespace
}  // namespace dattn

int main(int argc, char** argv) {
  using dattn::AttentionMode;
  using dattn::RowConfig;
  using dattn::RowResult;
  std::string suite = "issue", csv, only;
  bool longest = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--suite=", 0) == 0) suite = a.substr(8);
    if (a.rfind("--csv=", 0) == 0) csv = a.substr(6);
    if (a == "--longest") longest = true;
    if (a.rfind("--only=", 0) == 0) only = a.substr(7);
  }
  std::vector<RowConfig> rows;
  const int64_t big = int64_t{1} << 20, small = int64_t{1} << 16;
  for (auto [h, d] : {std::pair<int64_t, int64_t>{16, 64}, {8, 128}}) {
    const std::string hd = absl::StrCat(" H=", h, " D=", d);
    if (suite == "none") continue;
    if (suite == "parity") {
      // The standalone figure that scripts/gpu-ring-check.sh compares a 1-GPU service job with.
      if (h == 16) {
        rows.push_back({"parity grouped fwd N=2^20" + hd, AttentionMode::kGrouped, big, h, d, false,
                        false, 20});
      }
      continue;
    }
    if (suite == "grouped-fwd") {
      rows.push_back(
          {"grouped fwd N=2^20" + hd, AttentionMode::kGrouped, big, h, d, false, false, 20, true});
      continue;
    }
    if (suite == "fwd-bwd") {
      rows.push_back({"grouped fwd+bwd N=2^16" + hd, AttentionMode::kGrouped, small, h, d, true,
                      false, 50, true});
      rows.push_back({"mixture fwd+bwd N=2^16" + hd, AttentionMode::kMixture, small, h, d, true,
                      false, 30, true});
      rows.push_back({"grouped causal fwd+bwd N=2^16" + hd, AttentionMode::kGrouped, small, h, d,
                      true, true, 50});
      continue;
    }
    if (suite == "quick") {
      rows.push_back({"grouped fwd N=2^16" + hd, AttentionMode::kGrouped, small, h, d, false});
      rows.push_back({"grouped fwd+bwd N=2^14" + hd, AttentionMode::kGrouped, 1 << 14, h, d, true});
      continue;
    }
    rows.push_back(
        {"grouped fwd N=2^20" + hd, AttentionMode::kGrouped, big, h, d, false, false, 20, true});
    rows.push_back({"grouped fwd+bwd N=2^16" + hd, AttentionMode::kGrouped, small, h, d, true,
                    false, 50, true});
    rows.push_back(
        {"mixture fwd N=2^20" + hd, AttentionMode::kMixture, big, h, d, false, false, 10, true});
    rows.push_back({"mixture fwd+bwd N=2^16" + hd, AttentionMode::kMixture, small, h, d, true,
                    false, 30, true});
    rows.push_back(
        {"grouped causal fwd N=2^20" + hd, AttentionMode::kGrouped, big, h, d, false, true});
  }
  if (!only.empty()) {
    rows.erase(
        std::remove_if(rows.begin(), rows.end(),
                       [&](const RowConfig& c) { return c.name.find(only) == std::string::npos; }),
        rows.end());
  }
  std::vector<RowResult> results;
  bool failed = false;
  for (const RowConfig& c : rows) {
    RowResult r;
    r.config = c;
    absl::Status s = dattn::RunRow(r, /*with_floor=*/suite != "parity");
    if (!s.ok()) {
      r.error = std::string(s.message());
      failed = true;
    }
    if (s.ok() && c.breakdown) {
      using GroupScale = dattn::CudaBackendOptions::GroupScale;
      dattn::CudaBackendOptions prob, nooverlap, unchunked, ws5;
      prob.group_scale = GroupScale::kProbabilities;
      nooverlap.overlap_fills = false;
      unchunked.workspace_limit_bytes = int64_t{1} << 32;
      ws5.workspace_limit_bytes = std::max<int64_t>(1, r.one_input / 20);
      RowResult scratch;
      scratch.config = c;
      scratch.config.breakdown = false;
      for (auto [opts, out] : {std::pair<dattn::CudaBackendOptions*, double*>{&prob, &r.prob_ms},
                               {&nooverlap, &r.nooverlap_ms},
                               {&unchunked, &r.unchunked_ms}}) {
        absl::Status vs = dattn::RunRow(scratch, false, *opts, out);
        if (!vs.ok()) std::printf("  variant failed: %s\n", std::string(vs.message()).c_str());
      }
      if (c.backward) {
        absl::Status vs = dattn::RunRow(scratch, false, ws5, &r.ws5_ms, &r.ws5_workspace);
        if (!vs.ok()) std::printf("  variant failed: %s\n", std::string(vs.message()).c_str());
      }
    }
    std::printf(
        "%-36s dattn %8.3f ms  floor %8.3f ms  ratio %5.3f  cuDNN %8.3f ms ratio %5.3f  own "
        "kernel %8.3f ms ratio %5.3f (%lld calls)  %6.1f TFLOP/s  ws %s MiB (%.2f%% "
        "of an input; pool reserved %s, other %s)  planned %s / measured %s MiB  cudnn "
        "calls %lld, fallbacks %lld, 1/G passes %lld, max plan ws %lld B %s\n",
        c.name.c_str(), r.dattn_ms, r.floor_ms, r.ratio, r.cudnn_ms, r.cudnn_ratio, r.own_ms,
        r.own_ratio, static_cast<long long>(r.own_calls), r.tflops,
        dattn::Mib(r.pool_used_high + r.other_growth).c_str(),
        r.one_input > 0 ? 100.0 * (r.pool_used_high + r.other_growth) / r.one_input : 0.0,
        dattn::Mib(r.pool_reserved_high).c_str(), dattn::Mib(r.other_growth).c_str(),
        dattn::Mib(r.planned_total).c_str(), dattn::Mib(r.measured_total).c_str(),
        static_cast<long long>(r.cudnn_calls), static_cast<long long>(r.fallbacks),
        static_cast<long long>(r.p_scale_passes), static_cast<long long>(r.library_ws),
        r.error.c_str());
    std::fflush(stdout);
    results.push_back(r);
  }
  // The longest forward that fits: 2^23, then 9 * 2^20 positions (grouped, bf16, H=16, D=64).
  std::vector<RowResult> longest_rows;
  if (longest) {
    for (int64_t n : {int64_t{8388608}, int64_t{9437184}}) {
      RowResult r;
      r.config = {absl::StrCat("longest grouped fwd N=", n, " H=16 D=64"),
                  AttentionMode::kGrouped,
                  n,
                  16,
                  64,
                  false,
                  false,
                  3};
      absl::Status s = dattn::RunRow(r, /*with_floor=*/false);
      if (!s.ok()) r.error = std::string(s.message());
      std::printf("%-40s %s %8.3f ms planned %s MiB measured %s MiB %s\n", r.config.name.c_str(),
                  r.ran ? "ran" : "FAILED", r.dattn_ms, dattn::Mib(r.planned_total).c_str(),
                  dattn::Mib(r.measured_total).c_str(), r.error.c_str());
      std::fflush(stdout);
      longest_rows.push_back(r);
      if (!r.ran) break;
    }
  }
  cudaDeviceProp props;
  cudaGetDeviceProperties(&props, 0);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("\n== CUDA engine benchmark: %s, cuDNN %lld, %s ==\n", props.name,
              static_cast<long long>(dattn::cuda::CudnnSdpa::LoadedVersion()), date);
  std::printf(
      "| row | dattn ms | floor ms | dattn/floor | cuDNN fwd ms | cuDNN/floor | own kernel ms | "
      "own/floor | TFLOP/s | workspace MiB (%% of input) | planned MiB | measured MiB | plan err "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const RowResult& r : results) {
    if (!r.error.empty()) {
      std::printf("| %s | error: %s |\n", r.config.name.c_str(), r.error.c_str());
      continue;
    }
    const int64_t ws = r.pool_used_high + r.other_growth;
    std::printf(
        "| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %s (%.2f%%) | %s | %s | "
        "%+.1f%% |\n",
        r.config.name.c_str(), r.dattn_ms, r.floor_ms, r.ratio, r.cudnn_ms, r.cudnn_ratio, r.own_ms,
        r.own_ratio, r.tflops, dattn::Mib(ws).c_str(), 100.0 * ws / r.one_input,
        dattn::Mib(r.planned_total).c_str(), dattn::Mib(r.measured_total).c_str(),
        100.0 * (static_cast<double>(r.planned_total) - r.measured_total) / r.measured_total);
  }
  std::printf(
      "\n| breakdown (ms) | dattn | fused calls alone, on dattn's strided views | same, "
      "1/G on P in the graph | dattn, 1/G on P in the graph | dattn, fills not overlapped | "
      "dattn, unchunked | dattn at a 5%% workspace limit (workspace MiB) | floor "
      "|\n|---|---|---|---|---|---|---|---|---|\n");
  for (const RowResult& r : results) {
    if (!r.config.breakdown || !r.error.empty()) continue;
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %.3f |\n",
                r.config.name.c_str(), r.dattn_ms, r.strided_plain_ms, r.strided_ms, r.prob_ms,
                r.nooverlap_ms, r.unchunked_ms,
                r.config.backward
                    ? absl::StrFormat("%.3f (%s)", r.ws5_ms, dattn::Mib(r.ws5_workspace)).c_str()
                    : "-",
                r.floor_ms);
  }
  for (const RowResult& r : longest_rows) {
    std::printf("| %s | %s | - | - | - | %s | %s | %s | |\n", r.config.name.c_str(),
                r.ran ? absl::StrFormat("%.1f", r.dattn_ms).c_str() : "did not fit",
                dattn::Mib(r.pool_used_high + r.other_growth).c_str(),
                dattn::Mib(r.planned_total).c_str(), dattn::Mib(r.measured_total).c_str());
  }
  if (!csv.empty()) {
    if (FILE* f = std::fopen(csv.c_str(), "w")) {
      std::fprintf(f,
                   "row,dattn_ms,floor_ms,ratio,own_ms,own_ratio,tflops,workspace_bytes,planned_"
                   "total,measured_total,"
                   "tensor_bytes,pool_reserved_high,error\n");
      for (const RowResult& r : results) {
        std::fprintf(f, "%s,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%lld,%lld,%lld,%lld,%lld,%s\n",
                     r.config.name.c_str(), r.dattn_ms, r.floor_ms, r.ratio, r.own_ms, r.own_ratio,
                     r.tflops, static_cast<long long>(r.pool_used_high + r.other_growth),
                     static_cast<long long>(r.planned_total),
                     static_cast<long long>(r.measured_total),
                     static_cast<long long>(r.tensor_bytes),
                     static_cast<long long>(r.pool_reserved_high), r.error.c_str());
      }
      std::fclose(f);
    }
  }
  return failed ? 1 : 0;
}
