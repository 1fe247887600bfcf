// Sanity of the float64 oracle itself: geometry by hand, forward against an independent brute-force
// formulation (softmax over the multiset of keys a row sees), invariants, and its backward against
// central finite differences of sum(out * dout).
#include "engine/testing/oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using oracle::Shape;
using testutil::LseNear;
using testutil::RandomValues;
using testutil::RelativelyNear;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

AttentionSpec MakeSpec(std::vector<int64_t> w, std::vector<int64_t> r, AttentionMode mode,
                       bool causal, HeadOffsets offsets = HeadOffsets::kModulo) {
  AttentionSpec spec;
  spec.segment_lengths = std::move(w);
  spec.dilation_rates = std::move(r);
  spec.mode = mode;
  spec.causal = causal;
  spec.head_offsets = offsets;
  return spec;
}

TEST(OracleGeometryTest, SelectedRows) {
  using Rows = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(oracle::SelectedRows(10, 4, 3, 1), (Rows{{1}, {5}, {9}}));
  EXPECT_EQ(oracle::SelectedRows(10, 4, 3, 2), (Rows{{2}, {6}, {}}));   // Partial segment [8, 10).
  EXPECT_EQ(oracle::SelectedRows(10, 20, 3, 0), (Rows{{0, 3, 6, 9}}));  // Segment longer than N.
  EXPECT_EQ(oracle::SelectedRows(6, 3, 1, 0), (Rows{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(oracle::SelectedRows(5, 5, 2, 1), (Rows{{1, 3}}));
}

TEST(OracleGeometryTest, GroupedOffsets) {
  // H = 5, G = 3: groups of 2, 2, 1 heads; group i uses offset i mod r_i.
  const AttentionSpec spec = MakeSpec({2, 4, 8}, {1, 2, 4}, AttentionMode::kGrouped, false);
  using V = std::vector<int64_t>;
  EXPECT_EQ(oracle::PatternOffsets(spec, 0, 5), (V{0, 0, -1, -1, -1}));
  EXPECT_EQ(oracle::PatternOffsets(spec, 1, 5), (V{-1, -1, 1, 1, -1}));
  EXPECT_EQ(oracle::PatternOffsets(spec, 2, 5), (V{-1, -1, -1, -1, 2}));
  // H = 7, G = 3: 3, 2, 2.
  EXPECT_EQ(oracle::PatternOffsets(spec, 0, 7), (V{0, 0, 0, -1, -1, -1, -1}));
  EXPECT_EQ(oracle::PatternOffsets(spec, 2, 7), (V{-1, -1, -1, -1, -1, 2, 2}));
}

TEST(OracleGeometryTest, MixtureOffsets) {
  using V = std::vector<int64_t>;
  const AttentionSpec modulo = MakeSpec({8, 8}, {4, 3}, AttentionMode::kMixture, false);
  EXPECT_EQ(oracle::PatternOffsets(modulo, 0, 5), (V{0, 1, 2, 3, 0}));
  EXPECT_EQ(oracle::PatternOffsets(modulo, 1, 5), (V{0, 1, 2, 0, 1}));
  const AttentionSpec blocked =
      MakeSpec({8, 8}, {4, 3}, AttentionMode::kMixture, false, HeadOffsets::kBlocked);
  // ceil(5/4) = 2 heads per offset; ceil(5/3) = 2.
  EXPECT_EQ(oracle::PatternOffsets(blocked, 0, 5), (V{0, 0, 1, 1, 2}));
  EXPECT_EQ(oracle::PatternOffsets(blocked, 1, 5), (V{0, 0, 1, 1, 2}));
  // ceil(2/4) = 1: heads take offsets 0 and 1.
  EXPECT_EQ(oracle::PatternOffsets(blocked, 0, 2), (V{0, 1}));
}

TEST(OracleTest, HandComputedTwoPositions) {
  // B = H = D = 1, N = 2, one segment of 2, r = 1, scale 0.5.
  AttentionSpec spec = MakeSpec({2}, {1}, AttentionMode::kGrouped, false);
  spec.scale = 0.5;
  const Shape shape{1, 2, 1, 1};
  const std::vector<double> q = {1.0, -2.0}, k = {3.0, 0.5}, v = {10.0, -4.0};
  auto row = [&](int j, int keys) {
    double num = 0.0, den = 0.0;
    for (int t = 0; t < keys; ++t) {
      const double e = std::exp(0.5 * q[j] * k[t]);
      num += e * v[t];
      den += e;
    }
    return std::make_pair(num / den, std::log(den));
  };
  auto full = oracle::Forward(spec, shape, q, k, v);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_NEAR(full->out[0], row(0, 2).first, 1e-14);
  EXPECT_NEAR(full->out[1], row(1, 2).first, 1e-14);
  EXPECT_NEAR(full->lse[0], row(0, 2).second, 1e-14);
  EXPECT_NEAR(full->lse[1], row(1, 2).second, 1e-14);

  spec.causal = true;  // Row 0 sees only key 0: out = v0 exactly, lse = its score.
  auto causal = oracle::Forward(spec, shape, q, k, v);
  ASSERT_TRUE(causal.ok()) << causal.status();
  EXPECT_DOUBLE_EQ(causal->out[0], 10.0);
  EXPECT_DOUBLE_EQ(causal->lse[0], 0.5 * 1.0 * 3.0);
  EXPECT_NEAR(causal->out[1], row(1, 2).first, 1e-14);
}

// --- An independent formulation of the spec: for each row, the multiset of key positions it sees,
// derived by modular arithmetic (not by walking segments), and a softmax over that multiset without
// the max subtraction (inputs are small). Mixture mode's softmax-denominator weighting is exactly a
// softmax over the concatenation of the patterns' key lists.

bool Selects(int64_t w, int64_t r, int64_t o, int64_t p) {
  const int64_t in_segment = p % w;
  return in_segment >= o && (in_segment - o) % r == 0;
}

std::vector<int64_t> KeysOf(int64_t n, int64_t w, int64_t r, int64_t o, int64_t p, bool causal) {
  std::vector<int64_t> keys;
  const int64_t start = (p / w) * w;
  for (int64_t t = start; t < start + w && t < n; ++t) {
    if (Selects(w, r, o, t) && (!causal || t <= p)) keys.push_back(t);
  }
  return keys;
}

int64_t GroupOf(int64_t h, int64_t num_heads, int64_t g) {
  for (int64_t i = 0; i < g; ++i) {
    const int64_t begin = i * (num_heads / g) + std::min(i, num_heads % g);
    const int64_t end = begin + num_heads / g + (i < num_heads % g ? 1 : 0);
    if (h >= begin && h < end) return i;
  }
  return -1;
}

oracle::ForwardResult BruteForce(const AttentionSpec& spec, const Shape& s,
                                 const std::vector<double>& q, const std::vector<double>& k,
                                 const std::vector<double>& v) {
  const int64_t g = spec.num_patterns();
  const double scale = spec.scale ? *spec.scale : 1.0 / std::sqrt(double(s.head_dim));
  oracle::ForwardResult r{std::vector<double>(s.NumElements(), 0.0),
                          std::vector<double>(s.NumLseElements(), kNegInf)};
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      for (int64_t p = 0; p < s.seq_len; ++p) {
        std::vector<int64_t> keys;
        for (int64_t i = 0; i < g; ++i) {
          const int64_t w = spec.segment_lengths[i], rate = spec.dilation_rates[i];
          int64_t o;
          if (spec.mode == AttentionMode::kGrouped) {
            if (GroupOf(h, s.num_heads, g) != i) continue;
            o = i % rate;
          } else if (spec.head_offsets == HeadOffsets::kModulo) {
            o = h % rate;
          } else {
            o = h / ((s.num_heads + rate - 1) / rate);
          }
          if (!Selects(w, rate, o, p)) continue;
          for (int64_t t : KeysOf(s.seq_len, w, rate, o, p, spec.causal)) keys.push_back(t);
        }
        if (keys.empty()) continue;
        double den = 0.0;
        std::vector<double> num(s.head_dim, 0.0);
        for (int64_t t : keys) {
          double dot = 0.0;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dot += q[s.Index(b, p, h, d)] * k[s.Index(b, t, h, d)];
          }
          const double e = std::exp(scale * dot);
          den += e;
          for (int64_t d = 0; d < s.head_dim; ++d) num[d] += e * v[s.Index(b, t, h, d)];
        }
        const double divisor = spec.mode == AttentionMode::kGrouped ? double(g) : 1.0;
        for (int64_t d = 0; d < s.head_dim; ++d) {
          r.out[s.Index(b, p, h, d)] = num[d] / den / divisor;
        }
        r.lse[s.LseIndex(b, h, p)] = std::log(den);
      }
    }
  }
  return r;
}

struct BruteCase {
  std::vector<int64_t> w, r;
  int64_t n, h;
};

TEST(OracleTest, ForwardMatchesBruteForceFormulation) {
  SCOPED_TRACE(testutil::ReproduceHint());
  const std::vector<BruteCase> cases = {
      {{4, 8}, {1, 2}, 16, 4},
      {{4, 8}, {1, 2}, 13, 5},
      {{2, 4, 8}, {1, 2, 4}, 8, 5},
      {{2, 4, 8}, {1, 2, 4}, 24, 7},
      {{5, 7}, {2, 3}, 14, 3},
      {{3, 32}, {2, 5}, 17, 4},
      {{6}, {1}, 18, 2},
      {{4, 8}, {2, 4}, 9, 6},
      {{8, 8}, {3, 3}, 8, 5},
  };
  int check = 0;
  for (const BruteCase& c : cases) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      for (HeadOffsets offsets : {HeadOffsets::kModulo, HeadOffsets::kBlocked}) {
        if (mode == AttentionMode::kGrouped && offsets == HeadOffsets::kBlocked) continue;
        for (bool causal : {false, true}) {
          const AttentionSpec spec = MakeSpec(c.w, c.r, mode, causal, offsets);
          const Shape shape{2, c.n, c.h, 3};
          const uint64_t seed = testutil::CheckSeed(std::to_string(check++));
          const int64_t count = shape.NumElements();
          const auto q = RandomValues(count, seed, 1.5), k = RandomValues(count, seed + 1, 1.5),
                     v = RandomValues(count, seed + 2, 1.0);
          SCOPED_TRACE(spec.DebugString() + " " + HeadOffsetsName(offsets) +
                       " N=" + std::to_string(c.n) + " H=" + std::to_string(c.h));
          auto got = oracle::Forward(spec, shape, q, k, v);
          ASSERT_TRUE(got.ok()) << got.status();
          const oracle::ForwardResult want = BruteForce(spec, shape, q, k, v);
          EXPECT_TRUE(RelativelyNear("out", got->out, want.out, 1e-13));
          EXPECT_TRUE(LseNear("lse", got->lse, want.lse, 1e-13));
        }
      }
    }
  }
}

TEST(OracleTest, UnselectedRowsAreZeroWithNegativeInfinityLse) {
  // Grouped, one pattern with r = 3: only positions 0, 3, 6 of each segment of 8 are selected.
  const AttentionSpec spec = MakeSpec({8}, {3}, AttentionMode::kGrouped, false);
  const Shape shape{1, 16, 2, 2};
  const auto q = RandomValues(shape.NumElements(), 1), k = RandomValues(shape.NumElements(), 2),
             v = RandomValues(shape.NumElements(), 3);
  auto got = oracle::Forward(spec, shape, q, k, v);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t p = 0; p < 16; ++p) {
    const bool selected = (p % 8) % 3 == 0;
    for (int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(std::isinf(got->lse[shape.LseIndex(0, h, p)]), !selected) << p;
      for (int64_t d = 0; d < 2; ++d) {
        EXPECT_EQ(got->out[shape.Index(0, p, h, d)] == 0.0, !selected) << p;
      }
    }
  }
}

TEST(OracleTest, Invariants) {
  const Shape shape{2, 12, 3, 4};
  const int64_t count = shape.NumElements();
  const uint64_t seed = testutil::CheckSeed("invariants");
  SCOPED_TRACE(testutil::ReproduceHint());
  const auto q = RandomValues(count, seed, 1.5), k = RandomValues(count, seed + 1, 1.5),
             v = RandomValues(count, seed + 2);

  // A segment longer than N is the same as w = N.
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    auto longer = oracle::Forward(MakeSpec({4, 40}, {1, 2}, mode, true), shape, q, k, v);
    auto exact = oracle::Forward(MakeSpec({4, 12}, {1, 2}, mode, true), shape, q, k, v);
    ASSERT_TRUE(longer.ok() && exact.ok());
    EXPECT_EQ(longer->out, exact->out);
    EXPECT_EQ(longer->lse, exact->lse);
  }

  // Mixture of a pattern with itself: same output, lse + log 2.
  for (bool causal : {false, true}) {
    auto once =
        oracle::Forward(MakeSpec({6}, {2}, AttentionMode::kMixture, causal), shape, q, k, v);
    auto twice =
        oracle::Forward(MakeSpec({6, 6}, {2, 2}, AttentionMode::kMixture, causal), shape, q, k, v);
    ASSERT_TRUE(once.ok() && twice.ok());
    EXPECT_TRUE(RelativelyNear("out", twice->out, once->out, 1e-14));
    std::vector<double> shifted = once->lse;
    for (double& l : shifted) l += std::log(2.0);
    EXPECT_TRUE(LseNear("lse", twice->lse, shifted, 1e-14));
  }

  // Grouped with G identical patterns is 1/G of one pattern (all heads use the same offset 0 when
  // r = 1).
  {
    auto one = oracle::Forward(MakeSpec({6}, {1}, AttentionMode::kGrouped, false), shape, q, k, v);
    auto three = oracle::Forward(MakeSpec({6, 6, 6}, {1, 1, 1}, AttentionMode::kGrouped, false),
                                 shape, q, k, v);
    ASSERT_TRUE(one.ok() && three.ok());
    std::vector<double> third = one->out;
    for (double& x : third) x /= 3.0;
    EXPECT_TRUE(RelativelyNear("out", three->out, third, 1e-15));
    EXPECT_EQ(three->lse, one->lse);
  }

  // An explicit scale s equals the default scale applied to q * s * sqrt(D).
  {
    AttentionSpec scaled = MakeSpec({4, 8}, {1, 2}, AttentionMode::kMixture, true);
    scaled.scale = 0.3;
    std::vector<double> q_scaled = q;
    for (double& x : q_scaled) x *= 0.3 * std::sqrt(4.0);
    auto a = oracle::Forward(scaled, shape, q, k, v);
    auto b = oracle::Forward(MakeSpec({4, 8}, {1, 2}, AttentionMode::kMixture, true), shape,
                             q_scaled, k, v);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(RelativelyNear("out", a->out, b->out, 1e-14));
    EXPECT_TRUE(LseNear("lse", a->lse, b->lse, 1e-14));
  }

  // Batches are independent: batch 1 of a B = 2 run equals a B = 1 run on batch 1's inputs.
  {
    const AttentionSpec spec = MakeSpec({4, 8}, {1, 2}, AttentionMode::kGrouped, true);
    const Shape one{1, 12, 3, 4};
    const int64_t half = one.NumElements();
    auto tail = [&](const std::vector<double>& x) {
      return std::vector<double>(x.begin() + half, x.end());
    };
    auto both = oracle::Forward(spec, shape, q, k, v);
    auto second = oracle::Forward(spec, one, tail(q), tail(k), tail(v));
    ASSERT_TRUE(both.ok() && second.ok());
    EXPECT_EQ(tail(both->out), second->out);
  }
}

TEST(OracleTest, RejectsWhatTheSpecDoesNotDefine) {
  const Shape shape{1, 4, 2, 2};
  const std::vector<double> x(shape.NumElements(), 0.5);
  EXPECT_FALSE(oracle::Forward(MakeSpec({2, 2, 2}, {1, 1, 1}, AttentionMode::kGrouped, false),
                               shape, x, x, x)
                   .ok());  // H < G.
  EXPECT_FALSE(
      oracle::Forward(MakeSpec({2, 2}, {1}, AttentionMode::kMixture, false), shape, x, x, x).ok());
  EXPECT_FALSE(
      oracle::Forward(MakeSpec({}, {}, AttentionMode::kMixture, false), shape, x, x, x).ok());
  EXPECT_FALSE(
      oracle::Forward(MakeSpec({0}, {1}, AttentionMode::kMixture, false), shape, x, x, x).ok());
  EXPECT_FALSE(
      oracle::Forward(MakeSpec({2}, {0}, AttentionMode::kMixture, false), shape, x, x, x).ok());
  EXPECT_FALSE(oracle::Forward(MakeSpec({2}, {1}, AttentionMode::kMixture, false), shape,
                               std::vector<double>(3, 1.0), x, x)
                   .ok());
  EXPECT_FALSE(oracle::Backward(MakeSpec({2}, {1}, AttentionMode::kMixture, false), shape, x, x, x,
                                std::vector<double>(3, 1.0))
                   .ok());
}

// --- Backward: analytic gradients against central finite differences of sum(out * dout).

struct GradCase {
  std::string name;
  std::vector<int64_t> w, r;
  Shape shape;
};

struct GradParam {
  GradCase c;
  AttentionMode mode;
  HeadOffsets offsets;
  bool causal;
};

void PrintTo(const GradParam& p, std::ostream* os) {
  *os << p.c.name << " " << AttentionModeName(p.mode) << " " << HeadOffsetsName(p.offsets)
      << (p.causal ? " causal" : "");
}

class OracleGradientTest : public ::testing::TestWithParam<GradParam> {};

TEST_P(OracleGradientTest, BackwardMatchesFiniteDifferences) {
  const GradParam& param = GetParam();
  SCOPED_TRACE(testutil::ReproduceHint());
  const AttentionSpec spec =
      MakeSpec(param.c.w, param.c.r, param.mode, param.causal, param.offsets);
  const Shape& shape = param.c.shape;
  const int64_t count = shape.NumElements();
  const uint64_t seed = testutil::CheckSeed("grad");
  const auto q = RandomValues(count, seed, 1.5), k = RandomValues(count, seed + 1, 1.5),
             v = RandomValues(count, seed + 2), dout = RandomValues(count, seed + 3);

  auto grads = oracle::Backward(spec, shape, q, k, v, dout);
  ASSERT_TRUE(grads.ok()) << grads.status();

  // Loss as a function of one of q, k, v with the other two fixed.
  auto loss = [&](int which) {
    return [&, which](const std::vector<double>& x) {
      auto fwd =
          oracle::Forward(spec, shape, which == 0 ? x : q, which == 1 ? x : k, which == 2 ? x : v);
      return fwd.ok() ? testutil::Dot(fwd->out, dout) : std::nan("");
    };
  };
  const double step = 1e-5;
  EXPECT_TRUE(
      RelativelyNear("dq", grads->dq, testutil::CentralDifferenceGradient(loss(0), q, step), 1e-8));
  EXPECT_TRUE(
      RelativelyNear("dk", grads->dk, testutil::CentralDifferenceGradient(loss(1), k, step), 1e-8));
  EXPECT_TRUE(
      RelativelyNear("dv", grads->dv, testutil::CentralDifferenceGradient(loss(2), v, step), 1e-8));
}

std::vector<GradParam> GradParams() {
  const std::vector<GradCase> cases = {
      // H % G != 0, partial segments (N = 7 is a multiple of neither segment).
      {"HModG_Partial", {3, 4}, {1, 2}, Shape{2, 7, 3, 2}},
      // Rates that divide no segment, a segment longer than N, G = 3 with H % G == 0.
      {"RatesLongSegment", {2, 5, 12}, {2, 3, 2}, Shape{1, 9, 3, 3}},
      // G = 1, r = 1: plain blockwise attention.
      {"Blockwise", {4}, {1}, Shape{1, 8, 2, 2}},
  };
  std::vector<GradParam> params;
  for (const GradCase& c : cases) {
    for (bool causal : {false, true}) {
      params.push_back({c, AttentionMode::kGrouped, HeadOffsets::kModulo, causal});
      params.push_back({c, AttentionMode::kMixture, HeadOffsets::kModulo, causal});
      params.push_back({c, AttentionMode::kMixture, HeadOffsets::kBlocked, causal});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(All, OracleGradientTest, ::testing::ValuesIn(GradParams()),
                         [](const ::testing::TestParamInfo<GradParam>& info) {
                           const GradParam& p = info.param;
                           std::string mode = p.mode == AttentionMode::kGrouped ? "Grouped"
                                              : p.offsets == HeadOffsets::kModulo
                                                  ? "Mixture"
                                                  : "MixtureBlocked";
                           return p.c.name + "_" + mode + (p.causal ? "_Causal" : "_Full");
                         });

}  // namespace
}  // namespace dattn
