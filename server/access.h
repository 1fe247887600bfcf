// Who may make a call: authentication and authorization at the coordinator's gRPC edge.
//
// - Clients (JobService, AdminService) authenticate with a bearer token in the `authorization`
//   metadata ("Bearer <token>"), looked up in the token table (security/tokens.h): the principal's
//   tenant and role. No or an unknown token: UNAUTHENTICATED. Without a token table (the explicit
//   --insecure mode) every caller is an admin of the tenant its requests name.
// - Users see, watch, cancel, read and delete their own tenant's jobs only; another tenant's job is
//   NOT_FOUND with the very message of a job that does not exist. A job's tenant is the submitter's
//   (a spec naming another tenant: PERMISSION_DENIED). Admins act on every tenant and alone may use
//   AdminService (PERMISSION_DENIED otherwise).
// - Workers (WorkerRegistry) present a certificate signed by the cluster CA (mutual TLS); without
//   one: UNAUTHENTICATED. The certificate binds the worker names it may act as (its common name,
//   security/tls.h): registering, or calling for a registration, under another name is
//   PERMISSION_DENIED, so one worker's certificate cannot evict, impersonate or report for another.
//   Tokens do not open WorkerRegistry, certificates do not open JobService.
// - Admin actions (AdminService calls, and an admin's cancel or delete of another tenant's job) are
//   appended to the audit log, one JSON object per line, whatever their outcome.
// - Streams per client: each open WatchJob or ReadOutput holds a server thread, so one client may
//   hold at most `max_streams_per_client` at once (OpenStream); more are RESOURCE_EXHAUSTED naming
//   the client and the flag. A client is its token (tenant and name); without tokens (--insecure),
//   the peer's IP address. The coordinator's --max-watch-streams bounds all clients together.
//
// Thread-safety: thread-safe (the audit log and the stream counts under their own mutexes).
#ifndef DATTN_SERVER_ACCESS_H_
#define DATTN_SERVER_ACCESS_H_

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dattn/v1/job.pb.h"
#include "grpcpp/server_context.h"
#include "security/tokens.h"

namespace dattn {
namespace server {

struct AccessOptions {
  // Not owned; null: no authentication of clients (--insecure).
  security::TokenTable* tokens = nullptr;
  // WorkerRegistry calls need a verified client certificate (TLS with a CA).
  bool workers_need_certificate = false;
  // Append-only audit log (created 0600); empty: none.
  std::string audit_log;
  // Open WatchJob/ReadOutput streams of one client at once (--max-streams-per-client); >= 1.
  int max_streams_per_client = 64;
};

class Access {
 public:
  // Opens the audit log. INVALID_ARGUMENT naming the path when it cannot be opened for appending,
  // or naming the flag for max_streams_per_client < 1.
  static absl::StatusOr<std::unique_ptr<Access>> Create(AccessOptions options);
  ~Access();

  // The principal of a JobService or AdminService call.
  absl::StatusOr<security::Principal> Caller(const grpc::ServerContext& context) const;
  // OK for a WorkerRegistry call `method` acting as the worker named `worker_name`, from a peer
  // with a cluster certificate that binds that name (security/tls.h's worker-name patterns), or
  // when no certificate is needed (--insecure). UNAUTHENTICATED without a cluster certificate;
  // PERMISSION_DENIED naming the certificate's common name and `worker_name` when it does not bind
  // the name. An empty `worker_name` (an id the coordinator never issued: the call fails on its
  // own) checks the certificate only.
  absl::Status CheckWorker(const grpc::ServerContext& context, const char* method,
                           const std::string& worker_name) const;
  // OK for an admin; PERMISSION_DENIED naming `method`, the tenant and its role otherwise.
  static absl::Status RequireAdmin(const security::Principal& caller, const char* method);
  // Whether `caller` may act on `job`.
  static bool MaySee(const security::Principal& caller, const v1::Job& job);
  // Sets a submitted spec's tenant to the caller's. PERMISSION_DENIED when a user's spec names
  // another tenant.
  static absl::Status ScopeSubmit(const security::Principal& caller, v1::JobSpec* spec);
  // The same rule for a request's own tenant field (the model registry's calls): empty becomes the
  // caller's tenant; a user naming another tenant is PERMISSION_DENIED naming `field`. Sets
  // *foreign when an admin acts on another tenant (an act to audit).
  static absl::Status ScopeTenant(const security::Principal& caller, const char* field,
                                  std::string* tenant, bool* foreign);
  // Whether gRPC's `peer` ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "unix:/run/d.sock") is on
  // this host: a loopback address or a Unix socket. Calls that name this host's shared memory
  // (AttendStart.shared_memory) are taken only from such peers.
  static bool IsLocalPeer(const std::string& peer);

  // One open stream of a client: released when destroyed.
  class StreamSlot {
   public:
    StreamSlot(StreamSlot&& other) noexcept
        : access_(std::exchange(other.access_, nullptr)), client_(std::move(other.client_)) {}
    StreamSlot& operator=(StreamSlot&&) = delete;
    ~StreamSlot();

   private:
    friend class Access;
    StreamSlot(const Access* access, std::string client)
        : access_(access), client_(std::move(client)) {}
    const Access* access_;
    std::string client_;
  };
  // A slot for one more stream (`method`) of `caller`, whose call is `context`; RESOURCE_EXHAUSTED
  // when the client holds max_streams_per_client already.
  absl::StatusOr<StreamSlot> OpenStream(const security::Principal& caller,
                                        const grpc::ServerContext& context,
                                        const char* method) const;

  bool authenticates() const { return options_.tokens != nullptr; }
  // Whether worker calls need a certificate binding the worker's name (CheckWorker).
  bool binds_worker_names() const { return options_.workers_need_certificate; }

  // One audit record: who (tenant, name, role, peer address), what (method, target) and the
  // outcome's code.
  void Audit(const security::Principal& caller, const grpc::ServerContext& context,
             const char* method, const std::string& target, const absl::Status& outcome) const;

 private:
  explicit Access(AccessOptions options) : options_(std::move(options)) {}

  const AccessOptions options_;
  mutable absl::Mutex streams_mu_;
  mutable absl::flat_hash_map<std::string, int> streams_ ABSL_GUARDED_BY(streams_mu_);
  mutable absl::Mutex audit_mu_;
  FILE* audit_ ABSL_GUARDED_BY(audit_mu_) = nullptr;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_ACCESS_H_
