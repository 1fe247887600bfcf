// Durable SubmitJob throughput and latency: C concurrent clients, each on its own connection,
// submit attention jobs with fresh idempotency keys as fast as the coordinator acknowledges them,
// for a fixed time. Every acknowledgement means the job is committed to the store (fsync'ed).
// Prints one table.
//
//   submit_bench --coordinator=127.0.0.1:7070 [--clients=8] [--seconds=10] [--label=NAME]
//                [--tls-ca=CA.pem --token=TOKEN]
//
// With --tls-ca the connections are TLS (the coordinator's certificate checked against the CA) and
// every call carries the bearer token (an admin's: the jobs name several tenants).
// bench/submit/run.sh starts a plaintext and a TLS coordinator on fresh data dirs and runs this
// against each, in one run.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dattn/v1/job_service.grpc.pb.h"
#include "security/tls.h"

namespace {

struct ClientStats {
  std::vector<double> latencies_ms;
  int64_t errors = 0;
  std::string first_error;
};

dattn::v1::SubmitJobRequest MakeRequest(int client, int64_t i) {
  dattn::v1::SubmitJobRequest req;
  req.set_idempotency_key(
      "bench-" + std::to_string(client) + "-" + std::to_string(i) + "-" +
      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  auto* spec = req.mutable_spec();
  spec->set_name("submit-bench");
  spec->set_tenant("bench-" + std::to_string(client % 4));
  auto* a = spec->mutable_attention();
  a->mutable_attention()->add_segment_lengths(2048);
  a->mutable_attention()->add_segment_lengths(4096);
  a->mutable_attention()->add_dilation_rates(1);
  a->mutable_attention()->add_dilation_rates(2);
  a->mutable_shape()->set_batch(1);
  a->mutable_shape()->set_seq_len(8192);
  a->mutable_shape()->set_num_heads(8);
  a->mutable_shape()->set_head_dim(64);
  a->set_dtype(dattn::v1::DTYPE_FP32);
  a->set_num_ranks(1);
  a->set_iterations(1);
  a->set_seed(static_cast<uint64_t>(i));
  return req;
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:7070";
  int clients = 8;
  double seconds = 10;
  std::string label = "plaintext";
  std::string tls_ca;
  std::string token;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      std::string prefix = std::string(name) + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--coordinator")) {
      address = v;
    } else if (const char* v = value("--clients")) {
      clients = std::atoi(v);
    } else if (const char* v = value("--seconds")) {
      seconds = std::atof(v);
    } else if (const char* v = value("--label")) {
      label = v;
    } else if (const char* v = value("--tls-ca")) {
      tls_ca = v;
    } else if (const char* v = value("--token")) {
      token = v;
    } else {
      std::fprintf(stderr,
                   "unknown argument %s\nusage: %s --coordinator=HOST:PORT [--clients=N] "
                   "[--seconds=S] [--label=NAME] [--tls-ca=FILE --token=TOKEN]\n",
                   argv[i], argv[0]);
      return 2;
    }
  }
  if (clients < 1 || seconds <= 0) {
    std::fprintf(stderr, "--clients must be >= 1 and --seconds > 0\n");
    return 2;
  }

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!tls_ca.empty()) {
    dattn::security::TlsFiles files;
    files.ca_file = tls_ca;
    auto tls = dattn::security::ChannelCredentials(files);
    if (!tls.ok()) {
      std::fprintf(stderr, "%s\n", std::string(tls.status().message()).c_str());
      return 2;
    }
    credentials = *tls;
  }
  const std::string authorization = token.empty() ? "" : "Bearer " + token;

  std::vector<ClientStats> stats(static_cast<size_t>(clients));
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  const auto duration = std::chrono::duration<double>(seconds);
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      // A distinct channel argument gives each client its own TCP connection.
      grpc::ChannelArguments args;
      args.SetInt("dattn.bench.client", c);
      auto channel = grpc::CreateCustomChannel(address, credentials, args);
      auto stub = dattn::v1::JobService::NewStub(channel);
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
      while (!go.load()) std::this_thread::yield();
      const auto end = std::chrono::steady_clock::now() + duration;
      ClientStats& s = stats[static_cast<size_t>(c)];
      for (int64_t i = 0; std::chrono::steady_clock::now() < end; ++i) {
        dattn::v1::SubmitJobRequest req = MakeRequest(c, i);
        dattn::v1::SubmitJobResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
        const auto t0 = std::chrono::steady_clock::now();
        grpc::Status st = stub->SubmitJob(&ctx, req, &resp);
        const auto t1 = std::chrono::steady_clock::now();
        if (st.ok() && resp.created()) {
          s.latencies_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        } else {
          if (s.errors++ == 0) s.first_error = st.ok() ? "not created" : st.error_message();
        }
      }
    });
  }
  const auto start = std::chrono::steady_clock::now();
  go = true;
  for (auto& t : threads) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> all;
  int64_t errors = 0;
  for (auto& s : stats) {
    all.insert(all.end(), s.latencies_ms.begin(), s.latencies_ms.end());
    errors += s.errors;
    if (!s.first_error.empty()) std::fprintf(stderr, "client error: %s\n", s.first_error.c_str());
  }
  const double rate = static_cast<double>(all.size()) / elapsed;
  std::vector<double> copy = all;
  const double p50 = Percentile(copy, 0.50);
  const double p99 = Percentile(copy, 0.99);
  const double max = all.empty() ? 0 : *std::max_element(all.begin(), all.end());
  // One row; run.sh prints the header once for both transports.
  std::printf("| %s | %d | %.1f | %zu | %lld | %.0f | %.2f | %.2f | %.2f |\n", label.c_str(),
              clients, elapsed, all.size(), static_cast<long long>(errors), rate, p50, p99, max);
  return errors > 0 ? 1 : 0;
}
