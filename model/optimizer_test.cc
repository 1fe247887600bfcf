#include "model/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "model/rng.h"

namespace dattn {
namespace model {
namespace {

// A small model's layout: an embedding, a matrix with its bias, a LayerNorm, an untied head.
ParamLayout TestLayout() {
  ParamLayout layout;
  EXPECT_TRUE(layout.Add("tok_embeddings.weight", {16, 4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.attn.q_proj.weight", {4, 4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.attn.q_proj.bias", {4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.ln1.weight", {4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.ln1.bias", {4}).ok());
  EXPECT_TRUE(layout.Add("lm_head.weight", {16, 4}).ok());
  return layout;
}

std::vector<float> RandomVector(int64_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = static_cast<float>((rng.Uniform() * 2 - 1) * scale);
  return x;
}

// The float64 reference: AdamW written directly from its definition (Loshchilov & Hutter, with
// PyTorch's placement of the decay), every quantity in double.
struct Reference {
  std::vector<double> p, m, v;
  void Step(const AdamWConfig& c, int64_t t, double lr, double grad_scale,
            const std::vector<float>& grad, const std::vector<bool>& decay) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = static_cast<double>(grad[i]) * grad_scale;
      if (decay[i]) p[i] -= lr * c.weight_decay * p[i];
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(c.beta1, static_cast<double>(t)));
      const double vhat = v[i] / (1 - std::pow(c.beta2, static_cast<double>(t)));
      p[i] -= lr * mhat / (std::sqrt(vhat) + c.epsilon);
    }
  }
};

TEST(OptimizerTest, DecayConventionSkipsVectorsAndEmbeddings) {
  ParamLayout layout = TestLayout();
  absl::StatusOr<AdamW> opt = AdamW::Create(layout, AdamWConfig{});
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(opt->decayed_entries(),
            (std::vector<std::string>{"blocks.0.attn.q_proj.weight", "lm_head.weight"}));
  for (const ParamEntry& e : layout.entries()) {
    const bool expected = e.name == "blocks.0.attn.q_proj.weight" || e.name == "lm_head.weight";
    EXPECT_EQ(opt->Decays(e.offset), expected) << e.name;
    EXPECT_EQ(opt->Decays(e.offset + e.numel - 1), expected) << e.name;
  }
  // A caller's own predicate replaces the convention.
  absl::StatusOr<AdamW> all =
      AdamW::Create(layout, AdamWConfig{}, [](const ParamEntry&) { return true; });
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->decayed_entries().size(), layout.entries().size());
}

TEST(OptimizerTest, MatchesFloat64ReferenceOverManySteps) {
  ParamLayout layout = TestLayout();
  AdamWConfig config;
  config.beta1 = 0.9;
  config.beta2 = 0.95;
  config.epsilon = 1e-8;
  config.weight_decay = 0.1;
  absl::StatusOr<AdamW> opt = AdamW::Create(layout, config);
  ASSERT_TRUE(opt.ok()) << opt.status();
  LrSchedule schedule{1e-2, 1e-3, 5, 40};
  ASSERT_TRUE(ValidateLrSchedule(schedule).ok());

  const int64_t n = layout.total();
  std::vector<float> params = RandomVector(n, 1, 0.5);
  AdamWState state = opt->NewState();
  Reference ref;
  ref.p.assign(params.begin(), params.end());
  ref.m.assign(n, 0.0);
  ref.v.assign(n, 0.0);
  std::vector<bool> decay(n);
  for (int64_t i = 0; i < n; ++i) decay[i] = opt->Decays(i);

  for (int64_t t = 1; t <= 40; ++t) {
    std::vector<float> grads = RandomVector(n, 100 + t, t % 7 == 0 ? 1e-4 : 1.0);
    const double scale = t % 5 == 0 ? 0.5 : 1.0;
    ASSERT_TRUE(opt->Step(&state, schedule.At(t), scale, absl::MakeSpan(params), grads).ok());
    ref.Step(config, t, schedule.At(t), scale, grads, decay);
  }
  EXPECT_EQ(state.step, 40);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::abs(params[i] - ref.p[i]) / (std::abs(ref.p[i]) + 1e-3);
    worst = std::max(worst, err);
    EXPECT_NEAR(state.m[i], ref.m[i], 1e-5 * (std::abs(ref.m[i]) + 1e-6)) << i;
    EXPECT_NEAR(state.v[i], ref.v[i], 1e-5 * (std::abs(ref.v[i]) + 1e-9)) << i;
  }
  // 40 fp32 updates, each a handful of roundings of 6e-8: far below 1e-5 relative.
  EXPECT_LT(worst, 1e-5);
}

TEST(OptimizerTest, DecayActsOnlyWhereChosen) {
  ParamLayout layout = TestLayout();
  AdamWConfig config;
  config.weight_decay = 0.5;
  absl::StatusOr<AdamW> opt = AdamW::Create(layout, config);
  ASSERT_TRUE(opt.ok());
  std::vector<float> params(layout.total(), 2.0f);
  std::vector<float> zero(layout.total(), 0.0f);
  AdamWState state = opt->NewState();
  // Zero gradients: the Adam part is 0 / (0 + eps) = 0, only the decay moves weights.
  ASSERT_TRUE(opt->Step(&state, 0.1, 1.0, absl::MakeSpan(params), zero).ok());
  for (int64_t i = 0; i < layout.total(); ++i) {
    EXPECT_EQ(params[i], opt->Decays(i) ? 2.0f * static_cast<float>(1 - 0.1 * 0.5) : 2.0f) << i;
  }
}

TEST(OptimizerTest, BitForBitDeterministicAndIndependentOfSharding) {
  ParamLayout layout = TestLayout();
  absl::StatusOr<AdamW> opt = AdamW::Create(layout, AdamWConfig{});
  ASSERT_TRUE(opt.ok());
  const int64_t n = layout.total();
  const std::vector<float> start = RandomVector(n, 7, 1.0);

  auto run = [&](int shards) {
    std::vector<float> p = start;
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    for (int64_t t = 1; t <= 12; ++t) {
      const std::vector<float> g = RandomVector(n, 1000 + t, 1.0);
      AdamWStepArgs args{t, 1e-3 * t, 0.75};
      // Uneven shard boundaries that cut through entries.
      for (int s = 0; s < shards; ++s) {
        const int64_t b = n * s / shards + (s > 0 ? 1 : 0);
        const int64_t e = s + 1 == shards ? n : n * (s + 1) / shards + 1;
        const int64_t k = e - b;
        EXPECT_TRUE(opt->Update(args, b, e, absl::MakeSpan(p).subspan(b, k),
                                absl::MakeConstSpan(g).subspan(b, k),
                                absl::MakeSpan(m).subspan(b, k), absl::MakeSpan(v).subspan(b, k))
                        .ok());
      }
    }
    return p;
  };
  const std::vector<float> once = run(1);
  const std::vector<float> again = run(1);
  const std::vector<float> three = run(3);
  const std::vector<float> seven = run(7);
  EXPECT_EQ(std::memcmp(once.data(), again.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(once.data(), three.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(once.data(), seven.data(), n * sizeof(float)), 0);
}

TEST(OptimizerTest, BadArgumentsAreRefusedByName) {
  ParamLayout layout = TestLayout();
  AdamWConfig bad;
  bad.beta2 = 1.0;
  absl::Status s = AdamW::Create(layout, bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("beta2 = 1"), std::string::npos) << s;
  bad = AdamWConfig{};
  bad.epsilon = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(AdamW::Create(layout, bad).status()));
  bad = AdamWConfig{};
  bad.weight_decay = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(AdamW::Create(layout, bad).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(AdamW::Create(ParamLayout(), AdamWConfig{}).status()));

  absl::StatusOr<AdamW> opt = AdamW::Create(layout, AdamWConfig{});
  ASSERT_TRUE(opt.ok());
  const int64_t n = layout.total();
  std::vector<float> p(n, 1.0f), g(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  const std::vector<float> before = p;
  s = opt->Update({1, 1e-3, 1.0}, 0, n + 1, absl::MakeSpan(p), g, absl::MakeSpan(m),
                  absl::MakeSpan(v));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find(std::to_string(n + 1)), std::string::npos) << s;
  s = opt->Update({1, 1e-3, 1.0}, 0, n, absl::MakeSpan(p), absl::MakeConstSpan(g).subspan(1),
                  absl::MakeSpan(m), absl::MakeSpan(v));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("grads"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(opt->Update({0, 1e-3, 1.0}, 0, n, absl::MakeSpan(p), g,
                                                  absl::MakeSpan(m), absl::MakeSpan(v))));
  EXPECT_TRUE(absl::IsInvalidArgument(opt->Update({1, std::nan(""), 1.0}, 0, n, absl::MakeSpan(p),
                                                  g, absl::MakeSpan(m), absl::MakeSpan(v))));
  EXPECT_TRUE(absl::IsInvalidArgument(opt->Update({1, 1e-3, 0.0}, 0, n, absl::MakeSpan(p), g,
                                                  absl::MakeSpan(m), absl::MakeSpan(v))));
  EXPECT_EQ(p, before);  // Nothing refused was written.
  AdamWState state = opt->NewState();
  state.m.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(opt->Step(&state, 1e-3, 1.0, absl::MakeSpan(p), g)));
  EXPECT_EQ(state.step, 0);
}

TEST(OptimizerTest, ScheduleValuesAtKnownSteps) {
  LrSchedule s{1e-3, 1e-4, 10, 110};
  ASSERT_TRUE(ValidateLrSchedule(s).ok());
  EXPECT_DOUBLE_EQ(s.At(1), 1e-4);  // 1e-3 * 1/10
  EXPECT_DOUBLE_EQ(s.At(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.At(10), 1e-3);                        // The end of warmup is the peak.
  EXPECT_DOUBLE_EQ(s.At(60), 1e-4 + (1e-3 - 1e-4) * 0.5);  // Half way down: cos(pi/2) = 0.
  EXPECT_NEAR(s.At(35), 1e-4 + (1e-3 - 1e-4) * (1 + std::cos(M_PI * 0.25)) / 2, 1e-18);
  EXPECT_DOUBLE_EQ(s.At(110), 1e-4);  // The last scheduled update has the minimum.
  EXPECT_DOUBLE_EQ(s.At(1000), 1e-4);
  EXPECT_DOUBLE_EQ(s.At(0), s.At(1));
  for (int64_t t = 11; t < 110; ++t) EXPECT_LT(s.At(t + 1), s.At(t)) << t;  // Strictly down.

  LrSchedule no_warmup{2e-3, 0, 0, 4};
  ASSERT_TRUE(ValidateLrSchedule(no_warmup).ok());
  EXPECT_NEAR(no_warmup.At(1), 2e-3 * (1 + std::cos(M_PI / 4)) / 2, 1e-18);
  EXPECT_NEAR(no_warmup.At(4), 0.0, 1e-18);

  LrSchedule all_warmup{1.0, 0.5, 4, 4};
  ASSERT_TRUE(ValidateLrSchedule(all_warmup).ok());
  EXPECT_DOUBLE_EQ(all_warmup.At(4), 1.0);
  EXPECT_DOUBLE_EQ(all_warmup.At(5), 0.5);

  absl::Status bad = ValidateLrSchedule({1e-3, 2e-3, 0, 10});
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_NE(bad.message().find("min_lr"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateLrSchedule({0, 0, 0, 10})));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateLrSchedule({1e-3, 0, 20, 10})));
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateLrSchedule({1e-3, 0, -1, 10})));
}

TEST(OptimizerTest, ClippingFromShardedPartialSums) {
  // 3-4-12-84: the norm of {3, 4, 12, 84} is 85.
  const std::vector<float> g = {3, 4, 12, 84};
  EXPECT_EQ(SumOfSquares(g), 85.0 * 85.0);
  const double partials[] = {SumOfSquares(absl::MakeConstSpan(g).subspan(0, 2)),
                             SumOfSquares(absl::MakeConstSpan(g).subspan(2, 2))};
  EXPECT_EQ(GlobalNorm(partials), 85.0);
  absl::StatusOr<double> scale = ClipScale(85.0, 1.0);
  ASSERT_TRUE(scale.ok());
  EXPECT_DOUBLE_EQ(*scale, 1.0 / (85.0 + 1e-6));
  EXPECT_EQ(*ClipScale(0.5, 1.0), 1.0);  // Below the limit: untouched.
  EXPECT_EQ(*ClipScale(1e30, std::numeric_limits<double>::infinity()), 1.0);
  absl::Status nan = ClipScale(std::nan(""), 1.0).status();
  EXPECT_TRUE(absl::IsOutOfRange(nan));
  EXPECT_NE(nan.message().find("nan"), std::string::npos) << nan;
  EXPECT_TRUE(absl::IsOutOfRange(ClipScale(std::numeric_limits<double>::infinity(), 1.0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ClipScale(1.0, 0.0).status()));

  // fp64 accumulation: squares of large fp32 values that overflow fp32 still give a finite norm.
  const std::vector<float> big = {3e20f, 4e20f};
  EXPECT_NEAR(GlobalNorm({SumOfSquares(big)}), 5e20,
              5e20 * 1e-6);  // fp32 inputs: 3e20f is not 3e20.

  // Clipping through grad_scale equals clipping the gradients first.
  ParamLayout layout;
  ASSERT_TRUE(layout.Add("w", {2, 2}).ok());
  absl::StatusOr<AdamW> opt = AdamW::Create(layout, AdamWConfig{});
  ASSERT_TRUE(opt.ok());
  std::vector<float> p1 = {1, 2, 3, 4}, p2 = p1;
  AdamWState s1 = opt->NewState(), s2 = opt->NewState();
  ASSERT_TRUE(opt->Step(&s1, 1e-2, 0.5, absl::MakeSpan(p1), g).ok());
  std::vector<float> halved = {1.5f, 2.0f, 6.0f, 42.0f};
  ASSERT_TRUE(opt->Step(&s2, 1e-2, 1.0, absl::MakeSpan(p2), halved).ok());
  EXPECT_EQ(p1, p2);
}

}  // namespace
}  // namespace model
}  // namespace dattn
