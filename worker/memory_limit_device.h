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

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_MEMORY_LIMIT_DEVICE_H_
