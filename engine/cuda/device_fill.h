// Device-side fills and checks for tests and benchmarks of the CUDA backend: random inputs that are
// never zero (docs/ENGINE.md: never test on zeros), poison, and a count of non-finite
// elements (an unwritten poisoned output shows up as NaN). Launchers enqueue on `stream`, return
// the launch's cudaError_t and never synchronize.
#ifndef DATTN_ENGINE_CUDA_DEVICE_FILL_H_
#define DATTN_ENGINE_CUDA_DEVICE_FILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace cuda {

// x[i] := a value uniform in [-magnitude, magnitude] with |x| >= magnitude / 1000, from a counter
// hash of (seed, i): the same seed gives the same values on any device. Bytes: writes n elements.
cudaError_t LaunchFillRandom(void* x, ElemType type, int64_t n, uint64_t seed, float magnitude,
                             cudaStream_t stream);

// x[i] := value (NaN poisons). Bytes: writes n elements.
cudaError_t LaunchFillValue(void* x, ElemType type, int64_t n, float value, cudaStream_t stream);

// *count += number of NaN or infinite elements of x[0, n); *count is device memory. Bytes: reads n.
cudaError_t LaunchCountNonFinite(const void* x, ElemType type, int64_t n, unsigned long long* count,
                                 cudaStream_t stream);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_DEVICE_FILL_H_
