// The CUDA kernels of the LongNet model's training step (cuda_longnet.h wires them), apart from
// the GEMMs (gemm.h, cuBLASLt) and attention (the engine's CUDA backend). One job per kernel, in
// the style of llm.c: every launcher states the shapes it takes and the FLOPs and bytes of one
// call (each operand read or written once; s = 2 for bf16, 4 for fp32), uses 64-bit indices,
// enqueues on `stream` and never synchronizes. Each returns the launch's cudaError_t (or
// cudaErrorInvalidValue for arguments outside what it states); the caller turns it into an
// absl::Status naming the call (engine/cuda/cuda_status.h).
//
// Types: bf16 values are passed as their 16-bit patterns (bf16_t) so that host code needs only the
// CUDA runtime's headers. Every kernel computes in fp32 and rounds once on store (round to nearest
// even); reductions that cross rows (parameter gradients, the loss) are deterministic: fixed
// partitions, fixed orders, the last level in fp64. So a call repeated on the same inputs gives the
// same bits, whatever else runs on the device.
//
// Row kernels (LayerNorm, GELU + LayerNorm, rotary positions): rows of n columns, n a multiple of
// 8 and at most kMaxRowWidth (16384), every row's start 16-byte aligned (pointers 16-byte aligned,
// leading dimensions multiples of 8). A thread owns 8-column chunks of a row; a CTA holds G row
// groups and walks the rows in steps of G x gridDim.x (RowLaunchFor). Backward row kernels also add
// up, per CTA and in row order, the column sums of the parameter gradients they feed (LayerNorm
// gain and shift, the bias of the linear layer whose output gradient they produce) into `partials`,
// [ctas][3][n] fp32; ColumnSums later adds every CTA's row, in CTA order and in fp64, into the
// fp32 gradients. Row kernels load a row ahead (the next row's loads are in flight while the
// current one is reduced); the backward ones keep their column accumulators in dynamic shared
// memory (96 bytes per thread per 8-column chunk) so that the row's values stay in registers.
#ifndef DATTN_MODEL_CUDA_MODEL_KERNELS_H_
#define DATTN_MODEL_CUDA_MODEL_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/launch_geometry.h"

namespace dattn {
namespace model {
namespace cuda {

using bf16_t = uint16_t;

// Rotary positions: the most pairs a head may have (head_dim <= 256).
inline constexpr int kMaxRotaryPairs = 128;

// Launch geometry (RowLaunchFor, CrossEntropyPartials): launch_geometry.h.

// --- Parameters: the bf16 working copy.
// One run of the working copy: packed[dst .. dst + n) := bf16(master[src .. src + n)); n, src and
// dst multiples of 8.
struct PackSegment {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t n = 0;
};
// Every segment of the table (device memory, sorted by dst, disjoint), `packed_size` elements of
// packed in all (gaps between segments are not written). FLOPs 0; bytes 6 x (elements copied).
cudaError_t CastPackParams(const float* master, const PackSegment* segments, int num_segments,
                           int64_t packed_size, bf16_t* packed, cudaStream_t stream);

// --- Token embedding. table [v, d] bf16, d a multiple of 8.
// out[t, :] := table[tokens[t], :] for t < m (tokens: device int32, each in [0, v)).
// FLOPs 0; bytes 2 m d s + 4 m.
cudaError_t EmbeddingForward(const int32_t* tokens, int64_t m, const bf16_t* table, int64_t d,
                             bf16_t* out, cudaStream_t stream);

// The positions of each token id, sorted on the host once per call (cuda_longnet.cc): positions of
// one id ascending, cut into items of at most kEmbeddingItemRows positions.
inline constexpr int64_t kEmbeddingItemRows = 256;
struct EmbeddingItem {
  int64_t begin = 0;  // first index into `order`
  int32_t count = 0;  // positions, <= kEmbeddingItemRows
  int32_t token = 0;  // the id whose positions these are
};
// dtable[v, :] += sum over the positions t of v (in ascending t, in fp32 per item, then the items
// of v in order) of dx[t, :]. order: device [m] positions grouped by id; items: device
// [num_items] in id order; token_items: device [vocab + 1], the items of id v being
// [token_items[v], token_items[v + 1]); partial: scratch [num_items, d] fp32. dx fp32 [m, d].
// FLOPs m d; bytes (4 m d + 8 num_items d + 8 v d).
cudaError_t EmbeddingBackward(const int64_t* order, const EmbeddingItem* items, int64_t num_items,
                              const int64_t* token_items, int64_t vocab, const float* dx, int64_t d,
                              float* partial, float* dtable, cudaStream_t stream);

// --- LayerNorm over rows of n (biased variance, two passes over the row held in registers),
// optionally of GELU(x) (the erf form, x/2 (1 + erf(x / sqrt 2)), with erf by Abramowitz & Stegun
// 7.1.26: absolute error <= 1.5e-7, below bf16's rounding by four orders) instead of x:
//   v = gelu ? GELU(x) : x;  mean = sum v / n;  rstd = 1 / sqrt(sum (v - mean)^2 / n + eps)
//   y = (v - mean) * rstd * gain + shift
// x, y bf16 [rows, n] (leading dimension n); gain, shift fp32 [n]; mean, rstd fp32 [rows].
// use_saved_stats: mean and rstd are read instead of computed (recomputing y in the backward pass;
// the arithmetic that produces y is the same, so the bits are). FLOPs about 8 rows n (plus 20 per
// element for GELU); bytes 2 rows n s + 8 n + 8 rows.
cudaError_t LayerNormForward(const bf16_t* x, int64_t rows, int64_t n, const float* gain,
                             const float* shift, float eps, bool gelu, bool use_saved_stats,
                             bf16_t* y, float* mean, float* rstd, int num_sms, cudaStream_t stream);

// What the backward of a LayerNorm writes.
enum class NormGradOut {
  kBf16,         // out_bf16 := dx (out_bf16 may be dy itself)
  kResidualSet,  // residual := dx (fp32), out_bf16 := bf16(residual)
  kResidualAdd,  // residual += dx (fp32), out_bf16 := bf16(residual)
};
struct LayerNormBackwardArgs {
  const bf16_t* dy = nullptr;  // [rows, n]
  const bf16_t* x = nullptr;   // [rows, n]: the forward's input (GELU's input when gelu)
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* gain = nullptr;  // [n]
  int64_t rows = 0;
  int64_t n = 0;
  bool gelu = false;  // the forward normalised GELU(x): dx is then d/dx through GELU too
  NormGradOut out = NormGradOut::kBf16;
  bf16_t* out_bf16 = nullptr;  // [rows, n]
  float* residual = nullptr;   // [rows, n] fp32 (kResidual*)
  // [ctas][3][n] fp32, ctas = RowLaunchFor(rows, n, num_sms).ctas: row 0 of each CTA's block
  // sum dy x_hat (the gain's gradient), row 1 sum dy (the shift's), row 2, when bias_sums, the sum
  // of what the kernel wrote (dx; the new residual for kResidual*): the gradient of the bias of the
  // linear layer whose output that is.
  float* partials = nullptr;
  bool bias_sums = false;
};
// With g = dy * gain and x_hat = (v - mean) * rstd:
//   dv = rstd (g - mean(g) - x_hat mean(g x_hat)),  dx = dv (x GELU'(x) when gelu)
// FLOPs about 14 rows n (+ 30 per element for GELU); bytes (3 rows n s + 12 n ctas) plus 8 rows n
// for the residual's read and write.
cudaError_t LayerNormBackward(const LayerNormBackwardArgs& args, int num_sms, cudaStream_t stream);

// --- Rotary positions and XPOS (model/rotary.h), on rows t = b * seq_len + i at absolute
// position p = position_offset + i. For pair j of a head: e = p - c(p), c(p) = floor(p / block) *
// block + floor(block / 2); angle = e * inv_freq[j] (fp64, reduced modulo 2 pi in fp64, then
// sincosf); with xpos, q's pair is scaled by 2^(e * log2_zeta_over_base[j]) and k's by its
// inverse (the exponent in fp64, exp2f on the rounded exponent).
struct RotaryConsts {
  int pairs = 0;  // head_dim / 2, at most kMaxRotaryPairs
  int64_t block = 1;
  bool xpos = false;
  double inv_freq[kMaxRotaryPairs] = {};
  double log2_zeta_over_base[kMaxRotaryPairs] = {};
};
// `consts` lives in device memory (the kernels index its arrays). In place on q = qkv[t, 0:d) and
// k = qkv[t, d:2d) of rows of ld columns (ld >= 2d, a multiple of 8); d = heads x head_dim,
// head_dim a multiple of 8. FLOPs about 40 per pair (sincos, exp2 and the
// fp64 reduction once per pair of q and k, 6 per element); bytes 4 rows d s.
cudaError_t RotaryForward(bf16_t* qkv, int64_t rows, int64_t ld, int64_t seq_len,
                          int64_t position_offset, int64_t d, int64_t head_dim,
                          const RotaryConsts* consts, int num_sms, cudaStream_t stream);
// The same with each row at its own position: row t at positions[t] (device int64 [rows], each
// >= 0), as a decoding step's rows of different sequences are. Same FLOPs; bytes 4 rows d s +
// 8 rows.
cudaError_t RotaryForwardAt(bf16_t* qkv, int64_t rows, int64_t ld, const int64_t* positions,
                            int64_t d, int64_t head_dim, const RotaryConsts* consts, int num_sms,
                            cudaStream_t stream);
// The transpose, out of place: dqkv[t, 0:d) := Rot^T(dq[t]), dqkv[t, d:2d) := Rot^T(dk[t]),
// dqkv[t, 2d:3d) := dv[t]; dq, dk, dv contiguous [rows, d]; dqkv [rows, 3d]. partials
// [ctas][3][d] (ctas = RowLaunchFor(rows, d, num_sms).ctas): the column sums of the three parts
// (the q, k, v biases' gradients). Same FLOPs; bytes 6 rows d s + 12 d ctas.
cudaError_t RotaryBackward(const bf16_t* dq, const bf16_t* dk, const bf16_t* dv, int64_t rows,
                           int64_t seq_len, int64_t position_offset, int64_t d, int64_t head_dim,
                           const RotaryConsts* consts, bf16_t* dqkv, float* partials, int num_sms,
                           cudaStream_t stream);

// --- Column sums of the row kernels' partials into the fp32 gradients.
struct ColumnSumJob {
  const float* src = nullptr;  // row c of the job at src + c * stride, n floats
  float* dst = nullptr;        // dst[j] += sum over c < ctas of src[c * stride + j], in fp64
  int64_t n = 0;
  int64_t stride = 0;
  int64_t ctas = 0;
};
// Every job of the table (device memory, num_jobs entries), one launch. FLOPs sum of ctas n;
// bytes sum of 4 (ctas + 2) n.
cudaError_t ColumnSums(const ColumnSumJob* jobs, int num_jobs, int64_t max_n, cudaStream_t stream);

// --- Softmax cross-entropy over rows of v fp32 logits (v >= 1), targets device int32 [m]
// (kIgnoreTarget = -1: no loss). row_lse[t] := log sum exp logits[t, :] for every row;
// *loss_sum (device fp64) := sum over counted rows of row_lse - logits[t, target], per-CTA fp64
// partial sums (scratch `partials`, CrossEntropyPartials(m) doubles) added in CTA order.
// FLOPs about 4 m v (+ m v exp); bytes 4 m v + 12 m.
cudaError_t CrossEntropyForward(const float* logits, const int32_t* targets, int64_t m, int64_t v,
                                float* row_lse, double* partials, double* loss_sum,
                                cudaStream_t stream);
// dlogits := bf16(scale (softmax(logits) - onehot(target))) on counted rows, 0 on the others.
// FLOPs about 3 m v; bytes (4 + 2) m v + 8 m.
cudaError_t CrossEntropyBackward(const float* logits, const float* row_lse, const int32_t* targets,
                                 int64_t m, int64_t v, float scale, bf16_t* dlogits,
                                 cudaStream_t stream);
// out[t] := logits[t, targets[t]] - row_lse[t], the log-probability of row t's target (0 where
// the target is kIgnoreTarget), after CrossEntropyForward wrote row_lse. FLOPs m; bytes 16 m.
cudaError_t TargetLogProbs(const float* logits, const float* row_lse, const int32_t* targets,
                           int64_t m, int64_t v, float* out, cudaStream_t stream);

// --- AdamW over elements [0, n) of flat fp32 buffers (the caller offsets the pointers), the
// update of model/optimizer.h (PyTorch's torch.optim.AdamW), one fp32 rounding per operation in
// the order written there (no fused multiply-adds), so that it equals a CPU fp32 loop bit for bit:
//   g = grad * grad_scale; w = p (* decay_keep where decay bit i of decay_bits is set);
//   m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) (g g);
//   p = w - step_size (m / (sqrt(v) / bc2_sqrt + epsilon)).
// decay_bits: device bitmask over the whole layout (bit (first + i) for element i; null: no
// decay anywhere). FLOPs about 16 n; bytes 28 n + n / 8.
struct AdamWFactors {
  float decay_keep = 1;  // 1 - lr weight_decay
  float step_size = 0;   // lr / (1 - beta1^t)
  float bc2_sqrt = 1;    // sqrt(1 - beta2^t)
  float beta1 = 0, one_minus_beta1 = 1, beta2 = 0, one_minus_beta2 = 1;
  float epsilon = 1e-8f;
  float grad_scale = 1;
};
cudaError_t AdamWUpdate(const AdamWFactors& f, int64_t n, int64_t first, const uint32_t* decay_bits,
                        float* p, const float* grad, float* m, float* v, cudaStream_t stream);

// *out (device fp64) := sum of x[i]^2 over i < n, each square and sum in fp64: per-CTA partial
// sums (scratch, SumOfSquaresPartials() doubles) in a fixed partition, then added in CTA order.
// FLOPs 2 n; bytes 4 n.
int64_t SumOfSquaresPartials();
cudaError_t SumOfSquares(const float* x, int64_t n, double* partials, double* out,
                         cudaStream_t stream);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_MODEL_KERNELS_H_
