// Attend over loopback against the same call made in-process (issue 17's benchmark): one forward of
// dilated attention on bf16 tensors in host memory, (1, N, H, D),
//   in-process: the CUDA backend in this process: q, k, v copied to the GPU (cudaMemcpy from
//     pageable host memory, as a caller's arrays are), the forward, out copied back;
//   Attend, streamed: the same tensors through JobService.Attend to a coordinator on loopback and
//     its GPU worker (which copies them to its GPU as they come and sends out back as it is
//     produced);
//   Attend, shared memory: the same tensors in a shared-memory region of the host
//     (AttendStart.shared_memory; the coordinator runs with --attend-shared-memory): the call
//     carries no tensor, each rank's worker reads its shard from the region and writes its out
//     back (at each ring size of --shared-ranks).
// All count the transfer. Prints a table (median of --rounds calls each, after one warm-up) and
// the ratio of throughputs. With --longest N: one Attend call of N tokens (the engine's own limit
// on one GPU is the target), reported the same way.
//
//   attend_bench --coordinator 127.0.0.1:7070 [--seq-len 1048576] [--heads 16] [--dim 64]
//                [--rounds 3] [--stream-rounds 1] [--longest 0] [--ranks 1] [--shared-ranks 1]
//                [--longest-shared 0]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "engine/attention.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/tensor.h"
#include "grpcpp/grpcpp.h"
#include "tests/attend_client.h"

namespace {

using dattn::AttentionSpec;
using dattn::DType;
using dattn::TensorView;
namespace v1 = dattn::v1;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// bf16 bits of small pseudo-random values (a cheap generator: the values do not matter).
std::string RandomBf16(int64_t count, uint32_t seed) {
  std::string bytes(static_cast<size_t>(count * 2), '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float f = static_cast<float>(static_cast<int32_t>(x & 0xffff) - 32768) / 32768.0f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t b = static_cast<uint16_t>(u >> 16);
    std::memcpy(&bytes[static_cast<size_t>(i * 2)], &b, 2);
  }
  return bytes;
}

float Bf16(const char* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// max |a - b| / (1 + |b|) over `count` bf16 elements.
double MaxBf16Difference(const char* a, const std::string& b, int64_t count) {
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = Bf16(a + 2 * i), y = Bf16(b.data() + 2 * i);
    worst = std::max(worst, std::abs(x - y) / (1 + std::abs(y)));
  }
  return worst;
}

AttentionSpec Spec() {
  AttentionSpec spec;  // The engine benchmark's parity row: the seed library's defaults.
  spec.segment_lengths = {2048, 4096, 8192, 16384};
  spec.dilation_rates = {1, 2, 4, 8};
  return spec;
}

#define CHECK_CUDA(x)                                              \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(2);                                                \
    }                                                              \
  } while (0)

// One in-process forward with the copies: {whole, engine only}.
std::pair<double, double> InProcess(dattn::CudaAttentionBackend& backend,
                                    const std::vector<std::string>& in, std::string* out,
                                    const std::vector<int64_t>& shape, void* const dev[5]) {
  const double t0 = Now();
  for (int i = 0; i < 3; ++i) {
    CHECK_CUDA(cudaMemcpy(dev[i], in[i].data(), in[i].size(), cudaMemcpyHostToDevice));
  }
  auto view = [&](void* p) {
    return TensorView::Contiguous(p, DType::kBFloat16, shape, dattn::Device::kCuda, 0);
  };
  const dattn::ForwardArgs args{
      view(dev[0]), view(dev[1]), view(dev[2]), view(dev[3]),
      TensorView::Contiguous(dev[4], DType::kFloat32, {shape[0], shape[2], shape[1]},
                             dattn::Device::kCuda, 0)};
  const double e0 = Now();
  absl::Status s = backend.Forward(Spec(), args);
  if (s.ok()) s = backend.Synchronize();
  const double e1 = Now();
  if (!s.ok()) {
    std::fprintf(stderr, "forward: %s\n", s.ToString().c_str());
    std::exit(2);
  }
  CHECK_CUDA(cudaMemcpy(out->data(), dev[3], out->size(), cudaMemcpyDeviceToHost));
  return {Now() - t0, e1 - e0};
}

v1::AttendStart StartOf(int64_t n, int64_t heads, int64_t dim, int ranks) {
  v1::AttendStart start;
  const AttentionSpec spec = Spec();
  for (int64_t w : spec.segment_lengths) start.mutable_attention()->add_segment_lengths(w);
  for (int64_t r : spec.dilation_rates) start.mutable_attention()->add_dilation_rates(r);
  start.mutable_shape()->set_batch(1);
  start.mutable_shape()->set_seq_len(n);
  start.mutable_shape()->set_num_heads(heads);
  start.mutable_shape()->set_head_dim(dim);
  start.set_dtype(v1::DTYPE_BF16);
  start.set_num_ranks(ranks);
  start.set_device(v1::DEVICE_PREFERENCE_GPU);
  return start;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Attend over loopback against the same call in-process");
  std::string coordinator = "127.0.0.1:7070";
  int64_t n = int64_t{1} << 20, heads = 16, dim = 64, longest = 0;
  int rounds = 3, ranks = 1, stream_rounds = 1;
  std::vector<int> shared_ranks = {1};
  int64_t longest_shared = 0;
  app.add_option("--coordinator", coordinator, "a coordinator started --insecure");
  app.add_option("--seq-len", n);
  app.add_option("--heads", heads);
  app.add_option("--dim", dim);
  app.add_option("--rounds", rounds);
  app.add_option("--ranks", ranks, "ring size of the Attend calls");
  app.add_option("--stream-rounds", stream_rounds, "streamed Attend calls timed (0: none)");
  app.add_option("--shared-ranks", shared_ranks, "ring sizes of the shared-memory Attend rows")
      ->delimiter(',');
  app.add_option("--longest", longest, "also one Attend call of this many tokens (0: none)");
  app.add_option("--longest-shared", longest_shared,
                 "also one shared-memory Attend call of this many tokens on the largest of "
                 "--shared-ranks (0: none)");
  CLI11_PARSE(app, argc, argv);

  const std::vector<int64_t> shape = {1, n, heads, dim};
  const int64_t elems = n * heads * dim;
  std::vector<std::string> in;
  for (int i = 0; i < 3; ++i) in.push_back(RandomBf16(elems, 11 + i));
  std::string out(static_cast<size_t>(elems * 2), '\0');
  const double moved = 4.0 * static_cast<double>(elems) * 2;  // q, k, v in; out back.

  // In-process.
  std::vector<double> whole, engine;
  {
    absl::StatusOr<std::unique_ptr<dattn::CudaAttentionBackend>> backend = dattn::NewCudaBackend();
    if (!backend.ok()) {
      std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
      return 2;
    }
    void* dev[5];
    for (int i = 0; i < 4; ++i) CHECK_CUDA(cudaMalloc(&dev[i], static_cast<size_t>(elems * 2)));
    CHECK_CUDA(cudaMalloc(&dev[4], static_cast<size_t>(heads * n * 4)));
    InProcess(**backend, in, &out, shape, dev);  // Warm-up: plans, first use.
    for (int r = 0; r < rounds; ++r) {
      auto [w, e] = InProcess(**backend, in, &out, shape, dev);
      whole.push_back(w);
      engine.push_back(e);
    }
    for (void* p : dev) CHECK_CUDA(cudaFree(p));
  }
  const std::string in_process_out = out;

  // Attend.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::JobService::NewStub(
      grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), args));
  std::vector<double> call, call_engine;
  bool same = true;
  for (int r = 0; r <= stream_rounds && stream_rounds > 0; ++r) {  // Round 0 warms up.
    dattn::testing::AttendAnswer a = dattn::testing::CallAttend(
        *stub, StartOf(n, heads, dim, ranks), in, int64_t{4} << 20, std::chrono::seconds(600));
    if (!a.status.ok() || !a.has_done) {
      std::fprintf(stderr, "attend: %s\n", a.status.error_message().c_str());
      return 1;
    }
    same = same && a.outputs.size() == 1 && a.outputs[0] == in_process_out;
    if (r == 0) continue;
    call.push_back(a.seconds);
    call_engine.push_back(a.done.seconds_per_step());
  }

  // Shared memory: the inputs written into the region once (as a caller that keeps its arrays
  // there would), then the calls.
  const int64_t tensor_bytes = elems * 2;
  auto made = dattn::client::SharedRegion::Create(4 * tensor_bytes, "bench");
  if (!made.ok()) {
    std::fprintf(stderr, "shared memory: %s\n", made.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<dattn::client::SharedRegion> region = *std::move(made);
  for (int i = 0; i < 3; ++i) {
    std::memcpy(region->data() + i * tensor_bytes, in[static_cast<size_t>(i)].data(),
                static_cast<size_t>(tensor_bytes));
  }
  char* const region_out = region->data() + dattn::client::SharedRegion::Offset(
                                                v1::ATTEND_TENSOR_OUT, tensor_bytes, false);
  struct SharedRow {
    int ranks;
    double call, engine;
  };
  std::vector<SharedRow> shared_rows;
  double ring_error = 0;
  for (int p : shared_ranks) {
    std::vector<double> sc, se;
    for (int r = 0; r <= rounds; ++r) {  // Round 0 warms the ring up.
      v1::AttendStart start = StartOf(n, heads, dim, p);
      *start.mutable_shared_memory() = region->Place(tensor_bytes, false);
      std::memset(region_out, 0, static_cast<size_t>(tensor_bytes));
      dattn::testing::AttendAnswer a =
          dattn::testing::CallAttend(*stub, start, {}, int64_t{4} << 20, std::chrono::seconds(600));
      if (!a.status.ok() || !a.has_done) {
        std::fprintf(stderr, "shared-memory attend at %d ranks: %s\n", p,
                     a.status.error_message().c_str());
        return 1;
      }
      if (p == 1) {
        same = same && std::memcmp(region_out, in_process_out.data(),
                                   static_cast<size_t>(tensor_bytes)) == 0;
      } else {
        // A ring sums its blocks in another order: close to the single-device out, not equal.
        ring_error = std::max(ring_error, MaxBf16Difference(region_out, in_process_out, elems));
      }
      if (r == 0) continue;
      sc.push_back(a.seconds);
      se.push_back(a.done.seconds_per_step());
    }
    shared_rows.push_back({p, Median(sc), Median(se)});
  }

  std::printf(
      "| path | N | call s | engine s | transfer GB/s (4 tensors) | tokens/s | vs in-process |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const double ip = Median(whole);
  std::printf("| in-process (H2D, forward, D2H) | %lld | %.3f | %.4f | %.2f | %.3g | 1.00 |\n",
              static_cast<long long>(n), ip, Median(engine), moved / (ip - Median(engine)) / 1e9,
              static_cast<double>(n) / ip);
  if (!call.empty()) {
    const double at = Median(call);
    std::printf(
        "| Attend streamed over loopback, %d rank(s) | %lld | %.3f | %.4f | %.2f | %.3g | "
        "%.3f |\n",
        ranks, static_cast<long long>(n), at, Median(call_engine),
        moved / (at - Median(call_engine)) / 1e9, static_cast<double>(n) / at, ip / at);
  }
  for (const SharedRow& row : shared_rows) {
    std::printf("| Attend, shared memory, %d rank(s) | %lld | %.3f | %.4f | %.2f | %.3g | %.3f |\n",
                row.ranks, static_cast<long long>(n), row.call, row.engine,
                moved / (row.call - row.engine) / 1e9, static_cast<double>(n) / row.call,
                ip / row.call);
  }
  std::printf("out of every one-rank Attend %s the in-process out, bit for bit\n",
              same ? "equals" : "DIFFERS from");
  if (std::any_of(shared_ranks.begin(), shared_ranks.end(), [](int p) { return p > 1; })) {
    std::printf("rings: largest |out - in-process out| / (1 + |in-process out|) = %.3g%s\n",
                ring_error, ring_error > 2e-2 ? " (TOO LARGE)" : "");
    same = same && ring_error <= 2e-2;
  }
  region.reset();

  if (longest_shared > 0 && !shared_ranks.empty()) {
    const int p = *std::max_element(shared_ranks.begin(), shared_ranks.end());
    const int64_t big_bytes = longest_shared * heads * dim * 2;
    auto big_made = dattn::client::SharedRegion::Create(4 * big_bytes, "bench");
    if (!big_made.ok()) {
      std::printf("| longest Attend, shared memory, %d rank(s) | %lld | - | - | - | - | %s |\n", p,
                  static_cast<long long>(longest_shared),
                  std::string(big_made.status().message()).c_str());
    } else {
      std::unique_ptr<dattn::client::SharedRegion> big = *std::move(big_made);
      for (int i = 0; i < 3; ++i) {
        const std::string part =
            RandomBf16(int64_t{1} << 20, 31 + i);  // Tiled: values do not matter.
        for (int64_t at = 0; at < big_bytes; at += static_cast<int64_t>(part.size())) {
          std::memcpy(big->data() + i * big_bytes + at, part.data(),
                      static_cast<size_t>(std::min<int64_t>(part.size(), big_bytes - at)));
        }
      }
      v1::AttendStart start = StartOf(longest_shared, heads, dim, p);
      *start.mutable_shared_memory() = big->Place(big_bytes, false);
      dattn::testing::AttendAnswer a =
          dattn::testing::CallAttend(*stub, start, {}, int64_t{4} << 20, std::chrono::seconds(900));
      std::printf(
          "| longest Attend, shared memory, %d rank(s) | %lld | %.3f | %.4f | %.2f | %.3g | "
          "%s |\n",
          p, static_cast<long long>(longest_shared), a.seconds, a.done.seconds_per_step(),
          4.0 * static_cast<double>(big_bytes) / (a.seconds - a.done.seconds_per_step()) / 1e9,
          static_cast<double>(longest_shared) / a.seconds,
          a.status.ok() ? "ok" : a.status.error_message().c_str());
    }
  }

  if (longest > 0) {
    const int64_t e2 = longest * heads * dim;
    std::vector<std::string> big;
    for (int i = 0; i < 3; ++i) big.push_back(RandomBf16(e2, 21 + i));
    dattn::testing::AttendAnswer a =
        dattn::testing::CallAttend(*stub, StartOf(longest, heads, dim, ranks), big,
                                   int64_t{4} << 20, std::chrono::seconds(900));
    std::printf("| longest Attend, %d rank(s) | %lld | %.3f | %.4f | %.2f | %.3g | %s |\n", ranks,
                static_cast<long long>(longest), a.seconds, a.done.seconds_per_step(),
                4.0 * static_cast<double>(e2) * 2 / (a.seconds - a.done.seconds_per_step()) / 1e9,
                static_cast<double>(longest) / a.seconds,
                a.status.ok() ? "ok" : a.status.error_message().c_str());
  }
  return same ? 0 : 1;
}
