// The LongNet language model's parameters: their names and shapes in a ParamLayout, where each
// lives in the flat buffer, which ones take weight decay, and MAGNETO initialisation.
//
// Entries, in this order (d = d_model, F = ffn_dim, V = vocab_size, i = 0 .. num_layers - 1; a
// linear layer's weight is [out, in] and computes y = x W^T + b, as torch.nn.Linear):
//   token_embedding.weight          [V, d]
//   blocks.i.attn_norm.{weight,bias}        [d]      LayerNorm before attention
//   blocks.i.attn.q_proj.{weight,bias}      [d, d], [d]
//   blocks.i.attn.k_proj.{weight,bias}      [d, d], [d]
//   blocks.i.attn.v_proj.{weight,bias}      [d, d], [d]
//   blocks.i.attn.sub_norm.{weight,bias}    [d]      MAGNETO sub-LayerNorm before out_proj
//   blocks.i.attn.out_proj.{weight,bias}    [d, d], [d]
//   blocks.i.ffn_norm.{weight,bias}         [d]      LayerNorm before the feed-forward layer
//   blocks.i.ffn.fc1.{weight,bias}          [F, d], [F]
//   blocks.i.ffn.sub_norm.{weight,bias}     [F]      MAGNETO sub-LayerNorm before fc2
//   blocks.i.ffn.fc2.{weight,bias}          [d, F], [d]
//   final_norm.{weight,bias}                [d]
//   lm_head.weight                  [V, d]   only when the head is not tied to the embedding
// A block's entries are contiguous in the buffer, so a block (or a range of blocks) is one range
// of elements. The names are those of the safetensors checkpoints.
//
// Everything here is pure and thread-safe.
#ifndef DATTN_MODEL_LONGNET_PARAMS_H_
#define DATTN_MODEL_LONGNET_PARAMS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/param_layout.h"

namespace dattn {
namespace model {

// The layout of a valid config's parameters (ValidateConfig's errors otherwise, and the layout's
// own INVALID_ARGUMENT if the element count overflows int64).
absl::StatusOr<ParamLayout> BuildParamLayout(const LongNetConfig& config);

// Whether AdamW should decay this entry: matrices (rank 2: linear weights, the token embedding,
// the untied LM head) yes; vectors (biases, LayerNorm gains and shifts) no.
bool WantsWeightDecay(const ParamEntry& entry);

// Offsets (elements into the flat buffer) of the tensors of one layer.
struct LinearOffsets {
  int64_t weight = 0;  // [out, in]
  int64_t bias = 0;    // [out]
};
struct NormOffsets {
  int64_t weight = 0;  // [n], the gain
  int64_t bias = 0;    // [n], the shift
};
struct BlockOffsets {
  NormOffsets attn_norm;
  LinearOffsets q_proj, k_proj, v_proj;
  NormOffsets attn_sub_norm;
  LinearOffsets out_proj;
  NormOffsets ffn_norm;
  LinearOffsets fc1;
  NormOffsets ffn_sub_norm;
  LinearOffsets fc2;
};
struct ModelOffsets {
  int64_t token_embedding = 0;  // [V, d]
  std::vector<BlockOffsets> blocks;
  NormOffsets final_norm;
  int64_t lm_head = -1;  // [V, d]; -1 when tied (the head reads token_embedding).
};

// Offsets of every tensor of `layout`, which BuildParamLayout(config) made. INTERNAL naming the
// entry if one is missing or has another shape (a layout from elsewhere).
absl::StatusOr<ModelOffsets> ResolveOffsets(const LongNetConfig& config, const ParamLayout& layout);

// The ranges of the flat buffer in the order a backward pass finishes their gradients:
// [final_norm, total) first (the final LayerNorm, and the LM head when it is not tied), then each
// block's range from the last block to the first, then the token embedding [0, V d) (last: the
// tied head and the embedding's own backward both write it). Disjoint, covering [0, total);
// num_layers + 2 ranges. What BackwardOptions::on_grads_final is called with, in this order.
std::vector<ElementRange> BackwardFinishOrder(const ModelOffsets& offsets, int64_t total);

// MAGNETO initialisation ("Foundation Transformers", arXiv 2210.06423, Fig. 2 and Sec. 2.2, the
// decoder-only case), written into `params` (layout.total() doubles):
//   gamma = sqrt(log(2 * num_layers));
//   v_proj, out_proj, fc1, fc2 weights: xavier normal with gain gamma,
//     std = gamma * sqrt(2 / (fan_in + fan_out));
//   q_proj, k_proj weights: xavier normal with gain 1;
//   token embedding and untied LM head: normal with std d_model^-1/2 (so that tied logits of a
//     LayerNorm'ed state start at about unit scale);
//   every bias 0; every LayerNorm gain 1 and shift 0.
// Deterministic: entry e's values depend only on (seed, e's name, e's shape), drawn from a
// SplitMix64 stream seeded by the seed and a 64-bit FNV-1a hash of the name, through Box-Muller;
// so fp32 and fp64 models built from the same seed hold the same values (rounded).
// `params` must not be null; the config must be the layout's.
absl::Status InitMagneto(const LongNetConfig& config, const ParamLayout& layout, uint64_t seed,
                         double* params);

// gamma above.
double MagnetoGamma(int64_t num_layers);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_LONGNET_PARAMS_H_
