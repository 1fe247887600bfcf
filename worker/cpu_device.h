// The host as a TaskDevice (task_device.h): the CPU backend for single-rank tasks, the CPU ring
// kernels and Gloo rings over TCP for ring ranks, host memory for tensors.
#ifndef DATTN_WORKER_CPU_DEVICE_H_
#define DATTN_WORKER_CPU_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

struct CpuDeviceOptions {
  // Numeric address (or resolvable name) of the interface Gloo listens on for ring peers; peers on
  // other hosts must be able to reach it.
  std::string ring_address = "127.0.0.1";
};

// Reads the CPU model and MemTotal. UNAVAILABLE if /proc/meminfo cannot be read.
absl::StatusOr<std::unique_ptr<TaskDevice>> NewCpuDevice(const CpuDeviceOptions& options = {});

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_CPU_DEVICE_H_
