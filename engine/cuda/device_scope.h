// Small host-side helpers shared by the CUDA backend and the CUDA ring kernels.
#ifndef DATTN_ENGINE_CUDA_DEVICE_SCOPE_H_
#define DATTN_ENGINE_CUDA_DEVICE_SCOPE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/kernel_types.h"
#include "engine/tensor.h"

namespace dattn {
namespace cuda {

// The kernels' element type of an engine dtype (fp16, bf16; fp32 for the rest).
inline ElemType ElemTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return ElemType::kF16;
    case DType::kBFloat16:
      return ElemType::kBF16;
    default:
      return ElemType::kF32;
  }
}

// fp16 or bf16: the types cuDNN's fused attention takes.
inline bool IsHalfType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// Makes `device` current for the scope and restores the caller's device when it ends, so that a
// backend bound to one GPU never changes the calling thread's device behind its back.
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }

  absl::Status Enter(int device) {
    DATTN_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (previous_ != device) {
      DATTN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
      switched_ = true;
    }
    return absl::OkStatus();
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_DEVICE_SCOPE_H_
