// Fault-injecting devices (tests and fault drills only).
//
// A device with less memory than it reports: its allocations fail with RESOURCE_EXHAUSTED, where
// they happen, once `limit_bytes` are outstanding, while its free-memory figure stays the real
// device's. The fault-injection seam for out of memory while running (docs/OPERATIONS.md,
// `--fault-device-memory-bytes`): the coordinator plans and places a rank on the figures it is
// shown, and the rank runs out of memory at a real allocation site, as on a GPU another process
// filled after placement.
//
// Thread-safety: as the base device's; the outstanding count is atomic, and a buffer may be freed
// from any thread.
#ifndef DATTN_WORKER_MEMORY_LIMIT_DEVICE_H_
#define DATTN_WORKER_MEMORY_LIMIT_DEVICE_H_

#include <cstdint>
#include <memory>

#include "worker/task_device.h"

namespace dattn {
namespace worker {

// `limit_bytes` >= 0 (0: every allocation fails).
std::unique_ptr<TaskDevice> NewMemoryLimitDevice(std::shared_ptr<TaskDevice> base,
                                                 int64_t limit_bytes);

// A device whose allocations number `first`, `first` + 1, ..., `first` + `count` - 1 (counted from
// 1 over the device's life, every caller together) fail with RESOURCE_EXHAUSTED naming the tensor,
// as if another process held the memory for a moment; the others go to `base`. The seam for the
// worker's own step (oom_retry.h: release caches, retry once) at each allocation site, like
// LevelDB's fault-injecting Env (`--fault-allocation-failures FIRST:COUNT`). first >= 1, count >=
// 0.
std::unique_ptr<TaskDevice> NewFailingAllocationsDevice(std::shared_ptr<TaskDevice> base,
                                                        int64_t first, int64_t count);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_MEMORY_LIMIT_DEVICE_H_
