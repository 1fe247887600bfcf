// Every layer of the CPU layer ops (and attention through SequenceAttention): the backward pass
// against float64 central finite differences of a random linear functional of the forward pass,
// L = sum(y * r), on tiny shapes. Outputs are poisoned (NaN) before each call so that an element a
// kernel fails to write fails the comparison; "accumulate" outputs start from random values.
#include "model/cpu_layer_ops.h"

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {
namespace {

using testutil::CentralDifferenceGradient;
using testutil::CheckSeed;
using testutil::Dot;
using testutil::RandomValues;
using testutil::RelativelyNear;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Central differences in fp64 with step 1e-5: truncation ~1e-10 relative, rounding ~1e-11.
constexpr double kStep = 1e-5;
constexpr double kFdTolerance = 1e-8;

std::vector<double> Poisoned(int64_t n) {
  return std::vector<double>(static_cast<size_t>(n), kNaN);
}

std::vector<double> Minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> c(a.size());
  for (size_t i = 0; i < a.size(); ++i) c[i] = a[i] - b[i];
  return c;
}

class CpuLayerOpsTest : public ::testing::Test {
 protected:
  void SetUp() override { trace_ = testutil::ReproduceHint(); }
  std::unique_ptr<LayerOps<double>> ops_ = NewCpuLayerOps<double>({/*num_threads=*/2});
  std::string trace_;
};

TEST_F(CpuLayerOpsTest, LinearMatchesFiniteDifferences) {
  SCOPED_TRACE(trace_);
  const int64_t m = 5, in = 4, out = 3;
  std::vector<double> x = RandomValues(m * in, CheckSeed("x"));
  std::vector<double> w = RandomValues(out * in, CheckSeed("w"));
  std::vector<double> b = RandomValues(out, CheckSeed("b"));
  const std::vector<double> r = RandomValues(m * out, CheckSeed("r"));
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    std::vector<double> y = Poisoned(m * out);
    EXPECT_TRUE(ops_->LinearForward(xx.data(), m, in, ww.data(), bb.data(), out, y.data()).ok());
    return Dot(y, r);
  };
  // Analytic: dx overwritten (poisoned first), dw and db accumulated onto random values.
  std::vector<double> dx = Poisoned(m * in);
  ASSERT_TRUE(
      ops_->LinearBackwardInput(r.data(), m, out, w.data(), in, dx.data(), Accumulate::kOverwrite)
          .ok());
  const std::vector<double> dw0 = RandomValues(out * in, CheckSeed("dw0"));
  const std::vector<double> db0 = RandomValues(out, CheckSeed("db0"));
  std::vector<double> dw = dw0, db = db0;
  ASSERT_TRUE(
      ops_->LinearBackwardParams(r.data(), x.data(), m, in, out, dw.data(), db.data()).ok());

  EXPECT_TRUE(
      RelativelyNear("dx", dx,
                     CentralDifferenceGradient(
                         [&](const std::vector<double>& v) { return loss(v, w, b); }, x, kStep),
                     kFdTolerance));
  EXPECT_TRUE(
      RelativelyNear("dw", Minus(dw, dw0),
                     CentralDifferenceGradient(
                         [&](const std::vector<double>& v) { return loss(x, v, b); }, w, kStep),
                     kFdTolerance));
  EXPECT_TRUE(
      RelativelyNear("db", Minus(db, db0),
                     CentralDifferenceGradient(
                         [&](const std::vector<double>& v) { return loss(x, w, v); }, b, kStep),
                     kFdTolerance));

  // kAdd adds to what is there.
  std::vector<double> dx_add = RandomValues(m * in, CheckSeed("dx0"));
  const std::vector<double> dx0 = dx_add;
  ASSERT_TRUE(
      ops_->LinearBackwardInput(r.data(), m, out, w.data(), in, dx_add.data(), Accumulate::kAdd)
          .ok());
  EXPECT_TRUE(RelativelyNear("dx (added)", Minus(dx_add, dx0), dx, 1e-14));

  // No bias: y = x w^T exactly what the bias run gives minus b.
  std::vector<double> y_bias = Poisoned(m * out), y_none = Poisoned(m * out);
  ASSERT_TRUE(ops_->LinearForward(x.data(), m, in, w.data(), b.data(), out, y_bias.data()).ok());
  ASSERT_TRUE(ops_->LinearForward(x.data(), m, in, w.data(), nullptr, out, y_none.data()).ok());
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < out; ++j) {
      EXPECT_NEAR(y_bias[t * out + j] - b[j], y_none[t * out + j], 1e-14);
    }
  }
}

TEST_F(CpuLayerOpsTest, LayerNormMatchesFiniteDifferences) {
  SCOPED_TRACE(trace_);
  const int64_t m = 4, n = 6;
  const double eps = 1e-5;
  std::vector<double> x = RandomValues(m * n, CheckSeed("x"));
  std::vector<double> gain = RandomValues(n, CheckSeed("gain"));
  std::vector<double> shift = RandomValues(n, CheckSeed("shift"));
  const std::vector<double> r = RandomValues(m * n, CheckSeed("r"));
  auto forward = [&](const std::vector<double>& xx, const std::vector<double>& gg,
                     const std::vector<double>& ss, std::vector<double>* mean,
                     std::vector<double>* rstd) {
    std::vector<double> y = Poisoned(m * n);
    *mean = Poisoned(m);
    *rstd = Poisoned(m);
    EXPECT_TRUE(ops_->LayerNormForward(xx.data(), m, n, gg.data(), ss.data(), eps, y.data(),
                                       mean->data(), rstd->data())
                    .ok());
    return y;
  };
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& gg,
                  const std::vector<double>& ss) {
    std::vector<double> mean, rstd;
    return Dot(forward(xx, gg, ss, &mean, &rstd), r);
  };
  std::vector<double> mean, rstd;
  const std::vector<double> y = forward(x, gain, shift, &mean, &rstd);
  // The definition, row by row.
  for (int64_t t = 0; t < m; ++t) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mu += x[t * n + i] / n;
    for (int64_t i = 0; i < n; ++i) var += (x[t * n + i] - mu) * (x[t * n + i] - mu) / n;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y[t * n + i], (x[t * n + i] - mu) / std::sqrt(var + eps) * gain[i] + shift[i],
                  1e-13);
    }
  }
  std::vector<double> dx = Poisoned(m * n);
  const std::vector<double> dg0 = RandomValues(n, CheckSeed("dg0"));
  const std::vector<double> ds0 = RandomValues(n, CheckSeed("ds0"));
  std::vector<double> dg = dg0, ds = ds0;
  ASSERT_TRUE(ops_->LayerNormBackward(r.data(), x.data(), mean.data(), rstd.data(), gain.data(), m,
                                      n, dx.data(), Accumulate::kOverwrite, dg.data(), ds.data())
                  .ok());
  EXPECT_TRUE(RelativelyNear(
      "dx", dx,
      CentralDifferenceGradient([&](const std::vector<double>& v) { return loss(v, gain, shift); },
                                x, kStep),
      kFdTolerance));
  EXPECT_TRUE(RelativelyNear(
      "dgain", Minus(dg, dg0),
      CentralDifferenceGradient([&](const std::vector<double>& v) { return loss(x, v, shift); },
                                gain, kStep),
      kFdTolerance));
  EXPECT_TRUE(RelativelyNear(
      "dshift", Minus(ds, ds0),
      CentralDifferenceGradient([&](const std::vector<double>& v) { return loss(x, gain, v); },
                                shift, kStep),
      kFdTolerance));
  std::vector<double> dx_add = RandomValues(m * n, CheckSeed("dx0"));
  const std::vector<double> dx0 = dx_add;
  std::vector<double> unused_g(n, 0.0), unused_s(n, 0.0);
  ASSERT_TRUE(ops_->LayerNormBackward(r.data(), x.data(), mean.data(), rstd.data(), gain.data(), m,
                                      n, dx_add.data(), Accumulate::kAdd, unused_g.data(),
                                      unused_s.data())
                  .ok());
  EXPECT_TRUE(RelativelyNear("dx (added)", Minus(dx_add, dx0), dx, 1e-13));
}

TEST_F(CpuLayerOpsTest, GeluIsTheErfFormAndMatchesFiniteDifferences) {
  SCOPED_TRACE(trace_);
  const int64_t n = 9;
  std::vector<double> x = RandomValues(n, CheckSeed("x"), 3.0);
  const std::vector<double> r = RandomValues(n, CheckSeed("r"));
  std::vector<double> y = Poisoned(n);
  ASSERT_TRUE(ops_->GeluForward(x.data(), n, y.data()).ok());
  for (int64_t i = 0; i < n; ++i) {
    // The erf form; the tanh approximation differs from it by up to ~1e-3 on this range.
    EXPECT_NEAR(y[i], 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0))), 1e-15);
  }
  std::vector<double> dx = Poisoned(n);
  ASSERT_TRUE(ops_->GeluBackward(x.data(), r.data(), n, dx.data()).ok());
  EXPECT_TRUE(RelativelyNear("dx", dx,
                             CentralDifferenceGradient(
                                 [&](const std::vector<double>& v) {
                                   std::vector<double> yy = Poisoned(n);
                                   EXPECT_TRUE(ops_->GeluForward(v.data(), n, yy.data()).ok());
                                   return Dot(yy, r);
                                 },
                                 x, kStep),
                             kFdTolerance));
}

TEST_F(CpuLayerOpsTest, EmbeddingMatchesFiniteDifferences) {
  SCOPED_TRACE(trace_);
  const int64_t v = 5, d = 3, m = 7;
  const std::vector<int32_t> tokens = {4, 0, 2, 4, 4, 1, 0};  // Repeats; token 3 unused.
  std::vector<double> table = RandomValues(v * d, CheckSeed("table"));
  const std::vector<double> r = RandomValues(m * d, CheckSeed("r"));
  const std::vector<double> dt0 = RandomValues(v * d, CheckSeed("dt0"));
  std::vector<double> dt = dt0;
  ASSERT_TRUE(ops_->EmbeddingBackward(tokens.data(), m, r.data(), d, dt.data()).ok());
  EXPECT_TRUE(RelativelyNear(
      "dtable", Minus(dt, dt0),
      CentralDifferenceGradient(
          [&](const std::vector<double>& tt) {
            std::vector<double> out = Poisoned(m * d);
            EXPECT_TRUE(ops_->EmbeddingForward(tokens.data(), m, tt.data(), d, out.data()).ok());
            return Dot(out, r);
          },
          table, kStep),
      kFdTolerance));
}

TEST_F(CpuLayerOpsTest, CrossEntropyMatchesDefinitionAndFiniteDifferences) {
  SCOPED_TRACE(trace_);
  const int64_t m = 4, v = 6;
  std::vector<double> logits = RandomValues(m * v, CheckSeed("logits"), 4.0);
  const std::vector<int32_t> targets = {3, kIgnoreTarget, 0, 5};
  const double scale = 0.37;
  auto loss = [&](const std::vector<double>& l, std::vector<double>* lse, int64_t* count) {
    *lse = Poisoned(m);
    double sum = kNaN;
    EXPECT_TRUE(
        ops_->CrossEntropyForward(l.data(), targets.data(), m, v, lse->data(), &sum, count).ok());
    return sum;
  };
  std::vector<double> lse;
  int64_t count = -1;
  const double sum = loss(logits, &lse, &count);
  EXPECT_EQ(count, 3);
  double want = 0;
  for (int64_t t = 0; t < m; ++t) {
    double z = 0;
    for (int64_t i = 0; i < v; ++i) z += std::exp(logits[t * v + i]);
    EXPECT_NEAR(lse[t], std::log(z), 1e-14);  // Every row, the ignored one too.
    if (targets[t] != kIgnoreTarget) want += std::log(z) - logits[t * v + targets[t]];
  }
  EXPECT_NEAR(sum, want, 1e-13);
  std::vector<double> dlogits = Poisoned(m * v);
  ASSERT_TRUE(ops_->CrossEntropyBackward(logits.data(), lse.data(), targets.data(), m, v, scale,
                                         dlogits.data())
                  .ok());
  EXPECT_TRUE(RelativelyNear("dlogits", dlogits,
                             CentralDifferenceGradient(
                                 [&](const std::vector<double>& l) {
                                   std::vector<double> unused;
                                   int64_t c = 0;
                                   return scale * loss(l, &unused, &c);
                                 },
                                 logits, kStep),
                             kFdTolerance));
  for (int64_t i = 0; i < v; ++i) EXPECT_EQ(dlogits[1 * v + i], 0.0);  // The ignored row.
}

TEST_F(CpuLayerOpsTest, AddAddsAndMayAlias) {
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30}, y = Poisoned(3);
  ASSERT_TRUE(ops_->Add(a.data(), b.data(), 3, y.data()).ok());
  EXPECT_EQ(y, (std::vector<double>{11, 22, 33}));
  ASSERT_TRUE(ops_->Add(a.data(), b.data(), 3, b.data()).ok());
  EXPECT_EQ(b, (std::vector<double>{11, 22, 33}));
}

// Rotary positions (with and without XPOS) at an offset: forward is the definition of rotary.h
// at absolute positions (small enough here for the naive formula), backward its transpose.
class RotaryOpsTest : public CpuLayerOpsTest, public ::testing::WithParamInterface<bool> {};

TEST_P(RotaryOpsTest, MatchesDefinitionAndFiniteDifferences) {
  SCOPED_TRACE(trace_);
  const bool xpos = GetParam();
  LongNetConfig config;
  config.d_model = 12;
  config.num_heads = 2;  // D = 6: three pairs.
  config.segment_lengths = {4, 8};
  config.dilation_rates = {1, 2};
  config.xpos = xpos;
  config.xpos_scale_base = 16;  // Strong decay, so that a wrong sign or reference shows.
  config.rope_theta = 100;
  const int64_t batch = 2, n = 5, heads = 2, d = 6, offset = 19, total = 40;
  absl::StatusOr<RotaryPlan> plan = RotaryPlan::Make(config, total);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t count = batch * n * heads * d;
  std::vector<double> q = RandomValues(count, CheckSeed("q"));
  std::vector<double> k = RandomValues(count, CheckSeed("k"));
  auto rotate = [&](std::vector<double> qq, std::vector<double> kk) {
    EXPECT_TRUE(ops_->RotaryForward(*plan, batch, n, heads, offset, qq.data(), kk.data()).ok());
    return std::make_pair(qq, kk);
  };
  const auto [qr, kr] = rotate(q, k);
  // Scores of pairs in one reference block equal the definition at absolute positions.
  auto definition_score = [&](int64_t b, int64_t tm, int64_t tn, int64_t h) {
    const double pm = offset + tm, pn = offset + tn;
    double s = 0;
    for (int64_t j = 0; j < d / 2; ++j) {
      const double theta = std::pow(config.rope_theta, -2.0 * j / d);
      const double zeta = (2.0 * j + 0.4 * d) / (1.4 * d);
      auto rot = [&](const std::vector<double>& x, int64_t t, double pos, double scale_sign) {
        const double* e = &x[((b * n + t) * heads + h) * d + 2 * j];
        const double c = std::cos(pos * theta), sn = std::sin(pos * theta);
        const double sc = xpos ? std::pow(zeta, scale_sign * pos / config.xpos_scale_base) : 1.0;
        return std::make_pair(sc * (e[0] * c - e[1] * sn), sc * (e[1] * c + e[0] * sn));
      };
      const auto [q0, q1] = rot(q, tm, pm, 1.0);
      const auto [k0, k1] = rot(k, tn, pn, -1.0);
      s += q0 * k0 + q1 * k1;
    }
    return s;
  };
  const int64_t w = plan->block();
  ASSERT_EQ(w, 8);  // lcm(4, 8).
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t tm = 0; tm < n; ++tm) {
        for (int64_t tn = 0; tn < n; ++tn) {
          if ((offset + tm) / w != (offset + tn) / w) continue;  // Never attend to each other.
          double got = 0;
          for (int64_t c = 0; c < d; ++c) {
            got += qr[((b * n + tm) * heads + h) * d + c] * kr[((b * n + tn) * heads + h) * d + c];
          }
          const double want = definition_score(b, tm, tn, h);
          EXPECT_NEAR(got, want, 1e-13 * (1 + std::fabs(want)))
              << "b " << b << " h " << h << " positions " << offset + tm << ", " << offset + tn;
        }
      }
    }
  }
  // Backward against finite differences of L = q'.rq + k'.rk.
  const std::vector<double> rq = RandomValues(count, CheckSeed("rq"));
  const std::vector<double> rk = RandomValues(count, CheckSeed("rk"));
  std::vector<double> dq = rq, dk = rk;
  ASSERT_TRUE(ops_->RotaryBackward(*plan, batch, n, heads, offset, dq.data(), dk.data()).ok());
  EXPECT_TRUE(RelativelyNear("dq", dq,
                             CentralDifferenceGradient(
                                 [&](const std::vector<double>& v) {
                                   const auto [a, unused] = rotate(v, k);
                                   return Dot(a, rq);
                                 },
                                 q, kStep),
                             kFdTolerance));
  EXPECT_TRUE(RelativelyNear("dk", dk,
                             CentralDifferenceGradient(
                                 [&](const std::vector<double>& v) {
                                   const auto [unused, a] = rotate(q, v);
                                   return Dot(a, rk);
                                 },
                                 k, kStep),
                             kFdTolerance));
}

INSTANTIATE_TEST_SUITE_P(RopeAndXpos, RotaryOpsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Xpos" : "Rope");
                         });

// The attention layer as the model calls it (SequenceAttention over the engine's CPU backend):
// gradients of sum(out * r) against finite differences, in both modes, causal.
class AttentionLayerTest : public CpuLayerOpsTest,
                           public ::testing::WithParamInterface<AttentionMode> {};

TEST_P(AttentionLayerTest, MatchesFiniteDifferences) {
  SCOPED_TRACE(trace_);
  AttentionSpec spec;
  spec.segment_lengths = {3, 6};
  spec.dilation_rates = {1, 2};
  spec.causal = true;
  spec.mode = GetParam();
  const int64_t b = 1, n = 7, h = 3, d = 2, count = b * n * h * d;
  std::unique_ptr<SequenceAttention> attention = NewCpuLocalAttention(1);
  const SequencePositions positions{0, n};
  auto view = [&](std::vector<double>& x) {
    return TensorView::Contiguous(x.data(), DType::kFloat64, {b, n, h, d});
  };
  std::vector<double> q = RandomValues(count, CheckSeed("q"));
  std::vector<double> k = RandomValues(count, CheckSeed("k"));
  std::vector<double> v = RandomValues(count, CheckSeed("v"));
  std::vector<double> r = RandomValues(count, CheckSeed("r"));
  auto forward = [&](std::vector<double> qq, std::vector<double> kk, std::vector<double> vv,
                     std::vector<double>* out, std::vector<double>* lse) {
    *out = Poisoned(count);
    *lse = Poisoned(b * h * n);
    ForwardArgs args;
    args.q = view(qq);
    args.k = view(kk);
    args.v = view(vv);
    args.out = view(*out);
    args.lse = TensorView::Contiguous(lse->data(), DType::kFloat64, {b, h, n});
    EXPECT_TRUE(attention->Forward(spec, positions, args).ok());
  };
  std::vector<double> out, lse;
  forward(q, k, v, &out, &lse);
  std::vector<double> dq = Poisoned(count), dk = Poisoned(count), dv = Poisoned(count);
  BackwardArgs args;
  args.q = view(q);
  args.k = view(k);
  args.v = view(v);
  args.out = view(out);
  args.lse = TensorView::Contiguous(lse.data(), DType::kFloat64, {b, h, n});
  args.dout = view(r);
  args.dq = view(dq);
  args.dk = view(dk);
  args.dv = view(dv);
  ASSERT_TRUE(attention->Backward(spec, positions, args).ok());
  auto fd = [&](int which) {
    std::vector<double> base = which == 0 ? q : which == 1 ? k : v;
    return CentralDifferenceGradient(
        [&](const std::vector<double>& x) {
          std::vector<double> o, l;
          forward(which == 0 ? x : q, which == 1 ? x : k, which == 2 ? x : v, &o, &l);
          return Dot(o, r);
        },
        base, kStep);
  };
  EXPECT_TRUE(RelativelyNear("dq", dq, fd(0), kFdTolerance));
  EXPECT_TRUE(RelativelyNear("dk", dk, fd(1), kFdTolerance));
  EXPECT_TRUE(RelativelyNear("dv", dv, fd(2), kFdTolerance));

  // Positions that are not the whole sequence are refused by the local attention.
  ForwardArgs shard;
  shard.q = view(q);
  shard.k = view(k);
  shard.v = view(v);
  shard.out = view(out);
  shard.lse = TensorView::Contiguous(lse.data(), DType::kFloat64, {b, h, n});
  const absl::Status refused = attention->Forward(spec, SequencePositions{7, 14}, shard);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("start at 7"), std::string::npos) << refused;
  // The first n rows of a longer sequence: taken with causal attention (no row sees a later one;
  // the decoder's prefill), with the same result as the n rows alone; refused otherwise.
  ASSERT_TRUE(attention->Forward(spec, SequencePositions{0, n}, shard).ok());
  const std::vector<double> whole_out = out;
  std::fill(out.begin(), out.end(), std::nan(""));
  const absl::Status prefix = attention->Forward(spec, SequencePositions{0, 3 * n}, shard);
  EXPECT_TRUE(prefix.ok()) << prefix;
  EXPECT_EQ(out, whole_out);
  AttentionSpec bidirectional = spec;
  bidirectional.causal = false;
  const absl::Status not_causal =
      attention->Forward(bidirectional, SequencePositions{0, 3 * n}, shard);
  EXPECT_TRUE(absl::IsInvalidArgument(not_causal)) << not_causal;
  EXPECT_NE(not_causal.message().find("not causal"), std::string::npos) << not_causal;
}

INSTANTIATE_TEST_SUITE_P(Modes, AttentionLayerTest,
                         ::testing::Values(AttentionMode::kGrouped, AttentionMode::kMixture),
                         [](const ::testing::TestParamInfo<AttentionMode>& info) {
                           return std::string(AttentionModeName(info.param));
                         });

// fp32 ops agree with fp64 ones (same inputs rounded) within fp32 rounding.
TEST(CpuLayerOpsFloatTest, Fp32AgreesWithFp64) {
  SCOPED_TRACE(testutil::ReproduceHint());
  auto ops32 = NewCpuLayerOps<float>({1});
  auto ops64 = NewCpuLayerOps<double>({1});
  const int64_t m = 6, n = 16;
  const std::vector<double> x = RandomValues(m * n, CheckSeed("x"), 2.0);
  const std::vector<double> gain = RandomValues(n, CheckSeed("g"));
  const std::vector<double> shift = RandomValues(n, CheckSeed("s"));
  std::vector<float> x32(x.begin(), x.end()), g32(gain.begin(), gain.end()),
      s32(shift.begin(), shift.end());
  std::vector<float> y32(m * n, NAN), mean32(m, NAN), rstd32(m, NAN), gl32(m * n, NAN);
  std::vector<double> y64 = Poisoned(m * n), mean64 = Poisoned(m), rstd64 = Poisoned(m),
                      gl64 = Poisoned(m * n);
  ASSERT_TRUE(ops32
                  ->LayerNormForward(x32.data(), m, n, g32.data(), s32.data(), 1e-5, y32.data(),
                                     mean32.data(), rstd32.data())
                  .ok());
  ASSERT_TRUE(ops64
                  ->LayerNormForward(x.data(), m, n, gain.data(), shift.data(), 1e-5, y64.data(),
                                     mean64.data(), rstd64.data())
                  .ok());
  ASSERT_TRUE(ops32->GeluForward(x32.data(), m * n, gl32.data()).ok());
  ASSERT_TRUE(ops64->GeluForward(x.data(), m * n, gl64.data()).ok());
  EXPECT_TRUE(
      RelativelyNear("layernorm fp32", std::vector<double>(y32.begin(), y32.end()), y64, 1e-6));
  EXPECT_TRUE(
      RelativelyNear("gelu fp32", std::vector<double>(gl32.begin(), gl32.end()), gl64, 1e-6));
}

}  // namespace
}  // namespace model
}  // namespace dattn
