// Tile sizes of the CPU backend, shared by the backend and the memory planner so that the plan is the
// scratch the backend really allocates.
#ifndef DATTN_ENGINE_CPU_TILING_H_
#define DATTN_ENGINE_CPU_TILING_H_

#include <cstdint>

#include "engine/tensor.h"

namespace dattn {

// Bytes of scratch one CPU worker thread allocates for one call (score tile, accumulators, row
// statistics, any packed copies). The CPU backend allocates exactly this per thread.
int64_t CpuTileScratchBytes(DType dtype, int64_t head_dim, bool backward);

}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_TILING_H_
