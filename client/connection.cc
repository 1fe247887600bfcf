#include "client/connection.h"

#include "api/limits.h"

#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/exit_codes.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_interceptor.h"
#include "security/tls.h"

namespace dattn {
namespace client {

Coordinator ResolveCoordinator(const std::string& flag, const char* env) {
  if (!flag.empty()) return {flag, "--coordinator"};
  if (env != nullptr && env[0] != '\0') return {env, kCoordinatorEnv};
  return {kDefaultCoordinator, "default"};
}

namespace {

// Adds "authorization: Bearer <token>" to every call of a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // Lives as long as the channel, which owns the factory.
};

}  // namespace

absl::StatusOr<ClientSecurity> ResolveSecurity(const std::string& ca_flag, const char* ca_env,
                                               const std::string& token_file, const char* token_env,
                                               bool insecure) {
  ClientSecurity security;
  security.insecure = insecure;
  if (!insecure) {
    security.ca_file = !ca_flag.empty() ? ca_flag : (ca_env != nullptr ? ca_env : "");
  }
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", token_file, ": cannot be read"));
    }
    std::getline(in, security.token);
    security.token = std::string(absl::StripAsciiWhitespace(security.token));
    if (security.token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", token_file, ": its first line holds no token"));
    }
  } else if (token_env != nullptr) {
    security.token = std::string(absl::StripAsciiWhitespace(token_env));
  }
  if (!security.token.empty() && security.ca_file.empty() && !insecure) {
    return absl::InvalidArgumentError(
        absl::StrCat("a bearer token goes only over TLS: give --tls-ca (or ", kTlsCaEnv,
                     ") with the cluster CA, or --insecure for a coordinator without TLS"));
  }
  return security;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
  // `dattn watch` holds a stream open for as long as a job runs; keepalive pings notice a
  // connection that died without a reset. gRPC servers refuse pings more often than every 5 minutes
  // by default (too_many_pings), hence the long interval; pings continue while no data flows.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 330 * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.ca_file.empty()) {
    security::TlsFiles files;
    files.ca_file = security.ca_file;
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
        security::ChannelCredentials(files);
    if (!tls.ok()) return tls.status();
    credentials = *tls;
    if (!security.server_name.empty()) {
      args.SetSslTargetNameOverride(security.server_name);
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty()) {
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
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
                          ") is unavailable (", code, ": ", detail, "). ", how,
                          " A coordinator with TLS needs --tls-ca (or ", kTlsCaEnv,
                          "); one started --insecure needs no CA.");
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat("cannot ", what, ": the coordinator at ", coordinator.address, " (", from,
                          ") did not answer within --timeout ", absl::FormatDuration(timeout), " (",
                          code, ": ", detail, "). Raise --timeout, or check that ",
                          coordinator.address, " is the coordinator. ", how);
    case grpc::StatusCode::NOT_FOUND:
      return absl::StrCat("cannot ", what, ": not found (", code, "): ", detail);
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::StrCat("cannot ", what, ": the coordinator at ", coordinator.address,
                          " does not know who you are (", code, ": ", detail,
                          "). Pass your token with --token-file FILE or ", kTokenEnv, ".");
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StrCat("cannot ", what, ": not allowed (", code, "): ", detail);
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
