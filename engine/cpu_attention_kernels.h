// AVX-512 micro-kernels for the fp32 forward pass of the CPU backend: the two products of one
// (query tile, key block) pair, on scores kept transposed (keys x queries).
//
// Why not BLAS here: OpenBLAS repacks both operands on every call, and for attention's thin shapes
// (inner dimension D for the scores, output width D for P V) the packing costs about a quarter of
// the multiply. With scores transposed, the query tile is packed once per tile (transposed and
// pre-scaled), keys are read where they lie (one broadcast per element), and the softmax runs down
// the columns with vertical vector operations only (cpu::SoftmaxColumnsStep).
//
// Available when the CPU has AVX-512F and D is a multiple of 16 up to 128 (AttentionKernelsFor);
// the backend uses BLAS otherwise, and for fp64 and the backward pass. Pure functions; thread-safe.
#ifndef DATTN_ENGINE_CPU_ATTENTION_KERNELS_H_
#define DATTN_ENGINE_CPU_ATTENTION_KERNELS_H_

#include <cstdint>

namespace dattn {
namespace cpu {

// Queries per packed chunk of Q^T (the width of one score panel).
constexpr int64_t kQueryChunk = 64;

// Whether the kernels below run for head dim d on this CPU (see AllowAvx512ForTesting).
bool AttentionKernelsFor(int64_t d);

// qt := scale x the nq x d query rows at `q` (row stride ldq, channel stride qd), transposed into
// chunks of kQueryChunk queries: qt[(c * d + x) * kQueryChunk + i] = scale * query c*64+i, channel
// x; queries past nq are 0. qt holds RoundUp(nq, kQueryChunk) * d floats.
void PackQueriesTransposed(const float* q, int64_t ldq, int64_t qd, int64_t nq, int64_t d,
                           float scale, float* qt);

// st[j * ldst + i] := sum_x qt(query i, channel x) * k[j * ldk + x * kd] for j < nk and
// i < RoundUp(nq, kQueryChunk) (queries past nq score 0); ldst >= RoundUp(nq, kQueryChunk).
void ScoresTransposed(const float* qt, int64_t nq, int64_t d, const float* k, int64_t ldk,
                      int64_t kd, int64_t nk, float* st, int64_t ldst);

// acc[i * d + x] += sum_{j < nk} pt[j * ldpt + i] * v[j * ldv + x], for i < nq and x < d; v's
// channels are contiguous.
void AccumulatePVTransposed(const float* pt, int64_t ldpt, int64_t nq, int64_t nk, const float* v,
                            int64_t ldv, int64_t d, float* acc);

}  // namespace cpu
}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_ATTENTION_KERNELS_H_
