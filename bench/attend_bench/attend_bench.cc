// Attend over loopback against the same call made in-process (issue 17's benchmark): one forward of
// dilated attention on bf16 tensors in host memory, (1, N, H, D),
//   in-process: the CUDA backend in this process: q, k, v copied to the GPU (cudaMemcpy from
//     pageable host memory, as a caller's arrays are), the forward, out copied back;
//   Attend: the same tensors through JobService.Attend to a coordinator on loopback and its GPU
//     worker (which copies them to its GPU as they come and sends out back as it is produced).
// Both count the transfer. Prints a table (median of --rounds calls each, after one warm-up) and
// the ratio of throughputs. With --longest N: one Attend call of N tokens (the engine's own limit
// on one GPU is the target), reported the same way.
//
//   attend_bench --coordinator 127.0.0.1:7070 [--seq-len 1048576] [--heads 16] [--dim 64]
//                [--rounds 3] [--longest 0] [--ranks 1]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
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
  int rounds = 3, ranks = 1;
  app.add_option("--coordinator", coordinator, "a coordinator started --insecure");
  app.add_option("--seq-len", n);
  app.add_option("--heads", heads);
  app.add_option("--dim", dim);
  app.add_option("--rounds", rounds);
  app.add_option("--ranks", ranks, "ring size of the Attend calls");
  app.add_option("--longest", longest, "also one Attend call of this many tokens (0: none)");
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
  for (int r = 0; r <= rounds; ++r) {  // Round 0 warms the worker up.
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
  std::printf(
      "| path | N | call s | engine s | transfer GB/s (4 tensors) | tokens/s | vs in-process |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const double ip = Median(whole), at = Median(call);
  std::printf("| in-process (H2D, forward, D2H) | %lld | %.3f | %.4f | %.2f | %.3g | 1.00 |\n",
              static_cast<long long>(n), ip, Median(engine), moved / (ip - Median(engine)) / 1e9,
              static_cast<double>(n) / ip);
  std::printf("| Attend over loopback, %d rank(s) | %lld | %.3f | %.4f | %.2f | %.3g | %.3f |\n",
              ranks, static_cast<long long>(n), at, Median(call_engine),
              moved / (at - Median(call_engine)) / 1e9, static_cast<double>(n) / at, ip / at);
  std::printf("out of Attend %s the in-process out, bit for bit\n",
              same ? "equals" : "DIFFERS from");

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
