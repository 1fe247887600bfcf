// The Attend check of a running cluster (scripts/gpu-attend-check.sh): calls JobService.Attend on
// random tensors of each dtype at each ring size, forward and backward, grouped causal and mixture,
// and compares out, dq, dk and dv with the CPU backend in fp64 run here on the same (rounded)
// inputs, with docs/ENGINE.md's tolerances (relative Frobenius error: fp32 1e-5, fp16 2e-3, bf16
// 1e-2). Prints a table, one row per call, and exits 0 when every row passed, 1 otherwise, 2 for
// bad flags or an unreachable coordinator.
//
//   attend_check --coordinator 127.0.0.1:7070 --device gpu --dtypes bf16,fp16 --ranks 1,2,4
//                [--seq-len 16384] [--heads 8] [--dim 64] [--threads 16]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/attention.h"
#include "engine/cpu_backend.h"
#include "engine/tensor.h"
#include "engine/testing/test_util.h"
#include "engine/validate.h"
#include "grpcpp/grpcpp.h"
#include "tests/attend_client.h"

namespace {

using dattn::AttentionMode;
using dattn::AttentionSpec;
using dattn::DType;
using dattn::TensorView;
namespace v1 = dattn::v1;

struct Case {
  const char* name;
  bool mixture;
  bool causal;
};

// out, dq, dk, dv of `spec` on the CPU backend in fp64.
std::vector<std::vector<double>> Reference(const AttentionSpec& spec,
                                           const std::vector<int64_t>& shape,
                                           std::vector<std::vector<double>> in, int threads) {
  const size_t n = in[0].size();
  std::vector<std::vector<double>> out(4, std::vector<double>(n));
  std::vector<double> lse(static_cast<size_t>(shape[0] * shape[1] * shape[2]));
  auto view = [&](std::vector<double>& x) {
    return TensorView::Contiguous(x.data(), DType::kFloat64, shape);
  };
  dattn::CpuBackendOptions options;
  options.num_threads = threads;
  std::unique_ptr<dattn::AttentionBackend> cpu = dattn::NewCpuBackend(options);
  dattn::ForwardArgs f{
      view(in[0]), view(in[1]), view(in[2]), view(out[0]),
      TensorView::Contiguous(lse.data(), DType::kFloat64, {shape[0], shape[2], shape[1]})};
  absl::Status s = cpu->Forward(spec, f);
  dattn::BackwardArgs b{view(in[0]), view(in[1]),  view(in[2]),  view(out[0]), f.lse,
                        view(in[3]), view(out[1]), view(out[2]), view(out[3])};
  if (s.ok()) s = cpu->Backward(spec, b);
  if (!s.ok()) {
    std::fprintf(stderr, "attend_check: the CPU reference failed: %s\n", s.ToString().c_str());
    std::exit(2);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Attend check: a cluster's Attend calls against the CPU backend in fp64");
  std::string coordinator = "127.0.0.1:7070", device = "gpu", dtypes = "bf16,fp16",
              ranks_text = "1,2,4";
  int64_t seq_len = 16384, heads = 8, dim = 64;
  int threads = 0;
  app.add_option("--coordinator", coordinator, "HOST:PORT of a coordinator started --insecure");
  app.add_option("--device", device, "gpu or cpu");
  app.add_option("--dtypes", dtypes, "comma-separated: fp32, fp16, bf16, fp64");
  app.add_option("--ranks", ranks_text, "comma-separated ring sizes");
  app.add_option("--seq-len", seq_len, "N");
  app.add_option("--heads", heads, "H");
  app.add_option("--dim", dim, "D");
  app.add_option("--threads", threads, "CPU threads of the reference (0: all)");
  CLI11_PARSE(app, argc, argv);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(coordinator, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(channel);

  // The seed library's pattern shape, scaled to N: segments N/8 .. N/2, rates 1, 2, 4.
  AttentionSpec spec;
  spec.segment_lengths = {seq_len / 8, seq_len / 4, seq_len / 2};
  spec.dilation_rates = {1, 2, 4};
  const std::vector<int64_t> shape = {1, seq_len, heads, dim};
  const int64_t n = seq_len * heads * dim;
  const Case cases[] = {{"grouped causal", false, true}, {"mixture", true, false}};
  std::printf("| dtype | ranks | case | out | dq | dk | dv | tol | call s | engine s | result |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  int failed = 0;
  uint64_t seed = 1;
  for (const std::string& dtype_text : std::vector<std::string>(absl::StrSplit(dtypes, ','))) {
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    DType engine_dtype = DType::kFloat32;
    if (dtype_text == "fp32") dtype = v1::DTYPE_FP32, engine_dtype = DType::kFloat32;
    if (dtype_text == "fp64") dtype = v1::DTYPE_FP64, engine_dtype = DType::kFloat64;
    if (dtype_text == "fp16") dtype = v1::DTYPE_FP16, engine_dtype = DType::kFloat16;
    if (dtype_text == "bf16") dtype = v1::DTYPE_BF16, engine_dtype = DType::kBFloat16;
    if (dtype == v1::DTYPE_UNSPECIFIED) {
      std::fprintf(stderr, "attend_check: unknown dtype %s\n", dtype_text.c_str());
      return 2;
    }
    const double tol = dattn::testutil::SpecTolerance(engine_dtype);
    for (const Case& c : cases) {
      spec.mode = c.mixture ? AttentionMode::kMixture : AttentionMode::kGrouped;
      spec.causal = c.causal;
      // Inputs rounded to the dtype: the reference sees what the workers see.
      std::vector<std::vector<double>> in;
      std::vector<std::string> bytes;
      for (int t = 0; t < 4; ++t) {
        bytes.push_back(
            dattn::testing::EncodeElements(dattn::testutil::RandomValues(n, seed++), dtype));
        in.push_back(dattn::testing::DecodeElements(bytes.back(), dtype));
      }
      const std::vector<std::vector<double>> want = Reference(spec, shape, in, threads);
      for (const std::string& ranks : std::vector<std::string>(absl::StrSplit(ranks_text, ','))) {
        v1::AttendStart start;
        for (int64_t w : spec.segment_lengths) start.mutable_attention()->add_segment_lengths(w);
        for (int64_t r : spec.dilation_rates) start.mutable_attention()->add_dilation_rates(r);
        start.mutable_attention()->set_causal(c.causal);
        start.mutable_attention()->set_mode(c.mixture ? v1::ATTENTION_MODE_MIXTURE
                                                      : v1::ATTENTION_MODE_GROUPED);
        start.mutable_shape()->set_batch(1);
        start.mutable_shape()->set_seq_len(seq_len);
        start.mutable_shape()->set_num_heads(heads);
        start.mutable_shape()->set_head_dim(dim);
        start.set_dtype(dtype);
        start.set_num_ranks(std::atoi(ranks.c_str()));
        start.set_backward(true);
        start.set_device(device == "cpu" ? v1::DEVICE_PREFERENCE_CPU : v1::DEVICE_PREFERENCE_GPU);
        dattn::testing::AttendAnswer a = dattn::testing::CallAttend(
            *stub, start, bytes, int64_t{4} << 20, std::chrono::seconds(600));
        std::string errors;
        bool pass =
            a.status.ok() && a.has_done && a.protocol_error.empty() && a.outputs.size() == 4;
        for (size_t t = 0; t < 4; ++t) {
          if (!pass || t >= a.outputs.size()) {
            errors += " - |";
            continue;
          }
          const double e = dattn::testutil::RelativeError(
              dattn::testing::DecodeElements(a.outputs[t], dtype), want[t]);
          pass &= e <= tol;
          errors += absl::StrFormat(" %.2e |", e);
        }
        failed += !pass;
        std::printf("| %s | %s | %s |%s %.0e | %.2f | %.4f | %s |\n", dtype_text.c_str(),
                    ranks.c_str(), c.name, errors.c_str(), tol, a.seconds,
                    a.done.seconds_per_step(),
                    pass ? "PASS" : (a.status.ok() ? "FAIL" : a.status.error_message().c_str()));
        std::fflush(stdout);
      }
    }
  }
  std::printf("%d of the rows failed\n", failed);
  return failed == 0 ? 0 : 1;
}
