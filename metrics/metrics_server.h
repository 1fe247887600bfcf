// MetricsServer: the HTTP endpoint of a process's Prometheus metrics, on an HttpServer
// (metrics/http_server.h; why not prometheus-cpp's civetweb-based Exposer is explained there).
// The coordinator (server/main.cc) and the workers (worker/main.cc) each serve their own registry
// through it. What it answers:
//
//   GET /metrics  the Prometheus text exposition (format 0.0.4) of the registry
//   GET /healthz  200 "ok": the process is live (its HTTP threads answer). Liveness only: readiness
//                 is grpc.health.v1 on the process's gRPC port (the coordinator's turns NOT_SERVING
//                 while its store cannot be written; a worker's "dattn-worker" service while it is
//                 not registered), which is what load balancers and probes should ask
//   GET /         200, a short text index of these paths
//   anything else 404; methods other than GET and HEAD 405; malformed requests 400, heads over
//                 16 KiB 431, heads not sent within 5 s 408 (http_server.h)
//
// Thread-safety: Start and the destructor from one thread; requests are served on the server's
// own threads (up to four at once), which call `before_scrape` and read the registry.
#ifndef DATTN_METRICS_METRICS_SERVER_H_
#define DATTN_METRICS_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

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
  // thread-safe), for gauges a process reads only when asked (a device's free memory).
  // INVALID_ARGUMENT quoting a malformed address; UNAVAILABLE naming the address when it cannot
  // bind. The server keeps a weak reference: keep the registry alive while the server runs
  // (/metrics answers 503 once it is gone).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, const std::shared_ptr<prometheus::Registry>& registry,
      const std::string& process_name = "dattn", std::function<void()> before_scrape = nullptr);
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
