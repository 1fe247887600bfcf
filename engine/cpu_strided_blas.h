// BLAS on strided rows, shared by the CPU backend and the CPU ring kernels (engine-internal).
//
// The dilated rows p0, p0 + r, ... of one (batch, head) of a (B, N, H, D) tensor are a matrix with
// leading dimension r * stride_N: BLAS reads them in place when that fits its int, and they are
// gathered into caller scratch otherwise. Header-only; every function is pure apart from writing
// its output arguments.
#ifndef DATTN_ENGINE_CPU_STRIDED_BLAS_H_
#define DATTN_ENGINE_CPU_STRIDED_BLAS_H_

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/tensor.h"

namespace dattn {
namespace cpu {

template <typename T>
struct Blas;

template <>
struct Blas<float> {
  static void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  }
};

template <>
struct Blas<double> {
  static void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                   double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
                   double beta, double* c, int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
                beta, c, static_cast<int>(ldc));
  }
};

// A (B, N, H, D) tensor seen through its strides.
template <typename T>
struct View4 {
  T* data = nullptr;
  int64_t sb = 0, sn = 0, sh = 0, sd = 0;

  View4() = default;
  explicit View4(const TensorView& v)
      : data(static_cast<T*>(v.data)),
        sb(v.strides[0]),
        sn(v.strides[1]),
        sh(v.strides[2]),
        sd(v.strides[3]) {}
  T* At(int64_t b, int64_t p, int64_t h) const { return data + b * sb + p * sn + h * sh; }
};

// A row-major matrix as BLAS takes it.
template <typename T>
struct Mat {
  const T* ptr;
  int64_t ld;
};

// Rows p0, p0 + r, ..., p0 + (n-1) r of head h, batch b, as a matrix of n x d. Direct when BLAS can
// step over the view (unit channel stride, row stride in [d, INT_MAX]); otherwise gathered into
// `scratch` (n x d).
template <typename T>
Mat<T> Rows(const View4<const T>& v, int64_t b, int64_t h, int64_t p0, int64_t r, int64_t n,
            int64_t d, T* scratch) {
  const T* first = v.At(b, p0, h);
  if (v.sd == 1) {
    if (n == 1) return {first, d};
    int64_t ld = 0;
    if (!__builtin_mul_overflow(r, v.sn, &ld) && ld >= d && ld <= INT_MAX) return {first, ld};
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* src = v.At(b, p0 + i * r, h);
    T* dst = scratch + i * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = src[c * v.sd];
  }
  return {scratch, d};
}

// C rows p0, p0 + r, ... (n x d, contiguous tensor with row stride `row_stride`) += alpha op(A)
// op(B), directly when the stride fits BLAS's int, through `scratch` (n x d) otherwise.
template <typename T>
void GemmAccumulateRows(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t n, int64_t d, int64_t k,
                        T alpha, Mat<T> a, Mat<T> b, T* c, int64_t row_stride, T* scratch) {
  if (n == 1 || row_stride <= INT_MAX) {
    Blas<T>::Gemm(ta, tb, n, d, k, alpha, a.ptr, a.ld, b.ptr, b.ld, T(1), c,
                  n == 1 ? d : row_stride);
    return;
  }
  Blas<T>::Gemm(ta, tb, n, d, k, alpha, a.ptr, a.ld, b.ptr, b.ld, T(0), scratch, d);
  for (int64_t i = 0; i < n; ++i) {
    T* dst = c + i * row_stride;
    const T* src = scratch + i * d;
    for (int64_t x = 0; x < d; ++x) dst[x] += src[x];
  }
}

// log(exp(a) + exp(b)) without overflow; -inf when both are -inf, NaN when either is NaN.
inline double LogAddExp(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  const double m = std::max(a, b);
  if (m == -std::numeric_limits<double>::infinity()) return m;
  return m + std::log1p(std::exp(-std::fabs(a - b)));
}

}  // namespace cpu
}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_STRIDED_BLAS_H_
