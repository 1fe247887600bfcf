// A coordinator and CPU workers on loopback, started from the real binaries, for multi-process
// tests.
//
// Every daemon listens on an ephemeral 127.0.0.1 port (the coordinator prints the ports it bound),
// so tests may run in parallel. The cluster owns its processes; the destructor SIGKILLs what still
// runs. Not thread-safe: one test thread drives it.
#ifndef DATTN_TESTS_CLUSTER_H_
#define DATTN_TESTS_CLUSTER_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dattn/v1/admin.grpc.pb.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "tests/process.h"

namespace dattn::testing {

struct ClusterOptions {
  std::string name = "cluster";
  int dead_after_ms = 3000;  // Short, so worker-loss tests finish quickly.
  int heartbeat_ms = 300;
  int max_attempts = 3;
  int ring_formation_timeout_ms = 10000;
  int ring_timeout_ms = 20000;
  // More coordinator flags (e.g. --feasibility-settle-ms=...).
  std::vector<std::string> coordinator_flags;
  // TLS with a cluster CA (scripts/make-certs.sh), workers with certificates and clients with
  // tokens, as a real deployment runs; false: every daemon --insecure.
  bool secure = true;
};

// The tokens a secure cluster makes: an admin (tenant "ops") and two users.
inline constexpr char kAdmin[] = "admin";
inline constexpr char kAlice[] = "alice";  // user of tenant "alice"
inline constexpr char kBob[] = "bob";      // user of tenant "bob"

class Cluster {
 public:
  explicit Cluster(ClusterOptions options = {});
  ~Cluster();

  // Starts (or restarts, on the same data dir and port) the coordinator; false + *error on failure.
  bool StartCoordinator(std::string* error);
  // The coordinator and `workers` one-thread workers, waiting (up to 30 s) until all are READY;
  // false + *error (with the daemons' logs) on failure.
  bool Start(int workers, std::string* error);
  // Adds a worker with `threads` engine threads (and `flags` more); returns its index. Its name is
  // `name`, or "worker-INDEX".
  int AddWorker(int threads, std::string* error, const std::string& name = "",
                const std::vector<std::string>& flags = {});
  // The index of the worker started under `name`, or -1.
  int WorkerIndex(const std::string& name) const;
  // The registered name of worker id `worker_id` (ListWorkers, dead ones included), or "".
  std::string WorkerName(const std::string& worker_id);
  // Waits until `count` workers are READY in ListWorkers.
  bool WaitForReadyWorkers(int count, std::chrono::milliseconds timeout);

  Process& coordinator() { return *coordinator_; }
  Process& worker(int i) { return *workers_[i]; }
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  const std::string& data_dir() const { return data_dir_; }
  const std::string& dir() const { return dir_; }

  // Runs the dattn CLI with DATTN_COORDINATOR pointing at this cluster (and, when secure,
  // DATTN_TLS_CA and the admin's DATTN_TOKEN).
  ProcessResult Cli(const std::vector<std::string>& args,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60),
                    const std::map<std::string, std::string>& env = {});

  // Secure clusters: the CA, the worker certificate and key, the token file, and the token of
  // kAdmin, kAlice or kBob ("" for another name or an insecure cluster).
  bool secure() const { return options_.secure; }
  const std::string& ca_file() const { return ca_file_; }
  const std::string& certs_dir() const { return certs_dir_; }
  const std::string& token_file() const { return token_file_; }
  std::string token(const std::string& who) const;
  // A channel to the coordinator carrying `token` (TLS when secure).
  std::shared_ptr<grpc::Channel> ChannelWithToken(const std::string& token) const;
  // The flags that give a worker the cluster's certificate (or --insecure).
  std::vector<std::string> WorkerSecurityFlags() const;

  dattn::v1::JobService::Stub& jobs();
  dattn::v1::AdminService::Stub& admin();
  // Waits until the job is in a terminal state; returns the last Job seen (with events).
  bool WaitForJobEnd(const std::string& job_id, std::chrono::milliseconds timeout,
                     dattn::v1::Job* job);
  bool WaitForJobState(const std::string& job_id, dattn::v1::JobState state,
                       std::chrono::milliseconds timeout, dattn::v1::Job* job);
  // All daemons' stderr, for failure messages.
  std::string Logs();

 private:
  void Connect();

  ClusterOptions options_;
  std::string dir_;
  std::string data_dir_;
  std::string address_;  // host:port of gRPC, fixed after the first start.
  std::string metrics_address_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
  int coordinator_starts_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dattn::v1::JobService::Stub> jobs_;
  std::unique_ptr<dattn::v1::AdminService::Stub> admin_;
  std::string certs_dir_;
  std::string ca_file_;
  std::string token_file_;
  std::map<std::string, std::string> tokens_;  // kAdmin, kAlice, kBob -> token.
};

// The first job id ("j-" + hex) in a CLI's output, or "".
std::string JobIdFrom(const std::string& text);
// Whether the job's events include one of `kind`.
bool HasEvent(const dattn::v1::Job& job, const std::string& kind);
// A job's events, one "kind: message" line each, for failure messages.
std::string EventsText(const dattn::v1::Job& job);
// The data of a .npy file (what `dattn output` and --output-file write), after its header; the
// header's dict in *dict when given. Empty when the file is missing or not a .npy.
std::string ReadNpyData(const std::string& path, std::string* dict = nullptr);

}  // namespace dattn::testing

#endif  // DATTN_TESTS_CLUSTER_H_
