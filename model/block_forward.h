// One LongNet block's forward wiring (longnet.h's architecture), shared by the model's batched
// forward pass (LongNetLM::BlockForward) and incremental decoding (decoder.h), which differ only
// in how attention is computed between the two halves:
//   BlockQkvForward:    ln1 = LN(x_in); q, k, v = q_proj(ln1), k_proj(ln1), v_proj(ln1)
//   (the caller rotates q and k, computes attn from them and v)
//   BlockOutputForward: x_mid = x_in + out_proj(SubLN(attn))
//                       x_out = x_mid + fc2(SubLN(GELU(fc1(LN(x_mid)))))
// Every pointer is device memory of the ops' device; each activation buffer holds m rows of its
// width (d, or F for h1, g, sub2; statistics one value per row). Written once so that the two
// paths cannot drift apart: decoding is tested against the batched forward to fp32 rounding.
// FLOPs: 6 m d^2 (QKV) and 2 m d^2 + 4 m d F (output half), as CountFlops counts them.
// Errors: the ops'. Thread-safety: that of the ops (one call at a time).
#ifndef DATTN_MODEL_BLOCK_FORWARD_H_
#define DATTN_MODEL_BLOCK_FORWARD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/layer_ops.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {

// The activations of one block's forward pass for m rows (non-owning).
template <typename T>
struct BlockTensors {
  T *ln1 = nullptr, *ln1_mean = nullptr, *ln1_rstd = nullptr;     // [m, d]; [m]
  T *q = nullptr, *k = nullptr, *v = nullptr;                     // [m, d]
  T* attn = nullptr;                                              // [m, d]
  T *sub1 = nullptr, *sub1_mean = nullptr, *sub1_rstd = nullptr;  // [m, d]; [m]
  T* x_mid = nullptr;                                             // [m, d]
  T *ln2 = nullptr, *ln2_mean = nullptr, *ln2_rstd = nullptr;     // [m, d]; [m]
  T *h1 = nullptr, *g = nullptr;                                  // [m, F]
  T *sub2 = nullptr, *sub2_mean = nullptr, *sub2_rstd = nullptr;  // [m, F]; [m]
};

// ln1 (and its statistics), q, k, v := the attention inputs of block `o` for rows x_in [m, d]
// (q and k not yet rotated).
template <typename T>
absl::Status BlockQkvForward(LayerOps<T>& ops, const LongNetConfig& config, const T* params,
                             const BlockOffsets& o, int64_t m, const T* x_in,
                             const BlockTensors<T>& t);

// x_out [m, d] := the block's output from x_in and t.attn; writes the other activations of t.
template <typename T>
absl::Status BlockOutputForward(LayerOps<T>& ops, const LongNetConfig& config, const T* params,
                                const BlockOffsets& o, int64_t m, const T* x_in,
                                const BlockTensors<T>& t, T* x_out);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_BLOCK_FORWARD_H_
