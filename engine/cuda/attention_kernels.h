// Our own attention kernels (CUDA cores, fp32 accumulation, no TF32): the fp32 path of the CUDA
// backend, and the fallback of the 16-bit paths where cuDNN has no engine (layouts it cannot read,
// graphs it rejects). Flash style: scores are recomputed tile by tile and never stored.
//
// One launch computes `count` x `heads` independent attentions of `rows` rows each, reading every
// tensor through its own strides (dilated rows in place). Causal: row s sees keys 0..s.
// D (head_dim) <= 256. Launchers enqueue on `stream`, return the launch's cudaError_t, and never
// synchronize. Scratch: none beyond what the arguments name.
#ifndef DATTN_ENGINE_CUDA_ATTENTION_KERNELS_H_
#define DATTN_ENGINE_CUDA_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/cuda/kernel_types.h"

namespace dattn {
namespace cuda {

constexpr int64_t kKernelMaxHeadDim = 256;

struct KernelForwardArgs {
  ElemType type = ElemType::kF32;
  KernelTensor q, k, v;
  KernelTensor o;          // written: p_scale * softmax(scale q k^T) v
  float* stats = nullptr;  // written: packed fp32 [count, heads, rows] log-sum-exp of each row
  int64_t count = 0;
  int64_t heads = 0;
  int64_t rows = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  float p_scale = 1.0f;
  bool causal = false;
};

// FLOPs 4 * count * heads * rows^2 * D (halved when causal); bytes: q, k, v read once per 8-row
// query tile (k, v re-read rows/8 times from L2), o written once.
cudaError_t LaunchAttentionForward(const KernelForwardArgs& args, cudaStream_t stream);

struct KernelBackwardArgs {
  ElemType type = ElemType::kF32;
  KernelTensor q, k, v, o, dout;
  KernelTensor dq, dk, dv;       // written
  const float* stats = nullptr;  // packed [count, heads, rows]: P = exp(scale q k^T - stats)
  float* delta = nullptr;        // scratch, packed [count, heads, rows]
  int64_t count = 0;
  int64_t heads = 0;
  int64_t rows = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  float delta_scale = 1.0f;  // delta = delta_scale * rowsum(dout * o)
  bool causal = false;
};

// dv = P^T dout; ds = P * (dout v^T - delta); dq = scale ds k; dk = scale ds^T q. Three launches
// (row sums, dq by query tiles, dk/dv by key tiles): no atomics, deterministic. FLOPs about 2.5x
// the forward's plus the recomputation of the scores twice.
cudaError_t LaunchAttentionBackward(const KernelBackwardArgs& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace dattn

#endif  // DATTN_ENGINE_CUDA_ATTENTION_KERNELS_H_
