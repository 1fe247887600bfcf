#include "server/access.h"

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "api/tenant.h"
#include "nlohmann/json.hpp"
#include "security/tls.h"

namespace dattn {
namespace server {

absl::StatusOr<std::unique_ptr<Access>> Access::Create(AccessOptions options) {
  if (options.max_streams_per_client < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-streams-per-client: must be >= 1, got ",
                                                   options.max_streams_per_client));
  }
  std::unique_ptr<Access> access(new Access(std::move(options)));
  if (!access->options_.audit_log.empty()) {
    const int fd =
        ::open(access->options_.audit_log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--audit-log ", access->options_.audit_log,
                                                     ": cannot be opened for appending"));
    }
    absl::MutexLock lock(&access->audit_mu_);
    access->audit_ = ::fdopen(fd, "a");
    if (access->audit_ == nullptr) {
      ::close(fd);
      return absl::InternalError("fdopen of the audit log failed");
    }
  }
  return access;
}

Access::~Access() {
  absl::MutexLock lock(&audit_mu_);
  if (audit_ != nullptr) std::fclose(audit_);
}

absl::StatusOr<security::Principal> Access::Caller(const grpc::ServerContext& context) const {
  if (options_.tokens == nullptr) {
    security::Principal anyone;
    anyone.role = security::Role::kAdmin;
    anyone.name = "anonymous (--insecure)";
    return anyone;
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "no bearer token: pass --token-file FILE or set DATTN_TOKEN (the token an admin made with "
        "`dattn token new`)");
  }
  const std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWith(value, kBearer) || value.size() == kBearer.size()) {
    return absl::UnauthenticatedError("the authorization metadata must be \"Bearer <token>\"");
  }
  return options_.tokens->Authenticate(absl::string_view(value).substr(kBearer.size()));
}

absl::Status Access::CheckWorker(const grpc::ServerContext& context, const char* method,
                                 const std::string& worker_name) const {
  if (!options_.workers_need_certificate) return absl::OkStatus();
  if (!security::PeerHasClusterCertificate(context)) {
    return absl::UnauthenticatedError(absl::StrCat(
        method,
        " is for workers: the caller presented no certificate signed by the cluster CA "
        "(start the worker with --tls-cert and --tls-key from scripts/make-certs.sh)"));
  }
  if (worker_name.empty()) return absl::OkStatus();
  const std::string common_name = security::PeerCommonName(context);
  if (security::WorkerNameAllowed(security::WorkerNamePattern(common_name), worker_name)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(method, ": the caller's certificate (common name \"", common_name,
                   "\") does not bind the worker name \"", worker_name,
                   "\"; a worker certificate binds \"", security::kWorkerCommonNamePrefix,
                   "NAME\" or \"...PREFIX*\" (scripts/make-certs.sh --worker)"));
}

absl::Status Access::RequireAdmin(const security::Principal& caller, const char* method) {
  if (caller.role == security::Role::kAdmin) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(method, " needs the admin role; the token of ", caller.name, " (tenant ",
                   caller.tenant, ") has the role ", security::RoleName(caller.role)));
}

bool Access::MaySee(const security::Principal& caller, const v1::Job& job) {
  return caller.role == security::Role::kAdmin ||
         api::TenantOrDefault(job.spec().tenant()) == caller.tenant;
}

absl::Status Access::ScopeSubmit(const security::Principal& caller, v1::JobSpec* spec) {
  if (caller.tenant.empty()) return absl::OkStatus();  // --insecure: the spec says.
  if (spec->tenant().empty()) {
    spec->set_tenant(caller.tenant);
    return absl::OkStatus();
  }
  if (spec->tenant() == caller.tenant || caller.role == security::Role::kAdmin) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "spec.tenant \"", spec->tenant().substr(0, 64), "\" is not yours: the token of ", caller.name,
      " submits for tenant \"", caller.tenant, "\" (leave spec.tenant empty)"));
}

absl::Status Access::ScopeTenant(const security::Principal& caller, const char* field,
                                 std::string* tenant, bool* foreign) {
  *foreign = false;
  if (caller.tenant.empty()) return absl::OkStatus();  // --insecure: the request says.
  if (tenant->empty()) {
    *tenant = caller.tenant;
    return absl::OkStatus();
  }
  if (*tenant == caller.tenant) return absl::OkStatus();
  if (caller.role == security::Role::kAdmin) {
    *foreign = true;
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, " \"", tenant->substr(0, 64), "\" is not yours: the token of ", caller.name,
      " acts for tenant \"", caller.tenant, "\" (leave ", field, " empty)"));
}

namespace {

// "ipv4:10.0.0.7:53211" / "ipv6:[::1]:53211" -> the address without the port.
std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

bool Access::IsLocalPeer(const std::string& peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) return true;
  // gRPC writes IPv6 peers with their brackets as they are or percent-encoded (%5B, %5D), by
  // version.
  const std::string host =
      absl::StrReplaceAll(PeerHost(peer), {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
  return absl::StartsWith(host, "ipv4:127.") || host == "ipv6:[::1]" ||
         absl::StartsWith(host, "ipv6:[::ffff:127.");
}

absl::StatusOr<Access::StreamSlot> Access::OpenStream(const security::Principal& caller,
                                                      const grpc::ServerContext& context,
                                                      const char* method) const {
  const std::string client =
      authenticates() ? absl::StrCat("token ", caller.name, " (tenant ", caller.tenant, ")")
                      : absl::StrCat("peer ", PeerHost(context.peer()));
  absl::MutexLock lock(&streams_mu_);
  int& open = streams_[client];
  if (open >= options_.max_streams_per_client) {
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": ", client, " has ", options_.max_streams_per_client,
        " WatchJob and ReadOutput streams open, its limit (--max-streams-per-client); close "
        "some, or poll GetJob"));
  }
  ++open;
  return StreamSlot(this, client);
}

Access::StreamSlot::~StreamSlot() {
  if (access_ == nullptr) return;
  absl::MutexLock lock(&access_->streams_mu_);
  auto it = access_->streams_.find(client_);
  if (it != access_->streams_.end() && --it->second <= 0) access_->streams_.erase(it);
}

void Access::Audit(const security::Principal& caller, const grpc::ServerContext& context,
                   const char* method, const std::string& target,
                   const absl::Status& outcome) const {
  nlohmann::json record = {
      {"time", absl::FormatTime(absl::RFC3339_full, absl::Now(), absl::UTCTimeZone())},
      {"tenant", caller.tenant},
      {"name", caller.name},
      {"role", security::RoleName(caller.role)},
      {"peer", context.peer()},
      {"method", method},
      {"target", target},
      {"code", absl::StatusCodeToString(outcome.code())},
  };
  // dump's "replace" keeps invalid UTF-8 in a request from throwing.
  const std::string line =
      record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  absl::MutexLock lock(&audit_mu_);
  if (audit_ == nullptr) return;
  std::fwrite(line.data(), 1, line.size(), audit_);
  std::fflush(audit_);
}

}  // namespace server
}  // namespace dattn
