// The worker's own first step when memory runs out (docs/ARCHITECTURE.md, "Failure handling, in
// order of preference", step 1): an allocation that fails with RESOURCE_EXHAUSTED where it happens
// (a tensor's Allocate, a model's device arrays) has what the failed attempt holds freed, the
// device's caches released (TaskDevice::ReleaseCaches) and is tried once more. Only then does the
// rank fail with RESOURCE_EXHAUSTED, which the coordinator answers with its recovery ladder (more
// micro-batches, more ranks, bf16 where allowed).
//
// Only set-up is retried, before a ring rank's first collective: a step of a ring cannot be run
// again by one rank alone (its peers are in the same step), and a single rank's steps allocate
// nothing of their own beyond what set-up made.
//
// Thread-safety: a call runs on the caller's thread; `device` as TaskDevice.
#ifndef DATTN_WORKER_OOM_RETRY_H_
#define DATTN_WORKER_OOM_RETRY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

// What RetryOnceOutOfMemory did.
struct OomRetry {
  int retries = 0;             // 0, or 1 when the first attempt ran out of memory.
  bool recovered = false;      // The retry succeeded.
  int64_t released_bytes = 0;  // What releasing the caches gave back (ReleaseCaches).
  std::string first_error;     // The first attempt's message.
};

// Runs `attempt`. When it fails with RESOURCE_EXHAUSTED: runs `undo` (frees what the failed attempt
// holds), releases the device's caches, runs `attempt` once more and fills `record` (not null).
// A second RESOURCE_EXHAUSTED keeps its code, its message adding that it was retried once after
// releasing the caches (with the bytes that gave back) and the first attempt's message; a failed
// release is reported the same way, without a retry. Any other error, and success, pass through.
absl::Status RetryOnceOutOfMemory(TaskDevice* device, const std::function<absl::Status()>& attempt,
                                  const std::function<void()>& undo, OomRetry* record);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_OOM_RETRY_H_
