// Small host-side helpers shared by the CUDA backend and the CUDA ring kernels.
#ifndef DATTN_ENGINE_CUDA_DEVICE_SCOPE_H_
#define DATTN_ENGINE_CUDA_DEVICE_SCOPE_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// OK when CUDA ordinal `device` exists and is a Hopper (compute capability 9.0) or newer part, what
// every kernel here is built for. UNAVAILABLE without a usable CUDA device (the message starts "no
// CUDA device", which GPU tests show when they skip) or without that ordinal; FAILED_PRECONDITION
// for an older GPU. `who` names the caller in the message ("the CUDA backend").
inline absl::Status CheckHopperDevice(int device, const std::string& who) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    cudaGetLastError();  // The probe's error is answered here; it must not leak into later calls.
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount returned ", static_cast<int>(probe), " (",
        cudaGetErrorName(probe), ": ", cudaGetErrorString(probe), "), ", count, " devices"));
  }
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("CUDA device ", device, " does not exist; this machine has ", count));
  }
  cudaDeviceProp props;
  DATTN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&props, device));
  if (props.major < 9) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", device, " (", props.name, ") has compute capability ", props.major, ".",
        props.minor, "; ", who, " is built for Hopper (9.0) and newer"));
  }
  return absl::OkStatus();
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
