#include "engine/cpu_attention_kernels.h"

#include <immintrin.h>

#include <algorithm>

#include "engine/cpu_vector_math.h"

namespace dattn {
namespace cpu {
namespace {

// GCC 12's AVX-512 headers trip -Wuninitialized when inlined into functions whose baseline target
// lacks AVX-512 (see cpu_vector_math.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // A GCC warning; clang has no such group.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// R keys x 64 queries of S^T: 4R accumulators; per channel 4 loads of Q^T and R broadcasts of key
// elements. R = 6: 24 accumulators + 4 operands fit the 32 zmm registers, and 10 loads per 24 FMAs
// keep the loop FMA-bound.
template <int R>
__attribute__((target("avx512f"))) void ScoresPanel(const float* qt, int64_t d, const float* k,
                                                    int64_t ldk, int64_t kd, float* st,
                                                    int64_t ldst) {
  __m512 acc[R][4];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t x = 0; x < d; ++x) {
    const float* row = qt + x * kQueryChunk;
    const __m512 q0 = _mm512_loadu_ps(row);
    const __m512 q1 = _mm512_loadu_ps(row + 16);
    const __m512 q2 = _mm512_loadu_ps(row + 32);
    const __m512 q3 = _mm512_loadu_ps(row + 48);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(k[r * ldk + x * kd]);
      acc[r][0] = _mm512_fmadd_ps(b, q0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, q1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(b, q2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(b, q3, acc[r][3]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(st + r * ldst + 16 * c, acc[r][c]);
  }
}

// R queries x NV*16 channels of the output: R*NV accumulators; per key NV loads of V and R
// broadcasts of P (R consecutive values of one row of P^T).
template <int R, int NV>
__attribute__((target("avx512f"))) void PvPanel(const float* pt, int64_t ldpt, int64_t nk,
                                                const float* v, int64_t ldv, float* acc) {
  constexpr int d = NV * 16;
  __m512 a[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) a[r][c] = _mm512_loadu_ps(acc + r * d + 16 * c);
  }
  for (int64_t j = 0; j < nk; ++j) {
    __m512 vv[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) vv[c] = _mm512_loadu_ps(v + j * ldv + 16 * c);
    const float* p = pt + j * ldpt;
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(p[r]);
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) a[r][c] = _mm512_fmadd_ps(b, vv[c], a[r][c]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc + r * d + 16 * c, a[r][c]);
  }
}

#pragma GCC diagnostic pop

// Panels of R rows, then the remainder with the next smaller panel (all instantiated at compile
// time).
template <int R>
void ScoresRows(const float* qt, int64_t d, const float* k, int64_t ldk, int64_t kd, int64_t nk,
                float* st, int64_t ldst) {
  int64_t j = 0;
  for (; j + R <= nk; j += R) ScoresPanel<R>(qt, d, k + j * ldk, ldk, kd, st + j * ldst, ldst);
  if constexpr (R > 1) {
    if (j < nk) ScoresRows<R - 1>(qt, d, k + j * ldk, ldk, kd, nk - j, st + j * ldst, ldst);
  }
}

template <int R, int NV>
void PvRows(const float* pt, int64_t ldpt, int64_t nq, int64_t nk, const float* v, int64_t ldv,
            float* acc) {
  constexpr int d = NV * 16;
  int64_t i = 0;
  for (; i + R <= nq; i += R) PvPanel<R, NV>(pt + i, ldpt, nk, v, ldv, acc + i * d);
  if constexpr (R > 1) {
    if (i < nq) PvRows<R - 1, NV>(pt + i, ldpt, nq - i, nk, v, ldv, acc + i * d);
  }
}

}  // namespace

bool AttentionKernelsFor(int64_t d) { return UsesAvx512() && d % 16 == 0 && d >= 16 && d <= 128; }

void PackQueriesTransposed(const float* q, int64_t ldq, int64_t qd, int64_t nq, int64_t d,
                           float scale, float* qt) {
  const int64_t chunks = (nq + kQueryChunk - 1) / kQueryChunk;
  for (int64_t c = 0; c < chunks; ++c) {
    float* dst = qt + c * d * kQueryChunk;
    const int64_t rows = std::min(kQueryChunk, nq - c * kQueryChunk);
    for (int64_t i = 0; i < rows; ++i) {
      const float* src = q + (c * kQueryChunk + i) * ldq;
      for (int64_t x = 0; x < d; ++x) dst[x * kQueryChunk + i] = scale * src[x * qd];
    }
    for (int64_t x = 0; x < d && rows < kQueryChunk; ++x) {
      std::fill(dst + x * kQueryChunk + rows, dst + (x + 1) * kQueryChunk, 0.0f);
    }
  }
}

void ScoresTransposed(const float* qt, int64_t nq, int64_t d, const float* k, int64_t ldk,
                      int64_t kd, int64_t nk, float* st, int64_t ldst) {
  const int64_t chunks = (nq + kQueryChunk - 1) / kQueryChunk;
  for (int64_t c = 0; c < chunks; ++c) {
    ScoresRows<6>(qt + c * d * kQueryChunk, d, k, ldk, kd, nk, st + c * kQueryChunk, ldst);
  }
}

void AccumulatePVTransposed(const float* pt, int64_t ldpt, int64_t nq, int64_t nk, const float* v,
                            int64_t ldv, int64_t d, float* acc) {
  switch (d / 16) {
    case 1:
      return PvRows<12, 1>(pt, ldpt, nq, nk, v, ldv, acc);
    case 2:
      return PvRows<12, 2>(pt, ldpt, nq, nk, v, ldv, acc);
    case 3:
      return PvRows<8, 3>(pt, ldpt, nq, nk, v, ldv, acc);
    case 4:
      return PvRows<6, 4>(pt, ldpt, nq, nk, v, ldv, acc);
    case 5:
      return PvRows<4, 5>(pt, ldpt, nq, nk, v, ldv, acc);
    case 6:
      return PvRows<4, 6>(pt, ldpt, nq, nk, v, ldv, acc);
    case 7:
      return PvRows<3, 7>(pt, ldpt, nq, nk, v, ldv, acc);
    case 8:
      return PvRows<3, 8>(pt, ldpt, nq, nk, v, ldv, acc);
  }
}

}  // namespace cpu
}  // namespace dattn
