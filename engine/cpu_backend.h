// The CPU backend: exact dilated attention in fp32 and fp64, forward and backward, multi-threaded.
//
// Tiled with an online softmax: memory beyond the caller's tensors is O(threads x tile), never
// O(segment^2). Accumulation is in the input precision (fp32 or fp64). It is the backend of workers
// without a GPU and the fp64 reference that GPU and ring backends are checked against on large shapes.
#ifndef DATTN_ENGINE_CPU_BACKEND_H_
#define DATTN_ENGINE_CPU_BACKEND_H_

#include <memory>

#include "engine/attention.h"

namespace dattn {

struct CpuBackendOptions {
  // Worker threads for one call; 0 means std::thread::hardware_concurrency().
  int num_threads = 0;
};

// The returned backend owns its thread pool; one call at a time per instance.
std::unique_ptr<AttentionBackend> NewCpuBackend(const CpuBackendOptions& options = {});

}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_BACKEND_H_
