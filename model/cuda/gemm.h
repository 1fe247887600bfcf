// Matrix products of the CUDA model through cuBLASLt: bf16 operands, fp32 accumulation, a bf16 or
// fp32 result, optionally a bf16 bias per output column and a residual or accumulator added
// (beta = 1), all in one call (cuBLASLt's epilogue), described in the model's row-major terms.
//
//   kNT: C[rows, cols] (:= or +=) alpha A[rows, k] B[cols, k]^T   (a linear layer: x W^T)
//   kNN: C[rows, cols] (:= or +=) alpha A[rows, k] B[k, cols]     (its input gradient: dy W)
//   kTN: C[rows, cols] (:= or +=) alpha A[k, rows]^T B[k, cols]   (its weight gradient: dy^T x)
// plus bias[cols] (kNT only) and beta C_in, C_in being `residual` when given (a different buffer
// of C's type and layout: out = x W^T + b + residual) or C itself. FLOPs 2 rows cols k; bytes
// (rows k + k cols) 2 + rows cols sizeof(C) (twice with beta != 0).
//
// Each distinct shape (op, sizes, leading dimensions, types, bias, beta != 0, pointer alignments)
// is planned once: descriptors are built and cuBLASLt's heuristic proposes up to 8 algorithms
// within the workspace; with autotune, each is timed on the call's own operands (3 runs after one;
// a call that accumulates into C in place is timed on a scratch C instead) and the fastest kept.
// The choice is shared process-wide: every Gemm of a process computes a shape with the same
// algorithm, so results are the same bits within a process (two processes may choose differently
// and differ in the last bits). Planning a shape synchronizes the stream once; every other call
// enqueues on the stream given at Create and never synchronizes. Errors: cuBLASLt's status as
// INTERNAL (RESOURCE_EXHAUSTED for an allocation failure; UNIMPLEMENTED when the heuristic has no
// algorithm for a shape), naming the call and the shape; INVALID_ARGUMENT for sizes < 1 or leading
// dimensions too small.
//
// Thread-safety: one call at a time per instance (the plan cache is not locked).
#ifndef DATTN_MODEL_CUDA_GEMM_H_
#define DATTN_MODEL_CUDA_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dattn {
namespace model {
namespace cuda {

enum class GemmOp { kNT, kNN, kTN };

struct GemmArgs {
  GemmOp op = GemmOp::kNT;
  int64_t rows = 0, cols = 0, k = 0;
  const void* a = nullptr;  // bf16, leading dimension lda (row-major)
  int64_t lda = 0;
  const void* b = nullptr;  // bf16, leading dimension ldb
  int64_t ldb = 0;
  void* c = nullptr;  // bf16 or fp32 (c_fp32), leading dimension ldc
  int64_t ldc = 0;
  bool c_fp32 = false;
  const void* bias = nullptr;      // bf16 [cols], or null
  const void* residual = nullptr;  // C's type, leading dimension ldc; with beta, in place of C
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: C is overwritten; 1: C (or residual) is added
};

// A linear layer over contiguous rows (kNT): y[rows, out] := x[rows, in] w[out, in]^T + bias[out]
// (bias null: none) + residual[rows, out] (null: none; else beta 1 on it), every leading dimension
// the row's width; y fp32 with y_fp32, else bf16.
inline GemmArgs LinearArgs(const void* x, int64_t rows, int64_t in, const void* w, const void* bias,
                           int64_t out, void* y, const void* residual = nullptr,
                           bool y_fp32 = false) {
  GemmArgs g;
  g.op = GemmOp::kNT;
  g.rows = rows, g.cols = out, g.k = in;
  g.a = x, g.lda = in;
  g.b = w, g.ldb = in;
  g.c = y, g.ldc = out;
  g.c_fp32 = y_fp32;
  g.bias = bias;
  if (residual != nullptr) {
    g.residual = residual;
    g.beta = 1.0f;
  }
  return g;
}

class Gemm {
 public:
  // A cuBLASLt handle and `workspace_bytes` of device memory (RESOURCE_EXHAUSTED if it cannot be
  // had), for calls on `stream` (not owned) of the current device. autotune: time the heuristic's
  // candidates (above); false: take its first.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(cudaStream_t stream, int64_t workspace_bytes,
                                                      bool autotune = true);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  absl::Status Run(const GemmArgs& args);

  int64_t workspace_bytes() const { return workspace_bytes_; }
  int64_t plans() const;

 private:
  struct Impl;
  Gemm() = default;
  // The index of the fastest of `count` candidates for the call x.
  absl::StatusOr<int> Tune(const GemmArgs& x, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                           cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                           const cublasLtMatmulHeuristicResult_t* results, int count,
                           const std::string& shape);
  std::unique_ptr<Impl> impl_;
  int64_t workspace_bytes_ = 0;
  bool autotune_ = true;
};

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_GEMM_H_
