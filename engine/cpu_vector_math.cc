#include "engine/cpu_vector_math.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dattn {
namespace cpu {
namespace {

// exp(x) = 2^n * e^f with n = round(x / ln 2) and |f| <= ln(2)/2; e^f by Cephes' degree-7 minimax
// polynomial (coefficients from the published Cephes expf), ln 2 split in two for an exact-ish f.
// 2^n is applied as 2^(n/2) * 2^(n - n/2) so that n in [-126, 128] never builds an inf or subnormal
// scale factor.
inline __m256 Exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.72283935546875f);   // ln(FLT_MAX)
  const __m256 lo = _mm256_set1_ps(-87.33654022216797f);  // ln(FLT_MIN)
  // min/max return the second operand when either is NaN: keep x second so NaN passes through.
  __m256 xc = _mm256_min_ps(hi, x);
  xc = _mm256_max_ps(lo, xc);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 f2 = _mm256_mul_ps(f, f);
  __m256 y = _mm256_fmadd_ps(p, f2, _mm256_add_ps(f, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return y;
}

// Lanes [0, n) of a partial vector, n in [0, 8).
inline __m256i TailMask(int64_t n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// fp64: exp(x) = 2^n * e^f as above, e^f by its Taylor series to degree 13 (the remainder,
// 0.35^14 / 14! ~ 4e-18, is below half an ulp), ln 2 split as in fdlibm so that n * ln2_hi is
// exact.
inline __m256d Exp4d(__m256d x) {
  const __m256d hi = _mm256_set1_pd(709.782712893384);    // ln(DBL_MAX)
  const __m256d lo = _mm256_set1_pd(-708.3964185322641);  // ln(DBL_MIN)
  __m256d xc = _mm256_min_pd(hi, x);
  xc = _mm256_max_pd(lo, xc);
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(xc, _mm256_set1_pd(1.4426950408889634)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d f = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.93147180369123816490e-01), xc);
  f = _mm256_fnmadd_pd(n, _mm256_set1_pd(1.90821492927058770002e-10), f);
  constexpr double kInvFactorial[14] = {1.0,
                                        1.0,
                                        1.0 / 2,
                                        1.0 / 6,
                                        1.0 / 24,
                                        1.0 / 120,
                                        1.0 / 720,
                                        1.0 / 5040,
                                        1.0 / 40320,
                                        1.0 / 362880,
                                        1.0 / 3628800,
                                        1.0 / 39916800,
                                        1.0 / 479001600,
                                        1.0 / 6227020800};
  __m256d p = _mm256_set1_pd(kInvFactorial[13]);
  for (int k = 12; k >= 0; --k) p = _mm256_fmadd_pd(p, f, _mm256_set1_pd(kInvFactorial[k]));
  const __m128i ni = _mm256_cvtpd_epi32(n);
  const __m128i n1 = _mm_srai_epi32(ni, 1);
  const __m128i n2 = _mm_sub_epi32(ni, n1);
  const __m128i bias = _mm_set1_epi32(1023);
  const __m256d s1 =
      _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(n1, bias)), 52));
  const __m256d s2 =
      _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(n2, bias)), 52));
  __m256d y = _mm256_mul_pd(_mm256_mul_pd(p, s1), s2);
  y = _mm256_blendv_pd(y, _mm256_setzero_pd(), _mm256_cmp_pd(x, lo, _CMP_LT_OQ));
  y = _mm256_blendv_pd(y, _mm256_set1_pd(std::numeric_limits<double>::infinity()),
                       _mm256_cmp_pd(x, hi, _CMP_GT_OQ));
  return y;
}

// Lanes [0, n) of a partial fp64 vector, n in [0, 4).
inline __m256i TailMask4(int64_t n) {
  const __m256i lanes = _mm256_setr_epi64x(0, 1, 2, 3);
  return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), lanes);
}

inline double HorizontalSum4(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

// GCC 12's AVX-512 intrinsics build "undefined" vectors as `__m512i __Y = __Y;`, which -Wall
// reports as uninitialized wherever they are inlined into a function whose baseline target lacks
// AVX-512. The warning is about the header's idiom, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // A GCC warning; clang has no such group.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The AVX-512 version of Exp8: the same reduction and polynomial, but 2^n is applied by vscalefps,
// which handles overflow to inf and gradual underflow itself, so the only clamp keeps -inf from
// turning f into NaN (exp(-104) already rounds to 0).
__attribute__((target("avx512f"))) inline __m512 Exp16(__m512 x) {
  __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
  xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), xc);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 f2 = _mm512_mul_ps(f, f);
  const __m512 y = _mm512_fmadd_ps(p, f2, _mm512_add_ps(f, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// Reductions go through memory and the AVX2 helpers (once per row, not in the inner loop).
__attribute__((target("avx512f"))) inline float HorizontalSum16(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return HorizontalSum(_mm256_add_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)));
}

__attribute__((target("avx512f"))) inline float HorizontalMax16(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return HorizontalMax(_mm256_max_ps(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8)));
}

inline __mmask16 TailMask16(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

__attribute__((target("avx512f"))) void Exp512(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, Exp16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 mask = TailMask16(n - i);
    _mm512_mask_storeu_ps(y + i, mask, Exp16(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

// max_ps drops a NaN operand, so NaN is tracked on the side: a row with a NaN score must come out
// NaN, as in ordinary attention.
__attribute__((target("avx512f"))) float RowMax512(const float* x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m1 = m0;
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i);
    const __m512 b = _mm512_loadu_ps(x + i + 16);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  for (; i < n; i += 16) {
    const __mmask16 mask = TailMask16(std::min<int64_t>(16, n - i));
    const __m512 a = _mm512_maskz_loadu_ps(mask, x + i);
    nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    m0 = _mm512_mask_max_ps(m0, mask, m0, a);
  }
  if (nan != 0) return std::numeric_limits<float>::quiet_NaN();
  return HorizontalMax16(_mm512_max_ps(m0, m1));
}

__attribute__((target("avx512f"))) float ExpShiftSum512(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 e0 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    const __m512 e1 = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), s));
    _mm512_storeu_ps(x + i, e0);
    _mm512_storeu_ps(x + i + 16, e1);
    acc0 = _mm512_add_ps(acc0, e0);
    acc1 = _mm512_add_ps(acc1, e1);
  }
  for (; i < n; i += 16) {
    const __mmask16 mask = TailMask16(std::min<int64_t>(16, n - i));
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s));
    _mm512_mask_storeu_ps(x + i, mask, e);
    acc0 = _mm512_mask_add_ps(acc0, mask, acc0, e);
  }
  return HorizontalSum16(_mm512_add_ps(acc0, acc1));
}

// The online-softmax step over transposed scores (see SoftmaxColumnsStep), 16 queries at a time:
// every operation is vertical, so no row needs a horizontal reduction.
__attribute__((target("avx512f"))) void SoftmaxColumns512(float* st, int64_t ldst, int64_t rows,
                                                          int64_t cols, float* m, float* l,
                                                          float* alpha) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t c = 0; c < cols; c += 16) {
    __m512 block_max = neg_inf;
    __mmask16 nan = 0;
    for (int64_t j = 0; j < rows; ++j) {
      const __m512 x = _mm512_loadu_ps(st + j * ldst + c);
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      block_max = _mm512_max_ps(block_max, x);
    }
    const __m512 m_old = _mm512_loadu_ps(m + c);
    nan |= _mm512_cmp_ps_mask(m_old, m_old, _CMP_UNORD_Q);
    // max_ps drops NaN: a query that met a NaN score stays NaN, as in ordinary attention.
    const __m512 m_new =
        _mm512_mask_mov_ps(_mm512_max_ps(m_old, block_max), nan,
                           _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
    // A query with nothing visible yet keeps m = -inf; shifting by 0 then gives exp(-inf) = 0
    // instead of exp(-inf - -inf) = NaN.
    const __m512 shift = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ),
                                            _mm512_setzero_ps());
    const __m512 a = Exp16(_mm512_sub_ps(m_old, shift));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < rows; ++j) {
      float* row = st + j * ldst + c;
      const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(row), shift));
      _mm512_storeu_ps(row, e);
      sum = _mm512_add_ps(sum, e);
    }
    _mm512_storeu_ps(l + c, _mm512_fmadd_ps(_mm512_loadu_ps(l + c), a, sum));
    _mm512_storeu_ps(m + c, m_new);
    _mm512_storeu_ps(alpha + c, a);
  }
}

#pragma GCC diagnostic pop

bool g_allow_avx512 = true;

// CPUID is read once: every call after the first is a load and a branch.
bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have && g_allow_avx512;
}

}  // namespace

bool AllowAvx512ForTesting(bool allow) {
  const bool previous = g_allow_avx512;
  g_allow_avx512 = allow;
  return previous;
}

bool UsesAvx512() { return HaveAvx512(); }

void Exp(const float* x, float* y, int64_t n) {
  if (HaveAvx512()) return Exp512(x, y, n);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, Exp8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mask = TailMask(n - i);
    _mm256_maskstore_ps(y + i, mask, Exp8(_mm256_maskload_ps(x + i, mask)));
  }
}

void Exp(const double* x, double* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(y + i, Exp4d(_mm256_loadu_pd(x + i)));
  if (i < n) {
    const __m256i mask = TailMask4(n - i);
    _mm256_maskstore_pd(y + i, mask, Exp4d(_mm256_maskload_pd(x + i, mask)));
  }
}

float RowMax(const float* x, int64_t n) {
  if (HaveAvx512()) return RowMax512(x, n);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  __m256 m0 = _mm256_set1_ps(neg_inf);
  __m256 m1 = m0;
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i);
    const __m256 b = _mm256_loadu_ps(x + i + 8);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
    m0 = _mm256_max_ps(m0, a);
    m1 = _mm256_max_ps(m1, b);
  }
  float m = HorizontalMax(_mm256_max_ps(m0, m1));
  if (_mm256_movemask_ps(nan) != 0) return std::numeric_limits<float>::quiet_NaN();
  for (; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    m = std::max(m, x[i]);
  }
  return m;
}

double RowMax(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return x[i];
    m = std::max(m, x[i]);
  }
  return m;
}

float ExpShiftSum(float* x, int64_t n, float shift) {
  if (HaveAvx512()) return ExpShiftSum512(x, n, shift);
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    const __m256 e1 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), s));
    _mm256_storeu_ps(x + i, e0);
    _mm256_storeu_ps(x + i + 8, e1);
    acc0 = _mm256_add_ps(acc0, e0);
    acc1 = _mm256_add_ps(acc1, e1);
  }
  for (; i < n; i += 8) {
    const __m256i mask = TailMask(std::min<int64_t>(8, n - i));
    // Masked-off lanes load 0, and exp(0 - shift) must not enter the sum: zero them after Exp8.
    __m256 e = Exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), s));
    e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(x + i, mask, e);
    acc0 = _mm256_add_ps(acc0, e);
  }
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}

double ExpShiftSum(double* x, int64_t n, double shift) {
  const __m256d s = _mm256_set1_pd(shift);
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256d e0 = Exp4d(_mm256_sub_pd(_mm256_loadu_pd(x + i), s));
    const __m256d e1 = Exp4d(_mm256_sub_pd(_mm256_loadu_pd(x + i + 4), s));
    _mm256_storeu_pd(x + i, e0);
    _mm256_storeu_pd(x + i + 4, e1);
    acc0 = _mm256_add_pd(acc0, e0);
    acc1 = _mm256_add_pd(acc1, e1);
  }
  for (; i < n; i += 4) {
    const __m256i mask = TailMask4(std::min<int64_t>(4, n - i));
    __m256d e = Exp4d(_mm256_sub_pd(_mm256_maskload_pd(x + i, mask), s));
    e = _mm256_and_pd(e, _mm256_castsi256_pd(mask));
    _mm256_maskstore_pd(x + i, mask, e);
    acc0 = _mm256_add_pd(acc0, e);
  }
  return HorizontalSum4(_mm256_add_pd(acc0, acc1));
}

void SoftmaxColumnsStep(float* st, int64_t ldst, int64_t rows, int64_t cols, float* m, float* l,
                        float* alpha) {
  SoftmaxColumns512(st, ldst, rows, cols, m, l, alpha);
}

}  // namespace cpu
}  // namespace dattn
