// Where the CLI finds the coordinator, the gRPC channel it opens, and how RPC failures are
// explained.
//
// Address precedence: the --coordinator flag, else the DATTN_COORDINATOR environment variable, else
// 127.0.0.1:7070. Any gRPC target works ("host:port", "dns:///host:port", "unix:/path"). The
// channel accepts messages up to api::kMaxMessageBytes (the coordinator's limit: no message
// carries a tensor; outputs come in chunks from ReadOutput). Thread-safe (no state).
//
// Security (docs/SECURITY.md): with a CA (--tls-ca or DATTN_TLS_CA) the channel is TLS and checks
// the coordinator's certificate; a bearer token (--token-file, or DATTN_TOKEN itself) goes in every
// call's `authorization` metadata. A token is never sent in plaintext: a token without a CA is an
// error unless --insecure says plaintext is meant. Neither a CA nor a token: plaintext, for a
// coordinator started --insecure.
#ifndef DATTN_CLIENT_CONNECTION_H_
#define DATTN_CLIENT_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"

namespace dattn {
namespace client {

constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
constexpr char kCoordinatorEnv[] = "DATTN_COORDINATOR";

struct Coordinator {
  std::string address;
  std::string
      source;  // How the address was chosen: "--coordinator", "DATTN_COORDINATOR", "default".
};

// `flag` is the --coordinator value ("" when not given); `env` the environment variable's value
// (nullptr or "" when unset).
Coordinator ResolveCoordinator(const std::string& flag, const char* env);

constexpr char kTokenEnv[] = "DATTN_TOKEN";
constexpr char kTlsCaEnv[] = "DATTN_TLS_CA";

struct ClientSecurity {
  std::string ca_file;      // TLS when set.
  std::string token;        // The bearer token itself ("" = none).
  std::string server_name;  // Name to check the certificate against ("" = the address's host).
  bool insecure = false;    // Plaintext even with a token.
};

// Resolves the flags and environment: `token_file` (the --token-file flag) wins over
// `token_env`, `ca_flag` over `ca_env`. INVALID_ARGUMENT for an unreadable or empty token file, and
// for a token without a CA unless `insecure`.
absl::StatusOr<ClientSecurity> ResolveSecurity(const std::string& ca_flag, const char* ca_env,
                                               const std::string& token_file, const char* token_env,
                                               bool insecure);

// A new channel to `address`. Connection errors surface on the first RPC; INVALID_ARGUMENT for an
// unusable CA file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientSecurity& security = {});

// One message for a failed RPC `what` ("submit the job"): the gRPC code, the server's message, and
// what to do about it. UNAVAILABLE and DEADLINE_EXCEEDED name the address tried, where it came
// from, how to change it, and (for the deadline) the --timeout in force.
std::string DescribeRpcError(const grpc::Status& status, const std::string& what,
                             const Coordinator& coordinator, absl::Duration timeout);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_CONNECTION_H_
