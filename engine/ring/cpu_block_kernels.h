// The CPU implementation of BlockKernels (block_kernels.h): fp32 and fp64, exact to the spec's
// tolerances, multi-threaded over (batch, head) pairs.
//
// Like the CPU backend, it hands OpenBLAS the dilated rows in place (row stride r * H * D) whenever
// the channel stride is 1, and works in tiles of query x key rows with an online softmax, so
// scratch is O(threads x tile) whatever the segment length. Every output row, dq row and dK/dV row
// belongs to one (batch, head) pair, so running pairs on different threads needs no locking,
// whichever tasks a call holds. The threads are the kernels' own (engine/cpu_thread_pool.h, the CPU
// backend's pool), started once; one call at a time, as BlockKernels requires.
#ifndef DATTN_ENGINE_RING_CPU_BLOCK_KERNELS_H_
#define DATTN_ENGINE_RING_CPU_BLOCK_KERNELS_H_

#include <memory>

#include "engine/ring/block_kernels.h"

namespace dattn {
namespace ring {

struct CpuBlockKernelOptions {
  // Threads per call (the calling thread included), kept for the kernels' life; 0 means
  // std::thread::hardware_concurrency().
  int num_threads = 0;
};

std::unique_ptr<BlockKernels> NewCpuBlockKernels(const CpuBlockKernelOptions& options = {});

}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_CPU_BLOCK_KERNELS_H_
