#include "model/language_model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/attention_spec.h"

namespace dattn {
namespace model {

ModelFlops CountFlops(const LongNetConfig& c, int64_t batch, int64_t seq_len,
                      bool checkpoint_activations) {
  const double m = static_cast<double>(batch) * static_cast<double>(seq_len);
  const double d = static_cast<double>(c.d_model), f = static_cast<double>(c.ffn_dim);
  const double layers = static_cast<double>(c.num_layers);
  const double linear = 2.0 * m * (4.0 * d * d + 2.0 * d * f);
  const double attention =
      dilation::NominalForwardFlops(c.attention_spec(), batch, seq_len, c.num_heads, c.head_dim());
  const double head = 2.0 * m * d * static_cast<double>(c.vocab_size);
  ModelFlops flops;
  flops.forward = layers * (linear + attention) + head;
  flops.backward = layers * (2.0 * linear + 2.5 * attention) + 2.0 * head;
  if (checkpoint_activations) flops.backward += layers * (linear + attention);
  return flops;
}

absl::Status CheckTokenBatch(const LongNetConfig& config, const TokenBatch& b,
                             int64_t element_bytes) {
  if (b.batch < 1 || b.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token batch: batch ", b.batch, " and seq_len ", b.seq_len, " must be >= 1"));
  }
  if (b.tokens == nullptr) return absl::InvalidArgumentError("token batch: tokens is null");
  // Every buffer is at most M x max(d, F, V) elements, and attention's lse B x H x N: they must
  // fit in int64 (long contexts pass 2^31 easily; 2^63 only by mistake).
  int64_t m = 0, widest = 0;
  const int64_t width =
      std::max({config.d_model, config.ffn_dim, config.vocab_size, config.num_heads});
  if (__builtin_mul_overflow(b.batch, b.seq_len, &m) || __builtin_mul_overflow(m, width, &widest) ||
      widest > std::numeric_limits<int64_t>::max() / std::max<int64_t>(element_bytes, 1)) {
    return absl::InvalidArgumentError(absl::StrCat("token batch: batch ", b.batch, " x seq_len ",
                                                   b.seq_len, " x width ", width,
                                                   " overflows int64 bytes"));
  }
  const SequencePositions& p = b.positions;
  if (p.total != 0 && (p.offset < 0 || p.offset > p.total - b.seq_len)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token batch: positions [", p.offset, ", ", p.offset, " + ", b.seq_len,
                     ") do not lie inside a sequence of ", p.total, " positions"));
  }
  for (int which = 0; which < 2; ++which) {
    const int32_t* ids = which == 0 ? b.tokens : b.targets;
    if (ids == nullptr) continue;
    for (int64_t t = 0; t < m; ++t) {
      const int32_t id = ids[t];
      const bool ok = (id >= 0 && id < config.vocab_size) || (which == 1 && id == kIgnoreTarget);
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            which == 0 ? "tokens" : "targets", "[", t / b.seq_len, ", ", t % b.seq_len, "] = ", id,
            " is outside [0, vocab_size = ", config.vocab_size, ")",
            which == 1 ? absl::StrCat(" and is not ", kIgnoreTarget, " (ignored)") : ""));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace model
}  // namespace dattn
