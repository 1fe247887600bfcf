#include "client/exit_codes.h"

namespace dattn {
namespace client {

ExitCode ExitCodeForRpc(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::NOT_FOUND:
      return kExitNotFound;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return kExitRejected;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnavailable;
    default:
      return kExitInternal;
  }
}

std::string RpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    default:
      return "CODE_" + std::to_string(static_cast<int>(code));
  }
}

std::string ExitCodeHelp() {
  return "Exit codes:\n"
         "  0  success (with --watch/--wait/watch: the job SUCCEEDED)\n"
         "  1  the job FAILED (--watch/--wait/watch)\n"
         "  2  usage error: bad flag, bad job file, locally invalid spec\n"
         "  3  not found: no such job or worker\n"
         "  4  rejected by the coordinator (INVALID_ARGUMENT, ALREADY_EXISTS, "
         "FAILED_PRECONDITION,\n"
         "     RESOURCE_EXHAUSTED, ...): its message says what to change\n"
         "  5  coordinator unavailable or no answer before --timeout\n"
         "  6  the job was CANCELLED (--watch/--wait/watch)\n"
         "  7  other internal error\n"
         "  8  drain --wait: the worker still runs tasks when the wait runs out\n";
}

}  // namespace client
}  // namespace dattn
