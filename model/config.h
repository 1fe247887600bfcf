// The LongNet language model's configuration: every size and the attention patterns.
//
// A config is a plain value. It is read from JSON (ParseConfigJson), written back (ConfigToJson,
// e.g. into checkpoints) and checked (ValidateConfig) before any model is built. Every field has a
// default: the LongNet base shape of the paper (d = 768, 12 layers, 12 heads, FFN 3072, segments
// 2048..32768 with rates 1, 2, 4, 6, 12) with a byte vocabulary. docs/MODEL.md lists the fields.
//
// JSON form (every key optional; an unknown key is an error, so that a typo is not silently a
// default):
//   {
//     "vocab_size": 256, "d_model": 768, "num_layers": 12, "num_heads": 12, "ffn_dim": 3072,
//     "layer_norm_eps": 1e-5, "tie_embeddings": true,
//     "attention": {"mode": "grouped", "head_offsets": "modulo",
//                   "segment_lengths": [2048, 4096, 8192, 16384, 32768],
//                   "dilation_rates": [1, 2, 4, 6, 12]},
//     "rotary": {"theta": 10000, "xpos": false, "xpos_scale_base": 512}
//   }
// Attention is always causal (a language model must not see the tokens it predicts) and scaled by
// 1/sqrt(head_dim); neither is a field.
//
// Errors are INVALID_ARGUMENT and name the field by its JSON path and the bad value, e.g.
// `config field "attention.segment_lengths[1]": 0 must be >= 1`.
#ifndef DATTN_MODEL_CONFIG_H_
#define DATTN_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/attention_spec.h"

namespace dattn {
namespace model {

struct LongNetConfig {
  int64_t vocab_size = 256;  // Token ids are 0 .. vocab_size - 1 (int32).
  int64_t d_model = 768;     // Width of the residual stream.
  int64_t num_layers = 12;   // Blocks.
  int64_t num_heads = 12;    // d_model / num_heads is the head dim: even (rotary pairs).
  int64_t ffn_dim = 3072;    // Hidden width of the feed-forward layer.
  double layer_norm_eps = 1e-5;
  bool tie_embeddings = true;  // LM head = token embedding (no lm_head.weight entry).

  AttentionMode attention_mode = AttentionMode::kGrouped;
  HeadOffsets head_offsets = HeadOffsets::kModulo;  // kBlocked: mixture mode only.
  std::vector<int64_t> segment_lengths = {2048, 4096, 8192, 16384, 32768};
  std::vector<int64_t> dilation_rates = {1, 2, 4, 6, 12};

  double rope_theta = 10000;     // Rotary frequencies theta^(-2j/head_dim).
  bool xpos = false;             // XPOS decay on top of the rotation.
  double xpos_scale_base = 512;  // XPOS: q scaled by zeta^(n/scale_base), k by zeta^(-n/...).

  int64_t head_dim() const { return d_model / num_heads; }
  // The engine call of every block: the patterns, causal, mode, default scale 1/sqrt(head_dim).
  AttentionSpec attention_spec() const;
};

// Parses and validates a JSON document (the form above). INVALID_ARGUMENT for malformed JSON (with
// the parser's message), an unknown key, a value of the wrong type, or what ValidateConfig refuses.
absl::StatusOr<LongNetConfig> ParseConfigJson(const std::string& text);

// The JSON form of `config`, every field written; ParseConfigJson(ConfigToJson(c)) == c.
std::string ConfigToJson(const LongNetConfig& config);

// A bound on num_layers: five times the deepest production language models (about 100 layers).
// The layout holds 20 named tensors per layer, and every plan of a training job builds it: at
// 2,564 layers a submit cost the coordinator 1.9 s of analysis (13 s under AddressSanitizer; found
// by requests_fuzz), at 1,024 still 0.5 s (8 s under ASan, near the fuzzers' 10 s timeout).
inline constexpr int64_t kMaxLayers = 512;

// Every rule of the config on its own: sizes >= 1; num_layers <= kMaxLayers and a parameter
// count whose fp64 bytes fit in int64; d_model divisible by num_heads with an even head dim;
// vocab_size, d_model and ffn_dim within a BLAS int (2^31 - 1); the attention spec valid
// (engine/validate.h's ValidateSpec) with num_heads >= the number of patterns in grouped mode;
// layer_norm_eps, rope_theta and xpos_scale_base finite and > 0.
absl::Status ValidateConfig(const LongNetConfig& config);

bool operator==(const LongNetConfig& a, const LongNetConfig& b);
inline bool operator!=(const LongNetConfig& a, const LongNetConfig& b) { return !(a == b); }

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CONFIG_H_
