// The GPU decoder (model/cuda/cuda_decoder.h) on one GPU (issue 18's decode benchmark): the base
// model (d 768, 12 layers, 12 heads, w 2048..32768, r 1..12; random weights: speed does not
// depend on them) with a context of N tokens: a prompt prefilled once (timed), cloned to S
// sequences, then one stream and S streams batched decode the last positions before N. N a
// multiple of the longest segment (the default, 2^20) puts those steps at the end of every
// pattern's segment, where the cache is fullest and a step reads the most rows: the slowest
// steps of a long generation. Prints a table: prefill seconds, ms per step and tokens/s, the floor
// of a step (the weights read once plus each stream's cached rows that the step reads, once, at
// the copy bandwidth measured in the same run), the cache's bytes per sequence (formula and
// allocated) against a full K/V cache of N tokens, and the reference a model without a cache pays
// (a forward pass over the prefix per token: the prefill's time).
//
// With --ranks R > 1 the same on a ring of R GPUs (a thread and a GPU each, NCCL): the model's
// attention the ring's, the decoder the ring's (each rank holds 1/R of every cache); every rank
// runs the same calls and rank 0 prints its times, the floor counting a rank's share of the cached
// rows read.
//
//   cuda_decode_bench [--context N] [--streams S] [--tokens T] [--layers L] [--ranks R]
// Defaults: N = 1,048,576, S = 32, T = 64 (timed steps of each row, after 8 warm-up steps), R = 1.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/communicator.h"
#include "model/config.h"
#include "model/cuda/cuda_decoder.h"
#include "model/cuda/cuda_longnet.h"
#include "model/cuda/cuda_sequence_attention.h"
#include "model/cuda/nccl_ranks.h"

namespace {

using dattn::model::LongNetConfig;
using dattn::model::ModelOptions;
using dattn::model::cuda::CudaDecoder;
using dattn::model::cuda::CudaDecodeState;
using dattn::model::cuda::CudaLongNetLM;
using dattn::model::cuda::CudaModelOptions;
using dattn::model::cuda::NewCudaRingSequenceAttention;

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "cuda_decode_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Device-to-device copy bandwidth (bytes read + written per second) over 1 GiB.
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double s = Seconds(t0);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * 10 * static_cast<double>(bytes) / s;
}

// `s` with `what` in front of its message.
absl::Status Err(const char* what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

struct Flags {
  int64_t context = 1 << 20, streams = 32, tokens = 64, layers = 12, ranks = 1;
};

// The benchmark on rank `rank` (the GPU of that ordinal) of a ring over `sp`, or on GPU 0 alone
// (sp null); rank 0 prints the table.
absl::Status Bench(const Flags& f, int rank, dattn::comm::Communicator* sp, double bandwidth) {
  const int64_t context = f.context, streams = f.streams, tokens = f.tokens, layers = f.layers;
  LongNetConfig c;  // The base shape.
  c.num_layers = layers;
  ModelOptions options;
  options.checkpoint_activations = true;  // A prefill keeps each block's input only.
  CudaModelOptions cuda_options;
  cuda_options.device = rank;
  if (sp != nullptr) {
    cuda_options.attention_factory = [sp, rank](cudaStream_t stream) {
      return NewCudaRingSequenceAttention(sp, stream, rank);
    };
  }
  auto model = CudaLongNetLM::Create(c, options, cuda_options);
  if (!model.ok()) return Err("model", model.status());
  if (absl::Status s = (*model)->InitParams(1); !s.ok()) return Err("init", s);
  const int64_t warmup = 8;
  // The prompt leaves room for both rows' steps, which end at position N - 1.
  const int64_t prompt = context - 2 * (warmup + tokens);
  if (prompt < 1) {
    return absl::InvalidArgumentError("--context must exceed 2 (8 + --tokens)");
  }
  const int64_t max_context = context;
  auto decoder = CudaDecoder::Create(model->get(), max_context, sp);
  if (!decoder.ok()) return Err("decoder", decoder.status());
  CudaDecoder& dec = **decoder;
  std::vector<int32_t> text(static_cast<size_t>(context));
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<int32_t>((i * 7 + 3) % 256);
  const int64_t v = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>(streams * v));

  // Prefill: once to warm up (the arena, GEMM plans), then timed on a fresh state.
  double prefill_s = 0;
  std::vector<CudaDecodeState> states;
  for (int round = 0; round < 2; ++round) {
    auto state = dec.NewState();
    if (!state.ok()) return Err("state", state.status());
    cudaDeviceSynchronize();
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = dec.Prefill(text.data(), prompt, &*state, logits.data()); !s.ok()) {
      return Err("prefill", s);
    }
    prefill_s = Seconds(t0);
    if (round == 1) states.push_back(*std::move(state));
  }
  for (int64_t j = 1; j < streams; ++j) {
    auto copy = dec.Clone(states[0]);
    if (!copy.ok()) return Err("clone", copy.status());
    states.push_back(*std::move(copy));
  }
  // The bytes of cached rows one sequence's step at position t reads: rows [0, row] of each slot
  // that selects t, K and V, every layer.
  const dattn::model::KvCacheGeometry& geometry = dec.geometry();
  auto rows_read = [&](int64_t t) {
    int64_t rows = 0;
    for (const auto& slot : geometry.slots()) {
      const int64_t row = geometry.RowOf(slot, t);
      if (row >= 0) rows += row + 1;
    }
    return static_cast<double>(rows) * 2 * c.head_dim() * 2 * static_cast<double>(layers);
  };
  // Times `steps` steps of the first `count` states (after the warm-up), in seconds per step;
  // *read := the mean bytes of cached rows a sequence's step read.
  absl::Status failed;
  auto run = [&](int64_t count, int64_t steps, double* read) -> double {
    std::vector<CudaDecodeState*> batch;
    for (int64_t j = 0; j < count; ++j) batch.push_back(&states[static_cast<size_t>(j)]);
    std::vector<int32_t> next(static_cast<size_t>(count), 1);
    double bytes = 0;
    for (int64_t i = 0; i < steps; ++i) bytes += rows_read(batch[0]->position() + i);
    if (read != nullptr) *read = bytes / static_cast<double>(steps);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      absl::Status s = dec.Step(absl::MakeSpan(batch), next.data(), logits.data());
      if (!s.ok()) {
        failed = s;
        return 0;
      }
      for (int64_t j = 0; j < count; ++j) {
        const float* row = logits.data() + j * v;
        next[static_cast<size_t>(j)] =
            static_cast<int32_t>(std::max_element(row, row + v) - row);  // greedy
      }
    }
    return Seconds(t0) / static_cast<double>(steps);
  };
  // Stream 0 decodes alone first, then every stream together: the first streams-1 states are
  // moved ahead by as many positions so that both rows end at N - 1.
  double read_one = 0, read_many = 0;
  run(1, warmup, nullptr);
  const double one = run(1, tokens, &read_one);
  if (!failed.ok()) return Err("step", failed);
  for (int64_t j = 1; j < streams; ++j) {
    std::vector<int32_t> filler(static_cast<size_t>(warmup + tokens), 1);
    for (int32_t tok : filler) {
      CudaDecodeState* p = &states[static_cast<size_t>(j)];
      if (absl::Status s = dec.Step(absl::MakeSpan(&p, 1), &tok, logits.data()); !s.ok()) {
        return Err("step", s);
      }
    }
  }
  run(streams, warmup, nullptr);
  const double many = run(streams, tokens, &read_many);
  if (!failed.ok()) return Err("step", failed);
  if (rank != 0) return absl::OkStatus();

  const int64_t cache = states[0].cache_bytes();                     // rank 0's share on a ring
  const int64_t formula = 2 * dec.geometry().ElementsPerSequence();  // K and V elements, 2 B each
  const double ranks = static_cast<double>(f.ranks);
  const double full = static_cast<double>(c.num_layers) * 2 * static_cast<double>(context) *
                      static_cast<double>(c.d_model) * 2;
  const double weights = 2.0 * static_cast<double>((*model)->working_layout().size);
  // Reads at the copy rate: bandwidth counts a byte read and a byte written.
  // On a ring each rank reads its 1/R share of the rows.
  const double floor_one = (weights + read_one / ranks) / (bandwidth / 2);
  const double floor_many =
      (weights + static_cast<double>(streams) * read_many / ranks) / (bandwidth / 2);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, rank);
  std::printf("\n== GPU decoding: %s%s, base shape with %lld layers, context %lld ==\n", prop.name,
              f.ranks > 1 ? absl::StrCat(" x ", f.ranks, ", a ring over NCCL").c_str() : "",
              static_cast<long long>(layers), static_cast<long long>(context));
  std::printf(
      "copy bandwidth %.0f GB/s (read + write); weights %.1f MB bf16; steps at positions %lld.."
      "%lld; cached rows read a step, a sequence: %.1f MB (1 stream), %.1f MB (batched)\n",
      bandwidth / 1e9, weights / 1e6, static_cast<long long>(prompt + warmup),
      static_cast<long long>(context - 1), read_one / 1e6, read_many / 1e6);
  std::printf(
      "| streams | prefill of %lld tokens | ms / step | tokens/s | floor ms / step (reads at copy "
      "rate) "
      "| x floor | vs recompute per token | cache / sequence%s (formula = allocated) | full K/V "
      "cache (bf16) |\n|---|---|---|---|---|---|---|---|---|\n",
      static_cast<long long>(prompt), f.ranks > 1 ? ", rank 0's share" : "");
  const double recompute_tps = 1.0 / prefill_s;
  std::printf(
      "| 1 | %.3f s | %.3f | %.0f | %.3f | %.1f | %.0fx | %lld B (%s) | %.1f GB (%.4fx) |\n",
      prefill_s, one * 1e3, 1.0 / one, floor_one * 1e3, one / floor_one,
      (1.0 / one) / recompute_tps, static_cast<long long>(cache),
      cache == formula ? "=" : "differs", full / 1e9, static_cast<double>(cache) / full);
  if (cache != formula) return absl::InternalError("the cache's bytes differ from the formula");
  std::printf("| %lld batched | | %.3f | %.0f | %.3f | %.1f | %.0fx | | |\n",
              static_cast<long long>(streams), many * 1e3, static_cast<double>(streams) / many,
              floor_many * 1e3, many / floor_many,
              (static_cast<double>(streams) / many) / recompute_tps);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--context") {
      f.context = value;
    } else if (flag == "--streams") {
      f.streams = value;
    } else if (flag == "--tokens") {
      f.tokens = value;
    } else if (flag == "--layers") {
      f.layers = value;
    } else if (flag == "--ranks") {
      f.ranks = value;
    } else {
      std::fprintf(stderr, "cuda_decode_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (f.context < 1 || f.streams < 1 || f.tokens < 1 || f.layers < 1 || f.ranks < 1 ||
      f.ranks > 8 || f.context % f.ranks != 0) {
    std::fprintf(stderr,
                 "cuda_decode_bench: every flag must be >= 1, --ranks at most 8 and dividing "
                 "--context\n");
    return 2;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "cuda_decode_bench: no CUDA device\n");
    return 1;
  }
  const double bandwidth = CopyBandwidth();
  if (f.ranks == 1) {
    if (absl::Status s = Bench(f, 0, nullptr, bandwidth); !s.ok()) return Fail("bench", s);
    return 0;
  }
  const std::vector<absl::Status> results = dattn::model::cuda::RunNcclRanks(
      static_cast<int>(f.ranks), static_cast<int>(f.ranks),
      [&](int rank, dattn::comm::Communicator&, dattn::comm::Communicator* sp) {
        return Bench(f, rank, sp, bandwidth);
      },
      "decode-bench");
  int rc = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      Fail(absl::StrCat("rank ", r).c_str(), results[r]);
      rc = 1;
    }
  }
  return rc;
}
