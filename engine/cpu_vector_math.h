// Row kernels of the CPU backend's softmax: maximum, and exp with a shift and a running sum.
//
// The fp32 versions use AVX-512 where the CPU has it and AVX2+FMA (the build's DATTN_FAST_COPTS
// baseline) otherwise, with the same polynomial; the fp64 versions call std::exp, since fp64 is the
// reference path and must stay within 1e-12 of the oracle. All functions are pure and thread-safe
// (except AllowAvx512ForTesting); arrays may have any alignment.
#ifndef DATTN_ENGINE_CPU_VECTOR_MATH_H_
#define DATTN_ENGINE_CPU_VECTOR_MATH_H_

#include <cstdint>

namespace dattn {
namespace cpu {

// y[i] = exp(x[i]) for i < n (x == y allowed). fp32: relative error below 2 ulp for x in
// [-87.33, 88.72]; results that would be subnormal (x < -87.33, i.e. below FLT_MIN) are 0, x
// > 88.72 gives +inf, NaN stays NaN.
void Exp(const float* x, float* y, int64_t n);
void Exp(const double* x, double* y, int64_t n);

// Largest of x[0..n); -inf when n == 0, NaN when any element is NaN.
float RowMax(const float* x, int64_t n);
double RowMax(const double* x, int64_t n);

// x[i] := exp(x[i] - shift) for i < n; returns the sum of the new values.
float ExpShiftSum(float* x, int64_t n, float shift);
double ExpShiftSum(double* x, int64_t n, double shift);

// Whether the fp32 functions run their AVX-512 versions.
bool UsesAvx512();

// Tests only, with no other thread calling into this file: allow == false forces the AVX2 versions.
// Returns the previous setting.
bool AllowAvx512ForTesting(bool allow);

}  // namespace cpu
}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_VECTOR_MATH_H_
