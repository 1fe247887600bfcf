// The fp64 checksums of a task's outputs (attention_task.h: sum and sum of squares of every
// element) on the GPU that holds them, so that no output is read back to the host for them.
#ifndef DATTN_WORKER_CHECKSUM_CUDA_H_
#define DATTN_WORKER_CHECKSUM_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/random_inputs_cuda.h"  // GpuElem

namespace dattn {
namespace worker {

// Blocks of the checksum kernel: `partial` holds 2 * kChecksumBlocks doubles.
inline constexpr int kChecksumBlocks = 1024;

// partial[2 b] and partial[2 b + 1] := the sum and the sum of squares, in fp64, of the elements
// i of `data` (count elements of `type`, device memory) with i mod (kChecksumBlocks * 256) in block
// b's 256 threads' share: thread t of block b adds elements t', t' + T, t' + 2T, ... (t' = 256 b +
// t, T = 256 kChecksumBlocks) in order, and the block adds its threads' sums in a fixed tree. The
// caller adds the blocks' sums in block order: the result depends on the count and the values
// only, never on the GPU or the timing. `partial` is device memory. Enqueues on `stream`; returns
// the launch's error. Work: 3 fp64 operations per element; bytes: reads each element once.
cudaError_t LaunchChecksum(const void* data, int64_t count, GpuElem type, double* partial,
                           cudaStream_t stream);

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_CHECKSUM_CUDA_H_
