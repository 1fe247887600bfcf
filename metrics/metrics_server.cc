#include "metrics/metrics_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace dattn {
namespace metrics {

MetricsServer::MetricsServer(std::unique_ptr<HttpServer> http) : http_(std::move(http)) {}

MetricsServer::~MetricsServer() = default;

const std::string& MetricsServer::address() const { return http_->address(); }

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry,
    const std::string& process_name, std::function<void()> before_scrape,
    std::function<absl::Status()> ready) {
  std::weak_ptr<prometheus::Registry> weak = registry;
  const std::string index = absl::StrCat(
      process_name,
      " metrics endpoint\n\n"
      "/metrics  Prometheus text exposition of every dattn_* metric\n"
      "/healthz  liveness: 200 \"ok\" while the process runs\n"
      "/readyz   readiness: 200 \"ready\", or 503 and why not (also grpc.health.v1 on the gRPC "
      "port)\n");
  HttpHandler handler = [weak, index, before_scrape = std::move(before_scrape),
                         ready = std::move(ready)](const HttpRequest& request) {
    HttpResponse response;
    if (request.path == "/metrics") {
      std::shared_ptr<prometheus::Registry> live = weak.lock();
      if (live == nullptr) {
        response.status = 503;
        response.body = "503 Service Unavailable: the metrics registry is gone (shutting down)\n";
        return response;
      }
      if (before_scrape) before_scrape();
      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
      response.body = prometheus::TextSerializer().Serialize(live->Collect());
    } else if (request.path == "/healthz") {
      response.body = "ok\n";
    } else if (request.path == "/readyz") {
      const absl::Status status = ready ? ready() : absl::OkStatus();
      if (status.ok()) {
        response.body = "ready\n";
      } else {
        response.status = 503;
        response.body = absl::StrCat("503 not ready: ", status.message(), "\n");
      }
    } else if (request.path == "/") {
      response.body = index;
    } else {
      response.status = 404;
      response.body = "404 Not Found: this endpoint serves /, /metrics, /healthz and /readyz\n";
    }
    return response;
  };
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(address, std::move(handler), HttpServer::Options());
  if (!http.ok()) return http.status();
  return std::unique_ptr<MetricsServer>(new MetricsServer(*std::move(http)));
}

}  // namespace metrics
}  // namespace dattn
