// dattn-coordinator: the daemon that owns the job store, schedules work on workers and serves the
// dattn.v1 API (see server/coordinator.h for what it promises).
//
// Start-up: metrics endpoint, then the gRPC server (live, health NOT_SERVING, calls answer
// UNAVAILABLE), then the store is opened and active jobs recovered, then health turns SERVING and
// "dattn-coordinator listening on ADDR, metrics on ADDR" is printed to stderr: scripts wait for
// that line. Exit codes: 0 after a clean shutdown, 1 when start-up or the final store flush fails,
// 2 for bad flags.
#include <arpa/inet.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "metrics/metrics_server.h"
#include "security/tls.h"
#include "security/tokens.h"
#include "server/access.h"
#include "server/coordinator.h"
#include "server/grpc_service.h"
#include "server/job_store.h"
#include "server/metrics.h"

namespace {

void Say(const std::string& message) {
  std::fprintf(stderr, "dattn-coordinator: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  using dattn::metrics::MetricsServer;
  using dattn::server::Coordinator;
  using dattn::server::CoordinatorOptions;
  using dattn::server::GrpcServer;
  using dattn::server::Metrics;
  // Buffers of 1 MiB and more (Attend's and ReadOutput's 4 MiB chunks) are mapped for each use and
  // unmapped when freed. By default glibc raises its mmap threshold to the size of the first large
  // block freed, after which every relayed chunk comes from a thread's malloc arena and its memory
  // stays there: the coordinator's resident memory grew by about 200 MiB relaying a 256 MiB
  // tensor whose queues never held more than 16 MiB (tests/attend_e2e_test). Setting the
  // threshold fixes it (and turns the dynamic adjustment off).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // And two malloc arenas, not glibc's default of eight per core: the smaller pieces (gRPC's slices
  // and messages) that threads allocate and other threads free spread over every arena's free
  // lists, and each arena keeps its own high-water mark. Relaying that 256 MiB tensor on 2 cores
  // (16 arenas) raised the resident memory by 122-261 MiB from run to run (one CI run failed the
  // test's bound on it); with 2 arenas by 99-149 MiB (20 runs), with 1 by 73-115 MiB (11). Durable
  // submits/s did not change measurably (bench/submit, 8 clients: within run-to-run noise); the
  // coordinator moves bytes and writes SQLite, and small blocks come from per-thread caches anyway.
  mallopt(M_ARENA_MAX, 2);

  std::string listen = "127.0.0.1:7070";
  std::string metrics_listen = "127.0.0.1:7071";
  std::string data_dir = "./dattn-data";
  int64_t dead_after_ms = 10000;
  int64_t heartbeat_ms = 2000;
  int max_attempts = 3;
  int64_t drain_timeout_ms = 10000;
  int64_t progress_interval_ms = 1000;
  std::string rendezvous_listen;
  std::string rendezvous_advertise;
  int64_t ring_formation_timeout_ms = 30000;
  int64_t ring_timeout_ms = 120000;
  int64_t feasibility_settle_ms = 5000;
  int64_t store_probe_ms = 5000;
  int max_watch_streams = 256;
  int max_streams_per_client = 64;
  double retention_hours = 24 * 7;
  bool attend_shared_memory = false;
  dattn::security::TlsFiles tls;
  int64_t tenant_max_queued_jobs = 0;
  double tenant_submits_per_second = 0;
  int tenant_max_running_ranks = 0;
  int64_t tenant_max_deployments = 0;
  std::string token_file;
  std::string audit_log;
  bool insecure = false;

  CLI::App app{
      "dattn-coordinator: accepts dilated-attention jobs over gRPC and runs them on workers"};
  app.add_option("--listen", listen, "gRPC address HOST:PORT (port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--metrics-listen", metrics_listen,
                 "HTTP address HOST:PORT of /metrics (Prometheus), /healthz (liveness) and / "
                 "(port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir, "folder of the job store (jobs.db); created if missing")
      ->capture_default_str();
  std::string model_dir;
  app.add_option("--model-dir", model_dir,
                 "folder of the model registry (`dattn models import`); workers load from it at "
                 "the same path (default: DATA_DIR/models)");
  app.add_option("--dead-after-ms", dead_after_ms,
                 "a worker silent this long is dead and its jobs are recovered")
      ->check(CLI::Range(int64_t{1}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat interval workers are told to use")
      ->check(CLI::Range(int64_t{1}, int64_t{3600} * 1000))
      ->capture_default_str();
  app.add_option("--max-attempts", max_attempts, "most runs of one job before it fails")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", drain_timeout_ms,
                 "on SIGTERM/SIGINT, how long running jobs may finish before they are requeued")
      ->check(CLI::Range(int64_t{0}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--progress-interval-ms", progress_interval_ms,
                 "most frequent stored progress event per job")
      ->check(CLI::Range(int64_t{0}, int64_t{3600} * 1000))
      ->capture_default_str();
  app.add_option("--rendezvous-listen", rendezvous_listen,
                 "numeric IPv4 address the rings' rendezvous stores listen on, each on an "
                 "ephemeral port (default: the host of --listen)");
  app.add_option("--rendezvous-advertise", rendezvous_advertise,
                 "numeric IPv4 address workers dial for the rendezvous stores (default: "
                 "--rendezvous-listen; required when that is 0.0.0.0)");
  app.add_option("--ring-formation-timeout-ms", ring_formation_timeout_ms,
                 "how long the ranks of a ring wait for each other before the formation fails")
      ->check(CLI::Range(int64_t{1}, int64_t{3600} * 1000))
      ->capture_default_str();
  app.add_option("--ring-timeout-ms", ring_timeout_ms,
                 "longest wait for a ring peer once the ring is formed")
      ->check(CLI::Range(int64_t{1}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--feasibility-settle-ms", feasibility_settle_ms,
                 "how long the set of ready workers must stay unchanged before jobs queued "
                 "without a check are checked against it")
      ->check(CLI::Range(int64_t{0}, int64_t{24} * 3600 * 1000))
      ->capture_default_str();
  app.add_option("--store-probe-ms", store_probe_ms,
                 "a job store with no commit for this long gets a probe write, so that a store "
                 "that can no longer be written makes the coordinator not ready before a real "
                 "write fails")
      ->check(CLI::Range(int64_t{1}, int64_t{3600} * 1000))
      ->capture_default_str();
  app.add_option("--max-watch-streams", max_watch_streams,
                 "most WatchJob streams open at once (each holds a server thread); more are "
                 "refused with RESOURCE_EXHAUSTED")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--max-streams-per-client", max_streams_per_client,
                 "open WatchJob and ReadOutput streams of one client (token; peer address with "
                 "--insecure) at most; more get RESOURCE_EXHAUSTED")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--attend-shared-memory", attend_shared_memory,
               "take Attend calls whose tensors are in a shared-memory region of this host "
               "(AttendStart.shared_memory; docs/ATTEND.md) from callers on this host");
  app.add_option("--retention-hours", retention_hours,
                 "finished jobs, their history and their outputs are deleted this long after they "
                 "finished (fractions allowed); 0 keeps them for ever")
      ->check(CLI::Range(0.0, 24.0 * 365 * 100))
      ->capture_default_str();
  app.add_option("--tenant-max-queued-jobs", tenant_max_queued_jobs,
                 "most queued jobs of one tenant; more submits get RESOURCE_EXHAUSTED (0: no "
                 "limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--tenant-submits-per-second", tenant_submits_per_second,
                 "most new jobs a second of one tenant, with bursts of as many (0: no limit)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--tenant-max-running-ranks", tenant_max_running_ranks,
                 "most ranks (GPUs, CPU worker slots) one tenant's jobs hold at once; more wait "
                 "in the queue, and a job asking for more is refused (0: no limit)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--tenant-max-deployments", tenant_max_deployments,
                 "most deployments of one tenant queued or serving at once; more get "
                 "RESOURCE_EXHAUSTED (0: no limit)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--tls-cert", tls.cert_file,
                 "PEM certificate of the API and the rendezvous stores (scripts/make-certs.sh); "
                 "re-read when it changes");
  app.add_option("--tls-key", tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", tls.ca_file,
                 "PEM cluster CA: workers must present a certificate it signed (mutual TLS)");
  app.add_option("--token-file", token_file,
                 "bearer tokens of clients: 'sha256:HEX TENANT user|admin [NAME]' per line "
                 "(`dattn token new`); re-read when it changes");
  app.add_option("--audit-log", audit_log,
                 "append-only log of admin actions (default: DATA_DIR/audit.log)");
  app.add_flag("--insecure", insecure,
               "plaintext, no client or worker authentication: only for a single trusted machine "
               "(logs a warning)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // Prints the help or the error.
    return rc == 0 ? 0 : 2;
  }
  // Secure unless told otherwise: TLS with a CA (workers' certificates) and tokens (clients').
  if (absl::Status s = dattn::security::CheckTransportFlags(
          tls, insecure, {token_file},
          "give --tls-cert, --tls-key, --tls-ca and --token-file (docs/SECURITY.md; "
          "scripts/make-certs.sh makes a CA and certificates, `dattn token new` a token), or "
          "--insecure for a plaintext coordinator on a trusted machine");
      !s.ok()) {
    Say(std::string(s.message()));
    return 2;
  }
  if (rendezvous_listen.empty()) {
    const size_t colon = listen.rfind(':');
    rendezvous_listen = colon == std::string::npos ? listen : listen.substr(0, colon);
  }
  // The rings' stores are plain TCP servers: numeric IPv4 addresses only (bad flags exit 2).
  in_addr parsed{};
  if (inet_pton(AF_INET, rendezvous_listen.c_str(), &parsed) != 1) {
    Say(absl::StrCat("--rendezvous-listen: \"", rendezvous_listen,
                     "\" is not a numeric IPv4 address (it defaults to the host of --listen; set "
                     "it explicitly)"));
    return 2;
  }
  if (!rendezvous_advertise.empty() &&
      inet_pton(AF_INET, rendezvous_advertise.c_str(), &parsed) != 1) {
    Say(absl::StrCat("--rendezvous-advertise: \"", rendezvous_advertise,
                     "\" is not a numeric IPv4 address"));
    return 2;
  }
  if (rendezvous_listen == "0.0.0.0" && rendezvous_advertise.empty()) {
    Say("--rendezvous-advertise: required when the rendezvous stores listen on 0.0.0.0 (workers "
        "need an address they can dial)");
    return 2;
  }

  // Signals are taken synchronously by this thread (sigtimedwait below); every thread started from
  // here on inherits the mask. A client that hangs up must not kill the daemon with SIGPIPE.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  CoordinatorOptions options;
  options.data_dir = data_dir;
  options.model_dir = model_dir;
  options.dead_after = absl::Milliseconds(dead_after_ms);
  options.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  options.max_attempts = max_attempts;
  options.progress_persist_interval = absl::Milliseconds(progress_interval_ms);
  options.rendezvous_host = rendezvous_listen;
  options.rendezvous_advertise = rendezvous_advertise;
  options.ring_formation_timeout = absl::Milliseconds(ring_formation_timeout_ms);
  options.ring_comm_timeout = absl::Milliseconds(ring_timeout_ms);
  options.feasibility_settle = absl::Milliseconds(feasibility_settle_ms);
  options.store_probe_interval = absl::Milliseconds(store_probe_ms);
  options.max_watch_streams = max_watch_streams;
  options.attend_shared_memory = attend_shared_memory;
  options.quotas.max_queued_jobs = tenant_max_queued_jobs;
  // The rings' rendezvous stores use the same certificate and CA (mutual TLS with the ranks).
  options.rendezvous_tls.ca_file = tls.ca_file;
  options.rendezvous_tls.cert_file = tls.cert_file;
  options.rendezvous_tls.key_file = tls.key_file;
  options.quotas.submits_per_second = tenant_submits_per_second;
  options.quotas.max_running_ranks = tenant_max_running_ranks;
  options.quotas.max_deployments = tenant_max_deployments;
  options.retention =
      retention_hours == 0 ? absl::InfiniteDuration() : absl::Seconds(retention_hours * 3600);

  Metrics metrics;
  // /readyz on the metrics port answers what grpc.health.v1 does (kubelet's HTTP probes reach it
  // whatever the gRPC port's TLS). Set once the coordinator has started; it outlives the metrics
  // endpoint on the path that sets it (stage 6 below).
  std::atomic<Coordinator*> started_coordinator{nullptr};
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics_server = MetricsServer::Start(
      metrics_listen, metrics.registry(), "dattn-coordinator", nullptr,
      [&started_coordinator]() -> absl::Status {
        Coordinator* coordinator = started_coordinator.load();
        if (coordinator == nullptr) {
          return absl::UnavailableError(
              "starting: opening the job store and recovering the active jobs");
        }
        return coordinator->Health();
      });
  if (!metrics_server.ok()) {
    Say(std::string(metrics_server.status().message()));
    return 1;
  }
  dattn::server::GrpcServerOptions grpc_options;
  std::unique_ptr<dattn::security::TokenTable> tokens;
  if (!token_file.empty()) {
    absl::StatusOr<std::unique_ptr<dattn::security::TokenTable>> loaded =
        dattn::security::TokenTable::Load(token_file);
    if (!loaded.ok()) {
      Say(absl::StrCat("--token-file: ", loaded.status().message()));
      return 2;
    }
    tokens = *std::move(loaded);
  }
  if (insecure) {
    Say("WARNING: --insecure: plaintext gRPC and rendezvous stores, and anyone who reaches "
        "the port may register a worker" +
        std::string(tokens == nullptr ? ", submit, cancel or drain anything" : "") +
        ". Only for a single trusted machine.");
  } else {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        dattn::security::ServerCredentials(tls);
    if (!credentials.ok()) {
      Say(std::string(credentials.status().message()));
      return 2;
    }
    grpc_options.credentials = *credentials;
  }
  if (audit_log.empty()) audit_log = data_dir + "/audit.log";
  // The audit log lives in the data dir by default: create it (private) if it is missing.
  ::mkdir(data_dir.c_str(), 0700);
  dattn::server::AccessOptions access_options;
  access_options.tokens = tokens.get();
  access_options.workers_need_certificate = !insecure;
  access_options.audit_log = audit_log;
  access_options.max_streams_per_client = max_streams_per_client;
  absl::StatusOr<std::unique_ptr<dattn::server::Access>> access =
      dattn::server::Access::Create(access_options);
  if (!access.ok()) {
    Say(std::string(access.status().message()));
    return 2;
  }
  grpc_options.access = access->get();
  Coordinator coordinator(options, &metrics);
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(listen, &coordinator, &metrics, grpc_options);
  if (!server.ok()) {
    Say(std::string(server.status().message()));
    return 1;
  }
  // Live from here; ready once the store is open and the active jobs are recovered.
  if (absl::Status s = coordinator.Start(); !s.ok()) {
    Say(absl::StrCat("cannot start: ", s.message()));
    (*server)->Shutdown(absl::Now() + absl::Seconds(1));
    coordinator.Close().IgnoreError();
    return 1;
  }
  (*server)->SetServing(true);
  started_coordinator = &coordinator;
  Say(absl::StrCat("job store ", data_dir, "/jobs.db open"));
  // The store creates what is missing private (0700/0600); a folder that existed keeps its mode.
  if (std::optional<std::string> warning = dattn::server::GroupOrWorldAccessWarning(data_dir)) {
    Say(*warning);
  }
  std::fprintf(stderr, "dattn-coordinator listening on %s, metrics on %s\n",
               (*server)->address().c_str(), (*metrics_server)->address().c_str());
  std::fflush(stderr);

  // Wait for a signal; meanwhile readiness follows the store's health (a failed write turns it
  // off).
  bool serving = true;
  int signal_number = 0;
  while (signal_number <= 0) {
    timespec tick{1, 0};
    signal_number = sigtimedwait(&signals, nullptr, &tick);
    const bool healthy = coordinator.Health().ok();
    if (signal_number <= 0 && healthy != serving) {
      serving = healthy;
      (*server)->SetServing(serving);
      Say(serving ? "ready again" : absl::StrCat("not ready: ", coordinator.Health().message()));
    }
  }

  // The shutdown order. Each stage is bounded in time, and a failing stage does not skip the rest:
  // the store is always closed last so that everything acknowledged is on disk.
  Say(absl::StrCat("signal ", signal_number, ": shutting down"));
  // 1. Not ready, and stop accepting: submits answer UNAVAILABLE (clients retry elsewhere/later);
  //    reports, heartbeats and reads go on so that running work can finish.
  (*server)->SetServing(false);
  coordinator.StopAccepting();
  // 2. Let running jobs finish up to the drain timeout; requeue the rest (their workers are told to
  //    stop). A failed write here is reported; the store's own state stays consistent.
  if (absl::Status s = coordinator.Drain(absl::Milliseconds(drain_timeout_ms)); !s.ok()) {
    Say(absl::StrCat("drain: ", s.message()));
  }
  // 3. End the long-lived streams (workers' assignments, job watchers): they answer UNAVAILABLE and
  //    their clients reconnect to the next coordinator.
  coordinator.CloseStreams();
  // 4. Stop the gRPC server: finish calls in flight for up to 5 s, then cancel them.
  (*server)->Shutdown(absl::Now() + absl::Seconds(5));
  // 5. Stop the coordinator's threads and flush and close the store.
  const absl::Status closed = coordinator.Close();
  // 6. The metrics endpoint goes last, so that scrapes see the shutdown.
  metrics_server->reset();
  if (!closed.ok()) {
    Say(absl::StrCat("the job store did not close cleanly: ", closed.message()));
    return 1;
  }
  Say("stopped");
  return 0;
}
