// Where the CLI finds the coordinator, the gRPC channel it opens, and how RPC failures are
// explained.
//
// Address precedence: the --coordinator flag, else the DATTN_COORDINATOR environment variable, else
// 127.0.0.1:7070. Any gRPC target works ("host:port", "dns:///host:port", "unix:/path"). The
// channel is plaintext and accepts messages up to api::kMaxMessageBytes (the coordinator's limit:
// no message carries a tensor; outputs come in chunks from ReadOutput). Thread-safe (no state).
#ifndef DATTN_CLIENT_CONNECTION_H_
#define DATTN_CLIENT_CONNECTION_H_

#include <memory>
#include <string>

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

// A new channel to `address`. Never fails: connection errors surface on the first RPC.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// One message for a failed RPC `what` ("submit the job"): the gRPC code, the server's message, and
// what to do about it. UNAVAILABLE and DEADLINE_EXCEEDED name the address tried, where it came
// from, how to change it, and (for the deadline) the --timeout in force.
std::string DescribeRpcError(const grpc::Status& status, const std::string& what,
                             const Coordinator& coordinator, absl::Duration timeout);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_CONNECTION_H_
