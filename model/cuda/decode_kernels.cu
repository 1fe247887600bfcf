// The decoding kernels (decode_kernels.h states each one's contract, shapes, FLOPs and bytes).
#include "model/cuda/decode_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "model/cuda/bf16_vector.cuh"

namespace dattn {
namespace model {
namespace cuda {
namespace {

constexpr int kAttendThreads = 256;
static_assert(kAttendThreads == kDecodeChunk, "one thread scores one row of a chunk");

__device__ __forceinline__ float Bf16ToFloat(bf16_t x) {
  return __bfloat162float(__ushort_as_bfloat16(x));
}

__global__ void CopyRowsKernel(const bf16_t* __restrict__ src, bf16_t* __restrict__ dst,
                               int64_t dst_shift, const RowCopy* __restrict__ jobs, int64_t count,
                               int64_t head_dim) {
  const int64_t chunks = head_dim / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t j = idx / chunks, col = (idx % chunks) * 8;
  if (j >= count) return;
  const RowCopy job = jobs[j];
  *reinterpret_cast<uint4*>(dst + dst_shift + job.dst_k + col) =
      *reinterpret_cast<const uint4*>(src + job.src_k + col);
  *reinterpret_cast<uint4*>(dst + dst_shift + job.dst_v + col) =
      *reinterpret_cast<const uint4*>(src + job.src_v + col);
}

__global__ void DecodeAppendKernel(DecodeBatch bt, const bf16_t* __restrict__ qkv) {
  const int s = blockIdx.x;
  const int64_t b = blockIdx.y;
  const int32_t row = (bt.append_rows != nullptr ? bt.append_rows : bt.rows)[b * bt.slots + s];
  if (row < 0) return;
  const int64_t dh = bt.head_dim, col = static_cast<int64_t>(threadIdx.x) * 8;
  if (col >= dh) return;
  const DecodeSlot slot = bt.slot[s];
  const int64_t src = b * 3 * bt.d + slot.head * dh + col;
  const int64_t dst = bt.layer_offset + (slot.first_row + row) * dh + col;
  *reinterpret_cast<uint4*>(bt.k_cache[b] + dst) =
      *reinterpret_cast<const uint4*>(qkv + src + bt.d);
  *reinterpret_cast<uint4*>(bt.v_cache[b] + dst) =
      *reinterpret_cast<const uint4*>(qkv + src + 2 * bt.d);
}

// Block-wide maximum or sum of one value per thread (kAttendThreads threads); every thread gets
// the result. `scratch` holds a value per warp.
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kAttendThreads / 32; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

__global__ void __launch_bounds__(kAttendThreads)
    DecodeAttendKernel(DecodeBatch bt, const bf16_t* __restrict__ qkv, float scale,
                       int64_t max_chunks, float* __restrict__ partials) {
  const int64_t c = blockIdx.x;
  const int s = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int32_t row = bt.rows[b * bt.slots + s];
  const int64_t dh = bt.head_dim;
  if (row < 0 || c * kDecodeChunk > row) {
    if (bt.ranks > 1) {  // an empty partial, which the merge of every rank's chunks reads
      float* out = partials + ((b * bt.slots + s) * max_chunks + c) * (dh + 2);
      for (int64_t i = threadIdx.x; i < dh + 2; i += kAttendThreads) {
        out[i] = i == 0 ? -INFINITY : 0.0f;
      }
    }
    return;
  }
  const DecodeSlot slot = bt.slot[s];
  const int64_t first = c * kDecodeChunk;
  const int n = static_cast<int>(min(static_cast<int64_t>(kDecodeChunk), row + 1 - first));
  __shared__ float q[256];
  __shared__ float weight[kDecodeChunk];
  __shared__ float scratch[kAttendThreads / 32];
  __shared__ float sums[kAttendThreads * 8];
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < dh; i += kAttendThreads) {
    q[i] = Bf16ToFloat(qkv[b * 3 * bt.d + slot.head * dh + i]);
  }
  __syncthreads();
  const int64_t at = bt.layer_offset + (slot.first_row + first) * dh;
  const bf16_t* keys = bt.k_cache[b] + at;
  const bf16_t* values = bt.v_cache[b] + at;
  // Scores: thread j takes row j of the chunk.
  float score = -INFINITY;
  if (tid < n) {
    float dot = 0.0f;
    for (int64_t col = 0; col < dh; col += 8) {
      float k[8];
      Load8(keys + tid * dh + col, k);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(q[col + e], k[e], dot);
    }
    score = dot * scale;
  }
  const float m = BlockReduce<true>(score, scratch);
  const float e = tid < n ? expf(score - m) : 0.0f;
  weight[tid] = e;
  const float l = BlockReduce<false>(e, scratch);  // its barriers also publish `weight`
  // Values: groups of dh / 8 threads, each group a row at a time, each thread 8 columns.
  const int cols = static_cast<int>(dh / 8);
  const int groups = kAttendThreads / cols;
  const int group = tid / cols, col = (tid % cols) * 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (group < groups) {
    for (int j = group; j < n; j += groups) {
      float v[8];
      Load8(values + static_cast<int64_t>(j) * dh + col, v);
      const float w = weight[j];
#pragma unroll
      for (int x = 0; x < 8; ++x) acc[x] = fmaf(w, v[x], acc[x]);
    }
#pragma unroll
    for (int x = 0; x < 8; ++x) sums[group * dh + col + x] = acc[x];
  }
  __syncthreads();
  float* out = partials + ((b * bt.slots + s) * max_chunks + c) * (dh + 2);
  for (int64_t i = tid; i < dh; i += kAttendThreads) {
    float total = 0.0f;
    for (int g = 0; g < groups; ++g) total += sums[g * dh + i];  // in group order
    out[2 + i] = total;
  }
  if (tid == 0) {
    out[0] = m;
    out[1] = l;
  }
}

__global__ void DecodeMergeKernel(DecodeBatch bt, const float* __restrict__ partials,
                                  int64_t max_chunks, const int32_t* __restrict__ slot_of,
                                  int patterns, int64_t heads, bool grouped,
                                  bf16_t* __restrict__ out) {
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int64_t dh = bt.head_dim;
  const int64_t stride = dh + 2;
  for (int64_t col = threadIdx.x; col < dh; col += blockDim.x) {
    float big_l = -INFINITY, weight_sum = 0.0f, total = 0.0f;
    for (int i = 0; i < patterns; ++i) {
      const int32_t s = slot_of[i * heads + h];
      if (s < 0) continue;
      const int32_t row = (bt.merge_rows != nullptr ? bt.merge_rows : bt.rows)[b * bt.slots + s];
      if (row < 0) continue;  // The pattern does not select the position for h.
      // One device: the chunks up to the row. A ring: every rank's every chunk, in rank order
      // (rank 0 holds the slot's row 0, so the maximum is finite; empty chunks weigh 0).
      const int64_t chunks = bt.ranks > 1 ? max_chunks : row / kDecodeChunk + 1;
      float m = -INFINITY;
      for (int r = 0; r < bt.ranks; ++r) {
        const float* p = partials + r * bt.rank_stride + (b * bt.slots + s) * max_chunks * stride;
        for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, p[c * stride]);
      }
      float sum = 0.0f, acc = 0.0f;
      for (int r = 0; r < bt.ranks; ++r) {
        const float* p = partials + r * bt.rank_stride + (b * bt.slots + s) * max_chunks * stride;
        for (int64_t c = 0; c < chunks; ++c) {
          const float f = expf(p[c * stride] - m);
          sum = fmaf(f, p[c * stride + 1], sum);
          acc = fmaf(f, p[c * stride + 2 + col], acc);
        }
      }
      const float o = acc / sum;
      if (grouped) {
        total = o / static_cast<float>(patterns);
        weight_sum = 1.0f;
        continue;
      }
      const float lse = m + logf(sum);
      const float new_l = fmaxf(big_l, lse);
      const float old_factor = isinf(big_l) ? 0.0f : expf(big_l - new_l);
      const float factor = expf(lse - new_l);
      total = total * old_factor + factor * o;
      weight_sum = weight_sum * old_factor + factor;
      big_l = new_l;
    }
    const float y = weight_sum > 0.0f ? total / weight_sum : 0.0f;
    out[b * bt.d + h * dh + col] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  }
}

bool HeadDimOk(int64_t dh) { return dh >= 8 && dh % 8 == 0 && dh <= 256; }

bool BatchOk(const DecodeBatch& bt) {
  return bt.batch >= 1 && bt.batch <= 65535 && bt.slots >= 1 && bt.slots <= 65535 &&
         HeadDimOk(bt.head_dim) && bt.d % bt.head_dim == 0 && bt.slot != nullptr &&
         bt.rows != nullptr && bt.k_cache != nullptr && bt.v_cache != nullptr &&
         bt.layer_offset >= 0 && bt.ranks >= 1 &&
         (bt.ranks == 1 ||
          (bt.merge_rows != nullptr && bt.append_rows != nullptr && bt.rank_stride >= 0));
}

}  // namespace

cudaError_t CopyRows(const bf16_t* src, bf16_t* dst, int64_t dst_shift, const RowCopy* jobs,
                     int64_t count, int64_t head_dim, cudaStream_t stream) {
  if (!HeadDimOk(head_dim) || count < 0 ||
      (count > 0 && (src == nullptr || dst == nullptr || jobs == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (count == 0) return cudaSuccess;
  const int64_t threads = count * (head_dim / 8);
  CopyRowsKernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      src, dst, dst_shift, jobs, count, head_dim);
  return cudaGetLastError();
}

cudaError_t DecodeAppend(const DecodeBatch& batch, const bf16_t* qkv, cudaStream_t stream) {
  if (!BatchOk(batch)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(batch.slots), static_cast<unsigned>(batch.batch));
  DecodeAppendKernel<<<grid, static_cast<unsigned>(batch.head_dim / 8), 0, stream>>>(batch, qkv);
  return cudaGetLastError();
}

cudaError_t DecodeAttend(const DecodeBatch& batch, const bf16_t* qkv, float scale,
                         int64_t max_chunks, float* partials, cudaStream_t stream) {
  if (!BatchOk(batch) || max_chunks < 1 || max_chunks > (int64_t{1} << 31) - 1) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(max_chunks), static_cast<unsigned>(batch.slots),
                  static_cast<unsigned>(batch.batch));
  DecodeAttendKernel<<<grid, kAttendThreads, 0, stream>>>(batch, qkv, scale, max_chunks, partials);
  return cudaGetLastError();
}

cudaError_t DecodeMerge(const DecodeBatch& batch, const float* partials, int64_t max_chunks,
                        const int32_t* slot_of, int patterns, int64_t heads, bool grouped,
                        bf16_t* out, cudaStream_t stream) {
  if (!BatchOk(batch) || max_chunks < 1 || patterns < 1 || heads < 1 || heads > 65535 ||
      heads * batch.head_dim != batch.d) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(batch.batch));
  DecodeMergeKernel<<<grid, static_cast<unsigned>(batch.head_dim), 0, stream>>>(
      batch, partials, max_chunks, slot_of, patterns, heads, grouped, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace model
}  // namespace dattn
