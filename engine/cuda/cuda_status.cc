#include "engine/cuda/cuda_status.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace cuda {
namespace {

// Trims "external/..." or an absolute prefix so that messages name the file the way the repo does.
const char* ShortFile(const char* file) {
  const char* p = std::strstr(file, "engine/");
  return p != nullptr ? p : file;
}

}  // namespace

absl::Status CudaErrorStatus(cudaError_t code, const char* call, const char* file, int line) {
  std::string message =
      absl::StrCat(call, " failed: ", cudaGetErrorName(code), " (", static_cast<int>(code),
                   "): ", cudaGetErrorString(code), " [", ShortFile(file), ":", line, "]");
  switch (code) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudnnErrorStatus(cudnnStatus_t code, const char* call, const char* file, int line) {
  std::string message =
      absl::StrCat(call, " failed: ", cudnnGetErrorString(code), " (", static_cast<int>(code),
                   ") [", ShortFile(file), ":", line, "]");
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') absl::StrAppend(&message, "; cuDNN says: ", detail);
  const int category = (static_cast<int>(code) / 1000) * 1000;
  if (code == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      code == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(message);
  }
  if (category == CUDNN_STATUS_NOT_SUPPORTED) return absl::UnimplementedError(message);
  return absl::InternalError(message);
}

}  // namespace cuda
}  // namespace dattn
