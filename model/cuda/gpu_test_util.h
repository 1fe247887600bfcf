// What the model's GPU tests share: whether this process has a usable CUDA device, and a skip
// that says why not (CI has none: every GPU test skips there, naming the CUDA error). Testing only.
#ifndef DATTN_MODEL_CUDA_GPU_TEST_UTIL_H_
#define DATTN_MODEL_CUDA_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <string>

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace cuda {

// True when cudaGetDeviceCount finds a device; otherwise false with *why naming the CUDA error
// and the count (the error is cleared, so later calls are not affected).
inline bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    *why = std::string("no CUDA device: cudaGetDeviceCount returned ") +
           std::to_string(static_cast<int>(e)) + " (" + cudaGetErrorString(e) + "), " +
           std::to_string(count) + " devices";
    return false;
  }
  return true;
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn

// In a test body or a fixture's SetUp: skips the test, saying why, without a usable GPU.
#define SKIP_WITHOUT_GPU()                                           \
  do {                                                               \
    std::string why_;                                                \
    if (!::dattn::model::cuda::HaveGpu(&why_)) GTEST_SKIP() << why_; \
  } while (0)

#endif  // DATTN_MODEL_CUDA_GPU_TEST_UTIL_H_
