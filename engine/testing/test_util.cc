#include "engine/testing/test_util.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

namespace dattn {
namespace testutil {
namespace {

uint32_t FloatBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// The element of type `dtype` at element offset `offset` from `base`.
double LoadAt(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kFloat64:
      return static_cast<const double*>(base)[offset];
    case DType::kFloat32:
      return static_cast<const float*>(base)[offset];
    case DType::kFloat16:
      return HalfBitsToFloat(static_cast<const uint16_t*>(base)[offset]);
    case DType::kBFloat16:
      return BFloat16BitsToFloat(static_cast<const uint16_t*>(base)[offset]);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void StoreAt(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kFloat64:
      static_cast<double*>(base)[offset] = value;
      return;
    case DType::kFloat32:
      static_cast<float*>(base)[offset] = static_cast<float>(value);
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[offset] = FloatToHalfBits(static_cast<float>(value));
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[offset] = FloatToBFloat16Bits(static_cast<float>(value));
      return;
  }
}

// Element offset (in the view's strides) of row-major element `flat_index`.
int64_t StridedOffset(const TensorView& view, int64_t flat_index) {
  int64_t offset = 0;
  for (int dim = view.rank() - 1; dim >= 0; --dim) {
    const int64_t extent = view.shape[dim];
    offset += (flat_index % extent) * view.strides[dim];
    flat_index /= extent;
  }
  return offset;
}

int64_t Product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t HashString(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string CurrentTestName() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}

}  // namespace

uint16_t FloatToHalfBits(float x) {
  const uint32_t bits = FloatBits(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // Inf or NaN; NaN stays a quiet NaN.
    return sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity.
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24. Scaling by 2^24 is exact and
    // nearbyint rounds ties to even; 1024 becomes the smallest normal's encoding, as it should.
    const float scaled = BitsFloat(magnitude) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even;
  // a carry out of the mantissa correctly increments the exponent.
  uint32_t half = (magnitude >> 13) - ((127u - 15u) << 10);
  const uint32_t dropped = magnitude & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float HalfBitsToFloat(uint16_t bits) {
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity()
                         : std::numeric_limits<float>::quiet_NaN();
  }
  return sign * std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
}

uint16_t FloatToBFloat16Bits(float x) {
  const uint32_t bits = FloatBits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // Keep NaN a quiet NaN.
  }
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float BFloat16BitsToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

double RoundToDType(double x, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return x;
    case DType::kFloat32:
      return static_cast<float>(x);
    case DType::kFloat16:
      return HalfBitsToFloat(FloatToHalfBits(static_cast<float>(x)));
    case DType::kBFloat16:
      return BFloat16BitsToFloat(FloatToBFloat16Bits(static_cast<float>(x)));
  }
  return std::numeric_limits<double>::quiet_NaN();
}

double ReadElement(const TensorView& view, int64_t flat_index) {
  return LoadAt(view.data, view.dtype, StridedOffset(view, flat_index));
}

void WriteElement(const TensorView& view, int64_t flat_index, double value) {
  StoreAt(view.data, view.dtype, StridedOffset(view, flat_index), value);
}

std::vector<double> ToDoubles(const TensorView& view) {
  const int64_t n = Product(view.shape);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = ReadElement(view, i);
  return values;
}

void FromDoubles(const std::vector<double>& values, const TensorView& view) {
  const int64_t n = Product(view.shape);
  if (static_cast<int64_t>(values.size()) != n) {
    ADD_FAILURE() << "FromDoubles: " << values.size() << " values for " << view.DebugString();
    return;
  }
  for (int64_t i = 0; i < n; ++i) WriteElement(view, i, values[i]);
}

const char* LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kPadded:
      return "padded";
    case Layout::kInterleaved:
      return "interleaved";
    case Layout::kReversed:
      return "reversed";
  }
  return "unknown";
}

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape, Layout layout) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t span = 1;  // Elements from the first element to one past the last addressable one.
  switch (layout) {
    case Layout::kContiguous:
      for (int dim = rank - 1; dim >= 0; --dim) {
        strides[dim] = span;
        span *= shape[dim];
      }
      break;
    case Layout::kPadded:
    case Layout::kInterleaved:
      span = layout == Layout::kInterleaved ? 2 : 1;
      for (int dim = rank - 1; dim >= 0; --dim) {
        strides[dim] = span;
        span *= shape[dim] + 1;
      }
      break;
    case Layout::kReversed:
      for (int dim = 0; dim < rank; ++dim) {
        strides[dim] = span;
        span *= shape[dim];
      }
      break;
  }
  storage_elements_ = span;
  // One spare word so that even an empty tensor has a non-null data pointer.
  const size_t bytes = static_cast<size_t>(span) * DTypeSize(dtype);
  storage_.assign(bytes / sizeof(double) + 1, 0.0);
  view_.data = storage_.data();
  view_.dtype = dtype;
  view_.device = Device::kCpu;
  view_.device_index = 0;
  view_.shape = std::move(shape);
  view_.strides = std::move(strides);
  Poison();
}

HostTensor HostTensor::FromValues(DType dtype, std::vector<int64_t> shape,
                                  const std::vector<double>& values, Layout layout) {
  HostTensor tensor(dtype, std::move(shape), layout);
  FromDoubles(values, tensor.view_);
  return tensor;
}

void HostTensor::Poison() { Fill(std::numeric_limits<double>::quiet_NaN()); }

void HostTensor::Fill(double value) {
  for (int64_t i = 0; i < storage_elements_; ++i) StoreAt(storage_.data(), view_.dtype, i, value);
}

std::vector<unsigned char> HostTensor::Bytes() const {
  const auto* begin = reinterpret_cast<const unsigned char*>(storage_.data());
  return std::vector<unsigned char>(begin, begin + storage_.size() * sizeof(double));
}

uint64_t Random::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Random::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

std::vector<double> RandomValues(int64_t count, uint64_t seed, double magnitude) {
  Random random(seed);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& x : values) {
    do {
      x = magnitude * (2.0 * random.Uniform() - 1.0);
    } while (std::fabs(x) < magnitude / 1000.0);
  }
  return values;
}

uint64_t BaseSeed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("DATTN_TEST_SEED"); env != nullptr && *env != '\0') {
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 10));
    }
    const auto now = std::chrono::high_resolution_clock::now().time_since_epoch().count();
    return Mix64(static_cast<uint64_t>(now)) % 1000000000000ULL;  // Short enough to retype.
  }();
  return seed;
}

uint64_t CheckSeed(const std::string& label) {
  return Mix64(BaseSeed() ^ Mix64(HashString(CurrentTestName() + "/" + label)));
}

std::string ReproduceHint() {
  std::ostringstream out;
  out << "DATTN_TEST_SEED=" << BaseSeed()
      << " (bazel test --test_env=DATTN_TEST_SEED=" << BaseSeed() << ") reproduces this run";
  return out.str();
}

double RelativeError(const std::vector<double>& x, const std::vector<double>& ref) {
  if (x.size() != ref.size()) return std::numeric_limits<double>::quiet_NaN();
  double diff2 = 0.0;
  double ref2 = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = x[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
  }
  if (ref2 == 0.0) return std::sqrt(diff2);
  return std::sqrt(diff2 / ref2);
}

::testing::AssertionResult RelativelyNear(const std::string& what, const std::vector<double>& x,
                                          const std::vector<double>& ref, double tol) {
  if (x.size() != ref.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << x.size() << " values, reference has " << ref.size();
  }
  const double error = RelativeError(x, ref);
  if (error <= tol) return ::testing::AssertionSuccess();
  size_t worst = 0;
  double worst_diff = -1.0;
  int64_t nan_count = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      if (nan_count == 0) worst = i;
      ++nan_count;
      worst_diff = std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(x[i] - ref[i]);
    if (nan_count == 0 && d > worst_diff) {
      worst_diff = d;
      worst = i;
    }
  }
  return ::testing::AssertionFailure()
         << what << ": relative error " << error << " > " << tol << " over " << x.size()
         << " elements; " << nan_count << " NaN; worst at flat index " << worst << ": got "
         << x[worst] << ", want " << ref[worst];
}

::testing::AssertionResult LseNear(const std::string& what, const std::vector<double>& x,
                                   const std::vector<double>& ref, double tol) {
  if (x.size() != ref.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << x.size() << " values, reference has " << ref.size();
  }
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> finite_x;
  std::vector<double> finite_ref;
  int64_t mismatches = 0;
  size_t first_mismatch = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool x_unselected = x[i] == neg_inf;
    const bool ref_unselected = ref[i] == neg_inf;
    if (x_unselected != ref_unselected) {
      if (mismatches == 0) first_mismatch = i;
      ++mismatches;
    } else if (!ref_unselected) {
      finite_x.push_back(x[i]);
      finite_ref.push_back(ref[i]);
    }
  }
  if (mismatches > 0) {
    return ::testing::AssertionFailure()
           << what << ": " << mismatches
           << " rows disagree on -inf (unselected); first at flat index " << first_mismatch
           << ": got " << x[first_mismatch] << ", want " << ref[first_mismatch];
  }
  return RelativelyNear(what + " (finite rows)", finite_x, finite_ref, tol);
}

::testing::AssertionResult BytesEqual(const std::string& what, const std::vector<unsigned char>& a,
                                      const std::vector<unsigned char>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << what << ": sizes " << a.size() << " and " << b.size();
  }
  int64_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  if (differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << differing << " of " << a.size() << " bytes differ";
}

std::vector<double> CentralDifferenceGradient(
    const std::function<double(const std::vector<double>&)>& f, const std::vector<double>& x,
    double step) {
  std::vector<double> gradient(x.size());
  std::vector<double> probe = x;
  for (size_t i = 0; i < x.size(); ++i) {
    probe[i] = x[i] + step;
    const double plus = f(probe);
    probe[i] = x[i] - step;
    const double minus = f(probe);
    probe[i] = x[i];
    gradient[i] = (plus - minus) / (2.0 * step);
  }
  return gradient;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

double SpecTolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 1e-12;
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 1e-2;
  }
  return 1e-12;
}

double GpuLseTolerance(DType dtype) { return dtype == DType::kFloat32 ? 1e-5 : 1e-4; }

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return std::string(srcdir) + "/" + (workspace != nullptr ? workspace : "dattn") + "/" +
         workspace_relative;
}

}  // namespace testutil
}  // namespace dattn
