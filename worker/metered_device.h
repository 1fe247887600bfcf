// MeteredDevice: a TaskDevice that is another one, and tells who asks when one of its ring
// communicators fails, for the worker's metrics (worker_metrics.h).
//
// Every call goes to the wrapped device unchanged. Communicators from NewCommunicator (and from
// their Shrink) come back wrapped: each reports, at most once, the moment it is found broken (an
// operation failed and health() is no longer OK, or it is destroyed broken) with any error but
// ABORTED, which is what this worker's own Abort gives (a cancelled rank, a stopping worker): a
// peer that closed its connection (UNAVAILABLE), a wait past the timeout (DEADLINE_EXCEEDED), a
// library error (INTERNAL, e.g. an asynchronous NCCL error). A NewCommunicator that fails (the
// transport could not be set up) reports its error too, unless it is CANCELLED or ABORTED. Nothing
// is reported for INVALID_ARGUMENT calls that leave the communicator healthy (a caller's bug, not
// the network).
//
// Thread-safety: as TaskDevice and Communicator (the wrapped objects' contracts); `on_failure` may
// be called from any thread that drives or checks a communicator, and must be thread-safe.
#ifndef DATTN_WORKER_METERED_DEVICE_H_
#define DATTN_WORKER_METERED_DEVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

// `backend` is the communicator's name() ("gloo", "nccl"), or the backend asked for when creation
// failed; `status` the error.
using CommunicatorFailureCallback =
    std::function<void(const std::string& backend, const absl::Status& status)>;

// `device` must not be null.
std::unique_ptr<TaskDevice> NewMeteredDevice(std::shared_ptr<TaskDevice> device,
                                             CommunicatorFailureCallback on_failure);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_METERED_DEVICE_H_
