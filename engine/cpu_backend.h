// The CPU backend: exact dilated attention in fp32 and fp64, forward and backward, multi-threaded.
//
// Tiled with an online softmax: memory beyond the caller's tensors is O(threads x tile), never
// O(segment^2): CpuTileScratchBytes (cpu_tiling.h) per thread, kept between calls. Accumulation is
// in the input precision (fp32 or fp64). It is the backend of workers without a GPU and the fp64
// reference that GPU and ring backends are checked against on large shapes.
//
// Capabilities: dtypes fp32 and fp64, any head dim D >= 1 (up to INT_MAX, BLAS's int), inputs of
// any strides (rows whose channel stride is 1 go to BLAS in place; others are gathered per tile).
// Results do not depend on the thread count (bit for bit).
//
// Matrix products: the fp32 forward pass runs its own AVX-512 micro-kernels when the CPU has
// AVX-512F and D is a multiple of 16 up to 128; every other product goes to OpenBLAS. The backend
// parallelises over (b, head, segment, query tile) itself and sets OpenBLAS to one thread at the
// start of every call (openblas_set_num_threads is process-wide). OpenBLAS picks its kernels from
// CPUID when the process starts; Debian's 0.3.21 does not know recent Xeons and falls back to SSE3
// kernels 4-5x slower than the AVX-512 ones: such processes need OPENBLAS_CORETYPE=SkylakeX
// (AVX-512) or Haswell (AVX2) in their environment. The workers and the CPU benchmark restart
// themselves with it (engine/openblas_core.h); other programs set it themselves
// (docs/PERFORMANCE_HISTORY.md, "OpenBLAS does not recognise this CPU").
#ifndef DATTN_ENGINE_CPU_BACKEND_H_
#define DATTN_ENGINE_CPU_BACKEND_H_

#include <memory>

#include "engine/attention.h"

namespace dattn {

struct CpuBackendOptions {
  // Worker threads for one call; 0 means std::thread::hardware_concurrency().
  int num_threads = 0;
};

// The returned backend owns its thread pool (num_threads - 1 threads; the calling thread works
// too) and its scratch; one call at a time per instance. Errors: validate.h's, as INVALID_ARGUMENT,
// before anything is written.
std::unique_ptr<AttentionBackend> NewCpuBackend(const CpuBackendOptions& options = {});

}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_BACKEND_H_
