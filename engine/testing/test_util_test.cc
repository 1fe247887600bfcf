#include "engine/testing/test_util.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace testutil {
namespace {

TEST(HalfTest, KnownEncodings) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);                      // Largest finite half.
  EXPECT_EQ(FloatToHalfBits(65519.0f), 0x7bff);                      // Rounds down to it.
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);                      // Halfway to 2^16: infinity.
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);         // Smallest subnormal.
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);         // Tie to even: zero.
  EXPECT_EQ(FloatToHalfBits(std::ldexp(3.0f, -25)), 0x0002);         // Tie to even: 2.
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -14)), 0x0400);         // Smallest normal.
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // Tie, even mantissa.
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // Tie, odd: up.
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(std::nanf("")))));
}

TEST(HalfTest, RoundTripsEveryFiniteHalf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00) continue;  // Inf and NaN.
    ASSERT_EQ(FloatToHalfBits(HalfBitsToFloat(h)), h) << std::hex << bits;
  }
}

TEST(BFloat16Test, KnownEncodings) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(-1.0f), 0xbf80);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // Tie, even: down.
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // Tie, odd: up.
  EXPECT_EQ(BFloat16BitsToFloat(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(std::nanf("")))));
}

TEST(RoundToDTypeTest, EachType) {
  const double x = 1.0 / 3.0;
  EXPECT_EQ(RoundToDType(x, DType::kFloat64), x);
  EXPECT_EQ(RoundToDType(x, DType::kFloat32), static_cast<double>(static_cast<float>(x)));
  EXPECT_NEAR(RoundToDType(x, DType::kFloat16), x, std::ldexp(1.0, -13));
  EXPECT_NE(RoundToDType(x, DType::kFloat16), static_cast<double>(static_cast<float>(x)));
  EXPECT_NEAR(RoundToDType(x, DType::kBFloat16), x, std::ldexp(1.0, -10));
}

class LayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(LayoutTest, RoundTripsValuesThroughStrides) {
  const std::vector<int64_t> shape = {2, 3, 4, 5};
  std::vector<double> values(2 * 3 * 4 * 5);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i) + 0.5;
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    HostTensor t = HostTensor::FromValues(dtype, shape, values, GetParam());
    EXPECT_EQ(t.view().dtype, dtype);
    EXPECT_EQ(t.view().shape, shape);
    EXPECT_EQ(t.view().IsContiguous(), GetParam() == Layout::kContiguous);
    std::vector<double> expected(values.size());
    for (size_t i = 0; i < values.size(); ++i) expected[i] = RoundToDType(values[i], dtype);
    EXPECT_EQ(t.ToDoubles(), expected) << DTypeName(dtype);
    // Element (1, 2, 3, 4) is the last one in row-major order.
    EXPECT_EQ(ReadElement(t.view(), 119), expected[119]);
  }
}

TEST_P(LayoutTest, PoisonReachesEveryElementAndMovesKeepTheView) {
  HostTensor t = HostTensor::FromValues(DType::kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6}, GetParam());
  HostTensor moved = std::move(t);
  EXPECT_EQ(moved.ToDoubles(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  moved.Poison();
  for (double x : moved.ToDoubles()) EXPECT_TRUE(std::isnan(x));
}

INSTANTIATE_TEST_SUITE_P(All, LayoutTest,
                         ::testing::Values(Layout::kContiguous, Layout::kPadded,
                                           Layout::kInterleaved, Layout::kReversed),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(LayoutName(info.param));
                         });

TEST(HostTensorTest, NewTensorIsPoisonedAndEmptyTensorHasData) {
  HostTensor t(DType::kFloat64, {2, 2});
  for (double x : t.ToDoubles()) EXPECT_TRUE(std::isnan(x));
  HostTensor empty(DType::kFloat32, {0, 4});
  EXPECT_NE(empty.view().data, nullptr);
  EXPECT_TRUE(empty.ToDoubles().empty());
}

TEST(HostTensorTest, BytesSeeWrites) {
  HostTensor t = HostTensor::FromValues(DType::kFloat64, {2}, {1.0, 2.0});
  const std::vector<unsigned char> before = t.Bytes();
  EXPECT_TRUE(BytesEqual("same", before, t.Bytes()));
  WriteElement(t.view(), 1, 3.0);
  EXPECT_FALSE(BytesEqual("changed", before, t.Bytes()));
}

TEST(RandomTest, ValuesAreReproducibleBoundedAndNeverZero) {
  const std::vector<double> a = RandomValues(10000, 42, 2.0);
  EXPECT_EQ(a, RandomValues(10000, 42, 2.0));
  EXPECT_NE(a, RandomValues(10000, 43, 2.0));
  double sum = 0.0;
  for (double x : a) {
    EXPECT_LE(std::fabs(x), 2.0);
    EXPECT_GE(std::fabs(x), 2.0 / 1000.0);
    sum += x;
  }
  EXPECT_LT(std::fabs(sum / a.size()), 0.1);  // Centred.
}

TEST(SeedTest, ChecksGetDistinctStableSeeds) {
  EXPECT_EQ(CheckSeed("a"), CheckSeed("a"));
  EXPECT_NE(CheckSeed("a"), CheckSeed("b"));
  EXPECT_NE(ReproduceHint().find(std::to_string(BaseSeed())), std::string::npos);
}

TEST(CompareTest, RelativeError) {
  EXPECT_DOUBLE_EQ(RelativeError({3.0, 4.0}, {3.0, 4.0}), 0.0);
  EXPECT_DOUBLE_EQ(RelativeError({3.0, 4.5}, {3.0, 4.0}), 0.1);
  EXPECT_DOUBLE_EQ(RelativeError({0.0, 0.5}, {0.0, 0.0}), 0.5);  // Absolute for a zero reference.
  EXPECT_TRUE(std::isnan(RelativeError({std::nan(""), 4.0}, {3.0, 4.0})));
  EXPECT_TRUE(RelativelyNear("x", {1.0, 2.0}, {1.0, 2.0 + 1e-13}, 1e-12));
  EXPECT_FALSE(RelativelyNear("x", {1.0, 2.0}, {1.0, 2.1}, 1e-12));
  EXPECT_FALSE(RelativelyNear("x", {std::nan(""), 2.0}, {1.0, 2.0}, 1e-12));
  EXPECT_FALSE(RelativelyNear("x", {1.0}, {1.0, 2.0}, 1e-12));
}

TEST(CompareTest, LseRequiresMatchingNegativeInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(LseNear("lse", {-inf, 1.0}, {-inf, 1.0}, 1e-12));
  EXPECT_FALSE(LseNear("lse", {0.0, 1.0}, {-inf, 1.0}, 1e-12));
  EXPECT_FALSE(LseNear("lse", {-inf, 1.0}, {0.5, 1.0}, 1e-12));
  EXPECT_FALSE(LseNear("lse", {std::nan(""), 1.0}, {-inf, 1.0}, 1e-12));
  EXPECT_FALSE(LseNear("lse", {-inf, std::nan("")}, {-inf, 1.0}, 1e-12));
}

TEST(FiniteDifferenceTest, GradientOfAKnownFunction) {
  // f(x) = x0^2 x1 + sin(x2): gradient (2 x0 x1, x0^2, cos(x2)).
  auto f = [](const std::vector<double>& x) { return x[0] * x[0] * x[1] + std::sin(x[2]); };
  const std::vector<double> x = {0.7, -1.3, 0.4};
  const std::vector<double> g = CentralDifferenceGradient(f, x, 1e-5);
  EXPECT_NEAR(g[0], 2 * 0.7 * -1.3, 1e-9);
  EXPECT_NEAR(g[1], 0.49, 1e-9);
  EXPECT_NEAR(g[2], std::cos(0.4), 1e-9);
  EXPECT_DOUBLE_EQ(Dot({1, 2, 3}, {4, 5, 6}), 32.0);
}

}  // namespace
}  // namespace testutil
}  // namespace dattn
