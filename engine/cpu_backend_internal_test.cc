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
  EXPECT_EQ(y[2], 0.0f);  // exp(-87.5) is below FLT_MIN: flushed to zero.
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

TEST(VectorMathDoubleTest, MatchesStdExp) {
  std::vector<double> x = {-700.0, -1.5, 0.0, 2.25, std::numeric_limits<double>::quiet_NaN()};
  std::vector<double> y(x.size());
  Exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i + 1 < x.size(); ++i) EXPECT_EQ(y[i], std::exp(x[i]));
  EXPECT_TRUE(std::isnan(y.back()));
  std::vector<double> row = {1.0, 3.0, 2.0};
  EXPECT_EQ(RowMax(row.data(), 3), 3.0);
  const double sum = ExpShiftSum(row.data(), 3, 3.0);
  EXPECT_EQ(row[1], 1.0);
  EXPECT_DOUBLE_EQ(sum, std::exp(-2.0) + 1.0 + std::exp(-1.0));
  row[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(RowMax(row.data(), 3)));
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
