// Transport security for every gRPC endpoint of dattn: TLS credentials from PEM files, for servers
// (the coordinator's API, a worker's health port) and clients (the CLI, workers, tests).
//
// Files, not bytes: certificates and keys are read from files (in Kubernetes, a mounted Secret) and
// re-read every `refresh` (gRPC's FileWatcherCertificateProvider), so a rotated certificate is used
// by new connections without a restart; connections already open keep the old one. The files are
// also checked once when the credentials are made: a missing, unreadable or malformed file is
// INVALID_ARGUMENT naming the file and the flag that gave it, before the process starts serving.
//
// Server credentials present `cert_file`/`key_file`. With a `ca_file` they also ask every client
// for a certificate and verify any that is presented against that CA (a client without one is let
// in: users authenticate with bearer tokens, auth.h); PeerHasClusterCertificate then says whether
// the peer of a call presented a valid certificate, which WorkerRegistry calls require (mutual TLS
// between coordinator and workers). A certificate that is expired, not yet valid or signed by
// another CA fails the handshake itself.
//
// Channel credentials verify the server's certificate against `ca_file` and its name against the
// target's host (or `server_name` when set: a certificate made for "coordinator" reached at an IP);
// with `cert_file`/`key_file` they present a client certificate (workers do; the CLI need not).
//
// Thread-safety: the functions are thread-safe; the credentials they return may be shared.
#ifndef DATTN_SECURITY_TLS_H_
#define DATTN_SECURITY_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace dattn {
namespace security {

// How often certificate files are re-read.
inline constexpr absl::Duration kDefaultRefresh = absl::Seconds(60);

struct TlsFiles {
  std::string ca_file;    // PEM bundle of the cluster CA.
  std::string cert_file;  // PEM certificate chain of this process.
  std::string key_file;   // PEM private key of cert_file.
  // The flags these came from, for error messages ("--tls-cert").
  std::string ca_flag = "--tls-ca";
  std::string cert_flag = "--tls-cert";
  std::string key_flag = "--tls-key";

  bool empty() const { return ca_file.empty() && cert_file.empty() && key_file.empty(); }
};

// Credentials for a server. Needs cert_file and key_file; ca_file optional (see above).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& files, absl::Duration refresh = kDefaultRefresh);

// Credentials for a client. Needs ca_file; cert_file and key_file together or neither.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files, absl::Duration refresh = kDefaultRefresh);

// True when the call's peer completed a TLS handshake presenting a certificate that the server's
// CA verified. False on a plaintext server and for TLS clients without a certificate.
bool PeerHasClusterCertificate(const grpc::ServerContext& context);

// The peer certificate's subject common name, "" when there is none.
std::string PeerCommonName(const grpc::ServerContext& context);

// Worker certificates bind the names a worker may register as: scripts/make-certs.sh gives a worker
// certificate the subject common name "dattn-worker PATTERN", where PATTERN is one name ("host-a":
// that name only) or a prefix followed by '*' ("dattn-gpu-worker-*": every name that starts with
// it; "*" alone: any name, for a fleet that shares one certificate). A certificate of the cluster
// CA without that form (the coordinator's) binds no name.
inline constexpr char kWorkerCommonNamePrefix[] = "dattn-worker ";

// The worker-name pattern of a common name; "" when `common_name` is not a worker's.
std::string WorkerNamePattern(const std::string& common_name);

// Whether `pattern` (from WorkerNamePattern) admits the worker name `name`. An empty pattern admits
// none.
bool WorkerNameAllowed(const std::string& pattern, const std::string& name);

// The daemons' start-up rule for their transport flags, one for both binaries: `insecure` together
// with any --tls-* file is INVALID_ARGUMENT ("contradict each other"); without `insecure`,
// `files.ca_file`, `cert_file` and `key_file` and every value in `other_required` (the
// coordinator's --token-file) must be given, else INVALID_ARGUMENT with `missing` (the daemon's
// message naming the flags and how to make them).
absl::Status CheckTransportFlags(const TlsFiles& files, bool insecure,
                                 const std::vector<std::string>& other_required,
                                 const std::string& missing);

// Checks that `path` holds what `what` says ("certificate", "private key", "CA bundle"): readable
// and at least one PEM object of that kind that OpenSSL parses. INVALID_ARGUMENT naming `flag` and
// the path otherwise. Exposed for the binaries' start-up checks.
absl::Status CheckPemFile(const std::string& path, const std::string& flag,
                          const std::string& what);

}  // namespace security
}  // namespace dattn

#endif  // DATTN_SECURITY_TLS_H_
