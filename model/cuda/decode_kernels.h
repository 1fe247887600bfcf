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

// --- Prefill: the rows a prompt leaves in the cache. Job j copies one row of head_dim values of K
// and one of V: src[src_k, + dh) to dst[dst_k, + dh) and src[src_v, + dh) to dst[dst_v, + dh)
// (element offsets; dst_shift is added to both destinations). One kernel serves the three copies
// of a prefill on a ring: a projection's rows (k and v of position p, head h: p ld + d + h dh and
// p ld + 2 d + h dh of the rotated [n, ld] output) into this rank's cache, into the buffers sent
// to the ranks that hold them, and from the buffers received into the cache. jobs: device memory,
// `count` of them. FLOPs 0; bytes 4 dh s per job.
struct RowCopy {
  int64_t src_k = 0, src_v = 0, dst_k = 0, dst_v = 0;
};
cudaError_t CopyRows(const bf16_t* src, bf16_t* dst, int64_t dst_shift, const RowCopy* jobs,
                     int64_t count, int64_t head_dim, cudaStream_t stream);

// A cache slot as the step kernels see it (device table, `slots` entries).
struct DecodeSlot {
  int64_t head = 0;
  int64_t first_row = 0;
};

// What every step kernel of one layer reads about the batch (device memory):
//   rows[b * slots + s]: slot s's row of sequence b's new position, or -1;
//   k_cache[b], v_cache[b]: sequence b's cache (layer 0's row 0); layer_offset elements further on
//   is this layer's.
//
// On a ring of R ranks (ranks > 1; model/decoder.h: row j of a slot is held by rank j mod R, as
// its row j / R) each rank's tables are its own: rows[b S + s] is the last of the slot's rows this
// rank holds up to the new position's row (the rows it attends to are [0, rows]), append_rows the
// row this rank writes the new key to (-1 when another rank holds it), merge_rows the slot's row
// of the position on the whole ring (-1: not selected). Every rank then writes every chunk's
// partial (an empty one, {-inf, 0, 0...}, past its rows), the partials of all ranks are gathered
// rank after rank (rank_stride floats apart) and every rank merges them all in rank order.
struct DecodeBatch {
  int64_t batch = 0;  // B
  int slots = 0;      // S
  const DecodeSlot* slot = nullptr;
  const int32_t* rows = nullptr;
  const int32_t* append_rows = nullptr;  // null: rows (one device)
  const int32_t* merge_rows = nullptr;   // null: rows (one device)
  int ranks = 1;
  int64_t rank_stride = 0;  // floats between two ranks' partials (ranks > 1)
  bf16_t* const* k_cache = nullptr;
  bf16_t* const* v_cache = nullptr;
  int64_t layer_offset = 0;
  int64_t d = 0;         // heads x head_dim
  int64_t head_dim = 0;  // dh
};

// Writes the new key and value of each (b, s) with append_rows (or rows) >= 0: qkv[b, d + head dh)
// and qkv[b, 2d + head dh) (qkv [B, 3d], k rotated) into row first_row + row of the layer's cache.
// FLOPs 0; bytes 4 dh s per row written.
cudaError_t DecodeAppend(const DecodeBatch& batch, const bf16_t* qkv, cudaStream_t stream);

// partials[((b S + s) max_chunks + c) (dh + 2) ...] := chunk c's partial softmax for the query
// q = qkv[b, head dh) over rows [c C, min((c + 1) C, row + 1)) of slot s (scores q.k scale in
// fp32): {m, l, a[0..dh)}. Chunks past the row are not written (DecodeMerge reads only
// c <= row / C), except on a ring, where every chunk is (empty past the row). max_chunks >= the
// largest row / C + 1. FLOPs 4 dh per row read; bytes 2 dh s per row read plus 4 (dh + 2) per
// chunk written.
cudaError_t DecodeAttend(const DecodeBatch& batch, const bf16_t* qkv, float scale,
                         int64_t max_chunks, float* partials, cudaStream_t stream);

// out[b, h dh + c) := the attention output of head h (bf16 [B, d]): for each pattern i with a slot
// s = slot_of[i H + h] >= 0 and merge_rows (or rows)[b S + s] >= 0, the slot's chunks (on a ring:
// every rank's max_chunks, in rank order) merged to its output o_i
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
