// Incremental decoding against the model's full forward pass: the logits of every step equal
// those of a full recompute of the same prefix (fp64 to 1e-11, fp32 to 1e-5 relative), in
// grouped and mixture modes (both head-offset rules), with XPOS, across many segment boundaries
// of patterns whose rates divide no segment; with and without a batched prefill; several
// sequences at different positions in one step; the cache's size by its formula; and the errors.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/longnet.h"
#include "model/testing/decode_fixtures.h"

namespace dattn {
namespace model {
namespace {

using testing::DecodeConfig;
using testing::RandomTokens;
using testutil::RelativelyNear;

template <typename T>
std::unique_ptr<LongNetLM<T>> MakeModel(const LongNetConfig& config, uint64_t seed) {
  ModelOptions options;
  options.poison_scratch = true;  // The prefill's forward pass reads nothing it did not write.
  absl::StatusOr<std::unique_ptr<LongNetLM<T>>> model =
      LongNetLM<T>::CreateCpu(config, options, /*num_threads=*/1);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  EXPECT_TRUE(testing::PerturbedParams(**model, seed).ok());
  return *std::move(model);
}

// The last position's logits of a full forward pass over tokens[0, n) on a separate model with
// the same parameters (default positions: the plain forward pass of that prefix).
template <typename T>
std::vector<double> FullLastLogits(LongNetLM<T>& reference, const std::vector<int32_t>& tokens,
                                   int64_t n) {
  TokenBatch b;
  b.tokens = tokens.data();
  b.batch = 1;
  b.seq_len = n;
  EXPECT_TRUE(reference.Forward(b).ok());
  const int64_t v = reference.config().vocab_size;
  std::vector<T> all(static_cast<size_t>(n * v));
  EXPECT_TRUE(reference.CopyLogitsToHost(all.data()).ok());
  return std::vector<double>(all.end() - v, all.end());
}

template <typename T>
std::vector<double> AsDouble(const T* x, int64_t n) {
  return std::vector<double>(x, x + n);
}

struct DecodeCase {
  std::string name;
  AttentionMode mode;
  HeadOffsets offsets;
  bool xpos;
  int64_t prompt;  // 0: no prefill, every token a Step.
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

class DecodeMatchesRecomputeTest : public ::testing::TestWithParam<DecodeCase> {};

template <typename T>
void CheckDecodeMatchesRecompute(const DecodeCase& c, double tol) {
  const LongNetConfig config = DecodeConfig(c.mode, c.offsets, c.xpos);
  const int64_t total = 30, max_context = 40, v = config.vocab_size;
  std::unique_ptr<LongNetLM<T>> model = MakeModel<T>(config, 7);
  std::unique_ptr<LongNetLM<T>> reference = MakeModel<T>(config, 7);
  ASSERT_NE(model, nullptr);
  absl::StatusOr<std::unique_ptr<Decoder<T>>> decoder =
      Decoder<T>::Create(model.get(), max_context);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  absl::StatusOr<DecodeState<T>> state = (*decoder)->NewState();
  ASSERT_TRUE(state.ok()) << state.status();
  const std::vector<int32_t> tokens = RandomTokens(v, total, 11);
  std::vector<T> logits(static_cast<size_t>(v));
  int64_t t = 0;
  if (c.prompt > 0) {
    ASSERT_TRUE((*decoder)->Prefill(tokens.data(), c.prompt, &*state, logits.data()).ok());
    t = c.prompt;
    EXPECT_EQ(state->position(), c.prompt);
    EXPECT_TRUE(RelativelyNear("prefill logits", AsDouble(logits.data(), v),
                               FullLastLogits(*reference, tokens, t), tol));
  }
  for (; t < total; ++t) {
    DecodeState<T>* states[] = {&*state};
    ASSERT_TRUE((*decoder)
                    ->Step(absl::MakeSpan(states), &tokens[static_cast<size_t>(t)], logits.data())
                    .ok());
    EXPECT_EQ(state->position(), t + 1);
    EXPECT_TRUE(RelativelyNear("step logits at position " + std::to_string(t),
                               AsDouble(logits.data(), v),
                               FullLastLogits(*reference, tokens, t + 1), tol));
  }
}

TEST_P(DecodeMatchesRecomputeTest, Fp64) { CheckDecodeMatchesRecompute<double>(GetParam(), 1e-11); }
TEST_P(DecodeMatchesRecomputeTest, Fp32) { CheckDecodeMatchesRecompute<float>(GetParam(), 1e-5); }

INSTANTIATE_TEST_SUITE_P(
    Patterns, DecodeMatchesRecomputeTest,
    ::testing::Values(DecodeCase{"grouped_steps_only", AttentionMode::kGrouped,
                                 HeadOffsets::kModulo, false, 0},
                      DecodeCase{"grouped_prefill_mid_segment", AttentionMode::kGrouped,
                                 HeadOffsets::kModulo, true, 13},
                      DecodeCase{"mixture_modulo_prefill", AttentionMode::kMixture,
                                 HeadOffsets::kModulo, true, 9},
                      DecodeCase{"mixture_blocked_steps_only", AttentionMode::kMixture,
                                 HeadOffsets::kBlocked, false, 0},
                      DecodeCase{"mixture_blocked_prefill_at_boundary", AttentionMode::kMixture,
                                 HeadOffsets::kBlocked, true, 16}),
    [](const ::testing::TestParamInfo<DecodeCase>& info) { return info.param.name; });

// Three sequences at different positions (one prefilled, one fresh, one further on) in one Step
// give what each gives stepped alone.
TEST(DecoderTest, ABatchedStepEqualsEachSequenceStepped) {
  const LongNetConfig config = DecodeConfig(AttentionMode::kMixture, HeadOffsets::kModulo, true);
  const int64_t v = config.vocab_size;
  std::unique_ptr<LongNetLM<double>> model = MakeModel<double>(config, 3);
  absl::StatusOr<std::unique_ptr<Decoder<double>>> decoder =
      Decoder<double>::Create(model.get(), 64);
  ASSERT_TRUE(decoder.ok());
  const std::vector<int32_t> prompts[3] = {RandomTokens(v, 5, 1), {}, RandomTokens(v, 19, 2)};
  const std::vector<int32_t> feed = RandomTokens(v, 3 * 12, 3);
  std::vector<double> logits(static_cast<size_t>(3 * v)), one(static_cast<size_t>(v));
  std::vector<DecodeState<double>> batched, alone;
  for (int j = 0; j < 3; ++j) {
    for (auto* states : {&batched, &alone}) {
      absl::StatusOr<DecodeState<double>> s = (*decoder)->NewState();
      ASSERT_TRUE(s.ok());
      if (!prompts[j].empty()) {
        ASSERT_TRUE((*decoder)
                        ->Prefill(prompts[j].data(), static_cast<int64_t>(prompts[j].size()), &*s,
                                  one.data())
                        .ok());
      }
      states->push_back(*std::move(s));
    }
  }
  for (int step = 0; step < 12; ++step) {
    const int32_t* tokens = &feed[static_cast<size_t>(3 * step)];
    DecodeState<double>* all[] = {&batched[0], &batched[1], &batched[2]};
    ASSERT_TRUE((*decoder)->Step(absl::MakeSpan(all), tokens, logits.data()).ok());
    for (int j = 0; j < 3; ++j) {
      DecodeState<double>* single[] = {&alone[static_cast<size_t>(j)]};
      ASSERT_TRUE((*decoder)->Step(absl::MakeSpan(single), tokens + j, one.data()).ok());
      EXPECT_TRUE(RelativelyNear(
          "sequence " + std::to_string(j) + " step " + std::to_string(step),
          std::vector<double>(logits.begin() + j * v, logits.begin() + (j + 1) * v), one, 1e-12));
      EXPECT_EQ(batched[static_cast<size_t>(j)].position(),
                alone[static_cast<size_t>(j)].position());
    }
  }
}

// The base model's cache by the header's numbers: 27,308 rows a layer, the same at 100K and 1M
// tokens of context (only the segments' selected rows are kept), and far less at a context
// shorter than the segments.
TEST(KvCacheGeometryTest, TheBaseModelKeepsTheSelectedRowsOfEachSegment) {
  const LongNetConfig base;  // The defaults are LongNet's base shape.
  for (int64_t context : {int64_t{100000}, int64_t{1} << 20}) {
    absl::StatusOr<KvCacheGeometry> g = KvCacheGeometry::Make(base, context);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->rows_per_layer(), 3 * 2048 + 3 * 2048 + 2 * 2048 + 2 * 2731 + 2 * 2731);
    EXPECT_EQ(g->ElementsPerSequence(), 12 * 2 * 27308 * 64);
  }
  // At 1,000 positions of context every pattern keeps the selected rows of 1,000 positions.
  absl::StatusOr<KvCacheGeometry> short_context = KvCacheGeometry::Make(base, 1000);
  ASSERT_TRUE(short_context.ok());
  int64_t rows = 0;
  const int64_t rates[] = {1, 2, 4, 6, 12};
  const int64_t heads[] = {3, 3, 2, 2, 2};
  for (int i = 0; i < 5; ++i) {
    const int64_t o = i % rates[i];
    rows += heads[i] * ((1000 - o + rates[i] - 1) / rates[i]);
  }
  EXPECT_EQ(short_context->rows_per_layer(), rows);
}

// A slot's rows: the selected positions of the current segment, counted from its start.
TEST(KvCacheGeometryTest, RowsFollowTheSegmentsAndOffsets) {
  const LongNetConfig c = DecodeConfig(AttentionMode::kMixture, HeadOffsets::kModulo, false);
  absl::StatusOr<KvCacheGeometry> g = KvCacheGeometry::Make(c, 100);
  ASSERT_TRUE(g.ok());
  // Pattern 1 (w 8, r 3), head 2: offset 2 mod 3 = 2; selected 2, 5 of each segment of 8.
  const KvCacheGeometry::Slot* slot = nullptr;
  for (const KvCacheGeometry::Slot& s : g->slots()) {
    if (s.pattern == 1 && s.head == 2) slot = &s;
  }
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(slot->offset, 2);
  EXPECT_EQ(slot->capacity, 2);
  const int64_t expected[16] = {-1, -1, 0, -1, -1, 1, -1, -1, -1, -1, 0, -1, -1, 1, -1, -1};
  for (int64_t t = 0; t < 16; ++t) EXPECT_EQ(g->RowOf(*slot, t), expected[t]) << "t = " << t;
}

TEST(DecoderTest, BadCallsAreRefusedNamingTheValue) {
  const LongNetConfig config = DecodeConfig(AttentionMode::kGrouped, HeadOffsets::kModulo, false);
  std::unique_ptr<LongNetLM<double>> model = MakeModel<double>(config, 5);
  EXPECT_EQ(Decoder<double>::Create(model.get(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<Decoder<double>>> decoder =
      Decoder<double>::Create(model.get(), 6);
  absl::StatusOr<std::unique_ptr<Decoder<double>>> other = Decoder<double>::Create(model.get(), 6);
  ASSERT_TRUE(decoder.ok() && other.ok());
  std::vector<double> logits(static_cast<size_t>(2 * config.vocab_size));
  absl::StatusOr<DecodeState<double>> s = (*decoder)->NewState();
  absl::StatusOr<DecodeState<double>> foreign = (*other)->NewState();
  ASSERT_TRUE(s.ok() && foreign.ok());
  EXPECT_EQ(s->cache_bytes(), (*decoder)->geometry().ElementsPerSequence() * 8);

  const std::vector<int32_t> seven = {1, 2, 3, 4, 5, 6, 7};
  absl::Status st = (*decoder)->Prefill(seven.data(), 7, &*s, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(st.message().find("7 tokens pass the decoder's max_context of 6"), std::string::npos)
      << st;
  EXPECT_EQ((*decoder)->Prefill(seven.data(), 0, &*s, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {1, 11};
  st = (*decoder)->Prefill(bad.data(), 2, &*s, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("11"), std::string::npos) << st;
  EXPECT_EQ(s->position(), 0);
  EXPECT_EQ((*decoder)->Prefill(seven.data(), 3, &*foreign, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE((*decoder)->Prefill(seven.data(), 5, &*s, logits.data()).ok());
  EXPECT_EQ((*decoder)->Prefill(seven.data(), 1, &*s, logits.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  DecodeState<double>* twice[] = {&*s, &*s};
  st = (*decoder)->Step(absl::MakeSpan(twice), seven.data(), logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("passed twice"), std::string::npos) << st;
  DecodeState<double>* mixed[] = {&*s, &*foreign};
  EXPECT_EQ((*decoder)->Step(absl::MakeSpan(mixed), seven.data(), logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  DecodeState<double>* one[] = {&*s};
  const int32_t negative = -3;
  st = (*decoder)->Step(absl::MakeSpan(one), &negative, logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token -3"), std::string::npos) << st;
  EXPECT_EQ(s->position(), 5);
  ASSERT_TRUE((*decoder)->Step(absl::MakeSpan(one), seven.data(), logits.data()).ok());
  st = (*decoder)->Step(absl::MakeSpan(one), seven.data(), logits.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_EQ(s->position(), 6);
}

}  // namespace
}  // namespace model
}  // namespace dattn
