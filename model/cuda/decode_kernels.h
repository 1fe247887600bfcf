// The CUDA kernels of incremental decoding (cuda_decoder.h wires them; model_kernels.h and gemm.h
// do the layers' other work). One job per kernel, in the style of model_kernels.h: every launcher
// states the shapes it takes and the FLOPs and bytes of one call (s = 2 for bf16), uses 64-bit
// row indices, enqueues on `stream` and never synchronizes; each returns the launch's cudaError_t
// (cudaErrorInvalidValue for arguments outside what it states).
//
// The cache of one sequence (model/decoder.h says which rows it keeps and why): K and V each
// [layers][rows_per_layer][head_dim] bf16; slot s's rows of a layer are
// [first_row(s), first_row(s) + capacity(s)). Row j of a slot holds the key (value) of the j-th
// position its pattern selects for its head in the current segment. A decoding step of B
// sequences hands the kernels, per sequence b and slot s, row[b][s]: the slot's row of b's new
// position, or -1 when the slot's pattern does not select it. The new key goes to that row and
// the query attends to rows [0, row].
//
// Attention of one step is split-K ("flash decoding"): the rows of each (sequence, slot) are cut
// into chunks of kDecodeChunk, each chunk's CTA writes a partial softmax (its maximum score m, its
// sum of exponentials l relative to m, and its unnormalized output a[head_dim], fp32), and
// DecodeMerge combines the chunks of a slot, then the patterns of a head (the engine's rule:
// grouped mode divides the head's one pattern's output by the number of patterns, mixture mode
// weighs the patterns by their log-sum-exps), in a fixed order: the same inputs give the same bits.
// head_dim: a multiple of 8, at most 256. Pointers to bf16 rows are 16-byte aligned.
#ifndef DATTN_MODEL_CUDA_DECODE_KERNELS_H_
#define DATTN_MODEL_CUDA_DECODE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/model_kernels.h"

namespace dattn {
namespace model {
namespace cuda {

// Rows of a slot that one CTA of DecodeAttend reads.
inline constexpr int kDecodeChunk = 256;

// --- Prefill: the rows a prompt leaves in the cache. Job j copies positions p = first_pos + i
// rate (i < count) of head `head`: k from qkv[p, d + head dh), v from qkv[p, 2d + head dh) (qkv
// [n, ld] bf16, k already rotated) into rows dst_row + i of cache_k and cache_v (one layer's,
// [rows][dh]). jobs: device memory; max_count >= every job's count. FLOPs 0; bytes 4 dh s per
// position copied.
struct CacheFillJob {
  int64_t first_pos = 0;
  int64_t rate = 1;
  int64_t count = 0;
  int64_t dst_row = 0;
  int64_t head = 0;
};
cudaError_t CacheFill(const bf16_t* qkv, int64_t ld, int64_t d, int64_t head_dim,
                      const CacheFillJob* jobs, int num_jobs, int64_t max_count, bf16_t* cache_k,
                      bf16_t* cache_v, cudaStream_t stream);

// A cache slot as the step kernels see it (device table, `slots` entries).
struct DecodeSlot {
  int64_t head = 0;
  int64_t first_row = 0;
};

// What every step kernel of one layer reads about the batch (device memory):
//   rows[b * slots + s]: slot s's row of sequence b's new position, or -1;
//   k_cache[b], v_cache[b]: sequence b's cache (layer 0's row 0); layer_offset elements further on
//   is this layer's.
struct DecodeBatch {
  int64_t batch = 0;  // B
  int slots = 0;      // S
  const DecodeSlot* slot = nullptr;
  const int32_t* rows = nullptr;
  bf16_t* const* k_cache = nullptr;
  bf16_t* const* v_cache = nullptr;
  int64_t layer_offset = 0;
  int64_t d = 0;         // heads x head_dim
  int64_t head_dim = 0;  // dh
};

// Writes the new key and value of each (b, s) with rows >= 0: qkv[b, d + head dh) and
// qkv[b, 2d + head dh) (qkv [B, 3d], k rotated) into row first_row + row of the layer's cache.
// FLOPs 0; bytes 4 dh s per row written.
cudaError_t DecodeAppend(const DecodeBatch& batch, const bf16_t* qkv, cudaStream_t stream);

// partials[((b S + s) max_chunks + c) (dh + 2) ...] := chunk c's partial softmax for the query
// q = qkv[b, head dh) over rows [c C, min((c + 1) C, row + 1)) of slot s (scores q.k scale in
// fp32): {m, l, a[0..dh)}. Chunks past the row are not written (DecodeMerge reads only
// c <= row / C). max_chunks >= the largest row / C + 1. FLOPs 4 dh per row read; bytes 2 dh s per
// row read plus 4 (dh + 2) per chunk written.
cudaError_t DecodeAttend(const DecodeBatch& batch, const bf16_t* qkv, float scale,
                         int64_t max_chunks, float* partials, cudaStream_t stream);

// out[b, h dh + c) := the attention output of head h (bf16 [B, d]): for each pattern i with a slot
// s = slot_of[i H + h] >= 0 and rows[b S + s] >= 0, the slot's chunks merged to its output o_i
// and log-sum-exp; then grouped: o_i / patterns (a head has one pattern), mixture: sum_i
// e^(lse_i - L) o_i / sum_i e^(lse_i - L); 0 when no pattern selects the position.
// FLOPs about 4 dh per chunk merged; bytes 4 (dh + 2) per chunk read plus 2 d s B.
cudaError_t DecodeMerge(const DecodeBatch& batch, const float* partials, int64_t max_chunks,
                        const int32_t* slot_of, int patterns, int64_t heads, bool grouped,
                        bf16_t* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_DECODE_KERNELS_H_
