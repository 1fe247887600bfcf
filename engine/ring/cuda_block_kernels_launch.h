// The memory-bound CUDA kernels of the ring's CUDA block kernels (cuda_block_kernels.h): moving
// dilated rows between a rank's (B, L, H, D) shards and packed blocks or tiles, merging a block's
// partial result into out/lse by log-sum-exp, and the fills of BeginForward / BeginBackward /
// EndForward. Attention itself is cuDNN's (engine/cuda/cudnn_sdpa.h) or the CUDA backend's own
// kernel (engine/cuda/attention_kernels.h); the strided-view helpers of
// engine/cuda/dilated_kernels.h serve the local segments.
//
// Internal to engine/ring (no absl, so that nvcc and the host compiler both include it). Launchers
// enqueue on `stream`, return the launch's cudaError_t (cudaSuccess for empty work) and never
// synchronize. Element offsets are int64; every index into a row space is int64 too.
#ifndef DATTN_ENGINE_RING_CUDA_BLOCK_KERNELS_LAUNCH_H_
#define DATTN_ENGINE_RING_CUDA_BLOCK_KERNELS_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace ring {
namespace cudak {

// Rows (b, k, i) x channels d of a strided set of rows: element at base + b*sb + k*sk + i*si + d*sc
// (element units). Packed blocks, tiles and shards are all described this way.
struct RowMap {
  int64_t base = 0;
  int64_t sb = 0;
  int64_t sk = 0;
  int64_t si = 0;
  int64_t sc = 1;
};

// Where the log-sum-exp of row (b, k, i) of a possibly chunked square call lies: the rows of one
// (b, k) are cut into chunks of `chunk` rows, and chunk t's stats are a packed [nb, nk, chunk]
// array: index ((t * nb + b) * nk + k) * chunk + i % chunk with t = i / chunk.
struct StatsMap {
  int64_t nb = 0;
  int64_t nk = 0;
  int64_t chunk = 1;
};

// dst[row] := (accumulate ? dst[row] : 0) + scale * src[row] for rows (b < nb, k < nk, i < rows),
// converting the element type through fp32. Bytes: reads src (and dst when accumulating), writes
// dst.
cudaError_t LaunchCopyRows(const void* src, cuda::ElemType src_type, const RowMap& src_map,
                           void* dst, cuda::ElemType dst_type, const RowMap& dst_map, int64_t nb,
                           int64_t nk, int64_t rows, int64_t dim, float scale, bool accumulate,
                           cudaStream_t stream);

// Merges a block's partial result (tile rows, log-sum-exp from stats) into out/lse, row by row:
// L = logaddexp(lse, l); out := out e^(lse - L) + tile e^(l - L); lse := L. direct: out := tile,
// lse := l (the row's only contribution). lse_map's sc is unused. Rows whose l is -inf (no visible
// key) are left alone. Bytes: 2-3 x D elements per row.
cudaError_t LaunchMergeRows(const void* tile, const RowMap& tile_map, const float* stats,
                            const StatsMap& stats_map, void* out, const RowMap& out_map, float* lse,
                            const RowMap& lse_map, cuda::ElemType type, int64_t nb, int64_t nk,
                            int64_t rows, int64_t dim, bool direct, cudaStream_t stream);

// stats[row] := lse[row] + add for rows (b < nb, k < nk, i < rows) in the StatsMap layout.
cudaError_t LaunchGatherLse(const float* lse, const RowMap& lse_map, float add, float* stats,
                            const StatsMap& stats_map, int64_t nb, int64_t nk, int64_t rows,
                            cudaStream_t stream);

// dst[i] += src[i], i < n.
cudaError_t LaunchAddF32(float* dst, const float* src, int64_t n, cudaStream_t stream);

// dst[i] := value, i < n.
cudaError_t LaunchFillF32(float* dst, int64_t n, float value, cudaStream_t stream);

// Grouped mode's row classes on one rank. Pattern p's heads [head_begin, head_end) select global
// positions g with (g mod w) >= o and ((g mod w) - o) mod r == 0. Rows in `chunk` ranges
// (shard-local positions of the segments whose rows several ranks hold) are accumulated by the
// ring, every other selected row is written once. All values fit 32 bits (the caller checks).
constexpr int kMaxFillPatterns = 16;
struct FillPattern {
  int32_t head_begin = 0;
  int32_t head_end = 0;
  uint32_t w = 1;
  uint32_t r = 1;
  uint32_t o = 0;
  int32_t chunk_begin[2] = {0, 0};
  int32_t chunk_end[2] = {0, 0};
};
struct FillParams {
  int32_t batch = 0;
  int32_t shard_len = 0;  // L
  int32_t heads = 0;
  int32_t dim = 0;
  uint32_t shard_begin = 0;  // global position of the shard's first row
  int32_t patterns = 0;
  FillPattern p[kMaxFillPatterns];
};

// For every (B, L, H) row of the contiguous x (and lse (B, H, L), if not null): rows that are not
// selected or lie in a chunk range := 0 (lse := -inf); other rows are left alone. Bytes: writes
// those rows.
cudaError_t LaunchInitRows(void* x, cuda::ElemType type, float* lse, const FillParams& params,
                           cudaStream_t stream);

// Selected rows of x *= scale. Bytes: reads and writes the selected rows.
cudaError_t LaunchScaleSelected(void* x, cuda::ElemType type, const FillParams& params, float scale,
                                cudaStream_t stream);

}  // namespace cudak
}  // namespace ring
}  // namespace dattn

#endif  // DATTN_ENGINE_RING_CUDA_BLOCK_KERNELS_LAUNCH_H_
