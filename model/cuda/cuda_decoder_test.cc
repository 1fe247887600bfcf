// The GPU decoder (cuda_decoder.h) against the CPU decoder (model/decoder.h, fp32, itself checked
// against full recomputes to 1e-5) on the same weights and tokens: the logits of the prefill and
// of every step, and Score's log-probabilities, within bf16 tolerance; grouped and mixture modes,
// RoPE and XPOS, head dims 64 and 128, many segment boundaries, a slot of more rows than one
// attention chunk; sequences at different positions batched into one step; Clone; the cache's
// bytes by its formula; the errors.
//
// Tolerances: the GPU computes activations in bf16 (2^-9 relative per rounding) with fp32
// accumulation, as CudaLongNetLM does (cuda_longnet_test: logits within 3e-2 relative of the CPU
// fp32 model); each position's logits here within 3e-2 relative (Frobenius), log-probabilities
// within 6e-2 absolute (a logit of magnitude 8 is rounded to 2^-6 = 0.016 in bf16; measured up to
// 0.034 on an H200). Each case prints its largest error ("[ parity ]" lines). On a ring of 2 GPUs
// (when the machine has them) the same against the CPU decoder on one device, and the same bits
// on both ranks.
//
// Without a GPU every test skips, saying why.
#include "model/cuda/cuda_decoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cuda_status.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/cuda/cuda_sequence_attention.h"
#include "model/cuda/cuda_serving_model.h"
#include "model/cuda/gpu_test_util.h"
#include "model/cuda/nccl_ranks.h"
#include "model/cuda/serving_plan.h"
#include "model/decoder.h"
#include "model/longnet.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

// D = 64, grouped with 3 heads over 2 patterns (H % G != 0), RoPE, tied head; segments of 32
// and 128 positions, so that a decode of a few hundred tokens crosses many boundaries.
LongNetConfig GroupedConfig() {
  LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 192;
  c.num_layers = 2;
  c.num_heads = 3;
  c.ffn_dim = 256;
  c.segment_lengths = {32, 128};
  c.dilation_rates = {1, 4};
  return c;
}

// D = 128, mixture mode with blocked offsets, XPOS, untied head, an odd vocabulary; the long
// pattern's slot holds 512 rows (two attention chunks of 256).
LongNetConfig MixtureConfig() {
  LongNetConfig c;
  c.vocab_size = 77;
  c.d_model = 256;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_dim = 200;
  c.tie_embeddings = false;
  c.attention_mode = AttentionMode::kMixture;
  c.head_offsets = HeadOffsets::kBlocked;
  c.segment_lengths = {32, 1024};
  c.dilation_rates = {1, 2};
  c.xpos = true;
  c.xpos_scale_base = 256;
  return c;
}

std::vector<int32_t> RandomTokens(int64_t vocab, int64_t n, uint64_t seed) {
  testutil::Random rng(seed);
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng.Next() % vocab));
  return t;
}

// MAGNETO's initialisation with every parameter nudged (N(0, 0.02)), so that biases and norm
// shifts are not 0: the same host values for both models.
std::vector<float> Params(const LongNetConfig& config, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> cpu =
      LongNetLM<float>::CreateCpu(config, ModelOptions{}, 1);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return {};
  EXPECT_TRUE((*cpu)->InitParams(seed).ok());
  std::vector<float> host(static_cast<size_t>((*cpu)->layout().total()));
  EXPECT_TRUE((*cpu)->CopyParamsToHost(host.data()).ok());
  const std::vector<double> noise = testutil::RandomValues((*cpu)->layout().total(), seed, 0.02);
  for (size_t i = 0; i < host.size(); ++i) host[i] += static_cast<float>(noise[i]);
  return host;
}

struct Models {
  std::unique_ptr<LongNetLM<float>> cpu;
  std::unique_ptr<Decoder<float>> cpu_decoder;
  std::unique_ptr<CudaLongNetLM> gpu;
  std::unique_ptr<CudaDecoder> gpu_decoder;
};

Models Make(const LongNetConfig& config, int64_t max_context, bool checkpoint) {
  Models m;
  const std::vector<float> params = Params(config, 11);
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> cpu =
      LongNetLM<float>::CreateCpu(config, ModelOptions{}, 0);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return m;
  m.cpu = *std::move(cpu);
  EXPECT_TRUE(m.cpu->CopyParamsFromHost(params.data()).ok());
  absl::StatusOr<std::unique_ptr<Decoder<float>>> cd =
      Decoder<float>::Create(m.cpu.get(), max_context);
  EXPECT_TRUE(cd.ok()) << cd.status();
  if (!cd.ok()) return m;
  m.cpu_decoder = *std::move(cd);
  ModelOptions options;
  options.checkpoint_activations = checkpoint;
  options.poison_scratch = true;  // The prefill reads nothing it did not write.
  absl::StatusOr<std::unique_ptr<CudaLongNetLM>> gpu = CudaLongNetLM::Create(config, options);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (!gpu.ok()) return m;
  m.gpu = *std::move(gpu);
  EXPECT_TRUE(m.gpu->CopyParamsFromHost(params.data()).ok());
  absl::StatusOr<std::unique_ptr<CudaDecoder>> gd = CudaDecoder::Create(m.gpu.get(), max_context);
  EXPECT_TRUE(gd.ok()) << gd.status();
  if (!gd.ok()) return m;
  m.gpu_decoder = *std::move(gd);
  return m;
}

double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Case {
  std::string name;
  LongNetConfig config;
  int64_t max_context, prompt, steps;
  bool checkpoint;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CudaDecoderParityTest : public ::testing::TestWithParam<Case> {};

// Prefill, then `steps` tokens one at a time: every position's logits against the CPU decoder's.
TEST_P(CudaDecoderParityTest, StepsMatchTheCpuDecoder) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  Models m = Make(c.config, c.max_context, c.checkpoint);
  ASSERT_NE(m.gpu_decoder, nullptr);
  const int64_t v = c.config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(v, c.prompt + c.steps, 5);
  absl::StatusOr<DecodeState<float>> cs = m.cpu_decoder->NewState();
  absl::StatusOr<CudaDecodeState> gs = m.gpu_decoder->NewState();
  ASSERT_TRUE(cs.ok() && gs.ok());
  // ElementsPerSequence counts K and V, 2 bytes each in bf16.
  EXPECT_EQ(gs->cache_bytes(), 2 * m.gpu_decoder->geometry().ElementsPerSequence());
  std::vector<float> want(static_cast<size_t>(v)), got(static_cast<size_t>(v));
  ASSERT_TRUE(m.cpu_decoder->Prefill(tokens.data(), c.prompt, &*cs, want.data()).ok());
  absl::Status s = m.gpu_decoder->Prefill(tokens.data(), c.prompt, &*gs, got.data());
  ASSERT_TRUE(s.ok()) << s;
  double worst = RelError(got, want);
  EXPECT_LE(worst, 3e-2) << "prefill of " << c.prompt;
  for (int64_t t = c.prompt; t < c.prompt + c.steps; ++t) {
    DecodeState<float>* cp = &*cs;
    CudaDecodeState* gp = &*gs;
    ASSERT_TRUE(m.cpu_decoder->Step(absl::MakeSpan(&cp, 1), &tokens[t], want.data()).ok());
    s = m.gpu_decoder->Step(absl::MakeSpan(&gp, 1), &tokens[t], got.data());
    ASSERT_TRUE(s.ok()) << s;
    const double e = RelError(got, want);
    EXPECT_LE(e, 3e-2) << "step at position " << t;
    worst = std::max(worst, e);
  }
  EXPECT_EQ(gs->position(), c.prompt + c.steps);
  std::cout << "[ parity ] " << c.name << ": prefill " << c.prompt << " + " << c.steps
            << " steps, largest relative logit error " << worst << "\n";
}

TEST_P(CudaDecoderParityTest, ScoreMatchesTheCpuDecoder) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  Models m = Make(c.config, c.max_context, c.checkpoint);
  ASSERT_NE(m.gpu_decoder, nullptr);
  const int64_t n = c.prompt + c.steps;
  const std::vector<int32_t> tokens = RandomTokens(c.config.vocab_size, n, 9);
  std::vector<double> want(static_cast<size_t>(n - 1)), got(static_cast<size_t>(n - 1));
  ASSERT_TRUE(m.cpu_decoder->Score(tokens.data(), n, want.data()).ok());
  absl::Status s = m.gpu_decoder->Score(tokens.data(), n, got.data());
  ASSERT_TRUE(s.ok()) << s;
  double worst = 0;
  for (int64_t i = 0; i + 1 < n; ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LE(worst, 6e-2);
  std::cout << "[ parity ] " << c.name << ": Score of " << n
            << " tokens, largest log-probability error " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CudaDecoderParityTest,
    ::testing::Values(Case{"grouped_d64_rope", GroupedConfig(), 512, 200, 90, false},
                      Case{"grouped_one_token_prompt", GroupedConfig(), 256, 1, 70, false},
                      Case{"mixture_d128_xpos_two_chunks", MixtureConfig(), 1024, 700, 40, true},
                      Case{"mixture_segment_boundary", MixtureConfig(), 1024, 64, 40, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --- A ring of GPUs (ranks are threads, one GPU each, over NCCL: nccl_ranks.h).

struct RingCase {
  std::string name;
  LongNetConfig config;
  int64_t max_context, prompt_a, prompt_b, steps;
};

void PrintTo(const RingCase& c, std::ostream* os) { *os << c.name; }

class CudaRingDecoderTest : public ::testing::TestWithParam<RingCase> {};

// What one rank of the ring decoded: every prefill's and step's logits, Score's log-probabilities,
// its caches' bytes.
struct RingRecord {
  std::vector<std::vector<float>> logits;
  std::vector<double> scored;
  int64_t cache_bytes = 0;
  int64_t followed_states = -1;  // a follower's states when its Follow returned
};

// Two sequences (prompts of prompt_a and prompt_b tokens, so at different positions) prefilled,
// then stepped together `steps` times, and a Score of prompt_a + steps tokens, on a ring of 2
// GPUs: each position's logits and each log-probability against the CPU decoder on one device
// (the tolerances of the one-GPU cases), and the same bits on both ranks; each rank's cache holds
// its half of the rows (to a row a slot), the two together the single device's.
TEST_P(CudaRingDecoderTest, ARingOfTwoGpusDecodesAsOneDevice) {
  std::string why;
  if (!HaveHopperGpus(2, &why)) GTEST_SKIP() << why;
  const RingCase& c = GetParam();
  const int64_t v = c.config.vocab_size;
  const std::vector<float> params = Params(c.config, 11);
  const std::vector<int32_t> a = RandomTokens(v, c.prompt_a + c.steps, 21);
  const std::vector<int32_t> b = RandomTokens(v, c.prompt_b + c.steps, 22);

  // The reference: the CPU decoder, fp32, one device.
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> cpu =
      LongNetLM<float>::CreateCpu(c.config, ModelOptions{}, 0);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE((*cpu)->CopyParamsFromHost(params.data()).ok());
  absl::StatusOr<std::unique_ptr<Decoder<float>>> cd =
      Decoder<float>::Create(cpu->get(), c.max_context);
  ASSERT_TRUE(cd.ok()) << cd.status();
  Decoder<float>& cpu_decoder = **cd;
  RingRecord want;
  {
    absl::StatusOr<DecodeState<float>> sa = cpu_decoder.NewState(), sb = cpu_decoder.NewState();
    ASSERT_TRUE(sa.ok() && sb.ok());
    std::vector<float> out(static_cast<size_t>(v));
    ASSERT_TRUE(cpu_decoder.Prefill(a.data(), c.prompt_a, &*sa, out.data()).ok());
    want.logits.push_back(out);
    ASSERT_TRUE(cpu_decoder.Prefill(b.data(), c.prompt_b, &*sb, out.data()).ok());
    want.logits.push_back(out);
    std::vector<float> two(static_cast<size_t>(2 * v));
    for (int64_t i = 0; i < c.steps; ++i) {
      DecodeState<float>* both[] = {&*sa, &*sb};
      const int32_t next[] = {a[static_cast<size_t>(c.prompt_a + i)],
                              b[static_cast<size_t>(c.prompt_b + i)]};
      ASSERT_TRUE(cpu_decoder.Step(absl::MakeSpan(both), next, two.data()).ok());
      want.logits.push_back(two);
    }
    want.scored.resize(static_cast<size_t>(c.prompt_a + c.steps - 1));
    ASSERT_TRUE(cpu_decoder.Score(a.data(), c.prompt_a + c.steps, want.scored.data()).ok());
    want.cache_bytes = sa->cache_bytes() / 2;  // fp32 there, bf16 on the GPUs
  }

  std::vector<RingRecord> got(2);
  const std::vector<absl::Status> ranks = RunNcclRanks(
      2, 2,
      [&](int rank, comm::Communicator&, comm::Communicator* sp) -> absl::Status {
        CudaModelOptions cuda_options;
        cuda_options.device = rank;
        cuda_options.attention_factory = [sp, rank](cudaStream_t stream) {
          return NewCudaRingSequenceAttention(sp, stream, rank);
        };
        ModelOptions options;
        options.poison_scratch = true;
        absl::StatusOr<std::unique_ptr<CudaLongNetLM>> model =
            CudaLongNetLM::Create(c.config, options, cuda_options);
        if (!model.ok()) return model.status();
        DATTN_RETURN_IF_ERROR((*model)->CopyParamsFromHost(params.data()));
        // A max_context the ring does not divide is refused.
        absl::StatusOr<std::unique_ptr<CudaDecoder>> odd =
            CudaDecoder::Create(model->get(), c.max_context - 1, sp);
        EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument) << odd.status();
        EXPECT_NE(odd.status().message().find("not a multiple of the ring's 2 ranks"),
                  std::string::npos)
            << odd.status();
        absl::StatusOr<std::unique_ptr<CudaDecoder>> decoder =
            CudaDecoder::Create(model->get(), c.max_context, sp);
        if (!decoder.ok()) return decoder.status();
        CudaDecoder& d = **decoder;
        RingRecord& mine = got[static_cast<size_t>(rank)];
        absl::StatusOr<CudaDecodeState> sa = d.NewState(), sb = d.NewState();
        if (!sa.ok()) return sa.status();
        if (!sb.ok()) return sb.status();
        mine.cache_bytes = sa->cache_bytes();
        std::vector<float> out(static_cast<size_t>(v));
        DATTN_RETURN_IF_ERROR(d.Prefill(a.data(), c.prompt_a, &*sa, out.data()));
        mine.logits.push_back(out);
        DATTN_RETURN_IF_ERROR(d.Prefill(b.data(), c.prompt_b, &*sb, out.data()));
        mine.logits.push_back(out);
        std::vector<float> two(static_cast<size_t>(2 * v));
        for (int64_t i = 0; i < c.steps; ++i) {
          CudaDecodeState* both[] = {&*sa, &*sb};
          const int32_t next[] = {a[static_cast<size_t>(c.prompt_a + i)],
                                  b[static_cast<size_t>(c.prompt_b + i)]};
          DATTN_RETURN_IF_ERROR(d.Step(absl::MakeSpan(both), next, two.data()));
          mine.logits.push_back(two);
        }
        mine.scored.resize(static_cast<size_t>(c.prompt_a + c.steps - 1));
        DATTN_RETURN_IF_ERROR(d.Score(a.data(), c.prompt_a + c.steps, mine.scored.data()));

        // The same calls on a ring driven by rank 0 alone (Lead/Follow, as a deployment runs):
        // rank 0's results equal the collective run's bit for bit; a state rank 0 drops is
        // dropped by the follower with the next call; Release ends the follower's Follow.
        if (rank == 1) {
          EXPECT_EQ(d.Lead().code(), absl::StatusCode::kFailedPrecondition);
          DATTN_RETURN_IF_ERROR(d.Follow());
          mine.followed_states = d.follower_states();
          return absl::OkStatus();
        }
        EXPECT_EQ(d.Follow().code(), absl::StatusCode::kFailedPrecondition);
        DATTN_RETURN_IF_ERROR(d.Lead());
        EXPECT_EQ(d.Clone(*sa).status().code(), absl::StatusCode::kFailedPrecondition);
        absl::StatusOr<CudaDecodeState> la = d.NewState(), lb = d.NewState();
        if (!la.ok()) return la.status();
        if (!lb.ok()) return lb.status();
        std::vector<std::vector<float>> led;
        DATTN_RETURN_IF_ERROR(d.Prefill(a.data(), c.prompt_a, &*la, out.data()));
        led.push_back(out);
        DATTN_RETURN_IF_ERROR(d.Prefill(b.data(), c.prompt_b, &*lb, out.data()));
        led.push_back(out);
        for (int64_t i = 0; i < c.steps; ++i) {
          CudaDecodeState* both[] = {&*la, &*lb};
          const int32_t next[] = {a[static_cast<size_t>(c.prompt_a + i)],
                                  b[static_cast<size_t>(c.prompt_b + i)]};
          DATTN_RETURN_IF_ERROR(d.Step(absl::MakeSpan(both), next, two.data()));
          led.push_back(two);
        }
        std::vector<double> led_scored(mine.scored.size());
        DATTN_RETURN_IF_ERROR(d.Score(a.data(), c.prompt_a + c.steps, led_scored.data()));
        EXPECT_EQ(led, mine.logits) << "a led ring computes what the collective calls do";
        EXPECT_EQ(led_scored, mine.scored);
        // lb goes: its id goes with the next call, a step of la alone.
        { const CudaDecodeState gone = std::move(*lb); }
        CudaDecodeState* alone[] = {&*la};
        const int32_t token = 7;
        DATTN_RETURN_IF_ERROR(d.Step(absl::MakeSpan(alone), &token, out.data()));
        DATTN_RETURN_IF_ERROR(d.KeepAlive(absl::ZeroDuration()));
        return d.Release();
      },
      "ring-decoder-" + c.name);
  for (size_t r = 0; r < ranks.size(); ++r)
    ASSERT_TRUE(ranks[r].ok()) << "rank " << r << ": " << ranks[r];

  // The follower held the led run's one live sequence when rank 0 released it.
  EXPECT_EQ(got[1].followed_states, 1);
  // Row j of a slot on rank j mod 2: rank 0 holds ceil(C / 2) rows of each slot, rank 1 the rest.
  EXPECT_EQ(got[0].cache_bytes + got[1].cache_bytes, want.cache_bytes);
  EXPECT_GE(got[0].cache_bytes, got[1].cache_bytes);
  double worst = 0, worst_score = 0;
  ASSERT_EQ(got[0].logits.size(), want.logits.size());
  ASSERT_EQ(got[1].logits.size(), want.logits.size());
  for (size_t i = 0; i < want.logits.size(); ++i) {
    EXPECT_EQ(got[0].logits[i], got[1].logits[i]) << "call " << i << ": the ranks differ";
    const double e = RelError(got[0].logits[i], want.logits[i]);
    EXPECT_LE(e, 3e-2) << "call " << i << " (0, 1: the prefills; then the steps)";
    worst = std::max(worst, e);
  }
  EXPECT_EQ(got[0].scored, got[1].scored);
  for (size_t i = 0; i < want.scored.size(); ++i) {
    worst_score = std::max(worst_score, std::abs(got[0].scored[i] - want.scored[i]));
  }
  EXPECT_LE(worst_score, 6e-2);
  std::cout << "[ parity ] ring of 2, " << c.name << ": prefills of " << c.prompt_a << " and "
            << c.prompt_b << " + " << c.steps << " batched steps, largest relative logit error "
            << worst << "; Score's largest log-probability error " << worst_score
            << "; cache bytes " << got[0].cache_bytes << " + " << got[1].cache_bytes << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CudaRingDecoderTest,
    ::testing::Values(RingCase{"grouped_d64_rope", GroupedConfig(), 512, 45, 130, 80},
                      RingCase{"grouped_one_token_prompt", GroupedConfig(), 256, 1, 2, 40},
                      RingCase{"mixture_d128_xpos", MixtureConfig(), 2048, 1101, 64, 30}),
    [](const ::testing::TestParamInfo<RingCase>& info) { return info.param.name; });

// Three sequences at different positions in one step give what each gives alone (to bf16's
// rounding: a batched GEMM may take another algorithm), and a clone decodes as its original.
TEST(CudaDecoderTest, BatchedStepAndClone) {
  SKIP_WITHOUT_GPU();
  const LongNetConfig config = MixtureConfig();
  Models m = Make(config, 1024, false);
  ASSERT_NE(m.gpu_decoder, nullptr);
  CudaDecoder& dec = *m.gpu_decoder;
  const int64_t v = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(v, 700, 3);
  std::vector<float> logits(static_cast<size_t>(3 * v));
  std::vector<CudaDecodeState> alone, batched;
  for (int64_t n : {10, 300, 650}) {
    absl::StatusOr<CudaDecodeState> a = dec.NewState();
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(dec.Prefill(tokens.data(), n, &*a, logits.data()).ok());
    absl::StatusOr<CudaDecodeState> b = dec.Clone(*a);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->position(), n);
    alone.push_back(*std::move(a));
    batched.push_back(*std::move(b));
  }
  for (int round = 0; round < 5; ++round) {
    std::vector<float> each(static_cast<size_t>(3 * v));
    std::vector<int32_t> next(3);
    for (int j = 0; j < 3; ++j) {
      next[j] = tokens[static_cast<size_t>(alone[j].position())];
      CudaDecodeState* p = &alone[j];
      ASSERT_TRUE(dec.Step(absl::MakeSpan(&p, 1), &next[j], each.data() + j * v).ok());
    }
    std::vector<CudaDecodeState*> all = {&batched[0], &batched[1], &batched[2]};
    ASSERT_TRUE(dec.Step(absl::MakeSpan(all), next.data(), logits.data()).ok());
    EXPECT_LE(RelError(logits, each), 2e-2) << "round " << round;
  }
  // A clone stepped alone gives its original's bits.
  absl::StatusOr<CudaDecodeState> twin = dec.Clone(alone[1]);
  ASSERT_TRUE(twin.ok());
  std::vector<float> a(static_cast<size_t>(v)), b(static_cast<size_t>(v));
  const int32_t token = 5;
  CudaDecodeState* pa = &alone[1];
  CudaDecodeState* pb = &*twin;
  ASSERT_TRUE(dec.Step(absl::MakeSpan(&pa, 1), &token, a.data()).ok());
  ASSERT_TRUE(dec.Step(absl::MakeSpan(&pb, 1), &token, b.data()).ok());
  EXPECT_EQ(a, b);
}

// The first step of a batch size runs eagerly, the second is captured as a CUDA graph, later ones
// replay it: all three give the same bits on the same inputs.
TEST(CudaDecoderTest, CapturedStepsEqualTheEagerStep) {
  SKIP_WITHOUT_GPU();
  const LongNetConfig config = GroupedConfig();
  Models m = Make(config, 512, false);
  ASSERT_NE(m.gpu_decoder, nullptr);
  CudaDecoder& dec = *m.gpu_decoder;
  const int64_t v = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(v, 300, 4);
  std::vector<float> first(static_cast<size_t>(2 * v));
  absl::StatusOr<CudaDecodeState> a = dec.NewState();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(dec.Prefill(tokens.data(), 300, &*a, first.data()).ok());
  std::vector<CudaDecodeState> copies;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<CudaDecodeState> c = dec.Clone(*a);
    ASSERT_TRUE(c.ok());
    copies.push_back(*std::move(c));
  }
  const int32_t next[2] = {7, 9};
  std::vector<std::vector<float>> out;
  for (CudaDecodeState& c : copies) {  // eager, captured, replayed
    std::vector<float> logits(static_cast<size_t>(2 * v));
    CudaDecodeState* p = &c;
    ASSERT_TRUE(dec.Step(absl::MakeSpan(&p, 1), next, logits.data()).ok());
    ASSERT_TRUE(dec.Step(absl::MakeSpan(&p, 1), next + 1, logits.data() + v).ok());
    out.push_back(logits);
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(out[0], out[2]);
}

// A model whose activations are reserved for max_context (what a GPU deployment does) runs every
// shorter prompt in that one arena, with the bits of a model that allocates an arena per shape.
TEST(CudaDecoderTest, AReservedArenaServesEveryPromptLengthWithTheSameBits) {
  SKIP_WITHOUT_GPU();
  const LongNetConfig config = GroupedConfig();
  Models reserved = Make(config, 512, true);
  Models plain = Make(config, 512, true);
  ASSERT_NE(reserved.gpu_decoder, nullptr);
  ASSERT_NE(plain.gpu_decoder, nullptr);
  EXPECT_EQ(reserved.gpu->ReserveActivations(0, 512).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(reserved.gpu->ReserveActivations(1, 512).ok());
  const int64_t capacity = reserved.gpu->memory().arena_capacity;
  EXPECT_GT(capacity, 0);
  const int64_t v = config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(v, 512, 8);
  for (int64_t n : {10, 300, 512, 100}) {
    std::vector<float> a(static_cast<size_t>(v)), b(static_cast<size_t>(v));
    absl::StatusOr<CudaDecodeState> sa = reserved.gpu_decoder->NewState();
    absl::StatusOr<CudaDecodeState> sb = plain.gpu_decoder->NewState();
    ASSERT_TRUE(sa.ok() && sb.ok());
    ASSERT_TRUE(reserved.gpu_decoder->Prefill(tokens.data(), n, &*sa, a.data()).ok());
    ASSERT_TRUE(plain.gpu_decoder->Prefill(tokens.data(), n, &*sb, b.data()).ok());
    EXPECT_EQ(a, b) << "prompt of " << n;
    EXPECT_EQ(reserved.gpu->memory().arena_capacity, capacity) << "prompt of " << n;
    EXPECT_EQ(plain.gpu->memory().arena_capacity, plain.gpu->memory().arena) << "prompt of " << n;
    if (n < 512) {
      EXPECT_LT(reserved.gpu->memory().arena, capacity) << "prompt of " << n;
    }
    std::vector<double> la(static_cast<size_t>(n - 1)), lb(static_cast<size_t>(n - 1));
    ASSERT_TRUE(reserved.gpu_decoder->Score(tokens.data(), n, la.data()).ok());
    ASSERT_TRUE(plain.gpu_decoder->Score(tokens.data(), n, lb.data()).ok());
    EXPECT_EQ(la, lb) << "Score of " << n;
  }
}

// What a GPU deployment holds at its fullest (the base model, its arena reserved for max_context,
// max_batch caches, a step of max_batch rows after a max_context prompt) within what
// model/cuda/serving_plan.h plans, which the coordinator reserves.
TEST(CudaDecoderTest, TheServingPlanCoversWhatADeploymentHolds) {
  SKIP_WITHOUT_GPU();
  const LongNetConfig config;  // the base model
  const int64_t max_context = 32768, max_batch = 8;
  absl::StatusOr<ServingMemoryPlan> plan = PlanCudaServingMemory(config, max_context, max_batch);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  int64_t used = 0;
  {
    ModelOptions options;
    options.checkpoint_activations = true;
    CudaModelOptions cuda_options;
    cuda_options.norms = CudaModelOptions::Norms::kRecompute;
    absl::StatusOr<std::unique_ptr<CudaLongNetLM>> model =
        CudaLongNetLM::Create(config, options, cuda_options);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE((*model)->InitParams(1).ok());
    ASSERT_TRUE((*model)->ReserveActivations(1, max_context).ok());
    absl::StatusOr<std::unique_ptr<CudaDecoder>> decoder =
        CudaDecoder::Create(model->get(), max_context);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    const std::vector<int32_t> tokens = RandomTokens(config.vocab_size, max_context, 2);
    std::vector<CudaDecodeState> states;
    std::vector<float> logits(static_cast<size_t>(max_batch * config.vocab_size));
    for (int64_t j = 0; j < max_batch; ++j) {
      absl::StatusOr<CudaDecodeState> s = (*decoder)->NewState();
      ASSERT_TRUE(s.ok()) << s.status();
      states.push_back(*std::move(s));
    }
    ASSERT_TRUE(
        (*decoder)->Prefill(tokens.data(), max_context - 1, &states[0], logits.data()).ok());
    for (int64_t j = 1; j < max_batch; ++j) {
      ASSERT_TRUE((*decoder)->Prefill(tokens.data(), 100, &states[j], logits.data()).ok());
    }
    std::vector<CudaDecodeState*> all;
    for (CudaDecodeState& s : states) all.push_back(&s);
    std::vector<int32_t> next(static_cast<size_t>(max_batch), 1);
    ASSERT_TRUE((*decoder)->Step(absl::MakeSpan(all), next.data(), logits.data()).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    size_t free_after = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    used = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
  }
  const double ratio = static_cast<double>(plan->total_bytes) / static_cast<double>(used);
  std::cout << "[ planner ] base model, GPU deployment, max_context " << max_context
            << ", max_batch " << max_batch << ": planned " << plan->DebugString() << "; measured "
            << used / (1 << 20) << " MiB (plan / measured " << ratio << ")\n";
  EXPECT_GE(plan->total_bytes, used);
  EXPECT_LE(ratio, 1.15);  // (a plan that counted the caches twice was 1.23)
}

// The serving model a GPU worker makes reports the bytes a sequence's cache takes, as allocated.
TEST(CudaDecoderTest, AServingModelReportsItsCacheAsAllocated) {
  SKIP_WITHOUT_GPU();
  const LongNetConfig config = MixtureConfig();
  const std::vector<float> params = Params(config, 3);
  absl::StatusOr<std::unique_ptr<ServingModel>> served =
      NewCudaServingModel(config, params, 1024, 2, 0);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ((*served)->device(), "cuda bf16");
  Models m = Make(config, 1024, true);
  ASSERT_NE(m.gpu_decoder, nullptr);
  absl::StatusOr<CudaDecodeState> state = m.gpu_decoder->NewState();
  ASSERT_TRUE(state.ok());
  EXPECT_EQ((*served)->cache_bytes_per_sequence(), state->cache_bytes());
  // A parameter count that is not the model's is refused naming both.
  absl::StatusOr<std::unique_ptr<ServingModel>> short_params =
      NewCudaServingModel(config, absl::MakeSpan(params).subspan(1), 1024, 2, 0);
  EXPECT_EQ(short_params.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_params.status().message().find(std::to_string(params.size() - 1)),
            std::string::npos)
      << short_params.status();
}

TEST(CudaDecoderTest, BadCallsAreRefusedAndChangeNothing) {
  SKIP_WITHOUT_GPU();
  const LongNetConfig config = GroupedConfig();
  Models m = Make(config, 64, false);
  ASSERT_NE(m.gpu_decoder, nullptr);
  CudaDecoder& dec = *m.gpu_decoder;
  std::vector<float> logits(static_cast<size_t>(2 * config.vocab_size));
  std::vector<int32_t> tokens = RandomTokens(config.vocab_size, 80, 1);
  absl::StatusOr<CudaDecodeState> s = dec.NewState();
  ASSERT_TRUE(s.ok());
  tokens[3] = 256;
  absl::Status e = dec.Prefill(tokens.data(), 10, &*s, logits.data());
  EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.message().find("token 256 at position 3"), std::string::npos) << e;
  tokens[3] = 1;
  e = dec.Prefill(tokens.data(), 65, &*s, logits.data());
  EXPECT_EQ(e.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(e.message().find("65"), std::string::npos) << e;
  EXPECT_EQ(s->position(), 0);
  ASSERT_TRUE(dec.Prefill(tokens.data(), 63, &*s, logits.data()).ok());
  EXPECT_EQ(dec.Prefill(tokens.data(), 5, &*s, logits.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  CudaDecodeState* p = &*s;
  const int32_t bad = -1;
  e = dec.Step(absl::MakeSpan(&p, 1), &bad, logits.data());
  EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.message().find("token -1"), std::string::npos) << e;
  std::vector<CudaDecodeState*> twice = {p, p};
  const int32_t two[2] = {1, 2};
  EXPECT_EQ(dec.Step(absl::MakeSpan(twice), two, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->position(), 63);
  ASSERT_TRUE(dec.Step(absl::MakeSpan(&p, 1), two, logits.data()).ok());
  e = dec.Step(absl::MakeSpan(&p, 1), two, logits.data());
  EXPECT_EQ(e.code(), absl::StatusCode::kOutOfRange) << e;
  EXPECT_EQ(s->position(), 64);
  // A state of another decoder.
  absl::StatusOr<std::unique_ptr<CudaDecoder>> other = CudaDecoder::Create(m.gpu.get(), 64);
  ASSERT_TRUE(other.ok());
  absl::StatusOr<CudaDecodeState> foreign = (*other)->NewState();
  ASSERT_TRUE(foreign.ok());
  CudaDecodeState* f = &*foreign;
  EXPECT_EQ(dec.Step(absl::MakeSpan(&f, 1), two, logits.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dec.Clone(*foreign).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<double> lp(80);
  EXPECT_EQ(dec.Score(tokens.data(), 1, lp.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dec.Score(tokens.data(), 65, lp.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CudaDecoder::Create(m.gpu.get(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cuda
}  // namespace model
}  // namespace dattn
