// The job inputs of random_inputs.h generated on the GPU that holds them: the same generator
// (normal_generator.h) over the same global indices, rounded once from double to the tensor's type
// with CUDA's round-to-nearest-even conversions, so that a rank's shard needs no host staging and
// no copy. Agreement with the host fill: see random_inputs.h.
#ifndef DATTN_WORKER_RANDOM_INPUTS_CUDA_H_
#define DATTN_WORKER_RANDOM_INPUTS_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dattn {
namespace worker {

// Element types the GPU fill writes (the CUDA backend's: it takes no fp64).
enum class GpuElem : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// out[((b * local_n + n) * row_elems) + e] := the normal deviate at global index
// ((b * seq_len + begin + n) * row_elems + e) of stream `key`, for b < batch, n < local_n,
// e < row_elems. `out` is contiguous device memory. Enqueues on `stream`, never synchronizes;
// returns the launch's error. Work: about 200 fp64 operations per element (two splitmix64
// finalizers, log, cos, sqrt); bytes: writes each element once.
cudaError_t LaunchFillStandardNormal(uint64_t key, int64_t batch, int64_t seq_len, int64_t begin,
                                     int64_t local_n, int64_t row_elems, GpuElem type, void* out,
                                     cudaStream_t stream);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_RANDOM_INPUTS_CUDA_H_
