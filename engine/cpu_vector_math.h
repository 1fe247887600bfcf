// Row kernels of the CPU backend's softmax: maximum, and exp with a shift and a running sum.
//
// The fp32 versions use AVX-512 where the CPU has it and AVX2+FMA (the build's DATTN_FAST_COPTS
// baseline) otherwise, with the same polynomial; the fp64 versions use AVX2+FMA. All functions are
// pure and thread-safe (except AllowAvx512ForTesting); arrays may have any alignment.
#ifndef DATTN_ENGINE_CPU_VECTOR_MATH_H_
#define DATTN_ENGINE_CPU_VECTOR_MATH_H_

#include <cstdint>

namespace dattn {
namespace cpu {

// y[i] = exp(x[i]) for i < n (x == y allowed). Relative error below 2 ulp wherever the result is a
// normal number (fp32: x in [-87.33, 88.72]; fp64: x in [-708.39, 709.78]); below that range the
// result is 0 or the subnormal exp(x) (versions differ), above it +inf; NaN stays NaN.
void Exp(const float* x, float* y, int64_t n);
void Exp(const double* x, double* y, int64_t n);

// Largest of x[0..n); -inf when n == 0, NaN when any element is NaN.
float RowMax(const float* x, int64_t n);
double RowMax(const double* x, int64_t n);

// x[i] := exp(x[i] - shift) for i < n; returns the sum of the new values.
float ExpShiftSum(float* x, int64_t n, float shift);
double ExpShiftSum(double* x, int64_t n, double shift);

// One block of an online softmax over transposed scores: st is rows (keys) x cols (queries), row
// stride ldst, cols a multiple of 16; m, l, alpha hold one value per query. For each query i:
// m_new = max(m[i], max_j st[j][i]) (NaN if any is NaN); st[j][i] := exp(st[j][i] - m_new);
// alpha[i] := exp(m[i] - m_new); l[i] := l[i] * alpha[i] + sum_j st[j][i]; m[i] := m_new. A query
// whose m_new is -inf (nothing visible yet) gets zeros and alpha = 0. AVX-512 only: call it only
// when UsesAvx512().
void SoftmaxColumnsStep(float* st, int64_t ldst, int64_t rows, int64_t cols, float* m, float* l,
                        float* alpha);

// Whether the fp32 functions run their AVX-512 versions.
bool UsesAvx512();

// Tests only, with no other thread calling into this file: allow == false forces the AVX2 versions.
// Returns the previous setting.
bool AllowAvx512ForTesting(bool allow);

}  // namespace cpu
}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_VECTOR_MATH_H_
