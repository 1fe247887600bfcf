// The small kernels around the fused attention calls of the CUDA backend: clearing the rows a
// pattern does not select (with the 1/G of grouped mode on the rows it does, where the fused call
// could not apply it), moving per-call log-sum-exp rows between packed scratch and the (B, H, N)
// lse tensor, copying scaled rows into a packed tile, merging one pattern's partial result into the
// mixture-mode output, and adding per-pattern gradients.
//
// Tensors are the backend's contiguous outputs: x is (B, N, H, D), lse is (B, H, N) fp32. Packed
// scratch is [count, heads, rows] (stats) or [count, heads, rows, D] (tiles) in the order of the
// call's CallRows. Launchers enqueue on `stream`, return the launch's cudaError_t and never
// synchronize; none uses scratch. All are memory-bound: the byte counts are given per launcher.
#ifndef DATTN_ENGINE_CUDA_DILATED_KERNELS_H_
#define DATTN_ENGINE_CUDA_DILATED_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace cuda {

struct RowSpace {
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t heads = 0;
  int64_t dim = 0;
};

// For heads of `rule` and every position: rows the pattern does not select := 0; if scale_selected,
// selected rows *= selected_scale. Bytes: writes the unselected rows; reads and writes the selected
// ones only when scale_selected.
cudaError_t LaunchFillRows(void* x, ElemType type, const RowSpace& space, const HeadRule& rule,
                           bool scale_selected, float selected_scale, cudaStream_t stream);

// lse[b, h, p] := -inf for heads of `rule` at positions the pattern does not select. Writes only.
cudaError_t LaunchFillLse(float* lse, const RowSpace& space, const HeadRule& rule,
                          cudaStream_t stream);

// lse[row(j, k, s)] := stats[j, k, s]. Bytes: 8 per row of the call.
cudaError_t LaunchScatterStats(const float* stats, float* lse, const CallRows& rows,
                               const RowSpace& space, cudaStream_t stream);

// stats[j, k, s] := lse[row(j, k, s)] + add. Bytes: 8 per row of the call.
cudaError_t LaunchGatherStats(const float* lse, float* stats, float add, const CallRows& rows,
                              const RowSpace& space, cudaStream_t stream);

// tile[j, k, s, :] := scale * x[row(j, k, s), :]. Bytes: 2 * D * elem per row.
cudaError_t LaunchGatherRows(const void* x, void* tile, float scale, ElemType type,
                             const CallRows& rows, const RowSpace& space, cudaStream_t stream);

// x[row(j, k, s), :] *= scale for every row of the call, in place. Bytes: 2 * D * elem per row.
cudaError_t LaunchScaleRows(void* x, float scale, ElemType type, const CallRows& rows,
                            const RowSpace& space, cudaStream_t stream);

// Mixture merge of one pattern's tile into the running output: with L = logaddexp(lse, l),
// x := x * exp(lse - L) + tile * exp(l - L) and lse := L, row by row (l = stats[j, k, s]).
// Bytes: reads tile and x rows, writes x rows (3 * D * elem per row) plus 12 per row of lse/stats.
cudaError_t LaunchMergeTile(const void* tile, const float* stats, void* x, float* lse,
                            ElemType type, const CallRows& rows, const RowSpace& space,
                            cudaStream_t stream);

// x_i[row(j, k, s), :] += tile_i[j, k, s, :] for the three gradients i = q, k, v; the three tiles
// follow each other in `tiles` (tile i at tiles + i * count * heads * rows * D elements).
// Bytes: 9 * D * elem per row.
cudaError_t LaunchAccumulateTiles(const void* tiles, void* dq, void* dk, void* dv, ElemType type,
                                  const CallRows& rows, const RowSpace& space, cudaStream_t stream);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_DILATED_KERNELS_H_
