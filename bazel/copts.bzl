"""Compiler options shared by every project target (generated code excluded)."""

# Project code is warning-free: -Werror turns any new warning into a build failure.
DATTN_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
]

# The engine's hot loops: vectorize for the x86-64 level every dev, CI and GPU host here has (AVX2+FMA).
DATTN_FAST_COPTS = DATTN_COPTS + [
    "-O3",
    "-mavx2",
    "-mfma",
    "-fno-math-errno",
]
