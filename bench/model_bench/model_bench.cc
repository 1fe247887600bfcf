// Benchmark of the LongNet model's training step on one GPU (issue 15): the base shape (d = 768,
// 12 layers, 12 heads, FFN 3072, byte vocabulary; segments 2048..32768, rates 1, 2, 4, 6, 12;
// causal, grouped) at 32K and 256K tokens per sequence, B = 1.
//
// Rows:
//   ceilings  a device-to-device copy (bytes read + written over time) and an 8192^3 bf16 GEMM
//             through our cuBLASLt wrapper: the two rates every kernel below is held against.
//   kernels   each kernel of model/cuda/model_kernels.h and each GEMM shape of the step at
//             M = 32768, median of 20 CUDA-event timings after warm-up: bytes or FLOPs, rate, the
//             floor (bytes / copy rate or FLOPs / GEMM rate) and time over floor.
//   steps     a full training step (Forward with the loss read back, Backward, CudaAdamW::Step):
//             median of --steps timed steps after 2 warm-up steps; tokens/s, MFU (CountFlops'
//             forward + backward over the step time over 989 TFLOP/s, the H100/H200 dense bf16
//             peak), the phases, and the device memory the step took (cudaMemGetInfo: in use after
//             the steps less in use before the model existed) against PlanTrainingMemory.
//   longest   with activation checkpointing (and recomputed norms): the longest of the candidate
//             lengths whose plan fits the free memory, run for 2 steps (--longest).
//   prefill   (--prefill=N, issue 18) a serving prefill of N tokens: the model's forward pass with
//             the log-probability and loss of every token (what Score computes; TrainableModel::
//             Evaluate with targets, the loss read back), on each ring size of --ranks (S GPUs in
//             one process, each rank N / S tokens, the ring's attention over NCCL; activation
//             checkpointing, so that a rank keeps only each block's input). Median of --steps
//             timed calls after one warm-up, each rank timed from a barrier to its loss on the
//             host, the call's time the slowest rank's. Floors: the forward's FLOPs (CountFlops)
//             over 989 TFLOP/s and the linear layers' alone over the measured GEMM rate, both
//             divided by S. The loss summed over ranks is printed beside the one-GPU loss (the
//             ring is exact: they agree to bf16 rounding).
//
// Usage: model_bench [--n=32768,262144] [--steps=8] [--kernels] [--longest] [--csv=path]
//                    [--prefill=1048576 [--ranks=1,2,4]]   (--prefill without --n: no step rows)
// Prints one line per row as it goes and a table last. Exit status 0 unless a CUDA error occurred.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/attention_spec.h"
#include "engine/cuda/cuda_backend.h"
#include "model/config.h"
#include "model/cuda/cuda_adamw.h"
#include "model/cuda/cuda_longnet.h"
#include "model/cuda/cuda_trainable_model.h"
#include "model/cuda/gemm.h"
#include "model/cuda/model_kernels.h"
#include "model/cuda/nccl_ranks.h"
#include "model/cuda/training_plan.h"
#include "model/language_model.h"
#include "model/longnet_params.h"
#include "model/trainable_model.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

#define BENCH_CUDA(expr)                                                             \
  do {                                                                               \
    const cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess) {                                                         \
      return absl::InternalError(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
    }                                                                                \
  } while (0)

#define BENCH_OK(expr)              \
  do {                              \
    const absl::Status s_ = (expr); \
    if (!s_.ok()) return s_;        \
  } while (0)

constexpr double kPeakFlops = 989e12;  // H100 / H200 SXM dense bf16

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median milliseconds of `iters` CUDA-event timings of fn on `stream` after `warmup` runs.
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

// Device buffers, freed together.
class Buffers {
 public:
  ~Buffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  absl::StatusOr<T*> Take(int64_t n) {
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // n bf16 values uniform in about [-1, 1) (never all zero: timings on zeros lie).
  absl::StatusOr<bf16_t*> RandomBf16(int64_t n, uint64_t seed) {
    absl::StatusOr<bf16_t*> p = Take<bf16_t>(n);
    if (!p.ok()) return p.status();
    std::vector<bf16_t> host(static_cast<size_t>(n));
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (bf16_t& h : host) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      const float f = static_cast<float>(static_cast<int32_t>(s >> 40) - (1 << 23)) / (1 << 23);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h = static_cast<bf16_t>(bits >> 16);
    }
    BENCH_CUDA(cudaMemcpy(*p, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    return p;
  }
  absl::StatusOr<float*> ConstF32(int64_t n, float value) {
    absl::StatusOr<float*> p = Take<float>(n);
    if (!p.ok()) return p.status();
    std::vector<float> host(static_cast<size_t>(n), value);
    BENCH_CUDA(cudaMemcpy(*p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    return p;
  }

 private:
  std::vector<void*> ptrs_;
};

struct KernelRow {
  std::string name;
  double ms = 0;
  double bytes = 0;  // 0 for GEMMs
  double flops = 0;
  double floor_ms = 0;
};

struct StepRow {
  std::string name;
  int64_t n = 0;
  bool ran = false;
  std::string error;
  bool ckpt = false, recompute = false;
  double step_ms = 0, fwd_ms = 0, bwd_ms = 0, opt_ms = 0;
  double tokens_per_s = 0, mfu = 0;
  int64_t measured = 0, planned = 0;
};

struct Ceilings {
  double copy_bytes_per_s = 0;
  double gemm_flops_per_s = 0;
};

std::string Device() {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "?";
  return absl::StrFormat("%s, %d SMs, %.1f GiB", p.name, p.multiProcessorCount,
                         static_cast<double>(p.totalGlobalMem) / (1ll << 30));
}

absl::StatusOr<Ceilings> MeasureCeilings(cudaStream_t stream, Gemm& gemm) {
  Ceilings c;
  Buffers b;
  const int64_t bytes = 2ll << 30;
  absl::StatusOr<char*> src = b.Take<char>(bytes), dst = b.Take<char>(bytes);
  if (!src.ok() || !dst.ok()) return absl::ResourceExhaustedError("copy buffers");
  BENCH_CUDA(cudaMemset(*src, 1, bytes));
  absl::StatusOr<double> ms = TimeIt(stream, 2, 10, [&]() -> absl::Status {
    BENCH_CUDA(cudaMemcpyAsync(*dst, *src, bytes, cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  });
  if (!ms.ok()) return ms.status();
  c.copy_bytes_per_s = 2.0 * bytes / (*ms * 1e-3);
  const int64_t n = 8192;
  absl::StatusOr<bf16_t*> a = b.RandomBf16(n * n, 1), w = b.RandomBf16(n * n, 2);
  absl::StatusOr<bf16_t*> out = b.Take<bf16_t>(n * n);
  if (!a.ok() || !w.ok() || !out.ok()) return absl::ResourceExhaustedError("GEMM buffers");
  GemmArgs g;
  g.op = GemmOp::kNT;
  g.rows = n, g.cols = n, g.k = n;
  g.a = *a, g.lda = n, g.b = *w, g.ldb = n, g.c = *out, g.ldc = n;
  ms = TimeIt(stream, 3, 10, [&]() { return gemm.Run(g); });
  if (!ms.ok()) return ms.status();
  c.gemm_flops_per_s = 2.0 * n * n * n / (*ms * 1e-3);
  return c;
}

// Every kernel and GEMM shape of the base model's step at M rows.
absl::Status BenchKernels(cudaStream_t stream, Gemm& gemm, const Ceilings& ceil, int sms,
                          std::vector<KernelRow>* rows) {
  const int64_t m = 32768, d = 768, f = 3072, v = 256;
  Buffers b;
  absl::StatusOr<bf16_t*> x = b.RandomBf16(m * f, 3), y = b.RandomBf16(m * f, 4),
                          z = b.RandomBf16(m * 3 * d, 5), w = b.RandomBf16(f * d * 3, 6);
  absl::StatusOr<float*> gain = b.ConstF32(f, 1.1f), shift = b.ConstF32(f, 0.1f),
                         stats = b.ConstF32(2 * m, 0.5f), res = b.ConstF32(m * d, 0.25f),
                         grads = b.ConstF32(f * d * 3, 0.0f),
                         partials = b.ConstF32(4 * 132 * 3 * f + 3 * 4 * sms * f, 0.0f),
                         logits = b.ConstF32(m * v, 0.3f), lse = b.ConstF32(m, 6.0f);
  absl::StatusOr<int32_t*> targets = b.Take<int32_t>(m);
  absl::StatusOr<double*> dpart = b.Take<double>(2048);
  for (const absl::Status& s :
       {x.status(), y.status(), z.status(), w.status(), gain.status(), shift.status(),
        stats.status(), res.status(), grads.status(), partials.status(), logits.status(),
        lse.status(), targets.status(), dpart.status()}) {
    BENCH_OK(s);
  }
  {
    std::vector<int32_t> t(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) t[i] = static_cast<int32_t>((i * 37) % v);
    BENCH_CUDA(cudaMemcpy(*targets, t.data(), m * 4, cudaMemcpyHostToDevice));
  }
  RotaryConsts rc;
  rc.pairs = 32;
  rc.block = 32768;
  for (int j = 0; j < 32; ++j) rc.inv_freq[j] = std::pow(10000.0, -2.0 * j / 64);
  absl::StatusOr<RotaryConsts*> drc = b.Take<RotaryConsts>(1);
  BENCH_OK(drc.status());
  BENCH_CUDA(cudaMemcpy(*drc, &rc, sizeof(rc), cudaMemcpyHostToDevice));
  auto add = [&](const std::string& name, double bytes, double flops,
                 const std::function<absl::Status()>& fn) -> absl::Status {
    absl::StatusOr<double> ms = TimeIt(stream, 3, 20, fn);
    if (!ms.ok()) return ms.status();
    KernelRow r;
    r.name = name;
    r.ms = *ms;
    r.bytes = bytes;
    r.flops = flops;
    r.floor_ms =
        bytes > 0 ? bytes / ceil.copy_bytes_per_s * 1e3 : flops / ceil.gemm_flops_per_s * 1e3;
    std::printf("kernel %-44s %9.1f us  %s  floor %8.1f us  x%.2f\n", name.c_str(), r.ms * 1e3,
                bytes > 0 ? absl::StrFormat("%7.0f GB/s", bytes / (r.ms * 1e-3) / 1e9).c_str()
                          : absl::StrFormat("%5.0f TFLOP/s", flops / (r.ms * 1e-3) / 1e12).c_str(),
                r.floor_ms * 1e3, r.ms / r.floor_ms);
    std::fflush(stdout);
    rows->push_back(r);
    return absl::OkStatus();
  };
  const double md = static_cast<double>(m) * d, mf = static_cast<double>(m) * f;
  BENCH_OK(add("LayerNorm fwd [32768, 768]", 4 * md + 8 * m, 8 * md, [&]() -> absl::Status {
    BENCH_CUDA(LayerNormForward(*x, m, d, *gain, *shift, 1e-5f, false, false, *y, *stats,
                                *stats + m, sms, stream));
    return absl::OkStatus();
  }));
  BENCH_OK(add("GELU+LayerNorm fwd [32768, 3072]", 4 * mf + 8 * m, 28 * mf, [&]() -> absl::Status {
    BENCH_CUDA(LayerNormForward(*x, m, f, *gain, *shift, 1e-5f, true, false, *y, *stats, *stats + m,
                                sms, stream));
    return absl::OkStatus();
  }));
  LayerNormBackwardArgs nb;
  nb.dy = *y;
  nb.x = *x;
  nb.mean = *stats;
  nb.rstd = *stats + m;
  nb.gain = *gain;
  nb.rows = m;
  nb.n = d;
  nb.out = NormGradOut::kResidualAdd;
  nb.out_bf16 = *z;
  nb.residual = *res;
  nb.partials = *partials;
  nb.bias_sums = true;
  BENCH_OK(add("LayerNorm bwd, residual += [32768, 768]", 14 * md + 8 * m, 14 * md,
               [&]() -> absl::Status {
                 BENCH_CUDA(LayerNormBackward(nb, sms, stream));
                 return absl::OkStatus();
               }));
  LayerNormBackwardArgs gb = nb;
  gb.n = f;
  gb.gelu = true;
  gb.out = NormGradOut::kBf16;
  gb.dy = *y;
  gb.out_bf16 = *y;  // in place, as the model runs it
  BENCH_OK(add("GELU+LayerNorm bwd [32768, 3072]", 6 * mf + 8 * m, 44 * mf, [&]() -> absl::Status {
    BENCH_CUDA(LayerNormBackward(gb, sms, stream));
    return absl::OkStatus();
  }));
  BENCH_OK(add("rotary fwd, q and k of [32768, 2304]", 8 * md, 6 * md, [&]() -> absl::Status {
    BENCH_CUDA(RotaryForward(*z, m, 3 * d, m, 0, d, 64, *drc, sms, stream));
    return absl::OkStatus();
  }));
  BENCH_OK(add("rotary bwd into [32768, 2304]", 12 * md, 6 * md, [&]() -> absl::Status {
    BENCH_CUDA(RotaryBackward(*x, *x + m * d, *x + 2 * m * d, m, m, 0, d, 64, *drc, *z, *partials,
                              sms, stream));
    return absl::OkStatus();
  }));
  BENCH_OK(add("cross-entropy fwd [32768, 256] fp32", 4.0 * m * v + 12 * m, 4.0 * m * v,
               [&]() -> absl::Status {
                 BENCH_CUDA(CrossEntropyForward(*logits, *targets, m, v, *lse, *dpart,
                                                *dpart + 2000, stream));
                 return absl::OkStatus();
               }));
  BENCH_OK(add("cross-entropy bwd [32768, 256]", 6.0 * m * v + 8 * m, 3.0 * m * v,
               [&]() -> absl::Status {
                 BENCH_CUDA(CrossEntropyBackward(*logits, *lse, *targets, m, v, 1e-5f, *y, stream));
                 return absl::OkStatus();
               }));
  // GEMMs of one block and the head, forward and backward.
  struct Shape {
    const char* name;
    GemmOp op;
    int64_t rows, cols, k;
    bool fp32, bias, residual;
  };
  const Shape shapes[] = {
      {"GEMM qkv fwd  M x 2304 x 768 +bias", GemmOp::kNT, m, 3 * d, d, false, true, false},
      {"GEMM out fwd  M x 768 x 768 +bias+res", GemmOp::kNT, m, d, d, false, true, true},
      {"GEMM fc1 fwd  M x 3072 x 768 +bias", GemmOp::kNT, m, f, d, false, true, false},
      {"GEMM fc2 fwd  M x 768 x 3072 +bias+res", GemmOp::kNT, m, d, f, false, true, true},
      {"GEMM head fwd M x 256 x 768 fp32", GemmOp::kNT, m, v, d, true, false, false},
      {"GEMM dX fc2   M x 3072 x 768", GemmOp::kNN, m, f, d, false, false, false},
      {"GEMM dX fc1   M x 768 x 3072", GemmOp::kNN, m, d, f, false, false, false},
      {"GEMM dX qkv   M x 768 x 2304", GemmOp::kNN, m, d, 3 * d, false, false, false},
      {"GEMM dX out   M x 768 x 768", GemmOp::kNN, m, d, d, false, false, false},
      {"GEMM dW 768 x 768, k = M, fp32 +=", GemmOp::kTN, d, d, m, true, false, false},
      {"GEMM dW 3072 x 768, k = M, fp32 +=", GemmOp::kTN, f, d, m, true, false, false},
      {"GEMM dW 768 x 3072, k = M, fp32 +=", GemmOp::kTN, d, f, m, true, false, false},
      {"GEMM dW head 256 x 768, fp32 +=", GemmOp::kTN, v, d, m, true, false, false},
  };
  // Attention of one block as the model calls it: q, k, v strided in the [M, 3d] projection
  // output, causal grouped base spec; FLOPs the engine's nominal count (causal halved).
  {
    CudaBackendOptions bo;
    bo.stream = stream;
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend(bo);
    BENCH_OK(backend.status());
    const LongNetConfig config;
    const AttentionSpec spec = config.attention_spec();
    const int64_t h = 12, dh = 64;
    absl::StatusOr<bf16_t*> attn_out = b.Take<bf16_t>(m * d), dq = b.Take<bf16_t>(3 * m * d);
    absl::StatusOr<float*> attn_lse = b.Take<float>(h * m);
    BENCH_OK(attn_out.status());
    BENCH_OK(dq.status());
    BENCH_OK(attn_lse.status());
    auto view = [&](bf16_t* data, int64_t row) {
      TensorView t;
      t.data = data;
      t.dtype = DType::kBFloat16;
      t.device = dattn::Device::kCuda;
      t.shape = {1, m, h, dh};
      t.strides = {m * row, row, dh, 1};
      return t;
    };
    ForwardArgs fa;
    fa.q = view(*z, 3 * d);
    fa.k = view(*z + d, 3 * d);
    fa.v = view(*z + 2 * d, 3 * d);
    fa.out = view(*attn_out, d);
    fa.lse = TensorView::Contiguous(*attn_lse, DType::kFloat32, {1, h, m}, dattn::Device::kCuda);
    const double fwd_flops = dilation::NominalForwardFlops(spec, 1, m, h, dh);
    BENCH_OK(add("attention fwd (engine), causal grouped", 0, fwd_flops,
                 [&]() { return (*backend)->Forward(spec, fa); }));
    BackwardArgs ba;
    ba.q = fa.q;
    ba.k = fa.k;
    ba.v = fa.v;
    ba.out = fa.out;
    ba.lse = fa.lse;
    ba.dout = view(*x, d);
    ba.dq = view(*dq, d);
    ba.dk = view(*dq + m * d, d);
    ba.dv = view(*dq + 2 * m * d, d);
    BENCH_OK(add("attention bwd (engine), causal grouped", 0, 2.5 * fwd_flops,
                 [&]() { return (*backend)->Backward(spec, ba); }));
  }
  absl::StatusOr<float*> c32 = b.Take<float>(m * v);
  absl::StatusOr<bf16_t*> o = b.Take<bf16_t>(m * f);
  BENCH_OK(c32.status());
  BENCH_OK(o.status());
  for (const Shape& s : shapes) {
    GemmArgs g;
    g.op = s.op;
    g.rows = s.rows, g.cols = s.cols, g.k = s.k;
    // A: x [M, k] (kTN: dy [M, rows]); B: a weight (kTN: the layer input [M, cols]).
    g.a = *x;
    g.lda = s.op == GemmOp::kTN ? s.rows : s.k;
    g.b = s.op == GemmOp::kTN ? *y : *w;
    g.ldb = s.op == GemmOp::kNT ? s.k : s.cols;
    g.ldc = s.cols;
    g.c_fp32 = s.fp32;
    if (s.op == GemmOp::kTN) {
      g.c = *grads;
      g.beta = 1.0f;
    } else {
      g.c = s.fp32 ? static_cast<void*>(*c32) : static_cast<void*>(*o);
    }
    if (s.bias) g.bias = *w;
    if (s.residual) {
      g.residual = *y;
      g.beta = 1.0f;
    }
    BENCH_OK(add(s.name, 0, 2.0 * s.rows * s.cols * s.k, [&]() { return gemm.Run(g); }));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> UsedBytes() {
  size_t free_bytes = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<int64_t>(total - free_bytes);
}

// N pseudo-random byte tokens (the same on every call) and their next-token targets.
void BenchTokens(int64_t n, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  tokens->assign(static_cast<size_t>(n), 0);
  targets->assign(static_cast<size_t>(n), 0);
  uint64_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    (*tokens)[i] = static_cast<int32_t>((s >> 33) % 256);
  }
  for (int64_t i = 0; i < n; ++i) (*targets)[i] = i + 1 < n ? (*tokens)[i + 1] : kIgnoreTarget;
}

// One model, `steps` timed training steps after 2 warm-up ones.
StepRow RunSteps(const std::string& name, const LongNetConfig& config, int64_t n, bool ckpt,
                 CudaModelOptions::Norms norms, int steps) {
  StepRow row;
  row.name = name;
  row.n = n;
  row.ckpt = ckpt;
  auto fail = [&](const absl::Status& s) {
    row.error = std::string(s.message().substr(0, 300));
    std::printf("step %s: %s\n", name.c_str(), row.error.c_str());
    std::fflush(stdout);
    return row;
  };
  cudaDeviceSynchronize();
  absl::StatusOr<int64_t> before = UsedBytes();
  if (!before.ok()) return fail(before.status());
  std::vector<int32_t> tokens, targets;
  BenchTokens(n, &tokens, &targets);
  TokenBatch batch;
  batch.tokens = tokens.data();
  batch.targets = targets.data();
  batch.batch = 1;
  batch.seq_len = n;
  {
    ModelOptions mo;
    mo.checkpoint_activations = ckpt;
    CudaModelOptions co;
    co.norms = norms;
    absl::StatusOr<std::unique_ptr<CudaLongNetLM>> model = CudaLongNetLM::Create(config, mo, co);
    if (!model.ok()) return fail(model.status());
    CudaLongNetLM& m = **model;
    absl::Status st = m.InitParams(1);
    if (!st.ok()) return fail(st);
    absl::StatusOr<std::unique_ptr<CudaAdamW>> opt =
        CudaAdamW::Create(m.layout(), AdamWOptions{}, m.stream());
    if (!opt.ok()) return fail(opt.status());
    cudaEvent_t ev[4];
    for (cudaEvent_t& e : ev) cudaEventCreate(&e);
    std::vector<double> step_ms, fwd_ms, bwd_ms, opt_ms;
    double first_loss = 0, last_loss = 0;
    for (int i = 0; i < steps + 2; ++i) {
      cudaEventRecord(ev[0], m.stream());
      absl::StatusOr<LossResult> loss = m.Forward(batch);
      if (!loss.ok()) return fail(loss.status());
      if (i == 0) first_loss = loss->loss;
      last_loss = loss->loss;
      cudaEventRecord(ev[1], m.stream());
      st = m.Backward();
      if (!st.ok()) return fail(st);
      cudaEventRecord(ev[2], m.stream());
      st = (*opt)->Step(1e-4, 1.0, m.params(), m.grads());
      if (!st.ok()) return fail(st);
      cudaEventRecord(ev[3], m.stream());
      st = m.Synchronize();
      if (!st.ok()) return fail(st);
      if (i < 2) continue;
      float a = 0, b = 0, c = 0;
      cudaEventElapsedTime(&a, ev[0], ev[1]);
      cudaEventElapsedTime(&b, ev[1], ev[2]);
      cudaEventElapsedTime(&c, ev[2], ev[3]);
      fwd_ms.push_back(a);
      bwd_ms.push_back(b);
      opt_ms.push_back(c);
      step_ms.push_back(a + b + c);
    }
    for (cudaEvent_t& e : ev) cudaEventDestroy(e);
    absl::StatusOr<int64_t> after = UsedBytes();
    if (!after.ok()) return fail(after.status());
    row.measured = *after - *before;
    row.recompute = m.recompute_norms();
    TrainingMemoryOptions po;
    po.arena.checkpoint_activations = ckpt;
    po.arena.recompute_norms = m.recompute_norms();
    po.arena.num_sms = m.num_sms();
    absl::StatusOr<TrainingMemoryPlan> plan = PlanTrainingMemory(config, 1, n, po);
    if (plan.ok()) row.planned = plan->total_bytes;
    row.step_ms = Median(step_ms);
    row.fwd_ms = Median(fwd_ms);
    row.bwd_ms = Median(bwd_ms);
    row.opt_ms = Median(opt_ms);
    const ModelFlops flops = CountFlops(config, 1, n, ckpt);
    row.tokens_per_s = static_cast<double>(n) / (row.step_ms * 1e-3);
    row.mfu = (flops.forward + flops.backward) / (row.step_ms * 1e-3) / kPeakFlops;
    row.ran = true;
    std::printf(
        "step %s: N=%lld %s%s step %.2f ms (fwd %.2f, bwd %.2f, AdamW %.2f) -> %.0f tokens/s, "
        "MFU %.1f%%; memory measured %.0f MiB, planned %.0f MiB (%+.1f%%); loss %.4f -> %.4f\n",
        name.c_str(), static_cast<long long>(n), ckpt ? "checkpointing " : "",
        row.recompute ? "norms recomputed" : "norms kept", row.step_ms, row.fwd_ms, row.bwd_ms,
        row.opt_ms, row.tokens_per_s, 100 * row.mfu, row.measured / 1048576.0,
        row.planned / 1048576.0,
        100.0 * (static_cast<double>(row.planned) / std::max<int64_t>(row.measured, 1) - 1),
        first_loss, last_loss);
    std::fflush(stdout);
  }
  return row;
}

// One prefill row: N tokens over a ring of `ranks` GPUs (1: the whole sequence on GPU 0).
struct PrefillRow {
  int ranks = 0;
  int64_t n = 0;
  bool ran = false;
  std::string error;
  double ms = 0;            // median over the timed calls of the slowest rank's time
  double loss_sum = 0;      // summed over ranks (fp64 on each)
  int64_t num_targets = 0;  // summed over ranks
  int64_t max_used = 0;     // the largest rank's device memory taken by its model and the call
};

PrefillRow RunPrefill(const LongNetConfig& config, int64_t n, int ranks, int steps) {
  PrefillRow row;
  row.ranks = ranks;
  row.n = n;
  std::string why;
  if (!HaveHopperGpus(ranks, &why)) {
    row.error = absl::StrCat("skipped: ", why);
    std::printf("prefill S=%d: %s\n", ranks, row.error.c_str());
    return row;
  }
  if (n % ranks != 0) {
    row.error = absl::StrCat("skipped: ", n, " tokens do not split over ", ranks, " ranks");
    return row;
  }
  // The same tokens on every ring size; each rank takes its slice.
  std::vector<int32_t> tokens, targets;
  BenchTokens(n, &tokens, &targets);
  const int64_t local = n / ranks;
  std::vector<std::vector<double>> ms(static_cast<size_t>(ranks));
  std::vector<LossResult> losses(static_cast<size_t>(ranks));
  std::vector<int64_t> used(static_cast<size_t>(ranks));
  const std::vector<absl::Status> results = RunNcclRanks(
      ranks, ranks,
      [&](int rank, comm::Communicator& world, comm::Communicator* sp) -> absl::Status {
        BENCH_CUDA(cudaDeviceSynchronize());
        absl::StatusOr<int64_t> before = UsedBytes();
        if (!before.ok()) return before.status();
        ModelOptions mo;
        mo.checkpoint_activations = true;
        CudaModelOptions co;
        co.device = rank;
        co.norms = CudaModelOptions::Norms::kRecompute;
        absl::StatusOr<std::unique_ptr<TrainableModel>> model =
            NewCudaTrainableModel(config, mo, co, sp);
        if (!model.ok()) return model.status();
        BENCH_OK((*model)->InitParams(1));
        TokenBatch batch;
        batch.tokens = tokens.data() + rank * local;
        batch.targets = targets.data() + rank * local;
        batch.batch = 1;
        batch.seq_len = local;
        batch.positions = {rank * local, n};
        for (int i = 0; i < steps + 1; ++i) {
          BENCH_OK(world.Barrier());
          const auto start = std::chrono::steady_clock::now();
          absl::StatusOr<LossResult> loss = (*model)->Evaluate(batch, {});
          if (!loss.ok()) return loss.status();
          const auto stop = std::chrono::steady_clock::now();
          if (i == 0) continue;
          ms[static_cast<size_t>(rank)].push_back(
              std::chrono::duration<double, std::milli>(stop - start).count());
          losses[static_cast<size_t>(rank)] = *loss;
        }
        BENCH_CUDA(cudaDeviceSynchronize());
        absl::StatusOr<int64_t> after = UsedBytes();
        if (!after.ok()) return after.status();
        used[static_cast<size_t>(rank)] = *after - *before;
        return absl::OkStatus();
      },
      absl::StrCat("prefill-", ranks));
  for (int r = 0; r < ranks; ++r) {
    if (!results[static_cast<size_t>(r)].ok()) {
      row.error =
          absl::StrCat("rank ", r, ": ", results[static_cast<size_t>(r)].message().substr(0, 300));
      std::printf("prefill S=%d: %s\n", ranks, row.error.c_str());
      std::fflush(stdout);
      return row;
    }
  }
  std::vector<double> slowest(static_cast<size_t>(steps), 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < steps; ++i) {
      slowest[static_cast<size_t>(i)] = std::max(
          slowest[static_cast<size_t>(i)], ms[static_cast<size_t>(r)][static_cast<size_t>(i)]);
    }
    row.loss_sum += losses[static_cast<size_t>(r)].loss_sum;
    row.num_targets += losses[static_cast<size_t>(r)].num_targets;
    row.max_used = std::max(row.max_used, used[static_cast<size_t>(r)]);
  }
  row.ms = Median(slowest);
  row.ran = true;
  std::printf(
      "prefill S=%d: N=%lld in %.1f ms (%.0f tokens/s), loss %.6f over %lld targets, "
      "%.0f MiB on the largest rank\n",
      ranks, static_cast<long long>(n), row.ms, n / (row.ms * 1e-3),
      row.loss_sum / std::max<int64_t>(row.num_targets, 1), static_cast<long long>(row.num_targets),
      row.max_used / 1048576.0);
  std::fflush(stdout);
  return row;
}

int Main(int argc, char** argv) {
  std::vector<int64_t> lengths = {32768, 262144};
  int steps = 8;
  bool kernels = false, longest = false, lengths_given = false;
  std::string csv;
  int64_t prefill = 0;
  std::vector<int> ring_sizes = {1, 2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--n=", 0) == 0) {
      lengths.clear();
      lengths_given = true;
      for (absl::string_view p : absl::StrSplit(a.substr(4), ',')) {
        lengths.push_back(std::strtoll(std::string(p).c_str(), nullptr, 10));
      }
    } else if (a.rfind("--steps=", 0) == 0) {
      steps = std::atoi(a.c_str() + 8);
    } else if (a == "--kernels") {
      kernels = true;
    } else if (a == "--longest") {
      longest = true;
    } else if (a.rfind("--csv=", 0) == 0) {
      csv = a.substr(6);
    } else if (a.rfind("--prefill=", 0) == 0) {
      prefill = std::strtoll(a.c_str() + 10, nullptr, 10);
      if (prefill < 1) {
        std::fprintf(stderr, "--prefill=%s: want a token count >= 1\n", a.c_str() + 10);
        return 2;
      }
    } else if (a.rfind("--ranks=", 0) == 0) {
      ring_sizes.clear();
      for (absl::string_view p : absl::StrSplit(a.substr(8), ',')) {
        const int r = std::atoi(std::string(p).c_str());
        if (r < 1) {
          std::fprintf(stderr, "--ranks: ring size '%s' is not >= 1\n", std::string(p).c_str());
          return 2;
        }
        ring_sizes.push_back(r);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (prefill > 0 && !lengths_given) lengths.clear();
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  cudaFree(nullptr);
  const std::string device = Device();
  std::printf("model_bench: %s, %s\n", device.c_str(), date);
  const LongNetConfig config;  // the base shape
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  Ceilings ceil;
  std::vector<KernelRow> krows;
  {
    absl::StatusOr<std::unique_ptr<Gemm>> gemm = Gemm::Create(stream, 32ll << 20);
    if (!gemm.ok()) {
      std::printf("GEMM: %s\n", gemm.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<Ceilings> c = MeasureCeilings(stream, **gemm);
    if (!c.ok()) {
      std::printf("ceilings: %s\n", c.status().ToString().c_str());
      return 1;
    }
    ceil = *c;
    std::printf("ceilings: copy %.0f GB/s, bf16 GEMM 8192^3 %.0f TFLOP/s\n",
                ceil.copy_bytes_per_s / 1e9, ceil.gemm_flops_per_s / 1e12);
    if (kernels) {
      absl::Status s = BenchKernels(stream, **gemm, ceil, sms, &krows);
      if (!s.ok()) std::printf("kernels: %s\n", s.ToString().c_str());
    }
  }
  std::vector<StepRow> srows;
  for (int64_t n : lengths) {
    srows.push_back(
        RunSteps(absl::StrCat("N=", n), config, n, false, CudaModelOptions::Norms::kAuto, steps));
    if (n >= 262144) {
      // The lean arrangement (what an 80 GB card would take) measured too.
      srows.push_back(RunSteps(absl::StrCat("N=", n, " lean"), config, n, false,
                               CudaModelOptions::Norms::kRecompute, std::max(2, steps / 2)));
    }
  }
  if (longest) {
    // Candidates, longest first: the first whose plan fits the free memory runs; if it fails,
    // the next.
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    const int64_t candidates[] = {3 << 20, 5 << 19, 2 << 20, 3 << 19, 1 << 20};
    for (int64_t n : candidates) {
      TrainingMemoryOptions po;
      po.arena.checkpoint_activations = true;
      po.arena.recompute_norms = true;
      po.arena.num_sms = sms;
      absl::StatusOr<TrainingMemoryPlan> plan = PlanTrainingMemory(config, 1, n, po);
      if (!plan.ok() || plan->total_bytes > static_cast<int64_t>(free_bytes)) {
        std::printf("longest: N=%lld planned %.1f GiB > free %.1f GiB, skipped\n",
                    static_cast<long long>(n), plan.ok() ? plan->total_bytes / 1073741824.0 : -1.0,
                    free_bytes / 1073741824.0);
        continue;
      }
      StepRow r = RunSteps(absl::StrCat("longest N=", n), config, n, true,
                           CudaModelOptions::Norms::kRecompute, 1);
      srows.push_back(r);
      if (r.ran) break;
    }
  }
  std::vector<PrefillRow> prows;
  if (prefill > 0) {
    for (int r : ring_sizes) prows.push_back(RunPrefill(config, prefill, r, steps));
  }
  std::printf("\n================ model_bench: %s, %s ================\n", device.c_str(), date);
  std::printf("ceilings: copy %.0f GB/s; bf16 GEMM 8192^3 %.0f TFLOP/s (%.1f%% of 989)\n",
              ceil.copy_bytes_per_s / 1e9, ceil.gemm_flops_per_s / 1e12,
              100 * ceil.gemm_flops_per_s / kPeakFlops);
  if (!krows.empty()) {
    std::printf("| kernel (M = 32768) | us | rate | floor us | x floor |\n|---|---|---|---|---|\n");
    for (const KernelRow& r : krows) {
      std::printf("| %s | %.1f | %s | %.1f | %.2f |\n", r.name.c_str(), r.ms * 1e3,
                  r.bytes > 0
                      ? absl::StrFormat("%.0f GB/s", r.bytes / (r.ms * 1e-3) / 1e9).c_str()
                      : absl::StrFormat("%.0f TFLOP/s", r.flops / (r.ms * 1e-3) / 1e12).c_str(),
                  r.floor_ms * 1e3, r.ms / r.floor_ms);
    }
  }
  if (!srows.empty()) {
    std::printf(
        "| step | N | mode | step ms | fwd / bwd / AdamW ms | tokens/s | MFU | memory measured | "
        "planned | plan/measured |\n|---|---|---|---|---|---|---|---|---|---|\n");
  }
  FILE* out = csv.empty() ? nullptr : std::fopen(csv.c_str(), "w");
  if (out != nullptr) {
    std::fprintf(out,
                 "name,n,ckpt,recompute,step_ms,tokens_per_s,mfu,measured_bytes,planned_bytes,"
                 "error\n");
  }
  for (const StepRow& r : srows) {
    if (!r.ran) {
      std::printf("| %s | %lld | - | FAILED: %s | | | | | | |\n", r.name.c_str(),
                  static_cast<long long>(r.n), r.error.c_str());
    } else {
      std::printf(
          "| %s | %lld | %s%s | %.2f | %.2f / %.2f / %.2f | %.0f | %.1f%% | %.0f MiB | %.0f "
          "MiB | %.3f |\n",
          r.name.c_str(), static_cast<long long>(r.n), r.ckpt ? "ckpt, " : "",
          r.recompute ? "norms recomputed" : "norms kept", r.step_ms, r.fwd_ms, r.bwd_ms, r.opt_ms,
          r.tokens_per_s, 100 * r.mfu, r.measured / 1048576.0, r.planned / 1048576.0,
          static_cast<double>(r.planned) / std::max<int64_t>(r.measured, 1));
    }
    if (out != nullptr) {
      std::fprintf(out, "%s,%lld,%d,%d,%.4f,%.1f,%.5f,%lld,%lld,%s\n", r.name.c_str(),
                   static_cast<long long>(r.n), r.ckpt ? 1 : 0, r.recompute ? 1 : 0, r.step_ms,
                   r.tokens_per_s, r.mfu, static_cast<long long>(r.measured),
                   static_cast<long long>(r.planned), r.error.c_str());
    }
  }
  for (const PrefillRow& r : prows) {
    if (out == nullptr) break;
    // mfu: the forward's FLOPs over the time over the ranks' peak.
    const double mfu =
        r.ran ? CountFlops(config, 1, r.n, false).forward / (r.ms * 1e-3) / (kPeakFlops * r.ranks)
              : 0;
    std::fprintf(out, "prefill S=%d,%lld,1,1,%.4f,%.1f,%.5f,%lld,0,%s\n", r.ranks,
                 static_cast<long long>(r.n), r.ms, r.ran ? r.n / (r.ms * 1e-3) : 0.0, mfu,
                 static_cast<long long>(r.max_used), r.error.c_str());
  }
  if (out != nullptr) std::fclose(out);
  if (!prows.empty()) {
    // Floors: all of the forward's FLOPs at the nominal peak; the linear layers' and the head's
    // alone at the GEMM rate measured above. Each split over the S ranks.
    const ModelFlops flops = CountFlops(config, 1, prefill, false);
    const double m = static_cast<double>(prefill), d = static_cast<double>(config.d_model);
    const double gemm_flops = config.num_layers * 2.0 * m * (4 * d * d + 2 * d * config.ffn_dim) +
                              2.0 * m * d * config.vocab_size;
    double one_gpu_ms = 0, one_gpu_loss = 0;
    for (const PrefillRow& r : prows) {
      if (r.ran && r.ranks == 1) {
        one_gpu_ms = r.ms;
        one_gpu_loss = r.loss_sum;
      }
    }
    std::printf(
        "| prefill + Score, N = %lld | GPUs | seconds | tokens/s | forward at 989 TFLOP/s | "
        "GEMMs at %.0f TFLOP/s | x GEMM floor | speed-up over 1 GPU | loss sum vs 1 GPU | "
        "memory, largest rank |\n|---|---|---|---|---|---|---|---|---|---|\n",
        static_cast<long long>(prefill), ceil.gemm_flops_per_s / 1e12);
    for (const PrefillRow& r : prows) {
      if (!r.ran) {
        std::printf("| base model | %d | %s | | | | | | | |\n", r.ranks, r.error.c_str());
        continue;
      }
      const double floor_s = flops.forward / kPeakFlops / r.ranks;
      const double gemm_s = gemm_flops / ceil.gemm_flops_per_s / r.ranks;
      std::printf(
          "| base model | %d | %.3f | %.0f | %.3f s | %.3f s | %.2f | %s | %s | %.1f GiB |\n",
          r.ranks, r.ms * 1e-3, prefill / (r.ms * 1e-3), floor_s, gemm_s, r.ms * 1e-3 / gemm_s,
          one_gpu_ms > 0 ? absl::StrFormat("%.2f", one_gpu_ms / r.ms).c_str() : "-",
          one_gpu_ms > 0 ? absl::StrFormat("%.2e", std::fabs(r.loss_sum - one_gpu_loss) /
                                                       std::fabs(one_gpu_loss))
                               .c_str()
                         : "-",
          r.max_used / 1073741824.0);
    }
  }
  cudaStreamDestroy(stream);
  for (const StepRow& r : srows) {
    if (!r.ran && r.name.rfind("longest", 0) != 0) return 1;
  }
  for (const PrefillRow& r : prows) {
    if (!r.ran && r.error.rfind("skipped", 0) != 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace cuda
}  // namespace model
}  // namespace dattn

int main(int argc, char** argv) { return dattn::model::cuda::Main(argc, argv); }
