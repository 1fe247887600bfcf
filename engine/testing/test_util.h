// Test utilities shared by the engine's tests (CPU, CUDA and ring), and used by a worker test and
// the end-to-end tests (tests/).
//
// Host tensors of any engine dtype and layout, conversion to and from float64, random inputs that
// are never zero, poisoning, the relative Frobenius error that docs/ENGINE.md's tolerances
// are stated in, and central finite differences. Everything here works on host memory only: a test
// of a device backend copies its tensors to the host first. Functions are pure unless they say
// otherwise; nothing here is thread-safe beyond that (tests are single-threaded callers).
#ifndef DATTN_ENGINE_TESTING_TEST_UTIL_H_
#define DATTN_ENGINE_TESTING_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "gtest/gtest.h"

namespace dattn {
namespace testutil {

// ---------------------------------------------------------------------------------------------------
// Element conversion.

// `x` rounded to `dtype` (round to nearest, ties to even; fp16 and bf16 saturate to +-inf like a
// cast), returned as a double. fp16/bf16 round through fp32, so a value within 2^-29 relative of a
// tie may round differently from a direct double->half rounding; test inputs never depend on that.
double RoundToDType(double x, DType dtype);

// Bit-level conversions for the 16-bit types.
uint16_t FloatToHalfBits(float x);
float HalfBitsToFloat(uint16_t bits);
uint16_t FloatToBFloat16Bits(float x);
float BFloat16BitsToFloat(uint16_t bits);

// Element `flat_index` (row-major order over view.shape) of a host view, read through its strides.
double ReadElement(const TensorView& view, int64_t flat_index);
// Writes RoundToDType(value) at element `flat_index` of a host view.
void WriteElement(const TensorView& view, int64_t flat_index, double value);

// Every element of a host view, in row-major order over its shape.
std::vector<double> ToDoubles(const TensorView& view);
// Writes values (row-major order over the view's shape; size must equal NumElements()).
void FromDoubles(const std::vector<double>& values, const TensorView& view);

// ---------------------------------------------------------------------------------------------------
// Host tensors.

// Memory layouts for views; all but kContiguous are non-contiguous strided views.
enum class Layout {
  kContiguous,   // Row-major, no gaps.
  kPadded,       // Row-major with one unused element after every row of every dimension.
  kInterleaved,  // Like kPadded, and the innermost stride is 2.
  kReversed,     // Column-major: the first dimension varies fastest.
};
const char* LayoutName(Layout layout);

// Owns host storage for one view. Move-only: the view points into the storage, which moves with it.
// A new tensor is poisoned (every byte of its storage, including gaps, holds NaN).
class HostTensor {
 public:
  HostTensor(DType dtype, std::vector<int64_t> shape, Layout layout = Layout::kContiguous);
  // A tensor holding `values` (row-major order over `shape`) rounded to `dtype`.
  static HostTensor FromValues(DType dtype, std::vector<int64_t> shape,
                               const std::vector<double>& values,
                               Layout layout = Layout::kContiguous);

  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;

  const TensorView& view() const { return view_; }
  std::vector<double> ToDoubles() const { return testutil::ToDoubles(view_); }
  // Sets every element of the storage (including gaps) to NaN, so that an element a backend fails
  // to write shows up in any comparison.
  void Poison();
  // Sets every element of the storage to `value` rounded to the dtype.
  void Fill(double value);
  // The raw storage, for "nothing was written" checks.
  std::vector<unsigned char> Bytes() const;

 private:
  std::vector<double> storage_;   // double-sized words keep every dtype aligned.
  int64_t storage_elements_ = 0;  // Elements of view_.dtype that fit in storage_.
  TensorView view_;
};

// ---------------------------------------------------------------------------------------------------
// Random inputs and seeds.

// SplitMix64: small, fully specified, so a seed reproduces the same values on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();

 private:
  uint64_t state_;
};

// `count` values uniform in [-magnitude, magnitude] with |x| >= magnitude / 1000: never zero.
std::vector<double> RandomValues(int64_t count, uint64_t seed, double magnitude = 1.0);

// This process's base seed: the environment variable DATTN_TEST_SEED if set (decimal), otherwise
// drawn once from the clock. Fresh by default, reproducible on demand.
uint64_t BaseSeed();
// A seed for one check, mixing BaseSeed(), the running gtest test's full name and `label`, so that
// a failing check is reproduced by running the same test with the same DATTN_TEST_SEED, whatever
// other tests run in the process.
uint64_t CheckSeed(const std::string& label);
// "DATTN_TEST_SEED=<base> (bazel test --test_env=DATTN_TEST_SEED=<base>) reproduces this run": put
// it in a SCOPED_TRACE so that every failure prints it.
std::string ReproduceHint();

// docs/ENGINE.md's bound on ||out - ref|| / ||ref|| (and on dq, dk, dv) for a backend's
// results in `dtype`: fp64 1e-12, fp32 1e-5, fp16 2e-3, bf16 1e-2.
double SpecTolerance(DType dtype);
// The bound the tests put on the log-sum-exp on a GPU, where it is fp32 whatever the inputs: 1e-5
// for fp32 inputs, 1e-4 for 16-bit ones (it sees only their rounding, which the oracle shares).
double GpuLseTolerance(DType dtype);

// The path of a file of the workspace among a test's runfiles (a binary in `data`), e.g.
// "worker/dattn-worker"; the relative path itself outside Bazel.
std::string RunfilePath(const std::string& workspace_relative);

// ---------------------------------------------------------------------------------------------------
// Comparisons.

// ||x - ref||_F / ||ref||_F; ||x - ref||_F if ref is all zero. NaN if any term is NaN (so a
// comparison `err <= tol` fails on unwritten, poisoned elements). Sizes must match.
double RelativeError(const std::vector<double>& x, const std::vector<double>& ref);

// Success when RelativeError(x, ref) <= tol; the failure message names `what`, the error, the
// largest elementwise difference with its index and values, and how many elements of x are NaN.
::testing::AssertionResult RelativelyNear(const std::string& what, const std::vector<double>& x,
                                          const std::vector<double>& ref, double tol);

// For log-sum-exp rows: -inf entries of ref and x must coincide exactly; the other entries must be
// RelativelyNear.
::testing::AssertionResult LseNear(const std::string& what, const std::vector<double>& x,
                                   const std::vector<double>& ref, double tol);

// Success when the two byte strings are identical; the message counts differing bytes.
::testing::AssertionResult BytesEqual(const std::string& what, const std::vector<unsigned char>& a,
                                      const std::vector<unsigned char>& b);

// ---------------------------------------------------------------------------------------------------
// Finite differences.

// Gradient of f at x by central differences: (f(x + h e_i) - f(x - h e_i)) / (2 h) for every i.
std::vector<double> CentralDifferenceGradient(
    const std::function<double(const std::vector<double>&)>& f, const std::vector<double>& x,
    double step);

// sum_i a_i * b_i; NaN if the sizes differ.
double Dot(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace testutil
}  // namespace dattn

#endif  // DATTN_ENGINE_TESTING_TEST_UTIL_H_
