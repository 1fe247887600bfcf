// Rotary positions and XPOS at millions of positions: the rotated q and k stay finite and bounded,
// and every score q'_m . k'_n of a pair that attention computes (same reference block) equals the
// fp64 definition, which depends only on m - n, where naive absolute factors are 0 and inf.
#include "model/rotary.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/cpu_layer_ops.h"

namespace dattn {
namespace model {
namespace {

// LongNet's patterns, D = 64, XPOS's default scale base.
LongNetConfig LongNetBase(bool xpos) {
  LongNetConfig c;
  c.d_model = 768;
  c.num_heads = 12;
  c.xpos = xpos;
  return c;
}

constexpr int64_t kFourM = int64_t{1} << 22;

TEST(RotaryPlanTest, ReferenceBlocks) {
  absl::StatusOr<RotaryPlan> plan = RotaryPlan::Make(LongNetBase(true), kFourM + 40000);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->block(), 32768);  // lcm(2048, ..., 32768).
  EXPECT_EQ(plan->ReferencePosition(0), 16384);
  EXPECT_EQ(plan->ReferencePosition(32767), 16384);
  EXPECT_EQ(plan->ReferencePosition(kFourM), kFourM + 16384);
  // A sequence shorter than the lcm is one block.
  plan = RotaryPlan::Make(LongNetBase(true), 1000);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->block(), 1000);
  EXPECT_EQ(plan->ReferencePosition(999), 500);
  // Segments that do not nest: their lcm.
  LongNetConfig c = LongNetBase(true);
  c.segment_lengths = {2048, 3072};
  c.dilation_rates = {1, 2};
  plan = RotaryPlan::Make(c, kFourM);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->block(), 6144);
}

TEST(RotaryPlanTest, Lcm) {
  EXPECT_EQ(SaturatingLcm({4, 6}), 12);
  EXPECT_EQ(SaturatingLcm({7}), 7);
  EXPECT_EQ(SaturatingLcm({int64_t{1} << 40, (int64_t{1} << 40) + 1}), INT64_MAX);
}

TEST(RotaryPlanTest, RefusesXposBlocksBeyondItsRange) {
  LongNetConfig c = LongNetBase(true);
  c.segment_lengths = {65536};
  c.dilation_rates = {1};
  // One segment of 65,536 positions: factors up to (2/7)^(-32768/512) = e^80 > e^60.
  absl::StatusOr<RotaryPlan> plan = RotaryPlan::Make(c, kFourM);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status()));
  EXPECT_NE(plan.status().message().find("lcm of attention.segment_lengths = 65536"),
            std::string::npos)
      << plan.status();
  EXPECT_NE(plan.status().message().find("xpos_scale_base = 512"), std::string::npos);
  // The same patterns are fine on sequences of up to 49,042 positions, and without XPOS.
  EXPECT_TRUE(RotaryPlan::Make(c, 49042).ok());
  EXPECT_FALSE(RotaryPlan::Make(c, 49100).ok());
  c.xpos = false;
  EXPECT_TRUE(RotaryPlan::Make(c, kFourM).ok());
  EXPECT_FALSE(RotaryPlan::Make(c, 0).ok());
}

// Positions of two reference blocks near 4M: the whole block [2^22, 2^22 + 32768) (first, last,
// centre and others) and a partial last block of a sequence of 2^22 + 40000 positions, whose
// reference position lies beyond the sequence's end.
std::vector<std::vector<int64_t>> BlocksNearFourM() {
  const int64_t a = kFourM, c = kFourM + 16384;
  const int64_t b = kFourM + 32768;
  return {{a, a + 1, a + 7, a + 1000, c - 1, c, c + 1, c + 9999, a + 32766, a + 32767},
          {b, b + 1, b + 3000, b + 7231}};
}

template <typename T>
void CheckScoresNearFourM(bool xpos, double tolerance) {
  SCOPED_TRACE(testutil::ReproduceHint());
  const LongNetConfig config = LongNetBase(xpos);
  const int64_t total = kFourM + 40000;
  absl::StatusOr<RotaryPlan> plan = RotaryPlan::Make(config, total);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t d = config.head_dim();
  auto ops = NewCpuLayerOps<T>({1});
  // The naive XPOS factor of q at 4M positions is 0 even in fp64 (and its inverse on k inf).
  ASSERT_EQ(std::pow(2.0 / 7.0, static_cast<double>(kFourM) / 512.0), 0.0);
  double worst = 0;
  for (const std::vector<int64_t>& block : BlocksNearFourM()) {
    // One random q row and k row per position, rotated at that position.
    std::vector<std::vector<double>> q, k;
    std::vector<std::vector<T>> qr, kr;
    for (int64_t p : block) {
      q.push_back(testutil::RandomValues(d, testutil::CheckSeed(absl::StrCat("q", p))));
      k.push_back(testutil::RandomValues(d, testutil::CheckSeed(absl::StrCat("k", p))));
      std::vector<T> qt(q.back().begin(), q.back().end()), kt(k.back().begin(), k.back().end());
      ASSERT_TRUE(ops->RotaryForward(*plan, 1, 1, 1, p, qt.data(), kt.data()).ok());
      for (int64_t i = 0; i < d; ++i) {
        ASSERT_TRUE(std::isfinite(static_cast<double>(qt[i])) &&
                    std::isfinite(static_cast<double>(kt[i])))
            << "position " << p;
        // Bounded by the largest factor, (7/2)^(16384/512) = e^40.1.
        ASSERT_LE(std::fabs(static_cast<double>(qt[i])), 2.0 * std::exp(40.1));
      }
      qr.push_back(qt);
      kr.push_back(kt);
    }
    // Rounded inputs, as the rotated values saw them.
    for (size_t i = 0; i < block.size(); ++i) {
      for (int64_t c = 0; c < d; ++c) {
        q[i][c] = static_cast<double>(static_cast<T>(q[i][c]));
        k[i][c] = static_cast<double>(static_cast<T>(k[i][c]));
      }
    }
    for (size_t im = 0; im < block.size(); ++im) {
      for (size_t in = 0; in < block.size(); ++in) {
        const double distance = static_cast<double>(block[im] - block[in]);  // m - n
        // The definition in fp64, from m - n only (rotary.h).
        double want = 0, magnitude = 0;
        for (int64_t j = 0; j < d / 2; ++j) {
          const double theta = std::pow(config.rope_theta, -2.0 * j / d);
          const double zeta = (2.0 * j + 0.4 * d) / (1.4 * d);
          const double decay = xpos ? std::pow(zeta, distance / config.xpos_scale_base) : 1.0;
          const double phi = -distance * theta;  // (n - m) theta
          const double* a = &q[im][2 * j];
          const double* b = &k[in][2 * j];
          const double dot = a[0] * b[0] + a[1] * b[1], cross = a[1] * b[0] - a[0] * b[1];
          want += decay * (dot * std::cos(phi) + cross * std::sin(phi));
          magnitude += decay * (std::fabs(dot) + std::fabs(cross));
        }
        double got = 0;
        for (int64_t c = 0; c < d; ++c) {
          got += static_cast<double>(qr[im][c]) * static_cast<double>(kr[in][c]);
        }
        const double err = std::fabs(got - want) / magnitude;
        worst = std::max(worst, err);
        EXPECT_LE(err, tolerance) << "positions " << block[im] << ", " << block[in] << ": got "
                                  << got << ", definition " << want;
      }
    }
  }
  std::cout << (xpos ? "XPOS" : "RoPE") << " in " << (sizeof(T) == 4 ? "fp32" : "fp64")
            << " near position 4M: worst score error " << worst
            << " (relative to the sum of |terms|)\n";
}

// fp64: angles (m - n) theta_j with |m - n| < 32768 carry up to 32768 x 2^-53 = 4e-12 of rounding
// in either computation (ours from n - c(n), the definition's from m - n), hence 1e-11; fp32: its
// rounding of q, k and of the factors.
TEST(RotaryNearFourMTest, XposScoresEqualTheDefinitionFp64) {
  CheckScoresNearFourM<double>(true, 1e-11);
}
TEST(RotaryNearFourMTest, XposScoresEqualTheDefinitionFp32) {
  CheckScoresNearFourM<float>(true, 1e-6);
}
TEST(RotaryNearFourMTest, RopeScoresEqualTheDefinitionFp64) {
  CheckScoresNearFourM<double>(false, 1e-11);
}
TEST(RotaryNearFourMTest, RopeScoresEqualTheDefinitionFp32) {
  CheckScoresNearFourM<float>(false, 1e-6);
}

}  // namespace
}  // namespace model
}  // namespace dattn
