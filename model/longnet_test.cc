// The whole model on the CPU: gradients of every parameter against fp64 central finite
// differences, activation checkpointing bit for bit, fp32 against fp64, poisoned scratch, gradient
// accumulation, positions, and the errors of the API. Tiny shapes: the suite runs in seconds.
#include "model/longnet.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <vector>

#include "engine/cpu_backend.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/cpu_layer_ops.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace {

using testutil::CheckSeed;
using testutil::RelativeError;

// A tiny model whose patterns exercise the engine's corners: H % G != 0 in grouped mode (3 heads,
// 2 patterns), a rate that divides no segment (3 against 8), a segment longer than N = 10 is not
// (8 < 10) but N is no multiple of 8 or 3, so the last segments are partial.
LongNetConfig TinyConfig() {
  LongNetConfig c;
  c.vocab_size = 7;
  c.d_model = 12;
  c.num_layers = 2;
  c.num_heads = 3;  // D = 4.
  c.ffn_dim = 10;
  c.segment_lengths = {3, 8};
  c.dilation_rates = {1, 3};
  c.rope_theta = 50;
  c.xpos_scale_base = 8;  // Strong decay at these lengths, so that XPOS matters to the test.
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  int64_t batch = 0, seq_len = 0;
  TokenBatch View() const {
    TokenBatch b;
    b.tokens = tokens.data();
    b.targets = targets.empty() ? nullptr : targets.data();
    b.batch = batch;
    b.seq_len = seq_len;
    return b;
  }
};

// Random tokens; targets are the next tokens with a few positions ignored.
Batch RandomBatch(int64_t vocab, int64_t batch, int64_t seq_len, uint64_t seed) {
  testutil::Random rng(seed);
  Batch b;
  b.batch = batch;
  b.seq_len = seq_len;
  for (int64_t i = 0; i < batch * (seq_len + 1); ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab)));
  }
  std::vector<int32_t> all = b.tokens;
  b.tokens.clear();
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t t = 0; t < seq_len; ++t) {
      b.tokens.push_back(all[s * (seq_len + 1) + t]);
      b.targets.push_back(rng.Next() % 5 == 0 ? kIgnoreTarget : all[s * (seq_len + 1) + t + 1]);
    }
  }
  return b;
}

template <typename T>
std::unique_ptr<LongNetLM<T>> MakeModel(const LongNetConfig& config, ModelOptions options = {},
                                        uint64_t seed = 1) {
  absl::StatusOr<std::unique_ptr<LongNetLM<T>>> model =
      LongNetLM<T>::CreateCpu(config, options, /*num_threads=*/1);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  EXPECT_TRUE((*model)->InitParams(seed).ok());
  return *std::move(model);
}

// The parameters perturbed away from MAGNETO's zeros and ones (biases 0, gains 1), so that every
// gradient path is exercised with generic values.
void Perturb(LongNetLM<double>* model, uint64_t seed) {
  std::vector<double> p(static_cast<size_t>(model->layout().total()));
  ASSERT_TRUE(model->CopyParamsToHost(p.data()).ok());
  const std::vector<double> noise = testutil::RandomValues(model->layout().total(), seed, 0.2);
  for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  ASSERT_TRUE(model->CopyParamsFromHost(p.data()).ok());
}

template <typename T>
std::vector<T> Grads(LongNetLM<T>* model) {
  std::vector<T> g(static_cast<size_t>(model->layout().total()));
  EXPECT_TRUE(model->CopyGradsToHost(g.data()).ok());
  return g;
}

template <typename T>
std::vector<T> Logits(LongNetLM<T>* model, const Batch& b) {
  std::vector<T> l(static_cast<size_t>(b.batch * b.seq_len * model->config().vocab_size));
  EXPECT_TRUE(model->CopyLogitsToHost(l.data()).ok());
  return l;
}

std::vector<double> Slice(const std::vector<double>& v, const ParamEntry& e) {
  return std::vector<double>(v.begin() + e.offset, v.begin() + e.offset + e.numel);
}

struct FdCase {
  std::string name;
  LongNetConfig config;
  bool checkpoint = false;
};

class ModelGradientTest : public ::testing::TestWithParam<FdCase> {};

// Every parameter's gradient against central differences of the loss (fp64, step 1e-5): per
// entry, ||g - fd|| / ||fd|| <= 1e-6, and over the whole buffer <= 1e-7.
TEST_P(ModelGradientTest, EveryParameterMatchesFiniteDifferences) {
  SCOPED_TRACE(testutil::ReproduceHint());
  const FdCase& c = GetParam();
  ModelOptions options;
  options.checkpoint_activations = c.checkpoint;
  options.poison_scratch = true;
  auto model = MakeModel<double>(c.config, options);
  ASSERT_NE(model, nullptr);
  Perturb(model.get(), CheckSeed("params"));
  const Batch b = RandomBatch(c.config.vocab_size, 2, 10, CheckSeed("batch"));
  absl::StatusOr<LossResult> loss = model->Forward(b.View());
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(std::isfinite(loss->loss));
  ASSERT_TRUE(model->Backward().ok());
  const std::vector<double> grads = Grads(model.get());

  std::vector<double> params(static_cast<size_t>(model->layout().total()));
  ASSERT_TRUE(model->CopyParamsToHost(params.data()).ok());
  const double h = 1e-5;
  std::vector<double> fd(params.size());
  auto loss_at = [&](std::vector<double>& p) {
    EXPECT_TRUE(model->CopyParamsFromHost(p.data()).ok());
    absl::StatusOr<LossResult> l = model->Forward(b.View());
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->loss : std::numeric_limits<double>::quiet_NaN();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const double x = params[i];
    params[i] = x + h;
    const double up = loss_at(params);
    params[i] = x - h;
    const double down = loss_at(params);
    params[i] = x;
    fd[i] = (up - down) / (2 * h);
  }
  double worst = 0, smallest_rms = std::numeric_limits<double>::infinity();
  std::string worst_name;
  for (const ParamEntry& e : model->layout().entries()) {
    const std::vector<double> want = Slice(fd, e);
    const double err = RelativeError(Slice(grads, e), want);
    // Central differences of a loss of about 2 in fp64 carry about 1e-16 x 2 / h = 2e-11 of noise
    // per element: the bound holds for entries whose gradients are well above it (all here).
    const double rms = std::sqrt(testutil::Dot(want, want) / static_cast<double>(e.numel));
    smallest_rms = std::min(smallest_rms, rms);
    ASSERT_GT(rms, 1e-6) << e.name << ": a gradient too small for the check to see";
    EXPECT_LE(err, 1e-6) << e.name;
    if (!(err <= worst)) {
      worst = err;
      worst_name = e.name;
    }
  }
  const double total = RelativeError(grads, fd);
  EXPECT_LE(total, 1e-7);
  std::cout << c.name << ": " << params.size() << " parameters, relative error " << total
            << " overall, worst entry " << worst_name << " " << worst
            << "; smallest rms gradient of an entry " << smallest_rms << "\n";
}

std::vector<FdCase> FdCases() {
  std::vector<FdCase> cases;
  {
    FdCase c{"GroupedRopeTied", TinyConfig()};
    cases.push_back(c);
  }
  {
    FdCase c{"MixtureXposUntied", TinyConfig()};
    c.config.attention_mode = AttentionMode::kMixture;
    c.config.xpos = true;
    c.config.tie_embeddings = false;
    cases.push_back(c);
  }
  {
    FdCase c{"MixtureBlockedXposCheckpointed", TinyConfig()};
    c.config.attention_mode = AttentionMode::kMixture;
    c.config.head_offsets = HeadOffsets::kBlocked;
    c.config.xpos = true;
    c.config.num_layers = 3;
    c.checkpoint = true;
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelGradientTest, ::testing::ValuesIn(FdCases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) {
                           return info.param.name;
                         });

// Activation checkpointing recomputes each block with the same code on the same inputs: the
// gradients, loss and logits are identical bit for bit, in fp64 and fp32.
template <typename T>
void ExpectCheckpointingBitExact(const LongNetConfig& config) {
  ModelOptions plain, checkpointed;
  checkpointed.checkpoint_activations = true;
  auto a = MakeModel<T>(config, plain, 7);
  auto b = MakeModel<T>(config, checkpointed, 7);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const Batch batch = RandomBatch(config.vocab_size, 3, 17, CheckSeed("batch"));
  absl::StatusOr<LossResult> la = a->Forward(batch.View());
  absl::StatusOr<LossResult> lb = b->Forward(batch.View());
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(std::memcmp(&la->loss, &lb->loss, sizeof(double)), 0);
  ASSERT_TRUE(a->Backward().ok());
  ASSERT_TRUE(b->Backward().ok());
  const std::vector<T> ga = Grads(a.get()), gb = Grads(b.get());
  ASSERT_EQ(ga.size(), gb.size());
  int64_t differing = 0;
  for (size_t i = 0; i < ga.size(); ++i) differing += std::memcmp(&ga[i], &gb[i], sizeof(T)) != 0;
  EXPECT_EQ(differing, 0) << "of " << ga.size() << " gradient elements";
  // Not vacuous: the gradients are not all zero.
  double norm = 0;
  for (T g : ga) norm += static_cast<double>(g) * g;
  EXPECT_GT(norm, 1e-6);
  const std::vector<T> xa = Logits(a.get(), batch), xb = Logits(b.get(), batch);
  EXPECT_EQ(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(T)), 0);
}

TEST(ModelCheckpointingTest, GradientsIdenticalBitForBitFp64) {
  SCOPED_TRACE(testutil::ReproduceHint());
  LongNetConfig c = TinyConfig();
  c.num_layers = 3;
  c.xpos = true;
  ExpectCheckpointingBitExact<double>(c);
}

TEST(ModelCheckpointingTest, GradientsIdenticalBitForBitFp32) {
  SCOPED_TRACE(testutil::ReproduceHint());
  LongNetConfig c = TinyConfig();
  c.num_layers = 3;
  c.attention_mode = AttentionMode::kMixture;
  c.tie_embeddings = false;
  ExpectCheckpointingBitExact<float>(c);
}

// The same weights (fp64 values rounded to fp32) give the same loss, logits and gradients within
// fp32 rounding.
TEST(ModelPrecisionTest, Fp32AgreesWithFp64) {
  SCOPED_TRACE(testutil::ReproduceHint());
  LongNetConfig c = TinyConfig();
  c.d_model = 32;
  c.num_heads = 4;
  c.ffn_dim = 48;
  c.vocab_size = 19;
  c.xpos = true;
  c.attention_mode = AttentionMode::kMixture;
  auto m64 = MakeModel<double>(c, {}, 3);
  auto m32 = MakeModel<float>(c, {}, 3);
  ASSERT_NE(m64, nullptr);
  ASSERT_NE(m32, nullptr);
  const Batch b = RandomBatch(c.vocab_size, 2, 24, CheckSeed("batch"));
  absl::StatusOr<LossResult> l64 = m64->Forward(b.View());
  absl::StatusOr<LossResult> l32 = m32->Forward(b.View());
  ASSERT_TRUE(l64.ok() && l32.ok());
  EXPECT_NEAR(l32->loss, l64->loss, 1e-5 * l64->loss);
  EXPECT_EQ(l32->num_targets, l64->num_targets);
  ASSERT_TRUE(m64->Backward().ok());
  ASSERT_TRUE(m32->Backward().ok());
  const std::vector<double> x64 = Logits(m64.get(), b);
  const std::vector<float> x32 = Logits(m32.get(), b);
  const double logit_err = RelativeError(std::vector<double>(x32.begin(), x32.end()), x64);
  EXPECT_LE(logit_err, 1e-5);
  const std::vector<double> g64 = Grads(m64.get());
  const std::vector<float> g32f = Grads(m32.get());
  const std::vector<double> g32(g32f.begin(), g32f.end());
  double worst = 0;
  for (const ParamEntry& e : m64->layout().entries()) {
    const double err = RelativeError(Slice(g32, e), Slice(g64, e));
    EXPECT_LE(err, 1e-3) << e.name;
    worst = std::max(worst, err);
  }
  const double grad_err = RelativeError(g32, g64);
  EXPECT_LE(grad_err, 1e-4);
  std::cout << "fp32 vs fp64: loss " << std::fabs(l32->loss - l64->loss) / l64->loss << ", logits "
            << logit_err << ", gradients " << grad_err << " (worst entry " << worst << ")\n";
}

// Poisoned scratch changes nothing (no buffer is read before it is written), and the gradient
// buffer is written in full under kOverwrite even when it starts as NaN.
TEST(ModelStateTest, PoisonedScratchChangesNothing) {
  SCOPED_TRACE(testutil::ReproduceHint());
  for (bool checkpoint : {false, true}) {
    LongNetConfig c = TinyConfig();
    c.xpos = true;
    ModelOptions clean, poisoned;
    clean.checkpoint_activations = poisoned.checkpoint_activations = checkpoint;
    poisoned.poison_scratch = true;
    auto a = MakeModel<double>(c, clean, 5);
    auto b = MakeModel<double>(c, poisoned, 5);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    std::vector<double> nan(static_cast<size_t>(b->layout().total()),
                            std::numeric_limits<double>::quiet_NaN());
    std::memcpy(b->grads(), nan.data(), nan.size() * sizeof(double));
    const Batch batch = RandomBatch(c.vocab_size, 2, 9, CheckSeed("batch"));
    ASSERT_TRUE(a->Forward(batch.View()).ok());
    ASSERT_TRUE(b->Forward(batch.View()).ok());
    ASSERT_TRUE(a->Backward().ok());
    ASSERT_TRUE(b->Backward().ok());
    EXPECT_EQ(Grads(a.get()), Grads(b.get())) << "checkpoint " << checkpoint;
    EXPECT_EQ(Logits(a.get(), batch), Logits(b.get(), batch));
  }
}

TEST(ModelStateTest, AccumulationAndLossScale) {
  SCOPED_TRACE(testutil::ReproduceHint());
  auto m = MakeModel<double>(TinyConfig());
  ASSERT_NE(m, nullptr);
  const Batch b = RandomBatch(7, 2, 10, CheckSeed("batch"));
  ASSERT_TRUE(m->Forward(b.View()).ok());
  ASSERT_TRUE(m->Backward().ok());
  const std::vector<double> g1 = Grads(m.get());
  BackwardOptions add;
  add.grads = Accumulate::kAdd;
  add.loss_scale = 0.5;
  ASSERT_TRUE(m->Backward(add).ok());  // g1 + 0.5 g1.
  const std::vector<double> g15 = Grads(m.get());
  std::vector<double> want(g1.size());
  for (size_t i = 0; i < g1.size(); ++i) want[i] = 1.5 * g1[i];
  EXPECT_LE(RelativeError(g15, want), 1e-14);
}

// BackwardOptions::on_grads_final: every range is handed once, in BackwardFinishOrder, and is
// final when handed (its values then are the values at the end), in both accumulation modes, with
// the head tied or not and with checkpointing; an error from the callback stops the backward.
TEST(ModelStateTest, GradientRangesAreHandedWhenFinal) {
  SCOPED_TRACE(testutil::ReproduceHint());
  for (bool tied : {true, false}) {
    for (bool checkpoint : {false, true}) {
      SCOPED_TRACE(testing::Message() << "tied " << tied << ", checkpointing " << checkpoint);
      LongNetConfig config = TinyConfig();
      config.tie_embeddings = tied;
      ModelOptions options;
      options.checkpoint_activations = checkpoint;
      auto m = MakeModel<double>(config, options);
      ASSERT_NE(m, nullptr);
      Perturb(m.get(), CheckSeed("perturb"));
      const int64_t total = m->layout().total();
      const std::vector<ElementRange> want = BackwardFinishOrder(m->offsets(), total);
      ASSERT_EQ(want.size(), static_cast<size_t>(config.num_layers + 2));
      // The order covers the buffer once: sorted, the ranges tile [0, total).
      std::vector<ElementRange> sorted = want;
      std::sort(sorted.begin(), sorted.end(),
                [](const ElementRange& a, const ElementRange& b) { return a.begin < b.begin; });
      int64_t next = 0;
      for (const ElementRange& r : sorted) {
        EXPECT_EQ(r.begin, next);
        EXPECT_LT(r.begin, r.end);
        next = r.end;
      }
      EXPECT_EQ(next, total);
      EXPECT_EQ(want.back().begin, 0);  // The embedding is last.

      const Batch b = RandomBatch(7, 2, 10, CheckSeed("batch"));
      ASSERT_TRUE(m->Forward(b.View()).ok());
      for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
        std::vector<ElementRange> handed;
        std::vector<std::vector<double>> at_hand_over;
        BackwardOptions bo;
        bo.grads = mode;
        bo.on_grads_final = [&](int64_t begin, int64_t end) {
          handed.push_back({begin, end});
          const std::vector<double> g = Grads(m.get());
          at_hand_over.emplace_back(g.begin() + begin, g.begin() + end);
          return absl::OkStatus();
        };
        ASSERT_TRUE(m->Backward(bo).ok());
        const std::vector<double> final_grads = Grads(m.get());
        ASSERT_EQ(handed.size(), want.size());
        for (size_t k = 0; k < want.size(); ++k) {
          EXPECT_EQ(handed[k].begin, want[k].begin) << "range " << k;
          EXPECT_EQ(handed[k].end, want[k].end) << "range " << k;
          EXPECT_TRUE(std::equal(at_hand_over[k].begin(), at_hand_over[k].end(),
                                 final_grads.begin() + handed[k].begin))
              << "range " << k << " [" << handed[k].begin << ", " << handed[k].end
              << ") changed after it was handed";
        }
      }

      // An error from the callback is the backward's, and the backward stops there.
      int calls = 0;
      BackwardOptions failing;
      failing.on_grads_final = [&](int64_t, int64_t) {
        return ++calls == 2 ? absl::UnavailableError("peer 3 is gone") : absl::OkStatus();
      };
      const absl::Status s = m->Backward(failing);
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
      EXPECT_EQ(calls, 2);
      EXPECT_EQ(m->Backward().code(), absl::StatusCode::kFailedPrecondition);
    }
  }
}

TEST(ModelStateTest, IgnoredTargetsAndInference) {
  SCOPED_TRACE(testutil::ReproduceHint());
  auto m = MakeModel<double>(TinyConfig());
  ASSERT_NE(m, nullptr);
  Batch b = RandomBatch(7, 1, 6, CheckSeed("batch"));
  // The loss is the mean over targeted positions: check it against the logits.
  absl::StatusOr<LossResult> loss = m->Forward(b.View());
  ASSERT_TRUE(loss.ok());
  const std::vector<double> logits = Logits(m.get(), b);
  double sum = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < 6; ++t) {
    if (b.targets[t] == kIgnoreTarget) continue;
    double z = 0;
    for (int64_t i = 0; i < 7; ++i) z += std::exp(logits[t * 7 + i]);
    sum += std::log(z) - logits[t * 7 + b.targets[t]];
    ++count;
  }
  EXPECT_EQ(loss->num_targets, count);
  EXPECT_NEAR(loss->loss, sum / count, 1e-13);
  // Every target ignored: loss 0 and zero gradients.
  std::fill(b.targets.begin(), b.targets.end(), kIgnoreTarget);
  loss = m->Forward(b.View());
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(loss->num_targets, 0);
  EXPECT_EQ(loss->loss, 0.0);
  ASSERT_TRUE(m->Backward().ok());
  for (double g : Grads(m.get())) ASSERT_EQ(g, 0.0);
  // No targets: logits only, and Backward refuses.
  b.targets.clear();
  loss = m->Forward(b.View());
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(Logits(m.get(), b), logits);
  const absl::Status s = m->Backward();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

// A model reused across shapes computes what a fresh one computes.
TEST(ModelStateTest, ShapeChangesReallocate) {
  SCOPED_TRACE(testutil::ReproduceHint());
  auto reused = MakeModel<double>(TinyConfig());
  ASSERT_NE(reused, nullptr);
  const Batch big = RandomBatch(7, 2, 12, CheckSeed("big"));
  const Batch small = RandomBatch(7, 1, 5, CheckSeed("small"));
  ASSERT_TRUE(reused->Forward(big.View()).ok());
  ASSERT_TRUE(reused->Backward().ok());
  ASSERT_TRUE(reused->Forward(small.View()).ok());
  ASSERT_TRUE(reused->Backward().ok());
  auto fresh = MakeModel<double>(TinyConfig());
  ASSERT_TRUE(fresh->Forward(small.View()).ok());
  ASSERT_TRUE(fresh->Backward().ok());
  EXPECT_EQ(Grads(reused.get()), Grads(fresh.get()));
  EXPECT_EQ(Logits(reused.get(), small), Logits(fresh.get(), small));
}

// Attention over the call's rows only, whatever the positions say: a stand-in for a rank that holds
// a whole number of reference blocks, to check that the model passes absolute positions to the
// rotary kernel (and the attention interface).
class RowsOnlyAttention final : public SequenceAttention {
 public:
  Device device() const override { return Device::kCpu; }
  absl::Status Forward(const AttentionSpec& spec, const SequencePositions& positions,
                       const ForwardArgs& args) override {
    last = positions;
    return backend_->Forward(spec, args);
  }
  absl::Status Backward(const AttentionSpec& spec, const SequencePositions& positions,
                        const BackwardArgs& args) override {
    last = positions;
    return backend_->Backward(spec, args);
  }
  SequencePositions last;

 private:
  std::unique_ptr<AttentionBackend> backend_ = NewCpuBackend({1});
};

TEST(ModelPositionsTest, RotaryUsesAbsolutePositions) {
  SCOPED_TRACE(testutil::ReproduceHint());
  LongNetConfig c = TinyConfig();
  c.segment_lengths = {4, 8};
  c.dilation_rates = {1, 2};
  c.xpos = true;  // Reference blocks of lcm = 8 positions.
  auto make = [&]() {
    auto attention = std::make_unique<RowsOnlyAttention>();
    RowsOnlyAttention* raw = attention.get();
    auto m = LongNetLM<double>::Create(c, {}, NewCpuLayerOps<double>({1}), std::move(attention));
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->InitParams(11).ok());
    return std::make_pair(*std::move(m), raw);
  };
  const Batch b = RandomBatch(c.vocab_size, 2, 8, CheckSeed("batch"));
  auto [whole, whole_attention] = make();
  auto [shard, shard_attention] = make();
  ASSERT_TRUE(whole->Forward(b.View()).ok());
  EXPECT_EQ(whole_attention->last.offset, 0);
  EXPECT_EQ(whole_attention->last.total, 8);
  // Rows 16..23 of 32: two whole blocks on, so every score is the same as at rows 0..7.
  TokenBatch at16 = b.View();
  at16.positions = SequencePositions{16, 32};
  ASSERT_TRUE(shard->Forward(at16).ok());
  EXPECT_EQ(shard_attention->last.offset, 16);
  EXPECT_EQ(shard_attention->last.total, 32);
  EXPECT_EQ(Logits(whole.get(), b), Logits(shard.get(), b));
  // Rows 3..10: blocks [0, 8) and [8, 16) now cut the attention's segments, and scores change.
  TokenBatch at3 = b.View();
  at3.positions = SequencePositions{3, 32};
  ASSERT_TRUE(shard->Forward(at3).ok());
  EXPECT_GT(RelativeError(Logits(shard.get(), b), Logits(whole.get(), b)), 1e-6);
}

// --- Errors: each names the bad value.

void ExpectInvalid(const absl::Status& s, const std::string& fragment) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s << "\nshould mention: " << fragment;
}

TEST(ModelErrorsTest, BadInputsAreNamed) {
  auto m = MakeModel<double>(TinyConfig());
  ASSERT_NE(m, nullptr);
  const absl::Status before = m->Backward();
  EXPECT_TRUE(absl::IsFailedPrecondition(before)) << before;
  Batch b = RandomBatch(7, 2, 5, 1);
  b.tokens[6] = 7;  // Sequence 1, position 1.
  ExpectInvalid(m->Forward(b.View()).status(), "tokens[1, 1] = 7 is outside [0, vocab_size = 7)");
  b.tokens[6] = -3;
  ExpectInvalid(m->Forward(b.View()).status(), "tokens[1, 1] = -3");
  b.tokens[6] = 0;
  b.targets[4] = 9;
  ExpectInvalid(m->Forward(b.View()).status(), "targets[0, 4] = 9");
  b.targets[4] = kIgnoreTarget;
  TokenBatch v = b.View();
  v.seq_len = 0;
  ExpectInvalid(m->Forward(v).status(), "seq_len 0");
  v = b.View();
  v.tokens = nullptr;
  ExpectInvalid(m->Forward(v).status(), "tokens is null");
  v = b.View();
  v.batch = int64_t{1} << 40;
  v.seq_len = int64_t{1} << 30;
  ExpectInvalid(m->Forward(v).status(), "overflows int64");
  v = b.View();
  v.positions = SequencePositions{4, 8};
  ExpectInvalid(m->Forward(v).status(), "positions [4, 4 + 5)");
  // The local attention holds whole sequences only.
  v.positions = SequencePositions{3, 8};
  ExpectInvalid(m->Forward(v).status(), "must be 0");
  // A failed Forward leaves nothing for Backward.
  EXPECT_TRUE(absl::IsFailedPrecondition(m->Backward()));
  ASSERT_TRUE(m->Forward(b.View()).ok());
  BackwardOptions nan_scale;
  nan_scale.loss_scale = std::numeric_limits<double>::infinity();
  ExpectInvalid(m->Backward(nan_scale), "loss_scale inf");
}

TEST(ModelErrorsTest, XposBeyondItsRangeIsRefusedAtForward) {
  LongNetConfig c = TinyConfig();
  c.xpos = true;
  c.xpos_scale_base = 0.05;  // Factors of zeta^(4/0.05) already pass e^60 at W = 8.
  c.segment_lengths = {8};
  c.dilation_rates = {1};
  c.num_heads = 3;
  auto m = MakeModel<double>(c);
  ASSERT_NE(m, nullptr);
  const Batch b = RandomBatch(7, 1, 8, 2);
  ExpectInvalid(m->Forward(b.View()).status(), "rotary.xpos_scale_base = 0.05");
  // Shorter sequences have smaller blocks and pass.
  const Batch shorter = RandomBatch(7, 1, 4, 2);
  EXPECT_TRUE(m->Forward(shorter.View()).ok());
}

TEST(ModelErrorsTest, CreateRefusesMismatches) {
  LongNetConfig bad = TinyConfig();
  bad.num_heads = 5;
  ExpectInvalid(LongNetLM<double>::CreateCpu(bad, {}).status(), "num_heads");
  ExpectInvalid(
      LongNetLM<double>::Create(TinyConfig(), {}, nullptr, NewCpuLocalAttention(1)).status(),
      "required");
}

TEST(ModelFlopsTest, CountsTheLinearLayersAndAttention) {
  LongNetConfig c;  // LongNet base.
  const ModelFlops f = CountFlops(c, 1, 32768, false);
  const double m = 32768, d = 768, ff = 3072;
  const double linear = 12 * 2 * m * (4 * d * d + 2 * d * ff);
  const double head = 2 * m * d * 256;
  const double attention = 12 * dilation::NominalForwardFlops(c.attention_spec(), 1, 32768, 12, 64);
  EXPECT_DOUBLE_EQ(f.forward, linear + head + attention);
  EXPECT_DOUBLE_EQ(f.backward, 2 * linear + 2 * head + 2.5 * attention);
  EXPECT_DOUBLE_EQ(CountFlops(c, 1, 32768, true).backward, f.backward + linear + attention);
  // About 86M parameters (the figure): 12 blocks of 7,095,552, the tied embedding
  // 256 x 768 and the final norm.
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(c);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->total(), 12 * 7095552 + 256 * 768 + 2 * 768);
}

}  // namespace
}  // namespace model
}  // namespace dattn
