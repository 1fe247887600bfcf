// Aborting the several communicators of one rank together.
//
// Why not one after another: NCCL's ncclCommAbort first raises the communicator's abort flag (the
// kernels of that communicator poll it and return), then releases its resources, and releasing
// pinned host memory (cudaFreeHost) waits for the whole device. A rank with two communicators (a
// training rank: the world's and its sequence group's) whose peer died has a kernel of each
// spinning on the dead peer; aborting the first communicator alone then waits forever for the
// second's kernel, whose abort flag is raised only after the first abort returns. Seen on two
// H100s: the survivor of a killed rank hung in commFree -> cudaFreeHost -> cuMemFreeHost.
//
// AbortAll calls Abort on every communicator from a thread of its own, so that every abort flag is
// raised before any abort waits for the device, and returns when all have returned. Nothing here is
// NCCL-specific: Gloo's Abort returns at once and is called the same way.
//
// Thread-safety: as Communicator::Abort (thread-safe, idempotent); the communicators must outlive
// the call. Null entries are skipped.
#ifndef DATTN_ENGINE_COMM_ABORT_ALL_H_
#define DATTN_ENGINE_COMM_ABORT_ALL_H_

#include <string>

#include "absl/types/span.h"
#include "engine/comm/communicator.h"

namespace dattn {
namespace comm {

void AbortAll(absl::Span<Communicator* const> comms, const std::string& reason);

}  // namespace comm
}  // namespace dattn

#endif  // DATTN_ENGINE_COMM_ABORT_ALL_H_
