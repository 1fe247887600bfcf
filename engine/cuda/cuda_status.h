// CUDA runtime and cuDNN return codes as absl::Status, converted at the call site.
//
// Every CUDA or cuDNN call of the CUDA backend goes through one of the macros below, so that an
// error names the call, the code and the place. Mapping: out of memory -> RESOURCE_EXHAUSTED (the
// worker's out-of-memory recovery looks for it); no device, no driver or a driver too old ->
// UNAVAILABLE; cuDNN "not supported" -> UNIMPLEMENTED; everything else -> INTERNAL. Pure functions;
// thread-safe.
#ifndef DATTN_ENGINE_CUDA_CUDA_STATUS_H_
#define DATTN_ENGINE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "absl/status/status.h"

namespace dattn {
namespace cuda {

// "cudaMalloc(&p, bytes) failed: cudaErrorMemoryAllocation (2): out of memory
// [engine/cuda/x.cc:12]"
absl::Status CudaErrorStatus(cudaError_t code, const char* call, const char* file, int line);

// As above for cuDNN; appends cudnnGetLastErrorString when it has something to say.
absl::Status CudnnErrorStatus(cudnnStatus_t code, const char* call, const char* file, int line);

}  // namespace cuda
}  // namespace dattn

// Evaluates a cudaError_t expression; returns the converted Status from the enclosing function on
// error.
#define DATTN_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                    \
    const cudaError_t dattn_cuda_code_ = (expr);                                          \
    if (dattn_cuda_code_ != cudaSuccess) {                                                \
      return ::dattn::cuda::CudaErrorStatus(dattn_cuda_code_, #expr, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)

// Evaluates a cudnnStatus_t expression; returns the converted Status on error.
#define DATTN_CUDNN_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                      \
    const cudnnStatus_t dattn_cudnn_code_ = (expr);                                         \
    if (dattn_cudnn_code_ != CUDNN_STATUS_SUCCESS) {                                        \
      return ::dattn::cuda::CudnnErrorStatus(dattn_cudnn_code_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

// Evaluates an absl::Status expression; returns it on error.
#define DATTN_RETURN_IF_ERROR(expr)                \
  do {                                             \
    const ::absl::Status dattn_status_ = (expr);   \
    if (!dattn_status_.ok()) return dattn_status_; \
  } while (0)

#endif  // DATTN_ENGINE_CUDA_CUDA_STATUS_H_
