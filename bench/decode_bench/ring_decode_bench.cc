// A deployment's ring on the CPU (model/decoder.h, "A ring of S ranks"; docs/SERVING.md, "Rings of
// workers"): R ranks as R processes (this binary re-executed, engine/comm/multiprocess.h) with Gloo
// over loopback, as a deployment's workers are, each with the whole model and T threads (OpenBLAS's
// thread pool is per process: rank threads of one process would share it), rank 0 leading (a
// BatchGenerator decides and samples), the others following; R = 1 is one process with the
// single-worker model (local attention, no communicator), as a one-rank deployment runs. For each R
// of --ranks: a prompt's prefill (split R ways), decoding one stream and S streams batched, and the
// cache of one sequence on the largest rank (rank 0), by formula and as allocated, against R = 1 in
// the same run. Prints a table with ratios.
//
//   bazel build -c opt //bench/decode_bench:ring_decode_bench
//   bazel-bin/bench/decode_bench/ring_decode_bench [--ranks 1,2,4] [--threads T] [--prompt N]
//       [--tokens K] [--streams S] [--layers L]
//
// What to expect (the floors of decode_bench.cc): a decoding step reads every weight on every rank,
// so a ring does not make it faster (the attention over the cached rows, split R ways, is a small
// part of a step; the partial softmaxes' all-gather adds a round trip a layer); the prefill is a
// sequence-parallel forward pass, near R times faster on R x T cores; a rank holds 1/R of the
// cache. The model: the base shape's layers and patterns (d 768, 12 heads, w 2048..32768, r 1..12,
// byte vocabulary), --layers of them (default 2), random weights (speed does not depend on them).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/comm/multiprocess.h"
#include "engine/comm/tcp_store.h"
#include "model/batch_generator.h"
#include "model/cpu_layer_ops.h"
#include "model/decoder.h"
#include "model/longnet.h"
#include "model/ring_sequence_attention.h"

namespace {

using dattn::model::BatchGenerator;
using dattn::model::Decoder;
using dattn::model::DecodeState;
using dattn::model::GenerationRequest;
using dattn::model::LongNetConfig;
using dattn::model::LongNetLM;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Row {
  int ranks = 0;
  double prefill_s = 0;        // One prompt, one stream.
  double one_per_token_s = 0;  // Decoding one stream.
  double batched_tokens_per_s = 0;
  int64_t cache_bytes = 0;    // Rank 0's share of one sequence, allocated.
  int64_t formula_bytes = 0;  // KvCacheGeometry of rank 0's share.
};

struct Flags {
  std::vector<int> ranks = {1, 2, 4};
  int threads = 4;
  int64_t prompt = 16384, tokens = 32, streams = 8, layers = 2;
};

Flags FlagsOf(const dattn::comm::multiprocess::ChildContext& ctx) {
  Flags f;
  f.threads = static_cast<int>(ctx.IntArg("threads", f.threads));
  f.prompt = ctx.IntArg("prompt", f.prompt);
  f.tokens = ctx.IntArg("tokens", f.tokens);
  f.streams = ctx.IntArg("streams", f.streams);
  f.layers = ctx.IntArg("layers", f.layers);
  return f;
}

// One rank's process: rank 0 measures and prints its row ("ROW ranks prefill one batched cache
// formula"), the others follow. Exit 0 on success; the error on stderr otherwise.
absl::Status RankMain(const dattn::comm::multiprocess::ChildContext& ctx) {
  const Flags f = FlagsOf(ctx);
  LongNetConfig c;  // The base shape's layers and patterns.
  c.num_layers = f.layers;
  const int ranks = ctx.size;
  std::unique_ptr<dattn::comm::Communicator> ring;
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> model;
  if (ranks == 1) {
    model = LongNetLM<float>::CreateCpu(c, {}, f.threads);
  } else {
    absl::StatusOr<std::unique_ptr<dattn::comm::TcpStore>> store =
        dattn::comm::TcpStore::Connect(ctx.store_address);
    if (!store.ok()) return store.status();
    dattn::comm::GlooOptions gloo;
    gloo.timeout = absl::Seconds(600);
    gloo.prefix = "bench";
    absl::StatusOr<std::unique_ptr<dattn::comm::Communicator>> comm =
        dattn::comm::CreateGlooCommunicator(std::shared_ptr<dattn::comm::Store>(*std::move(store)),
                                            ctx.rank, ranks, gloo);
    if (!comm.ok()) return comm.status();
    ring = *std::move(comm);
    dattn::model::CpuLayerOpsOptions ops;
    ops.num_threads = f.threads;
    model =
        LongNetLM<float>::Create(c, {}, dattn::model::NewCpuLayerOps<float>(ops),
                                 dattn::model::NewCpuRingSequenceAttention(ring.get(), f.threads));
  }
  if (!model.ok()) return model.status();
  if (absl::Status s = (*model)->InitParams(1); !s.ok()) return s;
  const int64_t max_context = (f.prompt + f.tokens + ranks - 1) / ranks * ranks;
  absl::StatusOr<std::unique_ptr<Decoder<float>>> decoder =
      Decoder<float>::Create(model->get(), max_context, ring.get());
  if (!decoder.ok()) return decoder.status();
  if (ctx.rank > 0) return (*decoder)->Follow();
  if (absl::Status s = (*decoder)->Lead(); !s.ok()) return s;
  std::vector<int32_t> text(static_cast<size_t>(max_context));
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int32_t>((i * 7 + 3) % 256);
  const std::vector<int32_t> prompt(text.begin(), text.begin() + f.prompt);
  Row row;
  row.ranks = ranks;
  {
    // One stream: prefill, then decode.
    absl::StatusOr<DecodeState<float>> state = (*decoder)->NewState();
    if (!state.ok()) return state.status();
    row.cache_bytes = state->cache_bytes();
    row.formula_bytes = (*decoder)->geometry().ElementsPerSequence() * 4;
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = (*decoder)->Prefill(prompt.data(), f.prompt, &*state, logits.data());
        !s.ok()) {
      return s;
    }
    row.prefill_s = Since(t0);
    t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < f.tokens; ++k) {
      DecodeState<float>* one[] = {&*state};
      const int32_t token = text[static_cast<size_t>(f.prompt + k)];
      if (absl::Status s = (*decoder)->Step(absl::MakeSpan(one), &token, logits.data()); !s.ok()) {
        return s;
      }
    }
    row.one_per_token_s = Since(t0) / static_cast<double>(f.tokens);
  }  // Its cache is freed here (and the followers', with the next call).
  // S streams: the first round prefills them all, the rest decode together.
  absl::StatusOr<std::unique_ptr<BatchGenerator<float>>> generator =
      BatchGenerator<float>::Create(decoder->get(), f.streams);
  if (!generator.ok()) return generator.status();
  for (int64_t s = 0; s < f.streams; ++s) {
    GenerationRequest r;
    r.prompt = prompt;
    r.prompt[0] = static_cast<int32_t>(s % 256);
    r.options.max_tokens = f.tokens;
    r.options.sampling.temperature = 0;
    if (auto id = (*generator)->Submit(std::move(r)); !id.ok()) return id.status();
  }
  if (auto t = (*generator)->Tick(absl::Now()); !t.ok()) return t.status();
  auto t0 = std::chrono::steady_clock::now();
  while ((*generator)->running() > 0) {
    if (auto t = (*generator)->Tick(absl::Now()); !t.ok()) return t.status();
  }
  // The first token of each stream was sampled in the prefill round.
  row.batched_tokens_per_s = static_cast<double>(f.streams * (f.tokens - 1)) / Since(t0);
  if (absl::Status s = (*decoder)->Release(); !s.ok()) return s;
  std::printf("ROW %d %.9g %.9g %.9g %lld %lld\n", row.ranks, row.prefill_s, row.one_per_token_s,
              row.batched_tokens_per_s, static_cast<long long>(row.cache_bytes),
              static_cast<long long>(row.formula_bytes));
  std::fflush(stdout);
  return absl::OkStatus();
}

int RankChild(const dattn::comm::multiprocess::ChildContext& ctx) {
  absl::Status s = RankMain(ctx);
  if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", ctx.rank, s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
DATTN_REGISTER_CHILD("ring_decode_rank", RankChild);

// Rank 0's row of a ring of `ranks` processes.
absl::StatusOr<Row> RunRing(const Flags& f, int ranks) {
  dattn::comm::multiprocess::LaunchOptions launch;
  launch.child = "ring_decode_rank";
  launch.size = ranks;
  launch.timeout = absl::Minutes(30);
  launch.args = {{"threads", absl::StrCat(f.threads)},
                 {"prompt", absl::StrCat(f.prompt)},
                 {"tokens", absl::StrCat(f.tokens)},
                 {"streams", absl::StrCat(f.streams)},
                 {"layers", absl::StrCat(f.layers)}};
  absl::StatusOr<std::vector<dattn::comm::multiprocess::ChildResult>> results =
      dattn::comm::multiprocess::RunChildren(launch);
  if (!results.ok()) return results.status();
  for (const auto& r : *results) {
    if (!r.exited || r.exit_code != 0) {
      return absl::InternalError(
          absl::StrCat(ranks, " ranks failed:\n", dattn::comm::multiprocess::Describe(*results)));
    }
  }
  for (absl::string_view line : absl::StrSplit((*results)[0].log, '\n')) {
    if (!absl::StartsWith(line, "ROW ")) continue;
    std::vector<std::string> v = absl::StrSplit(line.substr(4), ' ');
    Row row;
    if (v.size() == 6 && absl::SimpleAtoi(v[0], &row.ranks) &&
        absl::SimpleAtod(v[1], &row.prefill_s) && absl::SimpleAtod(v[2], &row.one_per_token_s) &&
        absl::SimpleAtod(v[3], &row.batched_tokens_per_s) &&
        absl::SimpleAtoi(v[4], &row.cache_bytes) && absl::SimpleAtoi(v[5], &row.formula_bytes)) {
      return row;
    }
  }
  return absl::InternalError(absl::StrCat("rank 0 printed no row:\n", (*results)[0].log));
}

}  // namespace

int main(int argc, char** argv) {
  if (std::optional<int> child = dattn::comm::multiprocess::MaybeRunChild(argc, argv)) {
    return *child;
  }
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    bool ok = true;
    if (flag == "--ranks") {
      f.ranks.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int r = 0;
        ok = ok && absl::SimpleAtoi(part, &r) && r >= 1;
        f.ranks.push_back(r);
      }
    } else if (flag == "--threads") {
      ok = absl::SimpleAtoi(value, &f.threads) && f.threads >= 1;
    } else if (flag == "--prompt") {
      ok = absl::SimpleAtoi(value, &f.prompt) && f.prompt >= 1;
    } else if (flag == "--tokens") {
      ok = absl::SimpleAtoi(value, &f.tokens) && f.tokens >= 2;
    } else if (flag == "--streams") {
      ok = absl::SimpleAtoi(value, &f.streams) && f.streams >= 1;
    } else if (flag == "--layers") {
      ok = absl::SimpleAtoi(value, &f.layers) && f.layers >= 1;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "ring_decode_bench: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  std::printf(
      "ring_decode_bench: base layers x %lld (d 768, 12 heads, w 2048..32768), fp32, %d threads a "
      "rank; prompt %lld tokens, %lld decoded per stream, %lld streams batched\n\n",
      static_cast<long long>(f.layers), f.threads, static_cast<long long>(f.prompt),
      static_cast<long long>(f.tokens), static_cast<long long>(f.streams));
  std::vector<Row> rows;
  for (int ranks : f.ranks) {
    absl::StatusOr<Row> row = RunRing(f, ranks);
    if (!row.ok()) {
      std::fprintf(stderr, "ring_decode_bench: %s\n", row.status().ToString().c_str());
      return 1;
    }
    rows.push_back(*row);
  }
  const Row& base = rows.front();
  std::printf("%5s %10s %7s %14s %7s %14s %7s %14s %14s %7s\n", "ranks", "prefill s", "x",
              "decode ms/tok", "x", "batched t/s", "x", "cache/rank B", "formula B", "share");
  bool exact = true;
  for (const Row& r : rows) {
    std::printf("%5d %10.3f %6.2fx %14.3f %6.2fx %14.0f %6.2fx %14lld %14lld %7.3f\n", r.ranks,
                r.prefill_s, base.prefill_s / r.prefill_s, 1e3 * r.one_per_token_s,
                base.one_per_token_s / r.one_per_token_s, r.batched_tokens_per_s,
                r.batched_tokens_per_s / base.batched_tokens_per_s,
                static_cast<long long>(r.cache_bytes), static_cast<long long>(r.formula_bytes),
                static_cast<double>(r.cache_bytes) / static_cast<double>(base.cache_bytes));
    exact = exact && r.cache_bytes == r.formula_bytes;
  }
  std::printf(
      "\n(x: the first row's time over this row's, or this row's rate over the first's; "
      "share: rank 0's cache over the first row's)\n");
  return exact ? 0 : 1;
}
