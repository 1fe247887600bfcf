// Unit tests of the CPU backend's private helpers: the vectorized exp and softmax rows (both the
// AVX-512 and the AVX2 versions where the CPU has both) and the thread pool.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "engine/cpu_attention_kernels.h"
#include "engine/cpu_thread_pool.h"
#include "engine/cpu_vector_math.h"
#include "gtest/gtest.h"

namespace dattn {
namespace cpu {
namespace {

// Runs each test body once per instruction set the CPU offers.
class VectorMathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    previous_ = AllowAvx512ForTesting(GetParam());
    if (GetParam() && !UsesAvx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  }
  void TearDown() override { AllowAvx512ForTesting(previous_); }

 private:
  bool previous_ = true;
};

INSTANTIATE_TEST_SUITE_P(Isa, VectorMathTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Avx512" : "Avx2";
                         });

// Distance in units of the last place between two positive normal floats.
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

TEST_P(VectorMathTest, ExpIsWithinTwoUlpOverTheNormalRange) {
  // Every 997th float bit pattern of [-87.33, 88.72] (~4M values, all lanes and tails), walking the
  // bits of each sign from zero outwards.
  std::vector<float> x;
  for (float limit : {-87.33f, 88.72f}) {
    uint32_t end;
    std::memcpy(&end, &limit, 4);
    const uint32_t sign = end & 0x80000000u;
    for (uint32_t bits = sign; bits <= end; bits += 997) {
      float v;
      std::memcpy(&v, &bits, 4);
      x.push_back(v);
    }
  }
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(88.72f);
  std::vector<float> y(x.size());
  Exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  int64_t worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
    const int64_t ulp = UlpDistance(y[i], want);
    if (ulp > worst) {
      worst = ulp;
      worst_x = x[i];
    }
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
}

TEST_P(VectorMathTest, ExpEdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {
      -inf, -1000.0f, -87.5f, 89.0f, inf, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  std::vector<float> y(x.size(), 123.0f);
  Exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 0.0f);
  // exp(-87.5) is below FLT_MIN: 0, or the subnormal, within a subnormal's precision.
  EXPECT_GE(y[2], 0.0f);
  EXPECT_LE(y[2], 1.1e-38f);
  EXPECT_EQ(y[3], inf);
  EXPECT_EQ(y[4], inf);
  EXPECT_TRUE(std::isnan(y[5]));
  EXPECT_EQ(y[6], 1.0f);
}

TEST_P(VectorMathTest, ExpShiftSumEveryLengthLeavesTheTailAlone) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<float> x(n + 5);
    for (float& v : x) v = normal(rng);
    const std::vector<float> before = x;
    const float shift = 1.25f;
    const float sum = ExpShiftSum(x.data(), n, shift);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double arg = static_cast<double>(before[i]) - shift;
      const double want = std::exp(arg);
      want_sum += want;
      // 2 ulp of exp plus the rounding of x - shift in fp32 (half an ulp of |arg|, relative).
      const double tol = (2.4e-7 + 6e-8 * std::fabs(arg)) * want;
      EXPECT_NEAR(x[i], want, tol) << "n = " << n << ", i = " << i;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum + 1e-30) << "n = " << n;
    for (int64_t i = n; i < n + 5; ++i) EXPECT_EQ(x[i], before[i]) << "wrote past n = " << n;
  }
}

TEST_P(VectorMathTest, RowMaxEveryLengthAndNaN) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  EXPECT_EQ(RowMax(static_cast<const float*>(nullptr), 0), -std::numeric_limits<float>::infinity());
  for (int64_t n = 1; n <= 70; ++n) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    // The maximum in every position, the tail lanes included.
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> y = x;
      y[at] = 100.0f;
      EXPECT_EQ(RowMax(y.data(), n), 100.0f) << "n = " << n << ", at = " << at;
      y[at] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(RowMax(y.data(), n))) << "NaN lost: n = " << n << ", at = " << at;
    }
  }
}

TEST(VectorMathDoubleTest, ExpIsWithinTwoUlpOfStdExp) {
  // 1M points spread over the normal range, every length mod 4 covered by the tail below.
  std::vector<double> x;
  for (int64_t i = 0; i <= 1000000; ++i) x.push_back(-708.39 + i * (709.78 + 708.39) / 1000000);
  std::vector<double> y(x.size());
  Exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  double worst = 0;
  double worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(x[i]);
    const double ulps = std::fabs(y[i] - want) / (want * std::numeric_limits<double>::epsilon());
    if (ulps > worst) {
      worst = ulps;
      worst_x = x[i];
    }
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
}

TEST(VectorMathDoubleTest, EdgeValuesAndRows) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = {-inf, -800.0, 710.0, inf, std::numeric_limits<double>::quiet_NaN(), 0.0};
  std::vector<double> y(x.size());
  Exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 0.0);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_EQ(y[2], inf);
  EXPECT_EQ(y[3], inf);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], 1.0);
  for (int64_t n = 0; n <= 13; ++n) {
    std::vector<double> row(n + 3);
    for (size_t i = 0; i < row.size(); ++i) row[i] = 0.25 * static_cast<double>(i) - 1.0;
    const std::vector<double> before = row;
    const double sum = ExpShiftSum(row.data(), n, 0.5);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = std::exp(before[i] - 0.5);
      want_sum += want;
      EXPECT_NEAR(row[i], want, 4e-16 * want) << "n = " << n << ", i = " << i;
    }
    EXPECT_NEAR(sum, want_sum, 1e-15 * want_sum + 1e-300) << "n = " << n;
    for (size_t i = n; i < row.size(); ++i) EXPECT_EQ(row[i], before[i]) << "wrote past n = " << n;
  }
  std::vector<double> row = {1.0, 3.0, 2.0};
  EXPECT_EQ(RowMax(row.data(), 3), 3.0);
  row[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(RowMax(row.data(), 3)));
}

// --- The AVX-512 forward micro-kernels against plain loops (double accumulation).

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(AttentionKernelsTest, ScoresAndPvMatchPlainLoopsForEveryPanelRemainder) {
  if (!AttentionKernelsFor(64)) GTEST_SKIP() << "this CPU has no AVX-512";
  EXPECT_FALSE(AttentionKernelsFor(8));
  EXPECT_FALSE(AttentionKernelsFor(144));
  for (int64_t d : {16, 32, 48, 64, 80, 96, 112, 128}) {
    for (int64_t nq : {1, 5, 63, 64, 77}) {
      for (int64_t nk : {1, 6, 13}) {
        SCOPED_TRACE(::testing::Message() << "d=" << d << " nq=" << nq << " nk=" << nk);
        // Queries with row stride d + 3 and channel stride 1; keys dense.
        const int64_t ldq = d + 3;
        const std::vector<float> q = RandomFloats(nq * ldq, 1);
        const std::vector<float> k = RandomFloats(nk * d, 2);
        const std::vector<float> v = RandomFloats(nk * d, 3);
        const float scale = 0.3f;
        const int64_t padded = (nq + kQueryChunk - 1) / kQueryChunk * kQueryChunk;
        std::vector<float> qt(padded * d, 7.0f);
        PackQueriesTransposed(q.data(), ldq, 1, nq, d, scale, qt.data());
        const int64_t ldst = padded + 16;
        std::vector<float> st(nk * ldst, 7.0f);
        ScoresTransposed(qt.data(), nq, d, k.data(), d, 1, nk, st.data(), ldst);
        for (int64_t j = 0; j < nk; ++j) {
          for (int64_t i = 0; i < padded; ++i) {
            double want = 0;
            if (i < nq) {
              for (int64_t x = 0; x < d; ++x) want += double(scale * q[i * ldq + x]) * k[j * d + x];
            }
            ASSERT_NEAR(st[j * ldst + i], want, 1e-4) << "j=" << j << " i=" << i;
          }
          ASSERT_EQ(st[j * ldst + padded], 7.0f) << "wrote past the padded queries";
        }
        std::vector<float> acc = RandomFloats(nq * d, 4);
        const std::vector<float> before = acc;
        AccumulatePVTransposed(st.data(), ldst, nq, nk, v.data(), d, d, acc.data());
        for (int64_t i = 0; i < nq; ++i) {
          for (int64_t x = 0; x < d; ++x) {
            double want = before[i * d + x];
            for (int64_t j = 0; j < nk; ++j) want += double(st[j * ldst + i]) * v[j * d + x];
            ASSERT_NEAR(acc[i * d + x], want, 1e-3) << "i=" << i << " x=" << x;
          }
        }
      }
    }
  }
}

TEST(AttentionKernelsTest, SoftmaxColumnsStepMatchesScalarOnlineSoftmax) {
  if (!UsesAvx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t rows = 5, cols = 32, ldst = 40;
  std::vector<float> st = RandomFloats(rows * ldst, 5);
  // Column 3: fully hidden in this block and nothing seen before. Column 4: a NaN score.
  // Column 5: hidden here but seen before. Column 6: a running max larger than this block's.
  for (int64_t j = 0; j < rows; ++j) st[j * ldst + 3] = -inf;
  st[2 * ldst + 4] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t j = 0; j < rows; ++j) st[j * ldst + 5] = -inf;
  std::vector<float> m(cols, -inf), l(cols, 0.0f), alpha(cols, 9.0f);
  m[5] = 1.0f;
  l[5] = 2.0f;
  m[6] = 10.0f;
  l[6] = 3.0f;
  const std::vector<float> s0 = st, m0 = m, l0 = l;
  SoftmaxColumnsStep(st.data(), ldst, rows, cols, m.data(), l.data(), alpha.data());
  for (int64_t i = 0; i < cols; ++i) {
    SCOPED_TRACE(::testing::Message() << "column " << i);
    if (i == 4) {
      EXPECT_TRUE(std::isnan(m[i]));
      EXPECT_TRUE(std::isnan(l[i]));
      continue;
    }
    double mx = m0[i];
    for (int64_t j = 0; j < rows; ++j) mx = std::max<double>(mx, s0[j * ldst + i]);
    if (mx == -inf) {
      EXPECT_EQ(m[i], -inf);
      EXPECT_EQ(l[i], 0.0f);
      EXPECT_EQ(alpha[i], 0.0f);
      for (int64_t j = 0; j < rows; ++j) EXPECT_EQ(st[j * ldst + i], 0.0f);
      continue;
    }
    const double a = std::exp(double(m0[i]) - mx);
    double sum = 0;
    for (int64_t j = 0; j < rows; ++j) {
      const double p = std::exp(double(s0[j * ldst + i]) - mx);
      sum += p;
      EXPECT_NEAR(st[j * ldst + i], p, 1e-6 * p + 1e-38);
    }
    EXPECT_EQ(m[i], static_cast<float>(mx));
    EXPECT_NEAR(alpha[i], a, 1e-6 * a);
    EXPECT_NEAR(l[i], l0[i] * a + sum, 1e-6 * (l0[i] * a + sum));
  }
  // Columns past `cols` untouched.
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t i = cols; i < ldst; ++i) EXPECT_EQ(st[j * ldst + i], s0[j * ldst + i]);
  }
}

TEST(ThreadPoolTest, RunsEveryItemExactlyOnceOnValidThreads) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_thread{0};
      pool.ParallelFor(n, [&](int64_t item, int thread) {
        hits[item].fetch_add(1);
        if (thread < 0 || thread >= threads) bad_thread.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "item " << i << " of " << n;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPoolTest, ManyLoopsInARowAndPerThreadScratch) {
  ThreadPool pool(3);
  std::vector<int64_t> per_thread(3);
  for (int loop = 0; loop < 500; ++loop) {
    std::fill(per_thread.begin(), per_thread.end(), 0);
    // Unsynchronised writes to per_thread[thread] are safe only if a thread id is never shared.
    pool.ParallelFor(64, [&](int64_t item, int thread) { per_thread[thread] += item; });
    int64_t total = 0;
    for (int64_t v : per_thread) total += v;
    ASSERT_EQ(total, 64 * 63 / 2) << "loop " << loop;
  }
}

TEST(ThreadPoolTest, UsesMoreThanOneThreadWhenItemsWait) {
  ThreadPool pool(2);
  std::atomic<int> seen_mask{0};
  pool.ParallelFor(200, [&](int64_t, int thread) {
    seen_mask.fetch_or(1 << thread);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  EXPECT_EQ(seen_mask.load(), 3);
}

TEST(ThreadPoolTest, ZeroOrNegativeThreadsMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int sum = 0;
  pool.ParallelFor(4, [&](int64_t item, int thread) { sum += static_cast<int>(item) + thread; });
  EXPECT_EQ(sum, 6);
}

}  // namespace
}  // namespace cpu
}  // namespace dattn
