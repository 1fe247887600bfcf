// The spec's names and the shared geometry helpers, checked against the oracle's own geometry
// (which re-derives it from docs/ENGINE.md) and against counts by brute force.
#include "engine/attention_spec.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/testing/oracle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using ::testing::HasSubstr;

AttentionSpec Spec(std::vector<int64_t> w, std::vector<int64_t> r, AttentionMode mode,
                   HeadOffsets offsets = HeadOffsets::kModulo) {
  AttentionSpec spec;
  spec.segment_lengths = std::move(w);
  spec.dilation_rates = std::move(r);
  spec.mode = mode;
  spec.head_offsets = offsets;
  return spec;
}

TEST(AttentionSpecTest, ParseModeAndOffsets) {
  EXPECT_EQ(*ParseAttentionMode("grouped"), AttentionMode::kGrouped);
  EXPECT_EQ(*ParseAttentionMode("mixture"), AttentionMode::kMixture);
  EXPECT_STREQ(AttentionModeName(AttentionMode::kGrouped), "grouped");
  EXPECT_STREQ(AttentionModeName(AttentionMode::kMixture), "mixture");
  EXPECT_EQ(*ParseHeadOffsets("modulo"), HeadOffsets::kModulo);
  EXPECT_EQ(*ParseHeadOffsets("blocked"), HeadOffsets::kBlocked);
  EXPECT_STREQ(HeadOffsetsName(HeadOffsets::kModulo), "modulo");
  EXPECT_STREQ(HeadOffsetsName(HeadOffsets::kBlocked), "blocked");
  for (const std::string bad : {"", "Grouped", "mix", "longnet"}) {
    auto mode = ParseAttentionMode(bad);
    ASSERT_FALSE(mode.ok()) << bad;
    EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(mode.status().message()), HasSubstr("'" + bad + "'"));
  }
  for (const std::string bad : {"", "Modulo", "block", "torchscale"}) {
    auto offsets = ParseHeadOffsets(bad);
    ASSERT_FALSE(offsets.ok()) << bad;
    EXPECT_EQ(offsets.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(offsets.status().message()), HasSubstr("'" + bad + "'"));
  }
}

TEST(AttentionSpecTest, ScaleAndDebugString) {
  AttentionSpec spec = Spec({2048, 4096}, {1, 2}, AttentionMode::kGrouped);
  EXPECT_DOUBLE_EQ(spec.ScaleFor(64), 0.125);
  EXPECT_DOUBLE_EQ(spec.ScaleFor(2), 1.0 / std::sqrt(2.0));
  spec.causal = true;
  spec.scale = 0.125;
  EXPECT_DOUBLE_EQ(spec.ScaleFor(7), 0.125);
  const std::string s = spec.DebugString();
  EXPECT_THAT(s, HasSubstr("grouped"));
  EXPECT_THAT(s, HasSubstr("w=[2048,4096]"));
  EXPECT_THAT(s, HasSubstr("r=[1,2]"));
  EXPECT_THAT(s, HasSubstr("causal"));
  EXPECT_THAT(s, HasSubstr("scale=0.125"));
  EXPECT_EQ(spec.num_patterns(), 2);
}

TEST(DilationTest, SegmentsAndSelectedCountsMatchEnumeration) {
  for (int64_t n = 1; n <= 20; ++n) {
    for (int64_t w = 1; w <= 24; ++w) {
      int64_t segments = 0;
      for (int64_t start = 0; start < n; start += w) ++segments;
      EXPECT_EQ(dilation::NumSegments(n, w), segments) << n << " " << w;
    }
  }
  for (int64_t len = 0; len <= 12; ++len) {
    for (int64_t r = 1; r <= 5; ++r) {
      for (int64_t o = 0; o < r + 2; ++o) {
        int64_t count = 0;
        for (int64_t p = o; p < len; p += r) ++count;
        EXPECT_EQ(dilation::SelectedCount(len, o, r), count) << len << " " << o << " " << r;
      }
    }
  }
  EXPECT_EQ(dilation::NumSegments(10, INT64_MAX), 1);
}

TEST(DilationTest, GroupHeads) {
  // H = 5, G = 3: [0, 2), [2, 4), [4, 5).
  EXPECT_EQ(dilation::GroupHeads(5, 3, 0).begin, 0);
  EXPECT_EQ(dilation::GroupHeads(5, 3, 0).end, 2);
  EXPECT_EQ(dilation::GroupHeads(5, 3, 1).begin, 2);
  EXPECT_EQ(dilation::GroupHeads(5, 3, 1).end, 4);
  EXPECT_EQ(dilation::GroupHeads(5, 3, 2).begin, 4);
  EXPECT_EQ(dilation::GroupHeads(5, 3, 2).end, 5);
  for (int64_t h = 1; h <= 12; ++h) {
    for (int g = 1; g <= h; ++g) {
      int64_t next = 0;
      for (int i = 0; i < g; ++i) {
        const dilation::HeadRange range = dilation::GroupHeads(h, g, i);
        EXPECT_EQ(range.begin, next);
        EXPECT_EQ(range.end - range.begin, h / g + (i < h % g ? 1 : 0));
        next = range.end;
      }
      EXPECT_EQ(next, h);
    }
  }
}

TEST(DilationTest, OffsetsAndUseAgreeWithTheOracle) {
  const std::vector<std::vector<int64_t>> rate_sets = {
      {1}, {1, 2}, {1, 2, 4}, {3, 5}, {8, 4, 2, 1}};
  for (const auto& rates : rate_sets) {
    const std::vector<int64_t> w(rates.size(), 16);
    for (int64_t h = static_cast<int64_t>(rates.size()); h <= 17; ++h) {
      for (const AttentionSpec& spec :
           {Spec(w, rates, AttentionMode::kGrouped), Spec(w, rates, AttentionMode::kMixture),
            Spec(w, rates, AttentionMode::kMixture, HeadOffsets::kBlocked)}) {
        for (int i = 0; i < spec.num_patterns(); ++i) {
          const std::vector<int64_t> want = oracle::PatternOffsets(spec, i, h);
          for (int64_t head = 0; head < h; ++head) {
            SCOPED_TRACE(spec.DebugString() + " H=" + std::to_string(h) + " pattern " +
                         std::to_string(i) + " head " + std::to_string(head));
            EXPECT_EQ(dilation::HeadUsesPattern(spec, i, head, h), want[head] >= 0);
            if (want[head] >= 0) {
              EXPECT_EQ(dilation::PatternOffset(spec, i, head, h), want[head]);
            }
          }
        }
      }
    }
  }
}

TEST(DilationTest, NominalForwardFlops) {
  // Grouped, H = 16 in 2 groups of 8: 4 * B * 8 * N * D * (2048 / 1 + 4096 / 4).
  AttentionSpec spec = Spec({2048, 4096}, {1, 2}, AttentionMode::kGrouped);
  const double grouped = 4.0 * 2 * 8 * 8192 * 64 * (2048.0 + 4096.0 / 4);
  EXPECT_DOUBLE_EQ(dilation::NominalForwardFlops(spec, 2, 8192, 16, 64), grouped);
  // H = 5 in 2 groups: 3 and 2 heads.
  EXPECT_DOUBLE_EQ(dilation::NominalForwardFlops(spec, 1, 8192, 5, 64),
                   4.0 * 8192 * 64 * (3 * 2048.0 + 2 * 4096.0 / 4));
  spec.causal = true;
  EXPECT_DOUBLE_EQ(dilation::NominalForwardFlops(spec, 2, 8192, 16, 64), grouped / 2);
  // Mixture: every head computes every pattern.
  spec = Spec({2048, 4096}, {1, 2}, AttentionMode::kMixture);
  EXPECT_DOUBLE_EQ(dilation::NominalForwardFlops(spec, 1, 8192, 16, 64),
                   4.0 * 16 * 8192 * 64 * (2048.0 + 4096.0 / 4));
  // A segment longer than N counts as N.
  spec = Spec({100000}, {2}, AttentionMode::kMixture);
  EXPECT_DOUBLE_EQ(dilation::NominalForwardFlops(spec, 1, 1000, 1, 8), 4.0 * 1000 * 8 * 1000 / 4);
}

}  // namespace
}  // namespace dattn
