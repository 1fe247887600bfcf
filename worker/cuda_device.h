// One GPU as a TaskDevice (task_device.h), for dattn-worker-gpu: the CUDA backend (engine/cuda) for
// single-rank tasks, the CUDA ring kernels (engine/ring/cuda_block_kernels.h) and NCCL
// communicators (engine/comm/nccl_communicator.h) for ring ranks, device memory (cudaMalloc) for
// tensors, cudaMemGetInfo for free memory. Tensors are copied with cudaMemcpy on the legacy default
// stream, which the backends' own blocking streams are ordered after.
//
// Every call sets the device on the calling thread first (cudaSetDevice), so any worker thread may
// use it.
#ifndef DATTN_WORKER_CUDA_DEVICE_H_
#define DATTN_WORKER_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

struct CudaDeviceOptions {
  int device = 0;  // CUDA ordinal.
};

// UNAVAILABLE when CUDA finds no device or not this ordinal (naming how many it sees); the CUDA
// runtime's other errors as engine/cuda/cuda_status.h maps them.
absl::StatusOr<std::unique_ptr<TaskDevice>> NewCudaDevice(const CudaDeviceOptions& options);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_CUDA_DEVICE_H_
