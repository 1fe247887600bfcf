// The incremental decoder on the CPU (model/decoder.h, model/batch_generator.h): decode tokens/s
// for one stream and for S concurrent streams after a prompt of N tokens, against the reference
// of recomputing the whole prefix for every token (the model's forward pass), and the cache's
// bytes per sequence by formula and as allocated. Prints a table with ratios.
//
//   bazel run -c opt //bench/decode_bench -- [--prompt N] [--tokens T] [--streams S]
//       [--threads K] [--config kjv-small|base-2layer]
//
// Floors, stated once: a decode step of one sequence reads every parameter once (the GEMV of
// each linear layer: 2 P FLOPs for P parameters, memory-bound) and every cached row of the
// patterns that select its position (4 D FLOPs per row); S streams share the parameter reads,
// which is what batching buys. The full recompute costs a forward pass over the prefix per token
// (CountFlops), growing with N.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "model/batch_generator.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "model/longnet.h"

namespace {

using dattn::model::BatchGenerator;
using dattn::model::Decoder;
using dattn::model::GenerateOptions;
using dattn::model::GenerationRequest;
using dattn::model::LongNetConfig;
using dattn::model::LongNetLM;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "decode_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t prompt = 4096, tokens = 64, streams = 32;
  int threads = 0;
  std::string shape = "kjv-small";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--prompt") {
      prompt = std::atoll(value);
    } else if (flag == "--tokens") {
      tokens = std::atoll(value);
    } else if (flag == "--streams") {
      streams = std::atoll(value);
    } else if (flag == "--threads") {
      threads = std::atoi(value);
    } else if (flag == "--config") {
      shape = value;
    } else {
      std::fprintf(stderr, "decode_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  LongNetConfig c;             // The base shape (12 layers) unless narrowed below.
  if (shape == "kjv-small") {  // trainer/configs/kjv-small.json's model.
    c.d_model = 128;
    c.num_layers = 4;
    c.num_heads = 4;
    c.ffn_dim = 512;
    c.segment_lengths = {64, 128, 256};
    c.dilation_rates = {1, 2, 4};
  } else if (shape == "base-2layer") {  // The base model's layers and patterns, 2 of them.
    c.num_layers = 2;
  } else {
    std::fprintf(stderr, "decode_bench: --config is kjv-small or base-2layer\n");
    return 2;
  }
  auto model = LongNetLM<float>::CreateCpu(c, {}, threads);
  if (!model.ok()) return Fail("model", model.status());
  if (absl::Status s = (*model)->InitParams(1); !s.ok()) return Fail("init", s);
  const int64_t max_context = prompt + tokens;
  auto decoder = Decoder<float>::Create(model->get(), max_context);
  if (!decoder.ok()) return Fail("decoder", decoder.status());
  std::vector<int32_t> text(static_cast<size_t>(max_context));
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int32_t>((i * 7 + 3) % 256);
  const std::vector<int32_t> prompt_tokens(text.begin(), text.begin() + prompt);
  GenerateOptions options;
  options.max_tokens = tokens;
  options.sampling.temperature = 0;

  // One stream: prefill, then decode.
  auto t0 = std::chrono::steady_clock::now();
  auto state = (*decoder)->NewState();
  if (!state.ok()) return Fail("state", state.status());
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  if (absl::Status s = (*decoder)->Prefill(prompt_tokens.data(), prompt, &*state, logits.data());
      !s.ok()) {
    return Fail("prefill", s);
  }
  const double prefill_s = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < tokens; ++k) {
    dattn::model::DecodeState<float>* one[] = {&*state};
    const int32_t token = text[static_cast<size_t>(prompt + k)];
    if (absl::Status s = (*decoder)->Step(absl::MakeSpan(one), &token, logits.data()); !s.ok()) {
      return Fail("step", s);
    }
  }
  const double one_stream_s = Seconds(t0);

  // S streams through the batch generator (one Step per round for all of them).
  auto generator = BatchGenerator<float>::Create(decoder->get(), streams);
  if (!generator.ok()) return Fail("generator", generator.status());
  int64_t finished = 0;
  for (int64_t s = 0; s < streams; ++s) {
    GenerationRequest r;
    r.prompt = prompt_tokens;
    r.prompt[0] = static_cast<int32_t>(s % 256);
    r.options = options;
    r.on_done = [&finished](absl::StatusOr<dattn::model::GenerateResult>) { ++finished; };
    if (auto id = (*generator)->Submit(std::move(r)); !id.ok()) return Fail("submit", id.status());
  }
  // The first tick prefills every stream: timed apart from the decoding rounds.
  t0 = std::chrono::steady_clock::now();
  if (auto t = (*generator)->Tick(absl::Now()); !t.ok()) return Fail("tick", t.status());
  const double batch_prefill_s = Seconds(t0);
  const int64_t batch_cache = (*generator)->cache_bytes();
  t0 = std::chrono::steady_clock::now();
  int64_t rounds = 0;
  while ((*generator)->running() > 0) {
    if (auto t = (*generator)->Tick(absl::Now()); !t.ok()) return Fail("tick", t.status());
    ++rounds;
  }
  const double batch_s = Seconds(t0);

  // The reference: the whole prefix's forward pass for each of a few tokens.
  const int64_t recompute_tokens = std::min<int64_t>(tokens, 4);
  t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < recompute_tokens; ++k) {
    dattn::model::TokenBatch b;
    b.tokens = text.data();
    b.batch = 1;
    b.seq_len = prompt + k + 1;
    if (auto r = (*model)->Forward(b); !r.ok()) return Fail("recompute", r.status());
  }
  const double recompute_per_token = Seconds(t0) / static_cast<double>(recompute_tokens);

  const auto& g = (*decoder)->geometry();
  const int64_t formula = c.num_layers * 2 * c.head_dim() * 4 * g.rows_per_layer();
  const int64_t full_cache = c.num_layers * 2 * c.d_model * 4 * max_context;
  const double one_per_token = one_stream_s / static_cast<double>(tokens);
  const double batch_tokens_per_s =
      static_cast<double>(streams * tokens - streams) / batch_s;  // Sampled-only first tokens.
  std::printf("decode_bench: %s model (d %lld, %lld layers, %lld heads, w %s), fp32, %s\n",
              shape.c_str(), static_cast<long long>(c.d_model),
              static_cast<long long>(c.num_layers), static_cast<long long>(c.num_heads),
              c.segment_lengths.size() == 3 ? "64/128/256" : "2048..32768",
              threads == 0 ? "every core" : absl::StrFormat("%d threads", threads).c_str());
  std::printf("prompt %lld tokens, %lld decoded per stream\n\n", static_cast<long long>(prompt),
              static_cast<long long>(tokens));
  std::printf("%-44s %14s %10s\n", "what", "value", "ratio");
  std::printf("%-44s %12.2f s %10s\n", "prefill, one stream", prefill_s, "");
  std::printf("%-44s %11.3f ms %10s\n", "recompute the prefix, per token (reference)",
              1e3 * recompute_per_token, "1.00");
  std::printf("%-44s %11.3f ms %9.1fx\n", "decode step, one stream, per token", 1e3 * one_per_token,
              recompute_per_token / one_per_token);
  std::printf("%-44s %10.0f t/s %10s\n", "decode, one stream", 1.0 / one_per_token, "1.00");
  std::printf("%-44s %10.0f t/s %9.1fx\n",
              absl::StrFormat("decode, %d streams batched (%d rounds)", streams, rounds).c_str(),
              batch_tokens_per_s, batch_tokens_per_s * one_per_token);
  std::printf("%-44s %12.2f s %10s\n",
              absl::StrFormat("prefill, %d streams (first round)", streams).c_str(),
              batch_prefill_s, "");
  std::printf("%-44s %12lld B %10s\n", "cache per sequence, formula",
              static_cast<long long>(formula), "");
  std::printf("%-44s %12lld B %10s\n", "cache per sequence, allocated",
              static_cast<long long>(state->cache_bytes()), "");
  std::printf("%-44s %12lld B %9.3fx\n", "full K/V cache at this context (fp32)",
              static_cast<long long>(full_cache),
              static_cast<double>(formula) / static_cast<double>(full_cache));
  std::printf("%-44s %12lld B %10s\n",
              absl::StrFormat("caches of %d streams, allocated", streams).c_str(),
              static_cast<long long>(batch_cache), "");
  return (formula == state->cache_bytes() && finished == streams) ? 0 : 1;
}
