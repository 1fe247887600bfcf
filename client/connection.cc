#include "client/connection.h"

#include "api/limits.h"

#include "absl/strings/str_cat.h"
#include "client/exit_codes.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace dattn {
namespace client {

Coordinator ResolveCoordinator(const std::string& flag, const char* env) {
  if (!flag.empty()) return {flag, "--coordinator"};
  if (env != nullptr && env[0] != '\0') return {env, kCoordinatorEnv};
  return {kDefaultCoordinator, "default"};
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
  // `dattn watch` holds a stream open for as long as a job runs; keepalive pings notice a
  // connection that died without a reset. gRPC servers refuse pings more often than every 5 minutes
  // by default (too_many_pings), hence the long interval; pings continue while no data flows.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 330 * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

std::string DescribeRpcError(const grpc::Status& status, const std::string& what,
                             const Coordinator& coordinator, absl::Duration timeout) {
  const std::string code = RpcCodeName(status.error_code());
  const std::string detail = status.error_message();
  const std::string from = coordinator.source == "default"
                               ? "the default address"
                               : absl::StrCat("from ", coordinator.source);
  const std::string how = absl::StrCat(
      "Start the coordinator there, or point dattn at it with --coordinator HOST:PORT "
      "or the ",
      kCoordinatorEnv, " environment variable.");
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StrCat("cannot ", what, ": the coordinator at ", coordinator.address, " (", from,
                          ") is unavailable (", code, ": ", detail, "). ", how);
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat("cannot ", what, ": the coordinator at ", coordinator.address, " (", from,
                          ") did not answer within --timeout ", absl::FormatDuration(timeout), " (",
                          code, ": ", detail, "). Raise --timeout, or check that ",
                          coordinator.address, " is the coordinator. ", how);
    case grpc::StatusCode::NOT_FOUND:
      return absl::StrCat("cannot ", what, ": not found (", code, "): ", detail);
    default:
      break;
  }
  if (ExitCodeForRpc(status.error_code()) == kExitRejected) {
    return absl::StrCat("the coordinator rejected the request to ", what, " (", code,
                        "): ", detail);
  }
  return absl::StrCat("cannot ", what, ": the coordinator at ", coordinator.address,
                      " returned an error (", code, "): ", detail);
}

}  // namespace client
}  // namespace dattn
