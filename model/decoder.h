// Incremental decoding of the LongNet language model, with a cache that keeps only the keys and
// values some attention pattern can still select.
//
// Why the cache is small. Attention is causal and every pattern i attends inside segments
// [m w_i, (m+1) w_i) only (ENGINE.md): the query at position t, for head h and pattern i, sees
// the keys of t's own segment at the positions that pattern selects for h (offset o, rate r_i:
// m w_i + o + j r_i) up to t. A later query t' >= t is in the same segment or a later one; so
// once t's segment of pattern i has ended, none of its keys is ever needed again by pattern i.
// The cache of one sequence is therefore, per layer and per (pattern i, head h that uses i), the
// selected rows of the current segment: at most
//   C(i, h) = SelectedCount(min(w_i, max_context), o(h, i), r_i) <= ceil(min(w_i, max_context) /
//   r_i)
// rows of K and of V, head_dim values each, whatever the context length. Per sequence:
//   bytes = num_layers * 2 * head_dim * sizeof(T) * sum over (i, h) of C(i, h)
// (KvCacheGeometry::ElementsPerSequence). The base model (12 layers, 12 heads in 5 groups,
// D = 64, w = 2048..32768, r = 1, 2, 4, 6, 12) keeps 27,308 rows a layer: 168 MB a sequence in
// fp32 (84 MB in bf16) at any context length; a full cache at 1M tokens holds 1,048,576 rows a
// head: 38.7 GB in bf16. A decoding step reads each cached row of the patterns that select its
// position.
//
// Rotary positions. The model rotates q and k relative to a reference position of each block of
// W = min(lcm(segment_lengths), N) positions (rotary.h), and N is the context length. A sequence
// that grows must keep one W, or keys cached early would not pair with later queries: the
// decoder plans rotary for `max_context` (the longest sequence it will decode) and its prefill
// runs the model's forward pass over the prompt as the first rows of a max_context-long causal
// sequence (sequence_attention.h). Results equal a full forward pass over the same prefix to the
// rounding of the compute type (decoder_test: fp64 to 1e-11, fp32 to 1e-5 relative).
//
// Use. Decoder::Create(model, max_context) borrows a LongNetLM (its parameters, layer ops and
// forward pass). NewState() makes one sequence's cache (its memory is allocated whole, once).
// Prefill(prompt) runs the prompt in one batched forward pass and fills the cache from it; Step
// then feeds one token to each of any number of sequences at once (each at its own position:
// the linear layers run over all of them as one matrix), writing each one's next-token logits.
// Step on a fresh state works too (it is a prefill of one token), so Prefill is an
// optimization, never a requirement. Sampling and stop rules are generation.h's.
//
// Device. The cache and the cached attention are host memory and host code (fp64 accumulation);
// the layers run on the model's ops. The CPU model is the one LongNetLM; a GPU decoder needs the
// cache on the device and is not built yet.
//
// Thread-safety: a decoder is used by one thread at a time, and its model must not be used by
// another thread meanwhile (Prefill runs the model's Forward and overwrites its activations). A
// state belongs to one sequence and is used by one call at a time.
// Errors: INVALID_ARGUMENT naming the bad value (a token outside the vocabulary, a state of
// another decoder, a state passed twice, an empty prompt); OUT_OF_RANGE when a sequence would
// pass max_context (naming both); FAILED_PRECONDITION for Prefill on a state that already holds
// tokens; the model's and ops' errors as they return them. A failed call leaves every state at
// the position it had (its cache rows for the failed position are rewritten by the next call).
#ifndef DATTN_MODEL_DECODER_H_
#define DATTN_MODEL_DECODER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/attention_spec.h"
#include "model/config.h"
#include "model/longnet.h"
#include "model/rotary.h"

namespace dattn {
namespace model {

// Which rows one sequence's cache holds (see above), for a config and a max_context.
class KvCacheGeometry {
 public:
  // One (pattern, head) pair whose keys are cached: rows [first_row, first_row + capacity) of
  // each layer's cache.
  struct Slot {
    int pattern = 0;
    int64_t head = 0;
    int64_t offset = 0;    // o(h, i): the first selected position of each segment.
    int64_t capacity = 0;  // C(i, h).
    int64_t first_row = 0;
  };

  // INVALID_ARGUMENT for a config ValidateConfig refuses or max_context < 1.
  static absl::StatusOr<KvCacheGeometry> Make(const LongNetConfig& config, int64_t max_context);

  const std::vector<Slot>& slots() const { return slots_; }
  int64_t max_context() const { return max_context_; }
  int64_t rows_per_layer() const { return rows_per_layer_; }
  // K and V of every layer: num_layers * 2 * rows_per_layer * head_dim.
  int64_t ElementsPerSequence() const;
  // Where position t's key sits in slot s, or -1 when the slot's pattern does not select t for
  // its head. The rows [0, row] of the slot are then the keys the query at t attends to.
  int64_t RowOf(const Slot& slot, int64_t t) const;

 private:
  LongNetConfig config_;
  int64_t max_context_ = 0;
  int64_t rows_per_layer_ = 0;
  std::vector<Slot> slots_;
};

template <typename T>
class Decoder;

// One sequence's cache and position. Move-only; made by Decoder::NewState and used with that
// decoder only.
template <typename T>
class DecodeState {
 public:
  DecodeState(DecodeState&&) noexcept = default;
  DecodeState& operator=(DecodeState&&) noexcept = default;

  // Tokens the sequence holds so far (the position of the next one).
  int64_t position() const { return position_; }
  // Bytes of its cache (allocated whole at creation).
  int64_t cache_bytes() const { return static_cast<int64_t>((k_.size() + v_.size()) * sizeof(T)); }

 private:
  friend class Decoder<T>;
  DecodeState() = default;
  const void* owner_ = nullptr;  // The decoder that made it.
  int64_t position_ = 0;
  std::vector<T> k_, v_;  // [layer][rows_per_layer][head_dim]
};

template <typename T>
class Decoder {
 public:
  // Borrows `model` (it must outlive the decoder). INVALID_ARGUMENT for max_context < 1; the
  // rotary plan's errors for a max_context it refuses (XPOS with too long a block).
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(LongNetLM<T>* model, int64_t max_context);

  const LongNetConfig& config() const { return model_->config(); }
  const KvCacheGeometry& geometry() const { return geometry_; }

  // A sequence with no tokens yet and its whole cache allocated (geometry().ElementsPerSequence()
  // values of T). RESOURCE_EXHAUSTED naming the bytes if they cannot be had.
  absl::StatusOr<DecodeState<T>> NewState() const;

  // Runs the prompt (n >= 1 tokens) through the model's batched forward pass, fills the state's
  // cache from it and writes the logits that predict token n into logits[0, vocab_size). The
  // state must hold no tokens yet (FAILED_PRECONDITION); n <= max_context (OUT_OF_RANGE).
  // Cost: the model's forward pass over n tokens (CountFlops) plus copying the cached rows.
  absl::Status Prefill(const int32_t* tokens, int64_t n, DecodeState<T>* state, T* logits);

  // Feeds tokens[j] to states[j] (distinct states of this decoder, each with position <
  // max_context) and writes the logits that predict each one's next token into
  // logits[j * vocab_size, (j + 1) * vocab_size). Every state advances by one. FLOPs per
  // sequence: 2 (L (4 d^2 + 2 d F) + d V) for the layers and the head, plus 4 D per cached row
  // read (scores and values).
  absl::Status Step(absl::Span<DecodeState<T>* const> states, const int32_t* tokens, T* logits);

 private:
  Decoder(LongNetLM<T>* model, KvCacheGeometry geometry, RotaryPlan rotary);
  absl::Status EnsureStepBuffers(int64_t rows);
  // Writes row `row` of [rows, d] k and v (host) into the state's cache at position t, layer l.
  void Append(DecodeState<T>& state, int64_t layer, int64_t t, const T* k, const T* v) const;
  // out[0, d) := the attention output at position t of layer l for q (host, [d]) from the cache.
  void Attend(const DecodeState<T>& state, int64_t layer, int64_t t, const T* q, T* out) const;

  LongNetLM<T>* const model_;
  const KvCacheGeometry geometry_;
  const AttentionSpec spec_;
  const RotaryPlan rotary_;
  // slot_of_[i * H + h]: index of (pattern i, head h)'s slot, or -1.
  std::vector<int64_t> slot_of_;

  // Step's buffers for step_rows_ sequences.
  int64_t step_rows_ = 0;
  std::vector<DeviceArray<T>> step_arrays_;
  BlockTensors<T> step_;
  T *x_ = nullptr, *x_next_ = nullptr, *xf_ = nullptr, *xf_mean_ = nullptr, *xf_rstd_ = nullptr,
    *logits_ = nullptr;
  std::vector<T> host_q_, host_k_, host_v_, host_attn_;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_DECODER_H_
