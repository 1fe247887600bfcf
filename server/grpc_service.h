// The coordinator's gRPC surface: JobService, WorkerRegistry and AdminService as thin handlers over
// Coordinator (coordinator.h), plus grpc.health.v1 from gRPC's built-in service.
//
// A handler only calls the core and converts its absl::Status with the one mapping table here
// (ToGrpcStatus); every call, streams included, is counted in dattn_rpc_total{method,code} when it
// ends. Health: every service name ("" and each dattn.v1 service) reports NOT_SERVING until
// SetServing(true) — the process is live before it is ready (the store open).
//
// Thread-safety: GrpcServer's methods may be called from any thread; Shutdown once.
#ifndef DATTN_SERVER_GRPC_SERVICE_H_
#define DATTN_SERVER_GRPC_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/access.h"
#include "server/coordinator.h"
#include "server/metrics.h"

namespace dattn {
namespace server {

// absl::Status -> grpc::Status: the code through one table, the message unchanged.
grpc::Status ToGrpcStatus(const absl::Status& status);

struct GrpcServerOptions {
  // TLS (security/tls.h); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Who may call what (access.h); not owned, outlives the server. Null: no checks at all (an
  // Access without tokens, certificates or audit log).
  const Access* access = nullptr;
};

class GrpcServer {
 public:
  // Serves the three services for `coordinator` on `address` ("127.0.0.1:7070"; port 0 picks a free
  // port), counting calls in `metrics`. Neither is owned; both must outlive the server. Health
  // starts NOT_SERVING. UNAVAILABLE naming the address if it cannot listen.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const std::string& address,
                                                           Coordinator* coordinator,
                                                           Metrics* metrics,
                                                           GrpcServerOptions options = {});
  // Shutdown(now) if not done yet.
  ~GrpcServer();

  // "host:port" actually listened on (the chosen port when 0 was asked for).
  const std::string& address() const { return address_; }

  // Sets grpc.health.v1 for "" and every dattn.v1 service.
  void SetServing(bool serving);

  // Stops accepting calls, waits for calls in progress until `deadline` and then cancels the rest.
  // Health turns NOT_SERVING first. Idempotent.
  void Shutdown(absl::Time deadline);

 private:
  class Services;
  GrpcServer() = default;

  std::unique_ptr<Access> own_access_;  // When options.access was null.
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_GRPC_SERVICE_H_
