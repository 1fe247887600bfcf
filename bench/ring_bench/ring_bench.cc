// Weak-scaling benchmark of the sequence-parallel ring on GPUs (issue 5): one process per GPU, NCCL
// between them, the CUDA block kernels on each, against the single-GPU CUDA backend in the same
// run.
//
// Spec (the issue's): 2^20 tokens per GPU (N = P * 2^20), B = 1, H = 16, D = 64, bf16, grouped,
// w = [4096, 16384, 65536, N], r = [1, 2, 8, 256] (the last pattern's only segment spans every
// rank), causal and not. For each P in --ranks, a forward pass (and forward + backward with
// --backward) is timed on every rank by the host clock around the call (each call ends with the
// stream drained), after a barrier, --iters times after --warmup calls; an iteration's time is the
// slowest rank's, the row's time the median iteration. The one-GPU baseline is the CUDA backend on
// N = 2^20 (w_4 = 2^20), timed the same way (a call plus Synchronize). Effective TFLOP/s per GPU:
// dilation::NominalForwardFlops of the whole problem (the attended blocks only; x3.5 with backward)
// over the time, over P. Efficiency: that over the baseline's figure.
//
// Memory per rank: the shards (q, k, v, out, lse; + dout, dq, dk, dv with backward) plus the high
// water of the ring kernels' pool (every ring buffer and scratch comes from it); also the device
// memory in use as cudaMemGetInfo sees it (CUDA context, NCCL, cuDNN included). Single-device
// footprint: the backend's tensors at N = P * 2^20 plus its pool's high water after one call
// (measured once per P, with the non-causal forward).
//
// Where the time goes (forward rows): every ring process also times the same call without the
// agreement check, and its kernels alone on its local blocks (BeginForward, phase 0's in-place
// blocks, EndForward) with CUDA events; a second table shows them.
//
// --longest: forward on P GPUs at growing shard lengths (--longest_shards, tokens per GPU); each
// row says whether the call ran and its outputs are finite.
//
// Usage: ring_bench [--ranks=1,2,4] [--shard=1048576] [--iters=10] [--warmup=2] [--backward]
//                   [--longest --longest_shards=8388608,9437184] [--csv=path]
// Prints one line per measurement and a table last. Inputs are random (never zeros), outputs
// poisoned with NaN first and checked for non-finite values after the last call.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/attention_spec.h"
#include "engine/comm/multiprocess.h"
#include "engine/comm/nccl_communicator.h"
#include "engine/comm/tcp_store.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_fill.h"
#include "engine/ring/cuda_block_kernels.h"
#include "engine/ring/ring_attention.h"

namespace dattn {
namespace {

using comm::multiprocess::ChildContext;

constexpr int64_t kHeads = 16, kDim = 64;

AttentionSpec BenchSpec(int64_t n, bool causal) {
  AttentionSpec spec;
  spec.segment_lengths = {4096, 16384, 65536, n};
  spec.dilation_rates = {1, 2, 8, 256};
  spec.mode = AttentionMode::kGrouped;
  spec.causal = causal;
  return spec;
}

#define CHILD_CUDA(expr)                                                           \
  do {                                                                             \
    const cudaError_t e_ = (expr);                                                 \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("ERROR rank %d: %s: %s\n", rank, #expr, cudaGetErrorString(e_)); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

#define CHILD_OK(expr)                                                            \
  do {                                                                            \
    const absl::Status s_ = (expr);                                               \
    if (!s_.ok()) {                                                               \
      std::printf("ERROR rank %d: %s: %s\n", rank, #expr, s_.ToString().c_str()); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

int64_t UsedDeviceBytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
  return static_cast<int64_t>(total_b - free_b);
}

// A device tensor (B = 1, rows x H x D or H x rows for lse), freed with the object.
struct Buffer {
  void* ptr = nullptr;
  int64_t bytes = 0;
  ~Buffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

TensorView View(void* p, DType dtype, std::vector<int64_t> shape, int device) {
  return TensorView::Contiguous(p, dtype, std::move(shape), Device::kCuda, device);
}

// Allocates and fills the call's tensors: random inputs, poisoned outputs.
struct Problem {
  Buffer q, k, v, out, lse, dout, dq, dk, dv;
  ForwardArgs fwd;
  BackwardArgs bwd;
  int64_t tensor_bytes = 0;
};

cudaError_t MakeProblem(Problem* p, int64_t len, bool backward, int device, uint64_t seed) {
  const int64_t elems = len * kHeads * kDim;
  const std::vector<int64_t> dims = {1, len, kHeads, kDim};
  std::vector<Buffer*> bufs = {&p->q, &p->k, &p->v, &p->out};
  if (backward) bufs.insert(bufs.end(), {&p->dout, &p->dq, &p->dk, &p->dv});
  for (Buffer* b : bufs) {
    b->bytes = elems * 2;
    if (cudaError_t e = cudaMalloc(&b->ptr, b->bytes); e != cudaSuccess) return e;
    p->tensor_bytes += b->bytes;
  }
  p->lse.bytes = kHeads * len * 4;
  if (cudaError_t e = cudaMalloc(&p->lse.ptr, p->lse.bytes); e != cudaSuccess) return e;
  p->tensor_bytes += p->lse.bytes;
  uint64_t s = seed;
  for (Buffer* b : {&p->q, &p->k, &p->v, &p->dout}) {
    if (b->ptr == nullptr) continue;
    if (cudaError_t e =
            cuda::LaunchFillRandom(b->ptr, cuda::ElemType::kBF16, elems, ++s, 1.0f, nullptr);
        e != cudaSuccess) {
      return e;
    }
  }
  for (Buffer* b : {&p->out, &p->dq, &p->dk, &p->dv}) {
    if (b->ptr == nullptr) continue;
    if (cudaError_t e = cuda::LaunchFillValue(b->ptr, cuda::ElemType::kBF16, elems, NAN, nullptr);
        e != cudaSuccess) {
      return e;
    }
  }
  auto v = [&](Buffer& b) { return View(b.ptr, DType::kBFloat16, dims, device); };
  const TensorView lse = View(p->lse.ptr, DType::kFloat32, {1, kHeads, len}, device);
  p->fwd = ForwardArgs{v(p->q), v(p->k), v(p->v), v(p->out), lse};
  if (backward) {
    p->bwd = BackwardArgs{v(p->q),    v(p->k),  v(p->v),  v(p->out), lse,
                          v(p->dout), v(p->dq), v(p->dk), v(p->dv)};
  }
  return cudaDeviceSynchronize();
}

// Non-finite elements of the outputs (NaN poison left unwritten shows up here).
int64_t NonFinite(const Problem& p, int64_t len, bool backward) {
  unsigned long long* count = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&count), sizeof(*count)) != cudaSuccess) return -1;
  cudaMemset(count, 0, sizeof(*count));
  const int64_t elems = len * kHeads * kDim;
  for (const Buffer* b : {&p.out, &p.dq, &p.dk, &p.dv}) {
    if (b->ptr == nullptr || (!backward && b != &p.out)) continue;
    cuda::LaunchCountNonFinite(b->ptr, cuda::ElemType::kBF16, elems, count, nullptr);
  }
  unsigned long long host = 0;
  cudaMemcpy(&host, count, sizeof(host), cudaMemcpyDeviceToHost);
  cudaFree(count);
  return static_cast<int64_t>(host);
}

// Child "ring": one rank of a ring of ctx.size GPUs.
int RingChild(const ChildContext& ctx) {
  const int rank = ctx.rank, p = ctx.size;
  const int64_t len = ctx.IntArg("shard", int64_t{1} << 20);
  const bool causal = ctx.Arg("causal") == "1";
  const bool backward = ctx.Arg("backward") == "1";
  const int iters = static_cast<int>(ctx.IntArg("iters", 10));
  const int warmup = static_cast<int>(ctx.IntArg("warmup", 2));
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  CHILD_CUDA(cudaSetDevice(rank));
  CHILD_CUDA(cudaFree(nullptr));
  const int64_t used_context = UsedDeviceBytes();
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
      comm::TcpStore::Connect(ctx.store_address);
  CHILD_OK(store.status());
  comm::NcclOptions nopt;
  nopt.device = rank;
  nopt.timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      comm::CreateNcclCommunicator(std::shared_ptr<comm::Store>(std::move(*store)), rank, p, nopt);
  CHILD_OK(comm.status());
  ring::CudaBlockKernelOptions kopt;
  kopt.device = rank;
  kopt.sync_timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<ring::CudaBlockKernels>> kernels = ring::NewCudaBlockKernels(kopt);
  CHILD_OK(kernels.status());
  Problem prob;
  CHILD_CUDA(MakeProblem(&prob, len, backward, rank, 1000 + 17 * rank));
  const int64_t n = len * p;
  const AttentionSpec spec = BenchSpec(n, causal);
  ring::RingAttention ring_attn(comm->get(), kernels->get());
  absl::StatusOr<ring::RingPlan> plan = ring_attn.Plan(spec, n, prob.fwd.q, backward);
  CHILD_OK(plan.status());
  auto call = [&]() -> absl::Status {
    absl::Status s = ring_attn.Forward(spec, n, prob.fwd);
    if (s.ok() && backward) s = ring_attn.Backward(spec, n, prob.bwd);
    return s;
  };
  for (int i = 0; i < warmup; ++i) CHILD_OK(call());
  std::string times;
  for (int i = 0; i < iters; ++i) {
    CHILD_OK((*comm)->Barrier());
    const absl::Time t0 = absl::Now();
    CHILD_OK(call());
    absl::StrAppend(&times, i == 0 ? "" : ",",
                    absl::StrFormat("%.4f", absl::ToDoubleMilliseconds(absl::Now() - t0)));
  }
  const int64_t bad = NonFinite(prob, len, backward);
  // Where the time goes (forward only): the same calls without the agreement check, and the
  // kernels alone on this rank's local work (phase 0's blocks in place), timed with events.
  std::string nocheck_times, begin_times, local_times, end_times;
  if (!backward && ctx.Arg("breakdown", "1") == "1") {
    ring::RingOptions nopt_ring;
    nopt_ring.check_agreement = false;
    ring::RingAttention unchecked(comm->get(), kernels->get(), nopt_ring);
    CHILD_OK(unchecked.Forward(spec, n, prob.fwd));
    for (int i = 0; i < iters; ++i) {
      CHILD_OK((*comm)->Barrier());
      const absl::Time t0 = absl::Now();
      CHILD_OK(unchecked.Forward(spec, n, prob.fwd));
      absl::StrAppend(&nocheck_times, i == 0 ? "" : ",",
                      absl::StrFormat("%.4f", absl::ToDoubleMilliseconds(absl::Now() - t0)));
    }
    absl::StatusOr<ring::RingGeometry> geo = ring::RingGeometry::Create(
        spec, ring::RingShape{1, n, kHeads, kDim, p}, rank, DType::kBFloat16);
    CHILD_OK(geo.status());
    std::vector<ring::BlockTask> tasks;
    for (const ring::ComputeStep& c : plan->phases[0].computes) {
      if (c.kv_buffer >= 0) continue;
      tasks.push_back(
          {c.pattern, c.segment_begin, c.segment_end, c.origin, nullptr, nullptr, false});
    }
    cudaStream_t s = (*kernels)->cuda_stream();
    cudaEvent_t ev[4];
    for (cudaEvent_t& e : ev) CHILD_CUDA(cudaEventCreate(&e));
    for (int i = 0; i < iters + 1; ++i) {
      CHILD_CUDA(cudaEventRecord(ev[0], s));
      CHILD_OK((*kernels)->BeginForward(*geo, prob.fwd));
      CHILD_CUDA(cudaEventRecord(ev[1], s));
      CHILD_OK((*kernels)->Forward(*geo, prob.fwd, tasks));
      CHILD_CUDA(cudaEventRecord(ev[2], s));
      CHILD_OK((*kernels)->EndForward(*geo, prob.fwd));
      CHILD_CUDA(cudaEventRecord(ev[3], s));
      CHILD_CUDA(cudaEventSynchronize(ev[3]));
      if (i == 0) continue;  // warm-up
      float ms[3] = {0, 0, 0};
      for (int k = 0; k < 3; ++k) CHILD_CUDA(cudaEventElapsedTime(&ms[k], ev[k], ev[k + 1]));
      const char* sep = i == 1 ? "" : ",";
      absl::StrAppend(&begin_times, sep, absl::StrFormat("%.4f", ms[0]));
      absl::StrAppend(&local_times, sep, absl::StrFormat("%.4f", ms[1]));
      absl::StrAppend(&end_times, sep, absl::StrFormat("%.4f", ms[2]));
    }
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  }
  const ring::CudaBlockKernelStats st = (*kernels)->stats();
  std::printf(
      "RESULT kind=ring P=%d rank=%d shard=%lld causal=%d backward=%d times=%s nonfinite=%lld "
      "tensor_bytes=%lld pool_high=%lld used=%lld used_context=%lld plan_buffer_bytes=%lld "
      "plan_bytes_sent=%lld cudnn=%lld own=%lld fallbacks=%lld nocheck=%s begin=%s local=%s "
      "end=%s\n",
      p, rank, static_cast<long long>(len), causal, backward, times.c_str(),
      static_cast<long long>(bad), static_cast<long long>(prob.tensor_bytes),
      static_cast<long long>(st.pool_high_water), static_cast<long long>(UsedDeviceBytes()),
      static_cast<long long>(used_context), static_cast<long long>(plan->buffer_bytes),
      static_cast<long long>(plan->bytes_sent), static_cast<long long>(st.cudnn_calls),
      static_cast<long long>(st.kernel_calls), static_cast<long long>(st.cudnn_fallbacks),
      nocheck_times.empty() ? "-" : nocheck_times.c_str(),
      begin_times.empty() ? "-" : begin_times.c_str(),
      local_times.empty() ? "-" : local_times.c_str(), end_times.empty() ? "-" : end_times.c_str());
  std::fflush(stdout);
  return bad == 0 ? 0 : 1;
}
DATTN_REGISTER_CHILD("ring", RingChild);

// Child "backend": the single-GPU CUDA backend on N = shard tokens (w_4 = N), on GPU 0.
int BackendChild(const ChildContext& ctx) {
  const int rank = 0;
  const int64_t len = ctx.IntArg("shard", int64_t{1} << 20);
  const bool causal = ctx.Arg("causal") == "1";
  const bool backward = ctx.Arg("backward") == "1";
  const int iters = static_cast<int>(ctx.IntArg("iters", 10));
  const int warmup = static_cast<int>(ctx.IntArg("warmup", 2));
  CHILD_CUDA(cudaSetDevice(0));
  CHILD_CUDA(cudaFree(nullptr));
  const int64_t used_context = UsedDeviceBytes();
  absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend();
  CHILD_OK(backend.status());
  Problem prob;
  CHILD_CUDA(MakeProblem(&prob, len, backward, 0, 5000));
  const AttentionSpec spec = BenchSpec(len, causal);
  auto call = [&]() -> absl::Status {
    absl::Status s = (*backend)->Forward(spec, prob.fwd);
    if (s.ok() && backward) s = (*backend)->Backward(spec, prob.bwd);
    if (s.ok()) s = (*backend)->Synchronize();
    return s;
  };
  for (int i = 0; i < warmup; ++i) CHILD_OK(call());
  std::string times;
  for (int i = 0; i < iters; ++i) {
    const absl::Time t0 = absl::Now();
    CHILD_OK(call());
    absl::StrAppend(&times, i == 0 ? "" : ",",
                    absl::StrFormat("%.4f", absl::ToDoubleMilliseconds(absl::Now() - t0)));
  }
  const int64_t bad = NonFinite(prob, len, backward);
  uint64_t high = 0;
  cudaMemPoolGetAttribute((*backend)->pool(), cudaMemPoolAttrReservedMemHigh, &high);
  std::printf(
      "RESULT kind=backend P=1 rank=0 shard=%lld causal=%d backward=%d times=%s nonfinite=%lld "
      "tensor_bytes=%lld pool_high=%lld used=%lld used_context=%lld fallbacks=%lld\n",
      static_cast<long long>(len), causal, backward, times.c_str(), static_cast<long long>(bad),
      static_cast<long long>(prob.tensor_bytes), static_cast<long long>(high),
      static_cast<long long>(UsedDeviceBytes()), static_cast<long long>(used_context),
      static_cast<long long>((*backend)->stats().cudnn_fallbacks));
  std::fflush(stdout);
  return bad == 0 ? 0 : 1;
}
DATTN_REGISTER_CHILD("backend", BackendChild);

// ---- Parent: launch, collect the RESULT lines, tabulate.

using Fields = std::map<std::string, std::string>;

std::vector<Fields> Results(const std::vector<comm::multiprocess::ChildResult>& children) {
  std::vector<Fields> out;
  for (const auto& c : children) {
    for (absl::string_view line : absl::StrSplit(c.log, '\n')) {
      if (!absl::ConsumePrefix(&line, "RESULT ")) continue;
      Fields f;
      for (absl::string_view kv : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        const size_t eq = kv.find('=');
        if (eq == absl::string_view::npos) continue;
        f[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
      }
      out.push_back(f);
    }
  }
  return out;
}

int64_t Int(const Fields& f, const std::string& k) {
  int64_t v = 0;
  auto it = f.find(k);
  if (it == f.end() || !absl::SimpleAtoi(it->second, &v)) return -1;
  return v;
}

std::vector<double> Times(const Fields& f, const std::string& key = "times") {
  std::vector<double> t;
  auto it = f.find(key);
  if (it == f.end()) return t;
  for (absl::string_view s : absl::StrSplit(it->second, ',')) {
    double v = 0;
    if (absl::SimpleAtod(s, &v)) t.push_back(v);
  }
  return t;
}

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Measured {
  bool ok = false;
  std::string error;
  double ms = -1;           // median over iterations of the slowest rank's time
  int64_t rank_bytes = -1;  // max over ranks: tensors + pool high water
  int64_t used_bytes = -1;  // max over ranks: cudaMemGetInfo's used
  int64_t nonfinite = 0;
  int64_t plan_bytes_sent = -1;
  int64_t fallbacks = 0;
  // Medians over iterations of the slowest rank: the call without the agreement check, and the
  // kernels alone on the local work (BeginForward, Forward of phase 0's in-place blocks,
  // EndForward); -1 when not measured.
  double nocheck_ms = -1, begin_ms = -1, local_ms = -1, end_ms = -1;
};

// Per iteration the slowest rank's value of `key`, then the median.
double SlowestMedian(const std::vector<Fields>& fields, const std::string& key) {
  std::vector<std::vector<double>> times;
  for (const Fields& f : fields) times.push_back(Times(f, key));
  if (times.empty() || times[0].empty()) return -1;
  std::vector<double> per_iter;
  for (size_t i = 0; i < times[0].size(); ++i) {
    double worst = 0;
    for (const auto& t : times) worst = std::max(worst, i < t.size() ? t[i] : 0.0);
    per_iter.push_back(worst);
  }
  return Median(per_iter);
}

Measured Launch(const std::string& child, int size, std::map<std::string, std::string> args,
                absl::Duration timeout) {
  comm::multiprocess::LaunchOptions launch;
  launch.child = child;
  launch.size = size;
  launch.args = std::move(args);
  launch.timeout = timeout;
  Measured m;
  absl::StatusOr<std::vector<comm::multiprocess::ChildResult>> results =
      comm::multiprocess::RunChildren(launch);
  if (!results.ok()) {
    m.error = results.status().ToString();
    return m;
  }
  const std::vector<Fields> fields = Results(*results);
  bool all_exit = true;
  for (const auto& r : *results) all_exit = all_exit && r.exited && r.exit_code == 0;
  if (!all_exit || static_cast<int>(fields.size()) != size) {
    const std::string report = comm::multiprocess::Describe(*results);
    m.error = report.substr(0, 3000);
    std::printf("%s\n", report.c_str());
  }
  if (fields.empty()) return m;
  std::vector<std::vector<double>> times;
  for (const Fields& f : fields) {
    times.push_back(Times(f));
    m.rank_bytes = std::max(m.rank_bytes, Int(f, "tensor_bytes") + Int(f, "pool_high"));
    m.used_bytes = std::max(m.used_bytes, Int(f, "used"));
    m.nonfinite += std::max<int64_t>(0, Int(f, "nonfinite"));
    m.plan_bytes_sent = std::max(m.plan_bytes_sent, Int(f, "plan_bytes_sent"));
    m.fallbacks += std::max<int64_t>(0, Int(f, "fallbacks"));
  }
  std::vector<double> per_iter;
  for (size_t i = 0; i < times[0].size(); ++i) {
    double worst = 0;
    for (const auto& t : times) worst = std::max(worst, i < t.size() ? t[i] : 0.0);
    per_iter.push_back(worst);
  }
  m.ms = Median(per_iter);
  m.nocheck_ms = SlowestMedian(fields, "nocheck");
  m.begin_ms = SlowestMedian(fields, "begin");
  m.local_ms = SlowestMedian(fields, "local");
  m.end_ms = SlowestMedian(fields, "end");
  m.ok = all_exit && static_cast<int>(fields.size()) == size && m.nonfinite == 0;
  return m;
}

double Mib(int64_t b) { return static_cast<double>(b) / (1 << 20); }

}  // namespace
}  // namespace dattn

int main(int argc, char** argv) {
  using namespace dattn;  // NOLINT
  if (std::optional<int> code = comm::multiprocess::MaybeRunChild(argc, argv)) return *code;
  std::vector<int> ranks = {1, 2, 4};
  int64_t shard = int64_t{1} << 20;
  int iters = 10, warmup = 2;
  bool with_backward = false, longest = false, weak = true;
  std::vector<int64_t> longest_shards = {int64_t{8} << 20, int64_t{9} << 20};
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--ranks=")) {
      ranks.clear();
      for (absl::string_view s : absl::StrSplit(a, ',')) {
        int v = 0;
        if (absl::SimpleAtoi(s, &v)) ranks.push_back(v);
      }
    } else if (absl::ConsumePrefix(&a, "--shard=")) {
      (void)absl::SimpleAtoi(a, &shard);
    } else if (absl::ConsumePrefix(&a, "--iters=")) {
      (void)absl::SimpleAtoi(a, &iters);
    } else if (absl::ConsumePrefix(&a, "--warmup=")) {
      (void)absl::SimpleAtoi(a, &warmup);
    } else if (a == "--backward") {
      with_backward = true;
    } else if (a == "--longest") {
      longest = true;
    } else if (a == "--no_weak") {
      weak = false;
    } else if (absl::ConsumePrefix(&a, "--longest_shards=")) {
      longest_shards.clear();
      for (absl::string_view s : absl::StrSplit(a, ',')) {
        int64_t v = 0;
        if (absl::SimpleAtoi(s, &v)) longest_shards.push_back(v);
      }
    } else if (absl::ConsumePrefix(&a, "--csv=")) {
      csv = std::string(a);
    }
  }
  const int gpus = comm::CudaDeviceCount();
  std::printf("ring_bench: %d GPUs visible; shard %lld tokens per GPU, H=%lld D=%lld bf16\n", gpus,
              static_cast<long long>(shard), static_cast<long long>(kHeads),
              static_cast<long long>(kDim));
  std::vector<std::string> table, csv_rows, breakdown;
  breakdown.push_back(
      "| causal | P | ring call ms | same without agreement check | kernels alone: BeginForward "
      "| local blocks | EndForward | 1-GPU backend ms |");
  breakdown.push_back("|---|---|---|---|---|---|---|---|");
  bool failed = false;
  auto flops = [&](int64_t n, bool causal, bool backward) {
    return dilation::NominalForwardFlops(BenchSpec(n, causal), 1, n, kHeads, kDim) *
           (backward ? 3.5 : 1.0);
  };
  if (weak) {
    table.push_back(
        "| pass | causal | P | ms (median, slowest rank) | eff. TFLOP/s per GPU | efficiency vs 1 "
        "GPU "
        "| per-rank MiB (tensors + pool) | single-device MiB / P | ratio | used MiB "
        "(cudaMemGetInfo) "
        "| bytes sent per rank |");
    table.push_back("|---|---|---|---|---|---|---|---|---|---|---|");
    for (bool backward :
         with_backward ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      for (bool causal : {false, true}) {
        std::map<std::string, std::string> args = {{"shard", absl::StrCat(shard)},
                                                   {"causal", causal ? "1" : "0"},
                                                   {"backward", backward ? "1" : "0"},
                                                   {"iters", absl::StrCat(iters)},
                                                   {"warmup", absl::StrCat(warmup)}};
        const char* pass = backward ? "fwd+bwd" : "fwd";
        const Measured base = Launch("backend", 1, args, absl::Seconds(300));
        const double base_tflops =
            base.ms > 0 ? flops(shard, causal, backward) / (base.ms * 1e9) : 0;
        std::printf("backend %s causal=%d N=%lld: %.3f ms, %.1f TFLOP/s %s\n", pass, causal,
                    static_cast<long long>(shard), base.ms, base_tflops,
                    base.ok ? "" : base.error.c_str());
        failed = failed || !base.ok;
        table.push_back(absl::StrFormat(
            "| %s | %d | 1 GPU backend | %.3f | %.1f | 1.000 | %.0f | %.0f | 1.000 | %.0f | 0 |",
            pass, causal, base.ms, base_tflops, Mib(base.rank_bytes), Mib(base.rank_bytes),
            Mib(base.used_bytes)));
        csv_rows.push_back(absl::StrFormat(
            "%s,%d,backend,1,%.4f,%.2f,1.0,%lld,%lld,%lld", pass, causal, base.ms, base_tflops,
            static_cast<long long>(base.rank_bytes), static_cast<long long>(base.rank_bytes),
            static_cast<long long>(base.used_bytes)));
        for (int p : ranks) {
          if (p > gpus) {
            table.push_back(absl::StrFormat("| %s | %d | %d | not run: %d GPUs | | | | | | | |",
                                            pass, causal, p, gpus));
            continue;
          }
          const Measured m = Launch("ring", p, args, absl::Seconds(300));
          const int64_t n = shard * p;
          const double tflops = m.ms > 0 ? flops(n, causal, backward) / (m.ms * 1e9) / p : 0;
          // The single-device footprint at N = P * shard, for the memory ratio (one call, no timing
          // that matters).
          Measured single = base;
          if (p > 1 && !causal && !backward) {
            std::map<std::string, std::string> sargs = args;
            sargs["shard"] = absl::StrCat(n);
            sargs["iters"] = "1";
            sargs["warmup"] = "0";
            single = Launch("backend", 1, sargs, absl::Seconds(300));
          }
          const bool have_single = p == 1 || (!causal && !backward);
          const double single_per =
              have_single && single.rank_bytes > 0 ? Mib(single.rank_bytes) / p : -1;
          std::printf("ring %s causal=%d P=%d: %.3f ms, %.1f TFLOP/s per GPU, %.3f of 1 GPU; %s\n",
                      pass, causal, p, m.ms, tflops, base_tflops > 0 ? tflops / base_tflops : 0,
                      m.ok ? "ok" : m.error.c_str());
          failed = failed || !m.ok;
          if (!backward) {
            breakdown.push_back(
                absl::StrFormat("| %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |", causal, p,
                                m.ms, m.nocheck_ms, m.begin_ms, m.local_ms, m.end_ms, base.ms));
          }
          table.push_back(absl::StrFormat(
              "| %s | %d | %d | %.3f | %.1f | %.3f | %.0f | %.0f%s | %.3f | %.0f | %lld |", pass,
              causal, p, m.ms, tflops, base_tflops > 0 ? tflops / base_tflops : 0,
              Mib(m.rank_bytes), single_per, single.ok ? "" : " (failed)",
              single_per > 0 ? Mib(m.rank_bytes) / single_per : 0, Mib(m.used_bytes),
              static_cast<long long>(m.plan_bytes_sent)));
          csv_rows.push_back(absl::StrFormat(
              "%s,%d,ring,%d,%.4f,%.2f,%.4f,%lld,%lld,%lld", pass, causal, p, m.ms, tflops,
              base_tflops > 0 ? tflops / base_tflops : 0, static_cast<long long>(m.rank_bytes),
              static_cast<long long>(have_single ? single.rank_bytes / std::max(1, p) : -1),
              static_cast<long long>(m.used_bytes)));
        }
      }
    }
  }
  if (longest) {
    const int p = std::min(gpus, ranks.empty() ? 4 : *std::max_element(ranks.begin(), ranks.end()));
    for (int64_t len : longest_shards) {
      std::map<std::string, std::string> args = {{"shard", absl::StrCat(len)},
                                                 {"causal", "0"},
                                                 {"backward", "0"},
                                                 {"iters", "1"},
                                                 {"warmup", "1"}};
      const Measured m = Launch("ring", p, args, absl::Seconds(300));
      const std::string line = absl::StrFormat(
          "| longest fwd | P=%d | N=%lld (%lld per GPU) | %s | %.1f ms | used %.0f MiB per rank |",
          p, static_cast<long long>(len * p), static_cast<long long>(len),
          m.ok ? "ran, finite" : "FAILED", m.ms, Mib(m.used_bytes));
      std::printf("%s %s\n", line.c_str(), m.ok ? "" : m.error.c_str());
      table.push_back(line);
      if (!m.ok) break;
    }
  }
  if (!csv.empty()) {
    if (FILE* f = std::fopen(csv.c_str(), "w")) {
      std::fprintf(f,
                   "pass,causal,kind,P,ms,tflops_per_gpu,efficiency,rank_bytes,single_bytes_per_p,"
                   "used_bytes\n");
      for (const std::string& r : csv_rows) std::fprintf(f, "%s\n", r.c_str());
      std::fclose(f);
    }
  }
  std::printf("\n");
  if (weak) {
    for (const std::string& line : breakdown) std::printf("%s\n", line.c_str());
    std::printf("\n");
  }
  for (const std::string& line : table) std::printf("%s\n", line.c_str());
  return failed ? 1 : 0;
}
