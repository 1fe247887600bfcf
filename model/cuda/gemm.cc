#include "model/cuda/gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/cuda/cuda_status.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

absl::Status CublasStatus(cublasStatus_t code, const char* call, const std::string& shape) {
  std::string message =
      absl::StrCat(call, " failed: ", cublasLtGetStatusName(code), " (", static_cast<int>(code),
                   "): ", cublasLtGetStatusString(code), " [", shape, "]");
  if (code == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (code == CUBLAS_STATUS_NOT_SUPPORTED) return absl::UnimplementedError(message);
  return absl::InternalError(message);
}

#define GEMM_RETURN_IF_ERROR(expr, shape)            \
  do {                                               \
    const cublasStatus_t gemm_code_ = (expr);        \
    if (gemm_code_ != CUBLAS_STATUS_SUCCESS) {       \
      return CublasStatus(gemm_code_, #expr, shape); \
    }                                                \
  } while (0)

// The largest power of two up to 256 dividing the address (what cuBLASLt's alignment preferences
// count).
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

const char* OpName(GemmOp op) {
  switch (op) {
    case GemmOp::kNT:
      return "NT";
    case GemmOp::kNN:
      return "NN";
    case GemmOp::kTN:
      return "TN";
  }
  return "?";
}

// The algorithm each plan key was given, process-wide, so that every Gemm of a process computes a
// shape with the same algorithm (the same bits) whichever instance timed it first.
struct TunedAlgos {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, cublasLtMatmulAlgo_t> algos ABSL_GUARDED_BY(mu);
};
TunedAlgos& Tuned() {
  static TunedAlgos* tuned = new TunedAlgos();
  return *tuned;
}

constexpr int kCandidates = 8;
constexpr int kTimedRuns = 3;

}  // namespace

struct Gemm::Impl {
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool has_bias = false;
  };
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  absl::flat_hash_map<std::string, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      if (p.a != nullptr) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b != nullptr) cublasLtMatrixLayoutDestroy(p.b);
      if (p.c != nullptr) cublasLtMatrixLayoutDestroy(p.c);
      if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
    }
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(cudaStream_t stream, int64_t workspace_bytes,
                                                   bool autotune) {
  std::unique_ptr<Gemm> g(new Gemm());
  g->autotune_ = autotune;
  g->impl_ = std::make_unique<Impl>();
  g->impl_->stream = stream;
  GEMM_RETURN_IF_ERROR(cublasLtCreate(&g->impl_->handle), "create");
  if (workspace_bytes > 0) {
    DATTN_CUDA_RETURN_IF_ERROR(
        cudaMalloc(&g->impl_->workspace, static_cast<size_t>(workspace_bytes)));
  }
  g->workspace_bytes_ = workspace_bytes;
  return g;
}

Gemm::~Gemm() = default;

int64_t Gemm::plans() const { return static_cast<int64_t>(impl_->plans.size()); }

absl::Status Gemm::Run(const GemmArgs& x) {
  const std::string shape = absl::StrCat(
      OpName(x.op), " rows=", x.rows, " cols=", x.cols, " k=", x.k, " lda=", x.lda, " ldb=", x.ldb,
      " ldc=", x.ldc, x.c_fp32 ? " C fp32" : " C bf16", x.bias != nullptr ? " bias" : "",
      x.residual != nullptr ? " residual" : "", " beta=", x.beta);
  if (x.rows < 1 || x.cols < 1 || x.k < 1 || x.a == nullptr || x.b == nullptr || x.c == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM: empty or null operand [", shape, "]"));
  }
  // Leading dimensions of the row-major operands as stored.
  int64_t need_a = x.k, need_b = x.k;
  if (x.op == GemmOp::kNN) need_b = x.cols;
  if (x.op == GemmOp::kTN) {
    need_a = x.rows;
    need_b = x.cols;
  }
  if (x.lda < need_a || x.ldb < need_b || x.ldc < x.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM: leading dimensions too small [", shape, "]"));
  }
  if (x.bias != nullptr && (x.op != GemmOp::kNT || x.c_fp32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM: a bias needs op NT and a bf16 result [", shape, "]"));
  }
  const void* c_in = x.residual != nullptr ? x.residual : x.c;
  const std::string key =
      absl::StrCat(shape, " align=", Alignment(x.a), ",", Alignment(x.b), ",", Alignment(c_in), ",",
                   Alignment(x.c), x.bias != nullptr ? absl::StrCat(",", Alignment(x.bias)) : "");
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    Impl::Plan p;
    const cudaDataType_t c_type = x.c_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    GEMM_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), shape);
    const cublasOperation_t ta = x.op == GemmOp::kNT ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = x.op == GemmOp::kTN ? CUBLAS_OP_T : CUBLAS_OP_N;
    GEMM_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        shape);
    GEMM_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        shape);
    if (x.bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      GEMM_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                          &epilogue, sizeof(epilogue)),
                           shape);
      const cudaDataType_t bias_type = CUDA_R_16BF;
      GEMM_RETURN_IF_ERROR(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)),
          shape);
      p.has_bias = true;
    }
    // cuBLASLt is column-major: the row-major C[rows, cols] is the column-major C^T[cols, rows]
    // = op(A') op(B') with A' our B and B' our A (gemm.h's three cases).
    const uint64_t rows = static_cast<uint64_t>(x.rows), cols = static_cast<uint64_t>(x.cols),
                   k = static_cast<uint64_t>(x.k);
    uint64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
    switch (x.op) {
      case GemmOp::kNT:
        a_rows = k, a_cols = cols, b_rows = k, b_cols = rows;
        break;
      case GemmOp::kNN:
        a_rows = cols, a_cols = k, b_rows = k, b_cols = rows;
        break;
      case GemmOp::kTN:
        a_rows = cols, a_cols = k, b_rows = rows, b_cols = k;
        break;
    }
    GEMM_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, a_rows, a_cols, x.ldb),
                         shape);
    GEMM_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, b_rows, b_cols, x.lda),
                         shape);
    GEMM_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, c_type, cols, rows, x.ldc), shape);
    cublasLtMatmulPreference_t pref = nullptr;
    GEMM_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref), shape);
    const uint64_t ws = static_cast<uint64_t>(workspace_bytes_);
    const uint32_t align_a = Alignment(x.b), align_b = Alignment(x.a), align_c = Alignment(c_in),
                   align_d = Alignment(x.c);
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &align_a, sizeof(align_a));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &align_b, sizeof(align_b));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &align_c, sizeof(align_c));
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &align_d, sizeof(align_d));
    }
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulAlgoGetHeuristic(impl_->handle, p.desc, p.a, p.b, p.c, p.c, pref,
                                          autotune_ ? kCandidates : 1, results, &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st != CUBLAS_STATUS_SUCCESS) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
      return CublasStatus(st, "cublasLtMatmulAlgoGetHeuristic", shape);
    }
    p.algo = results[0].algo;
    int device = 0;
    cudaGetDevice(&device);
    const std::string tuned_key = absl::StrCat("device ", device, " ", key);
    bool cached = false;
    {
      absl::MutexLock lock(&Tuned().mu);
      auto t = Tuned().algos.find(tuned_key);
      if (t != Tuned().algos.end()) {
        p.algo = t->second;
        cached = true;
      }
    }
    if (!cached && autotune_ && found > 1) {
      absl::StatusOr<int> best = Tune(x, p.desc, p.a, p.b, p.c, results, found, shape);
      if (!best.ok()) return best.status();
      p.algo = results[*best].algo;
    }
    if (!cached) {
      absl::MutexLock lock(&Tuned().mu);
      Tuned().algos.emplace(tuned_key, p.algo);
    }
    it = impl_->plans.emplace(key, p).first;
  }
  Impl::Plan& p = it->second;
  if (p.has_bias) {
    GEMM_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &x.bias, sizeof(x.bias)),
                         shape);
  }
  GEMM_RETURN_IF_ERROR(cublasLtMatmul(impl_->handle, p.desc, &x.alpha, x.b, p.a, x.a, p.b, &x.beta,
                                      c_in, p.c, x.c, p.c, &p.algo, impl_->workspace,
                                      static_cast<size_t>(workspace_bytes_), impl_->stream),
                       shape);
  return absl::OkStatus();
}

absl::StatusOr<int> Gemm::Tune(const GemmArgs& x, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c,
                               const cublasLtMatmulHeuristicResult_t* results, int count,
                               const std::string& shape) {
  // Accumulating in place (beta != 0 into C itself) is not repeatable: time on a scratch C.
  // Every other call is (its output depends only on its inputs): time it where it runs.
  const bool in_place = x.beta != 0.0f && x.residual == nullptr;
  void* scratch = nullptr;
  void* d = x.c;
  const void* c_in = x.residual != nullptr ? x.residual : x.c;
  if (in_place) {
    const size_t bytes =
        static_cast<size_t>(x.rows) * static_cast<size_t>(x.ldc) * (x.c_fp32 ? 4 : 2);
    DATTN_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, bytes));
    DATTN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch, 0, bytes, impl_->stream));
    d = scratch;
    c_in = scratch;
  }
  if (x.bias != nullptr) {
    GEMM_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &x.bias, sizeof(x.bias)),
                         shape);
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  DATTN_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  int best = 0;
  float best_ms = -1.0f;
  for (int i = 0; i < count; ++i) {
    auto run = [&]() {
      return cublasLtMatmul(impl_->handle, desc, &x.alpha, x.b, a, x.a, b, &x.beta, c_in, c, d, c,
                            &results[i].algo, impl_->workspace,
                            static_cast<size_t>(workspace_bytes_), impl_->stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // an algorithm that declines: not a candidate
    cudaEventRecord(start, impl_->stream);
    bool ok = true;
    for (int k = 0; k < kTimedRuns && ok; ++k) ok = run() == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(stop, impl_->stream);
    const cudaError_t e = cudaEventSynchronize(stop);
    if (e != cudaSuccess) {
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      if (scratch != nullptr) cudaFree(scratch);
      return ::dattn::cuda::CudaErrorStatus(e, "cudaEventSynchronize (GEMM tuning)", __FILE__,
                                            __LINE__);
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (ok && (best_ms < 0 || ms < best_ms)) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (scratch != nullptr) {
    DATTN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(impl_->stream));
    DATTN_CUDA_RETURN_IF_ERROR(cudaFree(scratch));
  }
  return best;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
