// MetricsServer: the HTTP endpoint of a process's Prometheus metrics, on an HttpServer
// (metrics/http_server.h; why not prometheus-cpp's civetweb-based Exposer is explained there).
// The coordinator (server/main.cc) and the workers (worker/main.cc) each serve their own registry
// through it. What it answers:
//
//   GET /metrics  the Prometheus text exposition (format 0.0.4) of the registry
//   GET /healthz  200 "ok": the process is live (its HTTP threads answer). Liveness only.
//   GET /readyz   200 "ready" while the process's `ready` callback says OK, 503 with its message
//                 otherwise (the coordinator: its store cannot be written, it is starting or
//                 shutting down; a worker: not registered, draining, leaving or its device failed).
//                 The same as grpc.health.v1 on the process's gRPC port, for probes that cannot
//                 speak TLS (kubelet's gRPC probes are plaintext; its HTTP probes reach this port)
//   GET /         200, a short text index of these paths
//   anything else 404; methods other than GET and HEAD 405; malformed requests 400, heads over
//                 16 KiB 431, heads not sent within 5 s 408 (http_server.h)
//
// Thread-safety: Start and the destructor from one thread; requests are served on the server's
// own threads (up to four at once), which call `before_scrape` and `ready` and read the registry.
#ifndef DATTN_METRICS_METRICS_SERVER_H_
#define DATTN_METRICS_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/http_server.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace dattn {
namespace metrics {

class MetricsServer {
 public:
  // Listens on `address` ("127.0.0.1:7071"; port 0 picks a free port) and serves `registry`.
  // `process_name` ("dattn-coordinator") titles the index page. `before_scrape`, when set, runs
  // before every /metrics answer (on a serving thread, possibly on several at once: it must be
  // thread-safe), for gauges a process reads only when asked (a device's free memory). `ready`
  // answers /readyz (thread-safe likewise); unset: always ready.
  // INVALID_ARGUMENT quoting a malformed address; UNAVAILABLE naming the address when it cannot
  // bind. The server keeps a weak reference: keep the registry alive while the server runs
  // (/metrics answers 503 once it is gone).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, const std::shared_ptr<prometheus::Registry>& registry,
      const std::string& process_name = "dattn", std::function<void()> before_scrape = nullptr,
      std::function<absl::Status()> ready = nullptr);
  ~MetricsServer();  // Stops serving; joins the HTTP threads.
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" actually bound (the real port when 0 was asked for).
  const std::string& address() const;

 private:
  explicit MetricsServer(std::unique_ptr<HttpServer> http);
  std::unique_ptr<HttpServer> http_;
};

}  // namespace metrics
}  // namespace dattn

#endif  // DATTN_METRICS_METRICS_SERVER_H_
