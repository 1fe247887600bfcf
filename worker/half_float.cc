#include "worker/half_float.h"

#include <cmath>
#include <cstring>

namespace dattn {
namespace worker {
namespace {

// x rounded to a binary format with `exp_bits` exponent and `mant_bits` stored mantissa bits (at
// most 16 bits in all), straight from the double's bits so that there is one rounding only.
uint16_t Narrow(double x, int exp_bits, int mant_bits) {
  uint64_t b = 0;
  std::memcpy(&b, &x, sizeof(b));
  const uint16_t sign = static_cast<uint16_t>((b >> 63) << (exp_bits + mant_bits));
  const int64_t exp = static_cast<int64_t>((b >> 52) & 0x7ff);
  const uint64_t mant = b & ((uint64_t{1} << 52) - 1);
  const uint16_t inf = static_cast<uint16_t>(((1u << exp_bits) - 1) << mant_bits);
  if (exp == 0x7ff) {
    // Infinity, or a quiet NaN (top mantissa bit set).
    return static_cast<uint16_t>(sign | inf | (mant != 0 ? 1u << (mant_bits - 1) : 0u));
  }
  if (exp == 0) return sign;  // Zero, or a double subnormal: far below any 16-bit subnormal.
  const int64_t bias = (int64_t{1} << (exp_bits - 1)) - 1;
  const int64_t e = exp - 1023;
  if (e > bias) return static_cast<uint16_t>(sign | inf);
  const int64_t emin = 1 - bias;
  // The significand bits that stay are full >> shift; the `shift` bits below decide the rounding.
  uint64_t head = 0;
  uint64_t full = 0;
  int shift = 0;
  if (e >= emin) {
    head = static_cast<uint64_t>(e + bias) << mant_bits;
    full = mant;  // The implicit leading 1 lives in the exponent field.
    shift = 52 - mant_bits;
  } else {
    // Subnormal in the narrow format: units of 2^(emin - mant_bits).
    full = mant | (uint64_t{1} << 52);
    shift = static_cast<int>(52 + emin - mant_bits - e);
    if (shift >= 54) return sign;  // Below half the smallest subnormal: rounds to zero.
  }
  const uint64_t rem = full & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  uint64_t bits = head | (full >> shift);
  // A carry out of the mantissa moves into the exponent, which is the right answer (up to inf).
  if (rem > half || (rem == half && (bits & 1) != 0)) ++bits;
  return static_cast<uint16_t>(sign | bits);
}

double Widen(uint16_t bits, int exp_bits, int mant_bits) {
  const bool negative = (bits >> (exp_bits + mant_bits)) & 1;
  const int exp = (bits >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << mant_bits) - 1);
  const int bias = (1 << (exp_bits - 1)) - 1;
  double value = 0;
  if (exp == (1 << exp_bits) - 1) {
    value = mant == 0 ? INFINITY : NAN;
  } else if (exp == 0) {
    value = std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits);
  } else {
    value = std::ldexp(static_cast<double>(mant | (1 << mant_bits)), exp - bias - mant_bits);
  }
  return negative ? -value : value;
}

}  // namespace

uint16_t DoubleToHalfBits(double x) { return Narrow(x, 5, 10); }
uint16_t DoubleToBFloat16Bits(double x) { return Narrow(x, 8, 7); }
double HalfBitsToDouble(uint16_t bits) { return Widen(bits, 5, 10); }
double BFloat16BitsToDouble(uint16_t bits) { return Widen(bits, 8, 7); }

}  // namespace worker
}  // namespace dattn
