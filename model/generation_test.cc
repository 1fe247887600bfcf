// Sampling and the generation loop: greedy is the argmax of a full recompute at every step;
// seeded sampling reproduces itself and follows the softmax; top-k and top-p keep what they say;
// stop sequences end the result before their tokens and hold back a partial match; max_tokens,
// the context limit and cancellation end it; bad options are refused naming the field.
#include "model/generation.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/decoder.h"
#include "model/longnet.h"

namespace dattn {
namespace model {
namespace {

LongNetConfig SmallConfig() {
  LongNetConfig c;
  c.vocab_size = 9;
  c.d_model = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_dim = 12;
  c.segment_lengths = {4, 6};
  c.dilation_rates = {1, 2};
  c.rope_theta = 30;
  return c;
}

std::unique_ptr<LongNetLM<double>> MakeModel(uint64_t seed) {
  absl::StatusOr<std::unique_ptr<LongNetLM<double>>> model =
      LongNetLM<double>::CreateCpu(SmallConfig(), {}, /*num_threads=*/1);
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->InitParams(seed).ok());
  std::vector<double> p(static_cast<size_t>((*model)->layout().total()));
  EXPECT_TRUE((*model)->CopyParamsToHost(p.data()).ok());
  const std::vector<double> noise = testutil::RandomValues((*model)->layout().total(), seed, 0.5);
  for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
  EXPECT_TRUE((*model)->CopyParamsFromHost(p.data()).ok());
  return *std::move(model);
}

std::vector<int32_t> Tokens(const GenerateResult& r) {
  std::vector<int32_t> t;
  for (const GeneratedToken& g : r.tokens) t.push_back(g.token);
  return t;
}

struct Fixture {
  std::unique_ptr<LongNetLM<double>> model = MakeModel(4);
  std::unique_ptr<LongNetLM<double>> reference = MakeModel(4);
  std::unique_ptr<Decoder<double>> decoder;
  explicit Fixture(int64_t max_context = 64) {
    absl::StatusOr<std::unique_ptr<Decoder<double>>> d =
        Decoder<double>::Create(model.get(), max_context);
    EXPECT_TRUE(d.ok()) << d.status();
    decoder = *std::move(d);
  }
  absl::StatusOr<GenerateResult> Run(const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                     const TokenCallback& cb = nullptr) {
    return Generate(*decoder, prompt, o, cb);
  }
};

// Greedy decoding: every token is the argmax of a full forward pass over the prompt and the
// tokens before it, and its logprob that pass's log-softmax.
TEST(GenerateTest, GreedyIsTheArgmaxOfAFullRecomputeAtEveryStep) {
  Fixture f;
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 20;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  absl::StatusOr<GenerateResult> r = f.Run(prompt, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tokens.size(), 20u);
  EXPECT_EQ(r->finish, FinishReason::kLength);
  EXPECT_EQ(r->prompt_tokens, 5);
  EXPECT_EQ(r->steps, 19);
  std::vector<int32_t> seq = prompt;
  const int64_t v = SmallConfig().vocab_size;
  for (const GeneratedToken& g : r->tokens) {
    TokenBatch b;
    b.tokens = seq.data();
    b.batch = 1;
    b.seq_len = static_cast<int64_t>(seq.size());
    ASSERT_TRUE(f.reference->Forward(b).ok());
    std::vector<double> logits(seq.size() * static_cast<size_t>(v));
    ASSERT_TRUE(f.reference->CopyLogitsToHost(logits.data()).ok());
    const double* last = logits.data() + (seq.size() - 1) * static_cast<size_t>(v);
    int32_t best = 0;
    double sum = 0;
    for (int32_t i = 0; i < v; ++i) {
      if (last[i] > last[best]) best = i;
    }
    for (int32_t i = 0; i < v; ++i) sum += std::exp(last[i] - last[best]);
    EXPECT_EQ(g.token, best) << "after " << seq.size() << " tokens";
    EXPECT_NEAR(g.logprob, last[g.token] - last[best] - std::log(sum), 1e-10);
    seq.push_back(g.token);
  }
}

TEST(TokenSamplerTest, SeededSamplingRepeatsAndFollowsTheSoftmax) {
  const std::vector<double> logits = {0.0, 1.0, 2.0, -1.0, 0.5};
  SamplingOptions o;
  o.seed = 42;
  absl::StatusOr<TokenSampler> a = TokenSampler::Create(o, 5), b = TokenSampler::Create(o, 5);
  o.seed = 43;
  absl::StatusOr<TokenSampler> c = TokenSampler::Create(o, 5);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::map<int32_t, int> counts;
  int differ = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = *a->Next(logits.data(), nullptr);
    EXPECT_EQ(x, *b->Next(logits.data(), nullptr));
    differ += x != *c->Next(logits.data(), nullptr);
    ++counts[x];
  }
  EXPECT_GT(differ, n / 4);
  double z = 0;
  for (double l : logits) z += std::exp(l);
  for (int32_t t = 0; t < 5; ++t) {
    const double p = std::exp(logits[static_cast<size_t>(t)]) / z;
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(counts[t], n * p, 4 * sigma) << "token " << t;
  }
}

TEST(TokenSamplerTest, TopKTopPAndTemperatureKeepWhatTheySay) {
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 1.0f, 3.0f};
  auto draws = [&](SamplingOptions o) {
    std::map<int32_t, int> seen;
    absl::StatusOr<TokenSampler> s = TokenSampler::Create(o, 6);
    EXPECT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 3000; ++i) ++seen[*s->Next(logits.data(), nullptr)];
    return seen;
  };
  SamplingOptions o;
  o.temperature = 0;  // Greedy: the lowest id of the two maxima.
  EXPECT_EQ(draws(o), (std::map<int32_t, int>{{1, 3000}}));
  o.temperature = 1;
  o.top_k = 1;  // The most probable token, ties to the lower id.
  EXPECT_EQ(draws(o), (std::map<int32_t, int>{{1, 3000}}));
  o.top_k = 3;
  std::map<int32_t, int> top3 = draws(o);
  EXPECT_EQ(top3.size(), 3u);
  EXPECT_TRUE(top3.count(1) && top3.count(5) && top3.count(2));
  o.top_k = 0;
  o.top_p = 0.5;  // Tokens 1 and 5 hold 0.37 each of the distribution: two are needed.
  std::map<int32_t, int> nucleus = draws(o);
  EXPECT_EQ(nucleus.size(), 2u);
  EXPECT_TRUE(nucleus.count(1) && nucleus.count(5));
  o.top_p = 1;
  o.temperature = 0.05;  // Sharp: only the three near the top survive in practice.
  for (const auto& [token, count] : draws(o)) {
    EXPECT_TRUE(token == 1 || token == 5 || token == 2) << token << " drawn " << count;
  }
  double logprob = 0;
  absl::StatusOr<TokenSampler> s = TokenSampler::Create({}, 6);
  const int32_t t = *s->Next(logits.data(), &logprob);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(logprob, static_cast<double>(logits[static_cast<size_t>(t)]) - std::log(z), 1e-6);

  const std::vector<float> broken = {0.0f, NAN, 1.0f};
  absl::StatusOr<TokenSampler> b = TokenSampler::Create({}, 3);
  absl::StatusOr<int32_t> none = b->Next(broken.data(), nullptr);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(none.status().message().find("token 1"), std::string::npos) << none.status();
}

// A stop sequence found in greedy output: the result ends before it, and the callback saw
// exactly the result's tokens. A partial match that does not complete is handed out whole.
TEST(GenerateTest, StopSequencesEndTheResultBeforeTheirTokens) {
  Fixture f;
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 12;
  const std::vector<int32_t> prompt = {2, 7, 1};
  const std::vector<int32_t> free_run = Tokens(*f.Run(prompt, o));
  ASSERT_EQ(free_run.size(), 12u);

  o.stop_sequences = {{free_run[4], free_run[5], free_run[6]}};
  std::vector<int32_t> streamed;
  absl::StatusOr<GenerateResult> r = f.Run(prompt, o, [&](const GeneratedToken& g) {
    streamed.push_back(g.token);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  // The earliest place the stop sequence occurs in the free run ends the result.
  size_t at = 0;
  while (!(free_run[at] == free_run[4] && free_run[at + 1] == free_run[5] &&
           free_run[at + 2] == free_run[6])) {
    ++at;
  }
  EXPECT_EQ(r->finish, FinishReason::kStop);
  EXPECT_EQ(Tokens(*r), std::vector<int32_t>(free_run.begin(), free_run.begin() + at));
  EXPECT_EQ(streamed, Tokens(*r));

  // A stop sequence whose first token occurs but whose second never follows: nothing is lost.
  const int32_t never = (free_run[3] + 1) % 9;
  bool follows = false;
  for (size_t i = 0; i + 1 < free_run.size(); ++i) {
    follows |= free_run[i] == free_run[3] && free_run[i + 1] == never;
  }
  if (!follows) {
    o.stop_sequences = {{free_run[3], never, never}};
    streamed.clear();
    r = f.Run(prompt, o, [&](const GeneratedToken& g) {
      streamed.push_back(g.token);
      return true;
    });
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->finish, FinishReason::kLength);
    EXPECT_EQ(Tokens(*r), free_run);
    EXPECT_EQ(streamed, free_run);
  }
}

TEST(GenerateTest, ContextLimitCancellationAndZeroTokens) {
  Fixture f(/*max_context=*/8);
  GenerateOptions o;
  o.sampling.seed = 9;
  o.max_tokens = 100;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  absl::StatusOr<GenerateResult> r = f.Run(prompt, o);
  ASSERT_TRUE(r.ok()) << r.status();
  // Positions 5, 6, 7 are fed back; the token after position 7 is the last one.
  EXPECT_EQ(r->finish, FinishReason::kContext);
  EXPECT_EQ(r->tokens.size(), 4u);
  EXPECT_EQ(r->steps, 3);

  int calls = 0;
  r = f.Run(prompt, o, [&](const GeneratedToken&) { return ++calls < 2; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish, FinishReason::kCancelled);
  EXPECT_EQ(r->tokens.size(), 2u);

  o.max_tokens = 0;
  r = f.Run(prompt, o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->tokens.empty());
  EXPECT_EQ(r->finish, FinishReason::kLength);
}

TEST(GenerateTest, BadRequestsAreRefusedNamingTheValue) {
  Fixture f(/*max_context=*/8);
  auto code_and = [&](const std::vector<int32_t>& prompt, const GenerateOptions& o,
                      absl::StatusCode code, const std::string& text) {
    absl::StatusOr<GenerateResult> r = f.Run(prompt, o);
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status();
  };
  GenerateOptions o;
  code_and({}, o, absl::StatusCode::kInvalidArgument, "prompt has 0 tokens");
  code_and({1, 9}, o, absl::StatusCode::kInvalidArgument, "9");
  code_and(std::vector<int32_t>(9, 1), o, absl::StatusCode::kOutOfRange, "max_context of 8");
  o.sampling.temperature = -1;
  code_and({1}, o, absl::StatusCode::kInvalidArgument, "temperature -1");
  o.sampling.temperature = 1;
  o.sampling.top_p = 0;
  code_and({1}, o, absl::StatusCode::kInvalidArgument, "top_p 0");
  o.sampling.top_p = 1;
  o.sampling.top_k = -2;
  code_and({1}, o, absl::StatusCode::kInvalidArgument, "top_k -2");
  o.sampling.top_k = 0;
  o.max_tokens = -1;
  code_and({1}, o, absl::StatusCode::kInvalidArgument, "max_tokens -1");
  o.max_tokens = 4;
  o.stop_sequences = {{1}, {}};
  code_and({1}, o, absl::StatusCode::kInvalidArgument, "stop sequence 1 is empty");
  o.stop_sequences = {{1, 12}};
  code_and({1}, o, absl::StatusCode::kInvalidArgument, "stop sequence 0 token 1: 12");
}

}  // namespace
}  // namespace model
}  // namespace dattn
