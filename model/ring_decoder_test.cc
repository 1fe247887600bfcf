// Incremental decoding on a ring of S ranks (decoder.h, "A ring of S ranks"): Gloo ranks as
// threads, each with the whole model, its attention the ring over the rank's communicator. At 1, 2
// and 4 ranks the logits of the prefill and of every step equal a full recompute of the same prefix
// on one device (fp64 to 1e-11, fp32 to 1e-5 relative) and are the same bits on every rank;
// prompts shorter than the ring, ending mid-segment and at a boundary; several sequences at
// different positions in one step; the ranks' caches add up to the single device's (each about
// 1/S of it); errors before anything is communicated. Then a ring led by rank 0 (as a deployment
// runs one): a BatchGenerator on rank 0 gives each request one device's tokens and Score one
// device's log-probabilities; followers drop ended sequences' states and wait as long as the
// leader keeps them alive, no longer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/batch_generator.h"
#include "model/cpu_layer_ops.h"
#include "model/decoder.h"
#include "model/longnet.h"
#include "model/ring_sequence_attention.h"
#include "model/testing/decode_fixtures.h"
#include "model/testing/gloo_ranks.h"

namespace dattn {
namespace model {
namespace {

using testing::DecodeConfig;
using testing::PerturbedParams;
using testing::RandomTokens;
using testing::RunRanks;
using testutil::RelativelyNear;

constexpr int64_t kMaxContext = 40;  // A multiple of 1, 2 and 4 ranks.
constexpr int64_t kTotal = 30;       // Tokens each sequence reaches.

// A ring rank's model: the layers on the CPU, attention the ring over `ring`.
template <typename T>
absl::StatusOr<std::unique_ptr<LongNetLM<T>>> RingModel(const LongNetConfig& config,
                                                        comm::Communicator* ring) {
  ModelOptions options;
  options.poison_scratch = true;  // The prefill reads nothing it did not write.
  CpuLayerOpsOptions ops;
  ops.num_threads = 1;
  absl::StatusOr<std::unique_ptr<LongNetLM<T>>> model = LongNetLM<T>::Create(
      config, options, NewCpuLayerOps<T>(ops), NewCpuRingSequenceAttention(ring, 1));
  if (!model.ok()) return model.status();
  if (absl::Status s = PerturbedParams(**model, 7); !s.ok()) return s;
  return model;
}

// The last position's logits of one device's full forward pass over tokens[0, n), for every n in
// [1, kTotal]: reference[n - 1].
template <typename T>
std::vector<std::vector<double>> ReferenceLogits(const LongNetConfig& config,
                                                 const std::vector<int32_t>& tokens) {
  absl::StatusOr<std::unique_ptr<LongNetLM<T>>> model =
      LongNetLM<T>::CreateCpu(config, ModelOptions{}, 1);
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(PerturbedParams(**model, 7).ok());
  std::vector<std::vector<double>> out;
  const int64_t v = config.vocab_size;
  for (int64_t n = 1; n <= kTotal; ++n) {
    TokenBatch b;
    b.tokens = tokens.data();
    b.batch = 1;
    b.seq_len = n;
    EXPECT_TRUE((*model)->Forward(b).ok());
    std::vector<T> all(static_cast<size_t>(n * v));
    EXPECT_TRUE((*model)->CopyLogitsToHost(all.data()).ok());
    out.emplace_back(all.end() - v, all.end());
  }
  return out;
}

struct RingCase {
  std::string name;
  AttentionMode mode;
  HeadOffsets offsets;
  bool xpos;
  int64_t prompt;  // Tokens of the prefill (0: every token a Step).
  int ranks;
};

void PrintTo(const RingCase& c, std::ostream* os) { *os << c.name; }

class RingDecodeMatchesRecomputeTest : public ::testing::TestWithParam<RingCase> {};

// Every rank prefills, then steps to kTotal; each rank's logits of each position are kept, and
// compared with the reference and with rank 0's after the ranks have returned.
template <typename T>
void CheckRingDecode(const RingCase& c, double tol) {
  const LongNetConfig config = DecodeConfig(c.mode, c.offsets, c.xpos);
  const int64_t v = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(v, kTotal, 11);
  const std::vector<std::vector<double>> reference = ReferenceLogits<T>(config, tokens);
  // logits[rank][n - 1]: the rank's logits after n tokens; cache[rank]: its cache's bytes.
  std::vector<std::vector<std::vector<T>>> logits(static_cast<size_t>(c.ranks));
  std::vector<int64_t> cache(static_cast<size_t>(c.ranks));
  const std::vector<absl::Status> results = RunRanks(
      c.ranks, c.ranks == 1 ? 1 : c.ranks,
      [&](int rank, comm::Communicator& world, comm::Communicator* sp) -> absl::Status {
        comm::Communicator* ring = sp != nullptr ? sp : &world;
        absl::StatusOr<std::unique_ptr<LongNetLM<T>>> model = RingModel<T>(config, ring);
        if (!model.ok()) return model.status();
        absl::StatusOr<std::unique_ptr<Decoder<T>>> decoder =
            Decoder<T>::Create(model->get(), kMaxContext, ring);
        if (!decoder.ok()) return decoder.status();
        absl::StatusOr<DecodeState<T>> state = (*decoder)->NewState();
        if (!state.ok()) return state.status();
        cache[static_cast<size_t>(rank)] = state->cache_bytes();
        std::vector<std::vector<T>>& mine = logits[static_cast<size_t>(rank)];
        std::vector<T> out(static_cast<size_t>(v));
        int64_t t = 0;
        if (c.prompt > 0) {
          absl::Status s = (*decoder)->Prefill(tokens.data(), c.prompt, &*state, out.data());
          if (!s.ok()) return s;
          t = c.prompt;
          mine.resize(static_cast<size_t>(t));
          mine.back() = out;
        }
        for (; t < kTotal; ++t) {
          DecodeState<T>* states[] = {&*state};
          absl::Status s =
              (*decoder)->Step(absl::MakeSpan(states), &tokens[static_cast<size_t>(t)], out.data());
          if (!s.ok()) return s;
          mine.resize(static_cast<size_t>(t + 1));
          mine.back() = out;
        }
        return ring->health();
      });
  for (int r = 0; r < c.ranks; ++r) {
    ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)];
  }
  for (int64_t n = std::max<int64_t>(c.prompt, 1); n <= kTotal; ++n) {
    const std::vector<T>& first = logits[0][static_cast<size_t>(n - 1)];
    EXPECT_TRUE(RelativelyNear(absl::StrCat("logits after ", n, " tokens"),
                               std::vector<double>(first.begin(), first.end()),
                               reference[static_cast<size_t>(n - 1)], tol));
    for (int r = 1; r < c.ranks; ++r) {
      const std::vector<T>& other = logits[static_cast<size_t>(r)][static_cast<size_t>(n - 1)];
      EXPECT_EQ(0, std::memcmp(first.data(), other.data(), first.size() * sizeof(T)))
          << "rank " << r << "'s logits after " << n << " tokens differ from rank 0's";
    }
  }
  // The ranks hold the single device's cache between them, each about 1/S of it.
  absl::StatusOr<KvCacheGeometry> whole = KvCacheGeometry::Make(config, kMaxContext);
  ASSERT_TRUE(whole.ok());
  const int64_t whole_bytes = whole->ElementsPerSequence() * static_cast<int64_t>(sizeof(T));
  int64_t sum = 0;
  for (int64_t b : cache) {
    sum += b;
    // At most one row a slot more than an even share.
    EXPECT_LE(b, whole_bytes / c.ranks + config.num_layers * 2 *
                                             static_cast<int64_t>(whole->slots().size()) *
                                             config.head_dim() * static_cast<int64_t>(sizeof(T)));
  }
  EXPECT_EQ(sum, whole_bytes);
}

TEST_P(RingDecodeMatchesRecomputeTest, Fp64) { CheckRingDecode<double>(GetParam(), 1e-11); }
TEST_P(RingDecodeMatchesRecomputeTest, Fp32) { CheckRingDecode<float>(GetParam(), 1e-5); }

std::vector<RingCase> RingCases() {
  std::vector<RingCase> cases;
  for (int ranks : {1, 2, 4}) {
    const std::string s = absl::StrCat("_", ranks, "_ranks");
    cases.push_back({"mixture_prefill_mid_segment" + s, AttentionMode::kMixture,
                     HeadOffsets::kModulo, true, 13, ranks});
    cases.push_back({"grouped_prefill_at_boundary" + s, AttentionMode::kGrouped,
                     HeadOffsets::kModulo, false, 16, ranks});
    // One token: on 2 and 4 ranks every rank but the first computes only padding.
    cases.push_back({"mixture_blocked_prompt_of_one" + s, AttentionMode::kMixture,
                     HeadOffsets::kBlocked, true, 1, ranks});
    cases.push_back(
        {"mixture_steps_only" + s, AttentionMode::kMixture, HeadOffsets::kModulo, false, 0, ranks});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Rings, RingDecodeMatchesRecomputeTest, ::testing::ValuesIn(RingCases()),
                         [](const ::testing::TestParamInfo<RingCase>& info) {
                           return info.param.name;
                         });

// Three sequences at different positions (one prefilled, one fresh, one further on) in one Step of
// a 4-rank ring give what one device's decoder gives each stepped alone.
TEST(RingDecoderTest, ABatchedStepOnARingEqualsOneDevice) {
  const LongNetConfig config = DecodeConfig(AttentionMode::kMixture, HeadOffsets::kModulo, true);
  const int64_t v = config.vocab_size;
  const std::vector<int32_t> a = RandomTokens(v, 20, 1), b = RandomTokens(v, 20, 2),
                             c = RandomTokens(v, 20, 3);
  // One device: a prefilled with 11 tokens, b fresh, c prefilled with 5 then stepped 4 times;
  // then one step of each with its next token.
  auto run = [&](comm::Communicator* ring, LongNetLM<double>& model,
                 std::vector<double>* out) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Decoder<double>>> decoder =
        Decoder<double>::Create(&model, kMaxContext, ring);
    if (!decoder.ok()) return decoder.status();
    std::vector<DecodeState<double>> states;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<DecodeState<double>> s = (*decoder)->NewState();
      if (!s.ok()) return s.status();
      states.push_back(*std::move(s));
    }
    std::vector<double> logits(static_cast<size_t>(3 * v));
    if (absl::Status s = (*decoder)->Prefill(a.data(), 11, &states[0], logits.data()); !s.ok()) {
      return s;
    }
    if (absl::Status s = (*decoder)->Prefill(c.data(), 5, &states[2], logits.data()); !s.ok()) {
      return s;
    }
    for (int64_t t = 5; t < 9; ++t) {
      DecodeState<double>* one[] = {&states[2]};
      absl::Status s =
          (*decoder)->Step(absl::MakeSpan(one), &c[static_cast<size_t>(t)], logits.data());
      if (!s.ok()) return s;
    }
    DecodeState<double>* all[] = {&states[0], &states[1], &states[2]};
    const int32_t next[] = {a[11], b[0], c[9]};
    if (absl::Status s = (*decoder)->Step(absl::MakeSpan(all), next, logits.data()); !s.ok()) {
      return s;
    }
    *out = logits;
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<LongNetLM<double>>> single =
      LongNetLM<double>::CreateCpu(config, ModelOptions{}, 1);
  ASSERT_TRUE(single.ok());
  ASSERT_TRUE(PerturbedParams(**single, 7).ok());
  std::vector<double> expected;
  ASSERT_TRUE(run(nullptr, **single, &expected).ok());
  std::vector<std::vector<double>> got(4);
  const std::vector<absl::Status> results =
      RunRanks(4, 4, [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
        absl::StatusOr<std::unique_ptr<LongNetLM<double>>> model = RingModel<double>(config, sp);
        if (!model.ok()) return model.status();
        return run(sp, **model, &got[static_cast<size_t>(rank)]);
      });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(results[static_cast<size_t>(r)].ok()) << results[static_cast<size_t>(r)];
    EXPECT_TRUE(RelativelyNear(absl::StrCat("rank ", r, "'s batched step"),
                               got[static_cast<size_t>(r)], expected, 1e-11));
  }
}

// Refused on every rank before anything is communicated (no rank is left waiting): a max_context
// the ring does not divide, a token outside the vocabulary anywhere in the prompt (each rank checks
// the whole prompt, not only its shard).
TEST(RingDecoderTest, BadRingsAndPromptsAreRefusedOnEveryRank) {
  const LongNetConfig config = DecodeConfig(AttentionMode::kGrouped, HeadOffsets::kModulo, false);
  const std::vector<absl::Status> results =
      RunRanks(4, 4, [&](int, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
        std::vector<int32_t> prompt = RandomTokens(config.vocab_size, 12, 5);
        prompt[10] = 11;  // On rank 3's shard of 4; vocab_size is 11.
        absl::StatusOr<std::unique_ptr<LongNetLM<float>>> model = RingModel<float>(config, sp);
        if (!model.ok()) return model.status();
        absl::StatusOr<std::unique_ptr<Decoder<float>>> odd =
            Decoder<float>::Create(model->get(), 42, sp);
        if (odd.status().code() != absl::StatusCode::kInvalidArgument ||
            odd.status().message().find(
                "max_context 42 must be a multiple of the ring's 4 ranks") == std::string::npos) {
          return absl::InternalError(absl::StrCat("max_context 42: ", odd.status().ToString()));
        }
        absl::StatusOr<std::unique_ptr<Decoder<float>>> decoder =
            Decoder<float>::Create(model->get(), kMaxContext, sp);
        if (!decoder.ok()) return decoder.status();
        absl::StatusOr<DecodeState<float>> state = (*decoder)->NewState();
        if (!state.ok()) return state.status();
        std::vector<float> logits(static_cast<size_t>(config.vocab_size));
        absl::Status s = (*decoder)->Prefill(prompt.data(), 12, &*state, logits.data());
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            s.message().find("token 11 at position 10 is outside [0, 11)") == std::string::npos) {
          return absl::InternalError(absl::StrCat("bad token: ", s.ToString()));
        }
        if (state->position() != 0) return absl::InternalError("the state moved");
        // The ring is still whole: a good prompt runs.
        prompt[10] = 3;
        if (absl::Status ok = (*decoder)->Prefill(prompt.data(), 12, &*state, logits.data());
            !ok.ok()) {
          return ok;
        }
        return sp->health();
      });
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)];
  }
}

// A ring driven by rank 0 alone, as a deployment is: rank 0 leads (its BatchGenerator decides what
// runs and samples), ranks 1.. follow. Each request gets the tokens one device's generator gives it
// (fp64: the logits agree to 1e-11, so every sampled token is the same), Score gives one device's
// log-probabilities, the followers drop the states of ended sequences, and Release ends them.
struct Generated {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kLength;
  bool done = false;
};

// Three requests at once (greedy, sampled with top-k, a stop sequence) and a Score, on `decoder`.
absl::Status Serve(Decoder<double>& decoder, int64_t vocab, std::vector<Generated>* out,
                   std::vector<double>* logprobs) {
  absl::StatusOr<std::unique_ptr<BatchGenerator<double>>> generator =
      BatchGenerator<double>::Create(&decoder, 2);  // The third waits for a free sequence.
  if (!generator.ok()) return generator.status();
  out->assign(3, Generated{});
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = RandomTokens(vocab, 5 + 6 * i, 20 + static_cast<uint64_t>(i));
    r.options.max_tokens = 12 - i;
    r.options.sampling.temperature = i == 0 ? 0.0 : 0.9;
    r.options.sampling.top_k = i == 2 ? 4 : 0;
    r.options.sampling.seed = 100 + static_cast<uint64_t>(i);
    if (i == 1) r.options.stop_sequences = {{3}};
    Generated* g = &(*out)[static_cast<size_t>(i)];
    r.on_done = [g](absl::StatusOr<GenerateResult> result) {
      g->done = true;
      if (!result.ok()) return;
      for (const GeneratedToken& t : result->tokens) g->tokens.push_back(t.token);
      g->finish = result->finish;
    };
    absl::StatusOr<int64_t> id = (*generator)->Submit(std::move(r));
    if (!id.ok()) return id.status();
  }
  while ((*generator)->running() > 0 || (*generator)->queued() > 0) {
    absl::StatusOr<TickStats> tick = (*generator)->Tick(absl::Now());
    if (!tick.ok()) return tick.status();
  }
  const std::vector<int32_t> text = RandomTokens(vocab, 23, 9);
  logprobs->resize(text.size() - 1);
  return decoder.Score(text.data(), static_cast<int64_t>(text.size()), logprobs->data());
}

TEST(RingDecoderTest, ALedRingServesAsOneDevice) {
  const LongNetConfig config = DecodeConfig(AttentionMode::kMixture, HeadOffsets::kModulo, true);
  const int64_t v = config.vocab_size;
  absl::StatusOr<std::unique_ptr<LongNetLM<double>>> single =
      LongNetLM<double>::CreateCpu(config, ModelOptions{}, 1);
  ASSERT_TRUE(single.ok());
  ASSERT_TRUE(PerturbedParams(**single, 7).ok());
  absl::StatusOr<std::unique_ptr<Decoder<double>>> one = Decoder<double>::Create(single->get(), 40);
  ASSERT_TRUE(one.ok());
  std::vector<Generated> expected;
  std::vector<double> expected_logprobs;
  ASSERT_TRUE(Serve(**one, v, &expected, &expected_logprobs).ok());
  // Score is the plain forward pass's log-softmax.
  {
    const std::vector<int32_t> text = RandomTokens(v, 23, 9);
    TokenBatch b;
    b.tokens = text.data();
    b.batch = 1;
    b.seq_len = 23;
    ASSERT_TRUE((*single)->Forward(b).ok());
    std::vector<double> logits(static_cast<size_t>(23 * v));
    ASSERT_TRUE((*single)->CopyLogitsToHost(logits.data()).ok());
    for (int64_t i = 0; i + 1 < 23; ++i) {
      double z = 0;
      for (int64_t k = 0; k < v; ++k) z += std::exp(logits[static_cast<size_t>(i * v + k)]);
      EXPECT_NEAR(
          expected_logprobs[static_cast<size_t>(i)],
          logits[static_cast<size_t>(i * v + text[static_cast<size_t>(i + 1)])] - std::log(z),
          1e-12);
    }
  }
  for (int ranks : {2, 4}) {
    std::vector<Generated> got;
    std::vector<double> logprobs;
    std::vector<int64_t> held(static_cast<size_t>(ranks), -1);
    const std::vector<absl::Status> results = RunRanks(
        ranks, ranks,
        [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
          absl::StatusOr<std::unique_ptr<LongNetLM<double>>> model = RingModel<double>(config, sp);
          if (!model.ok()) return model.status();
          absl::StatusOr<std::unique_ptr<Decoder<double>>> decoder =
              Decoder<double>::Create(model->get(), kMaxContext, sp);
          if (!decoder.ok()) return decoder.status();
          if (rank != 0) {
            absl::Status s = (*decoder)->Follow();
            held[static_cast<size_t>(rank)] = (*decoder)->follower_states();
            return s;
          }
          if (absl::Status s = (*decoder)->Lead(); !s.ok()) return s;
          if (absl::Status s = Serve(**decoder, v, &got, &logprobs); !s.ok()) return s;
          return (*decoder)->Release();
        },
        absl::Seconds(60), absl::StrCat("led", ranks));
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
          << ranks << " ranks, rank " << r << ": " << results[static_cast<size_t>(r)];
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(got[i].done);
      EXPECT_EQ(got[i].tokens, expected[i].tokens) << ranks << " ranks, request " << i;
      EXPECT_EQ(got[i].finish, expected[i].finish) << ranks << " ranks, request " << i;
    }
    EXPECT_TRUE(
        RelativelyNear(absl::StrCat(ranks, " ranks' Score"), logprobs, expected_logprobs, 1e-11));
    // Every sequence ended, so the followers dropped every state.
    for (int r = 1; r < ranks; ++r) EXPECT_EQ(held[static_cast<size_t>(r)], 0) << "rank " << r;
  }
  // The three requests differ, and the sampled ones are not the greedy tokens of the same
  // prompt: the comparison above is of real choices.
  EXPECT_NE(expected[0].tokens, expected[1].tokens);
  EXPECT_EQ(expected[1].finish, FinishReason::kStop);
}

// A follower waits for the next call at most the communicator's timeout (1 s here): a leader that
// has nothing to do keeps it with KeepAlive, and a leader that stops calling leaves it
// DEADLINE_EXCEEDED, not waiting for ever. Misuse is named.
TEST(RingDecoderTest, FollowersWaitAsLongAsTheLeaderKeepsThemAndNoLonger) {
  const LongNetConfig config = DecodeConfig(AttentionMode::kGrouped, HeadOffsets::kModulo, false);
  const std::vector<absl::Status> results = RunRanks(
      2, 2,
      [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
        absl::StatusOr<std::unique_ptr<LongNetLM<float>>> model = RingModel<float>(config, sp);
        if (!model.ok()) return model.status();
        absl::StatusOr<std::unique_ptr<Decoder<float>>> decoder =
            Decoder<float>::Create(model->get(), kMaxContext, sp);
        if (!decoder.ok()) return decoder.status();
        if (rank == 1) {
          absl::Status lead = (*decoder)->Lead();
          if (lead.code() != absl::StatusCode::kFailedPrecondition) {
            return absl::InternalError(absl::StrCat("Lead on rank 1: ", lead.ToString()));
          }
          absl::Status s = (*decoder)->Follow();
          if (s.code() != absl::StatusCode::kDeadlineExceeded) {
            return absl::InternalError(absl::StrCat("follower: ", s.ToString()));
          }
          return absl::OkStatus();
        }
        absl::Status follow = (*decoder)->Follow();
        if (follow.code() != absl::StatusCode::kFailedPrecondition) {
          return absl::InternalError(absl::StrCat("Follow on rank 0: ", follow.ToString()));
        }
        if (absl::Status s = (*decoder)->Lead(); !s.ok()) return s;
        // 2.5 s idle (2.5 timeouts), kept alive every 200 ms; then a prefill still runs.
        const absl::Time until = absl::Now() + absl::Milliseconds(2500);
        while (absl::Now() < until) {
          if (absl::Status s = (*decoder)->KeepAlive(absl::Milliseconds(200)); !s.ok()) return s;
          absl::SleepFor(absl::Milliseconds(20));
        }
        absl::StatusOr<DecodeState<float>> state = (*decoder)->NewState();
        if (!state.ok()) return state.status();
        const std::vector<int32_t> prompt = RandomTokens(config.vocab_size, 7, 3);
        std::vector<float> logits(static_cast<size_t>(config.vocab_size));
        if (absl::Status s = (*decoder)->Prefill(prompt.data(), 7, &*state, logits.data());
            !s.ok()) {
          return s;
        }
        // Then silence: the follower gives up after its timeout (its status is checked above);
        // this rank only waits long enough for that.
        absl::SleepFor(absl::Milliseconds(2500));
        return absl::OkStatus();
      },
      absl::Seconds(1), "keepalive");
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)];
  }
}

}  // namespace
}  // namespace model
}  // namespace dattn
