#include "worker/half_float.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace dattn {
namespace worker {
namespace {

// Every 16-bit pattern that is a number converts to a double and back to itself: the conversion
// to double is exact and rounding an exact value changes nothing.
TEST(HalfFloatTest, EveryFiniteBitPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const double h = HalfBitsToDouble(bits);
    if (std::isnan(h)) {
      EXPECT_TRUE(std::isnan(HalfBitsToDouble(DoubleToHalfBits(h)))) << b;
    } else {
      EXPECT_EQ(DoubleToHalfBits(h), bits) << b;
    }
    const double f = BFloat16BitsToDouble(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16BitsToDouble(DoubleToBFloat16Bits(f)))) << b;
    } else {
      EXPECT_EQ(DoubleToBFloat16Bits(f), bits) << b;
    }
  }
}

TEST(HalfFloatTest, KnownValues) {
  EXPECT_EQ(DoubleToHalfBits(1.0), 0x3c00);
  EXPECT_EQ(DoubleToHalfBits(-2.0), 0xc000);
  EXPECT_EQ(DoubleToHalfBits(65504.0), 0x7bff);               // Largest finite fp16.
  EXPECT_EQ(DoubleToHalfBits(65520.0), 0x7c00);               // Halfway to 2^16: rounds to inf.
  EXPECT_EQ(DoubleToHalfBits(std::ldexp(1.0, -24)), 0x0001);  // Smallest subnormal.
  EXPECT_EQ(DoubleToHalfBits(std::ldexp(1.0, -25)), 0x0000);  // Tie with zero: to even.
  EXPECT_EQ(DoubleToHalfBits(std::ldexp(1.5, -25)), 0x0001);
  EXPECT_EQ(DoubleToHalfBits(std::ldexp(1.0, -14)), 0x0400);            // Smallest normal.
  EXPECT_EQ(DoubleToHalfBits(1.0 + std::ldexp(1.0, -11)), 0x3c00);      // Tie: to even (down).
  EXPECT_EQ(DoubleToHalfBits(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);  // Tie: to even (up).
  EXPECT_EQ(DoubleToHalfBits(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), 0x3c01);
  EXPECT_EQ(DoubleToHalfBits(std::numeric_limits<double>::infinity()), 0x7c00);
  EXPECT_EQ(DoubleToBFloat16Bits(1.0), 0x3f80);
  EXPECT_EQ(DoubleToBFloat16Bits(-0.0), 0x8000);
  EXPECT_EQ(DoubleToBFloat16Bits(3.0e38), 0x7f62);
  EXPECT_EQ(DoubleToBFloat16Bits(1e39), 0x7f80);  // Beyond the largest finite bf16.
  EXPECT_EQ(DoubleToBFloat16Bits(1.0 + std::ldexp(1.0, -8)), 0x3f80);  // Tie: to even.
  EXPECT_TRUE(std::isnan(HalfBitsToDouble(DoubleToHalfBits(std::nan("")))));
  EXPECT_EQ(HalfBitsToDouble(0x3555), 0.333251953125);
  EXPECT_EQ(BFloat16BitsToDouble(0xc0a0), -5.0);
}

// Against a direct definition: the nearest representable value, ties to the even significand.
TEST(HalfFloatTest, RoundsToNearestOnRandomDoubles) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-30, 17);
  std::uniform_real_distribution<double> unit(-1, 1);
  for (int i = 0; i < 100000; ++i) {
    const double x = unit(rng) * std::exp2(exponent(rng));
    const uint16_t h = DoubleToHalfBits(x);
    const double got = HalfBitsToDouble(h);
    if (std::isinf(got)) {
      EXPECT_GE(std::fabs(x), 65520.0) << x;
      continue;
    }
    // The neighbours of the answer (one step either way) are no closer to x.
    const uint16_t mag = h & 0x7fff;
    for (int step : {-1, 1}) {
      if ((mag == 0 && step < 0) || mag + step >= 0x7c00) continue;
      const double other = HalfBitsToDouble(static_cast<uint16_t>((h & 0x8000) | (mag + step)));
      EXPECT_LE(std::fabs(got - x), std::fabs(other - x)) << x;
    }
  }
}

}  // namespace
}  // namespace worker
}  // namespace dattn
