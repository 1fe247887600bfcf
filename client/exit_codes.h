// The exit codes of the `dattn` CLI, and how gRPC errors from the coordinator map onto them.
//
// Scripts depend on these numbers: they are part of the CLI's interface (docs/CLI.md, `dattn
// --help`) and never change meaning. New codes may be added at the end.
#ifndef DATTN_CLIENT_EXIT_CODES_H_
#define DATTN_CLIENT_EXIT_CODES_H_

#include <string>

#include "grpcpp/support/status.h"

namespace dattn {
namespace client {

enum ExitCode : int {
  kExitOk = 0,           // Done (and, for --watch/--wait/watch, the job SUCCEEDED).
  kExitJobFailed = 1,    // The watched job ended FAILED.
  kExitUsage = 2,        // Bad flags, bad job file, or a spec that is obviously wrong locally.
  kExitNotFound = 3,     // No such job or worker (or no output tensor to save).
  kExitRejected = 4,     // The coordinator refused the request; its message says why.
  kExitUnavailable = 5,  // The coordinator could not be reached or did not answer in time.
  kExitCancelled = 6,    // The watched job ended CANCELLED.
  kExitInternal = 7,     // Anything else (a server bug, a local I/O error).
  kExitWaitRanOut = 8,   // drain --wait: the worker still ran tasks when the wait ran out.
};

// The exit code for a failed RPC. Must not be called with an OK status (returns kExitInternal
// then).
//   NOT_FOUND -> 3; INVALID_ARGUMENT, ALREADY_EXISTS, FAILED_PRECONDITION, RESOURCE_EXHAUSTED,
//   OUT_OF_RANGE, PERMISSION_DENIED, UNAUTHENTICATED -> 4; UNAVAILABLE, DEADLINE_EXCEEDED -> 5;
//   everything else -> 7.
ExitCode ExitCodeForRpc(grpc::StatusCode code);

// "INVALID_ARGUMENT", "UNAVAILABLE", ... for messages.
std::string RpcCodeName(grpc::StatusCode code);

// The table printed in `dattn --help` and docs/CLI.md: one line per code.
std::string ExitCodeHelp();

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_EXIT_CODES_H_
