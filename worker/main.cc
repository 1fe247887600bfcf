// dattn-worker: runs attention tasks for a dattn coordinator.
//
//   dattn-worker --coordinator host:7070 [--name NAME] [--slots N] [--threads T]
//                [--heartbeat-ms MS] [--health-port P] [--listen-address A] [--memory-bytes B]
//                [--ring-address A] [--drain-wait-s S] [--shutdown-timeout-s S]
//                [--fault-device-memory-bytes B] [--fault-allocation-failures FIRST:COUNT]
//                [--metrics-listen HOST:PORT]
//                (--tls-ca CA --tls-cert CERT --tls-key KEY | --insecure)
//   dattn-worker-gpu --gpu [--gpu-index I] ...   (the same worker on one GPU)
//
// Security (docs/SECURITY.md): with --tls-* the worker dials the coordinator over TLS, checking its
// certificate against the CA and presenting its own (mutual TLS: the coordinator's WorkerRegistry
// takes no other caller), and serves its health port over TLS with the same certificate.
// --insecure: plaintext both ways (logs a warning); one of the two is required (exit 2).
//
// The worker dials the coordinator (it needs no inbound port for work) and serves only
// grpc.health.v1 on --listen-address:--health-port: service "" is SERVING while the process is
// alive (liveness); service "dattn-worker" is SERVING while the worker is registered with the
// coordinator and accepting tasks (readiness). Ring ranks talk to their peers directly: Gloo over
// TCP on CPU workers, listening on --ring-address (ephemeral ports); NCCL on GPU workers. With
// --metrics-listen the worker serves its own Prometheus metrics (worker_metrics.h) on /metrics,
// with /healthz (liveness), /readyz (readiness, as "dattn-worker") and / beside it
// (metrics/metrics_server.h). Every important event is one timestamped line on stderr.
//
// The device is chosen by what the binary and the host offer: dattn-worker runs on the CPU;
// dattn-worker-gpu runs on GPU --gpu-index with --gpu (one process per GPU), and refuses to start
// (exit 2) when CUDA finds no such device. dattn-worker refuses --gpu: it links no CUDA library, so
// it starts on hosts without any.
//
// Exit codes: 0 after a signal-initiated shutdown; 1 if the health or metrics endpoint cannot
// listen, or on a second signal during shutdown (immediate exit); 2 for bad flags or a worker that
// cannot start. The worker never exits because the coordinator is unreachable.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "engine/openblas_core.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "metrics/metrics_server.h"
#include "security/tls.h"
#include "worker/cpu_device.h"
#include "worker/log.h"
#include "worker/memory_limit_device.h"
#include "worker/metered_device.h"
#include "worker/worker.h"
#include "worker/worker_metrics.h"
#ifdef DATTN_WORKER_WITH_CUDA
#include "worker/cuda_device.h"
#endif

namespace {

using dattn::worker::LogEvent;

// The readiness service name of the health endpoint.
constexpr char kReadyService[] = "dattn-worker";

std::string DefaultName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] != '\0' ? host : "worker", ":", getpid());
}

std::string DefaultCoordinator() {
  const char* env = std::getenv("DATTN_COORDINATOR");
  return env != nullptr && env[0] != '\0' ? env : "127.0.0.1:7070";
}

}  // namespace

int main(int argc, char** argv) {
  // CPU ranks run on OpenBLAS: off its generic kernels where it did not recognise the CPU.
  dattn::ReexecWithBestOpenBlasCore("dattn-worker", argv);
  dattn::worker::WorkerOptions options;
  options.coordinator_address = DefaultCoordinator();
  options.name = DefaultName();
  int heartbeat_ms = 0;
  int health_port = 0;
  std::string listen_address = "127.0.0.1";
  int shutdown_timeout_s = 10;
  int drain_wait_s = 0;
  int64_t fault_memory_bytes = -1;
  std::string fault_allocation_failures;
  bool gpu = false;
  int gpu_index = 0;
  std::string ring_address;
  std::string metrics_listen;

  CLI::App app{"dattn-worker: runs dilated-attention tasks for a dattn coordinator"};
  app.set_version_flag("--version", dattn::worker::kWorkerVersion);
  app.add_option("--coordinator", options.coordinator_address,
                 "Coordinator WorkerRegistry address, host:port or unix:/path "
                 "(default: $DATTN_COORDINATOR, else 127.0.0.1:7070)")
      ->capture_default_str();
  app.add_option("--name", options.name, "Stable worker name (default: hostname:pid)")
      ->capture_default_str();
  app.add_option("--threads", options.threads_per_task,
                 "Engine threads per task; 0 = hardware threads / slots")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_option("--slots", options.max_ranks, "Tasks (ranks) run at once")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "Heartbeat interval; 0 = the coordinator's (a shorter coordinator value wins)")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--health-port", health_port, "grpc.health.v1 port; 0 = ephemeral")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--listen-address", listen_address, "Address the health endpoint binds")
      ->capture_default_str();
  app.add_option("--memory-bytes", options.memory_bytes,
                 "Advertise and budget this much memory instead of MemTotal; 0 = MemTotal")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 60))
      ->capture_default_str();
  app.add_option("--fault-device-memory-bytes", fault_memory_bytes,
                 "Fault injection: allocations fail (RESOURCE_EXHAUSTED) once this many bytes are "
                 "outstanding, while the worker still reports its real memory; -1 = off")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 60))
      ->capture_default_str();
  app.add_option("--fault-allocation-failures", fault_allocation_failures,
                 "Fault injection: FIRST:COUNT, the device's allocations FIRST .. FIRST+COUNT-1 "
                 "(numbered from 1 over the worker's life) fail with RESOURCE_EXHAUSTED, as if "
                 "another process held the memory for a moment; empty = off")
      ->type_name("FIRST:COUNT");
  app.add_option("--drain-wait-s", drain_wait_s,
                 "On SIGTERM, first ask the coordinator to drain this worker and wait this long "
                 "for its running tasks to finish (0: cancel them at once)")
      ->check(CLI::Range(0, 24 * 3600))
      ->capture_default_str();
  app.add_option("--shutdown-timeout-s", shutdown_timeout_s,
                 "On SIGTERM, how long to keep trying to deliver final reports")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_flag("--gpu", gpu, "Run on a GPU (dattn-worker-gpu only; one worker process per GPU)");
  app.add_option("--gpu-index", gpu_index, "CUDA ordinal of the GPU, with --gpu")
      ->check(CLI::Range(0, 1023))
      ->capture_default_str();
  app.add_option("--ring-address", ring_address,
                 "Address CPU ring ranks listen on for their peers (default: --listen-address)");
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT of this worker's Prometheus /metrics (port 0 = ephemeral; printed at "
                 "start); empty: no metrics endpoint");
  dattn::security::TlsFiles tls;
  bool insecure = false;
  app.add_option(
      "--tls-ca", tls.ca_file,
      "PEM cluster CA that signed the coordinator's certificate (scripts/make-certs.sh)");
  app.add_option("--tls-cert", tls.cert_file,
                 "PEM certificate of this worker, signed by the cluster CA (mutual TLS); also "
                 "served on the health port; re-read when it changes");
  app.add_option("--tls-key", tls.key_file, "PEM private key of --tls-cert");
  app.add_flag("--insecure", insecure,
               "plaintext to the coordinator and on the health port (the coordinator must run "
               "--insecure too); logs a warning");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (absl::Status s = dattn::security::CheckTransportFlags(
          tls, insecure, {},
          "give --tls-ca, --tls-cert and --tls-key (docs/SECURITY.md; scripts/make-certs.sh "
          "makes them), or --insecure for a plaintext cluster on a trusted machine");
      !s.ok()) {
    LogEvent(s.message());
    return 2;
  }
  std::shared_ptr<grpc::ServerCredentials> health_credentials = grpc::InsecureServerCredentials();
  if (insecure) {
    LogEvent("WARNING: --insecure: plaintext to the coordinator and on the health port");
  } else {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel =
        dattn::security::ChannelCredentials(tls);
    if (!channel.ok()) {
      LogEvent(channel.status().message());
      return 2;
    }
    options.credentials = *channel;
    // Ring rendezvous stores: the same CA and certificate (mutual TLS with the coordinator's).
    options.store_tls.ca_file = tls.ca_file;
    options.store_tls.cert_file = tls.cert_file;
    options.store_tls.key_file = tls.key_file;
    dattn::security::TlsFiles served = tls;
    served.ca_file.clear();  // Probes present no certificate.
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server =
        dattn::security::ServerCredentials(served);
    if (!server.ok()) {
      LogEvent(server.status().message());
      return 2;
    }
    health_credentials = *server;
  }
  options.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  options.shutdown_report_deadline = absl::Seconds(shutdown_timeout_s);
  options.ring_address = ring_address.empty() ? listen_address : ring_address;

  // SIGTERM and SIGINT are taken synchronously by sigwait below: block them before any thread
  // (CUDA's driver threads and gRPC's included) starts, so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A coordinator connection that breaks mid-write must not kill the process.
  signal(SIGPIPE, SIG_IGN);

  // The device, before anything else starts: a worker that cannot have its device does not run.
  std::shared_ptr<dattn::worker::TaskDevice> device;
  if (gpu) {
#ifdef DATTN_WORKER_WITH_CUDA
    absl::StatusOr<std::unique_ptr<dattn::worker::TaskDevice>> gpu_device =
        dattn::worker::NewCudaDevice(dattn::worker::CudaDeviceOptions{gpu_index});
    if (!gpu_device.ok()) {
      LogEvent("cannot use GPU ", gpu_index, ": ", gpu_device.status().ToString());
      return 2;
    }
    device = std::move(*gpu_device);
#else
    LogEvent("--gpu: this dattn-worker is built without CUDA; run dattn-worker-gpu on GPU hosts");
    return 2;
#endif
  } else {
    dattn::worker::CpuDeviceOptions cpu;
    cpu.ring_address = options.ring_address;
    absl::StatusOr<std::unique_ptr<dattn::worker::TaskDevice>> host =
        dattn::worker::NewCpuDevice(cpu);
    if (!host.ok()) {
      LogEvent("cannot use the host as a device: ", host.status().ToString());
      return 2;
    }
    device = std::move(*host);
  }

  if (fault_memory_bytes >= 0) {
    LogEvent("FAULT INJECTION: allocations fail once ", fault_memory_bytes,
             " bytes are outstanding (--fault-device-memory-bytes); for tests only");
    device = dattn::worker::NewMemoryLimitDevice(std::move(device), fault_memory_bytes);
  }

  if (!fault_allocation_failures.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(fault_allocation_failures, ':');
    int64_t first = 0, count = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &first) ||
        !absl::SimpleAtoi(parts[1], &count) || first < 1 || count < 0) {
      LogEvent(
          "--fault-allocation-failures: expected FIRST:COUNT with FIRST >= 1 and COUNT >= 0, "
          "got \"",
          fault_allocation_failures, "\"");
      return 2;
    }
    LogEvent("FAULT INJECTION: allocations ", first, " .. ", first + count - 1,
             " fail (--fault-allocation-failures); for tests only");
    device = dattn::worker::NewFailingAllocationsDevice(std::move(device), first, count);
  }

  // The worker's own metrics. The device goes to the worker metered, so that its communicators'
  // failures are counted (metered_device.h); everything else passes through unchanged.
  dattn::worker::WorkerMetricsOptions metrics_options;
  metrics_options.name = options.name;
  metrics_options.version = dattn::worker::kWorkerVersion;
  metrics_options.slots = options.max_ranks;
  metrics_options.memory_budget_bytes = options.memory_bytes;
  dattn::worker::WorkerMetrics metrics(metrics_options, device.get());
  options.device = dattn::worker::NewMeteredDevice(
      device, [&metrics](const std::string& backend, const absl::Status& status) {
        metrics.CommunicatorFailed(backend, status);
      });
  options.on_task_end = [&metrics](const dattn::v1::TaskAssignment& assignment,
                                   const dattn::v1::TaskReport& report,
                                   dattn::v1::RankPhase last_phase) {
    metrics.TaskEnded(assignment, report, last_phase);
  };
  options.on_out_of_memory_retry = [&metrics](bool recovered) {
    metrics.OutOfMemoryRetried(recovered);
  };
  // Read per scrape; null until the worker exists and again once it is gone.
  std::atomic<const dattn::worker::Worker*> scraped_worker{nullptr};
  // /readyz: the "dattn-worker" health service's answer (set by on_ready_change below).
  std::atomic<bool> ready{false};
  std::unique_ptr<dattn::metrics::MetricsServer> metrics_server;
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<dattn::metrics::MetricsServer>> started =
        dattn::metrics::MetricsServer::Start(
            metrics_listen, metrics.registry(), "dattn-worker",
            [&metrics, &scraped_worker]() { metrics.Refresh(scraped_worker.load()); },
            [&ready]() -> absl::Status {
              if (ready) return absl::OkStatus();
              return absl::UnavailableError(
                  "not registered with the coordinator, draining, leaving or its device failed");
            });
    if (!started.ok()) {
      LogEvent("cannot serve metrics: ", started.status().ToString(), "; exiting");
      return 1;
    }
    metrics_server = *std::move(started);
    LogEvent("metrics on ", metrics_server->address(), " (/metrics, /healthz, /readyz)");
  }

  // grpc.health.v1 is gRPC's default health service. gRPC adds it only once the server starts, and
  // the builder refuses a server with no method of its own: this callback generic service (which
  // answers UNIMPLEMENTED to any other method) gives it one without a completion queue to drive.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC enables SO_REUSEPORT by default: a second worker on the same --health-port would then
  // bind too and share the probes. A port in use must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::CallbackGenericService unimplemented;
  builder.RegisterCallbackGenericService(&unimplemented);
  int bound_port = 0;
  const std::string listen = absl::StrCat(listen_address, ":", health_port);
  builder.AddListeningPort(listen, health_credentials, &bound_port);
  std::unique_ptr<grpc::Server> health_server = builder.BuildAndStart();
  if (health_server == nullptr || bound_port == 0) {
    LogEvent("cannot listen on ", listen, " for the health endpoint; exiting");
    return 1;
  }
  if (health_server->GetHealthCheckService() == nullptr) {
    LogEvent("gRPC did not install its default health service; exiting");
    health_server->Shutdown();
    return 1;
  }
  grpc::HealthCheckServiceInterface& health = *health_server->GetHealthCheckService();
  health.SetServingStatus("", true);
  health.SetServingStatus(kReadyService, false);
  options.address = absl::StrCat(listen_address, ":", bound_port);
  LogEvent("health endpoint on ", options.address, " (service \"\" = live, \"", kReadyService,
           "\" = ready)");
  options.on_ready_change = [&health, &ready](bool now_ready) {
    health.SetServingStatus(kReadyService, now_ready);
    ready = now_ready;
  };

  dattn::worker::Worker worker(options);
  absl::Status started = worker.Start();
  if (!started.ok()) {
    LogEvent("cannot start: ", started.ToString());
    health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 2;
  }

  scraped_worker = &worker;  // Started: its load can be read.

  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  LogEvent("received ", signal_number == SIGTERM ? "SIGTERM" : "SIGINT", "; shutting down");
  // A second signal during shutdown means "now": skip the remaining stages.
  std::thread([signals]() {
    int again = 0;
    while (sigwait(&signals, &again) != 0) {
    }
    LogEvent("second signal during shutdown; exiting at once");
    _exit(1);
  }).detach();

  // Shutdown order:
  // 1. Readiness goes NOT_SERVING, so probes and operators see the worker leaving. Liveness stays
  //    SERVING until the end: the process still answers. With --drain-wait-s, the worker first
  //    leaves gracefully: its heartbeats ask the coordinator to drain it, and running tasks get up
  //    to that long to finish (a second signal cuts it short).
  health.SetServingStatus(kReadyService, false);
  ready = false;
  if (drain_wait_s > 0) worker.Leave(absl::Seconds(drain_wait_s));
  // 2. Worker::Stop(): refuse new assignments and close the assignment stream; cancel running tasks
  //    (each stops before its next engine step: a step in progress finishes first); wait for the
  //    task threads; deliver their CANCELLED reports (and any other pending final report) for up to
  //    --shutdown-timeout-s, logging and dropping what the coordinator could not take (it then
  //    recovers those tasks when the heartbeats stop); stop heartbeating last, so the coordinator
  //    does not declare the worker dead while reports are still being delivered.
  worker.Stop();
  // 3. Close the health endpoint (in-flight probes get a second to finish).
  health.Shutdown();  // Everything NOT_SERVING, and Watch streams end.
  health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // 4. Stop the metrics endpoint last, so that scrapes see the ranks end during the drain.
  metrics_server.reset();
  LogEvent("shutdown complete");
  // 5. Exit 0: the shutdown was asked for and done, whatever the coordinator's state.
  return 0;
}
