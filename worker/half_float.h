// The 16-bit floating-point formats of the API (IEEE binary16 "fp16" and bfloat16 "bf16") on the
// host: conversion from double with one rounding (to nearest, ties to even; values beyond the
// largest finite number become +-inf, as a cast does; NaN stays NaN) and exact conversion back to
// double.
//
// Job inputs are generated in double and rounded once to the job's dtype (random_inputs.h); a GPU
// worker's results come back as these bits and are checksummed in double. Pure functions.
#ifndef DATTN_WORKER_HALF_FLOAT_H_
#define DATTN_WORKER_HALF_FLOAT_H_

#include <cstdint>

namespace dattn {
namespace worker {

uint16_t DoubleToHalfBits(double x);
uint16_t DoubleToBFloat16Bits(double x);
double HalfBitsToDouble(uint16_t bits);
double BFloat16BitsToDouble(uint16_t bits);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_HALF_FLOAT_H_
