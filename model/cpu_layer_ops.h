// The CPU implementation of LayerOps, in fp32 and fp64.
//
// GEMMs (linear layers, the LM head) go to OpenBLAS (cblas_sgemm / cblas_dgemm), in row chunks of
// at most 2^30 so that any m works with BLAS's int. The other layers are single-threaded loops over
// rows (memory-bound: O(elements) work against O(elements) bytes). Reductions (LayerNorm
// statistics, cross-entropy sums, bias and LayerNorm parameter gradients) accumulate in fp64 in a
// fixed order, so results are deterministic for a given thread count, and, in fp32, more accurate
// than the storage type. GELU and the softmax use libm's erf/exp in the compute type.
//
// OpenBLAS's thread count is process-wide and the engine's CPU backend sets it to 1 at every call;
// these ops set it back to their own count before each GEMM.
#ifndef DATTN_MODEL_CPU_LAYER_OPS_H_
#define DATTN_MODEL_CPU_LAYER_OPS_H_

#include <memory>

#include "model/layer_ops.h"

namespace dattn {
namespace model {

struct CpuLayerOpsOptions {
  // OpenBLAS threads for the GEMMs; 0 means std::thread::hardware_concurrency().
  int num_threads = 0;
};

// T is float or double. Memory from Allocate is 64-byte aligned host memory.
template <typename T>
std::unique_ptr<LayerOps<T>> NewCpuLayerOps(const CpuLayerOpsOptions& options = {});

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CPU_LAYER_OPS_H_
