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
// the layers run on the model's ops. The CPU model is the one LongNetLM; the GPU's decoder, with
// the cache and the cached attention on the device, is model/cuda/cuda_decoder.h.
//
// A ring of S ranks (Create with a communicator of S > 1 ranks, host memory: Gloo). Every rank
// holds the whole model; the sequence's positions and its cache are what is split:
//   - the cache: row j of every slot (the slot's j-th selected position of its current segment)
//     is held by rank j mod S only, so a rank holds ceil((C(i, h) - rank) / S) rows of each slot
//     and 1/S of the single-device cache's bytes (to a row a slot);
//   - Prefill: the prompt, padded with token 0 to n' = S ceil(n / S) positions (padding after the
//     prompt changes none of its rows: attention is causal), runs as a sequence-parallel forward
//     pass: rank r computes positions [r n' / S, (r + 1) n' / S) and its model's attention must be
//     the ring over the same communicator (ring_sequence_attention.h, which takes the prefix of a
//     max_context-long sequence). Each block's cached rows then go from the rank that computed
//     them to the rank that holds them (one group of point-to-point transfers a layer), and the
//     rank that computed position n - 1 hands its logits to all (an all-gather);
//   - Step: every rank runs the layers for the new tokens (replicated: the same weights, the same
//     inputs), its owner appends each new key and value, and each rank attends over the rows it
//     holds: per (sequence, pattern, head) a partial softmax (its maximum m_r, sum s_r and
//     unnormalized output a_r, in fp64), exchanged (each rank sends its own to every other at
//     once: one hop, not a ring all-gather's S - 1) and merged in rank order, M = max m_r,
//     out = sum_r e^(m_r - M) a_r / sum_r e^(m_r - M) s_r, lse = M + log(sum_r e^(m_r - M) s_r),
//     then patterns merged as on one device. Every rank merges the same numbers in the same order,
//     so every rank gets the same attention output and the same logits. With S = 1 the merge is
//     the single-device arithmetic, bit for bit.
// Traffic per Step and layer: (S - 1) x sequences x slots x (D + 2) fp64 values received by each
// rank. The layers' weights are read by every rank (a step costs each rank what it costs one
// device, less the attention's share): a ring serves a longer context or more sequences in the
// same memory per rank, and its prefill is split S ways; it does not make one decoding step
// faster. Collective contract: every rank of the ring makes the same calls (Prefill with the same
// prompt, Step with the same tokens to its own states of the same sequences, in the same order);
// a rank that does not leaves the others waiting until the communicator's timeout
// (DEADLINE_EXCEEDED). After a communicator error the states are unspecified (drop them).
//
// Thread-safety: a decoder is used by one thread at a time, and its model must not be used by
// another thread meanwhile (Prefill runs the model's Forward and overwrites its activations). A
// state belongs to one sequence and is used by one call at a time; while its decoder leads a ring
// (Lead, below) a state is destroyed on the decoder's thread (its id joins the decoder's list of
// dropped states). The calls a leader sends and a follower makes: decoder_calls.h.
// Errors: INVALID_ARGUMENT naming the bad value (a token outside the vocabulary, a state of
// another decoder, a state passed twice, an empty prompt, a ring that is not on host memory or
// whose size does not divide max_context); OUT_OF_RANGE when a sequence would
// pass max_context (naming both); FAILED_PRECONDITION for Prefill on a state that already holds
// tokens; the model's and ops' errors as they return them. A failed call leaves every state at
// the position it had (its cache rows for the failed position are rewritten by the next call).
#ifndef DATTN_MODEL_DECODER_H_
#define DATTN_MODEL_DECODER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/attention_spec.h"
#include "engine/comm/communicator.h"
#include "model/config.h"
#include "model/decoder_calls.h"
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
    int64_t offset = 0;          // o(h, i): the first selected position of each segment.
    int64_t capacity = 0;        // C(i, h): the slot's rows, every shard together.
    int64_t local_capacity = 0;  // The rows this shard holds: those j < C with j % shards == shard.
    int64_t first_row = 0;       // Of this shard's rows, in its layer's cache.
  };

  // The rows of shard `shard` of `shards` (a ring's rank and size, above; 0 of 1: every row).
  // INVALID_ARGUMENT for a config ValidateConfig refuses, max_context < 1 or a shard outside
  // [0, shards).
  static absl::StatusOr<KvCacheGeometry> Make(const LongNetConfig& config, int64_t max_context,
                                              int shards = 1, int shard = 0);

  const std::vector<Slot>& slots() const { return slots_; }
  int64_t max_context() const { return max_context_; }
  int shards() const { return shards_; }
  int shard() const { return shard_; }
  // This shard's rows of each layer.
  int64_t rows_per_layer() const { return rows_per_layer_; }
  // K and V of every layer, this shard's rows: num_layers * 2 * rows_per_layer * head_dim.
  int64_t ElementsPerSequence() const;
  // Where position t's key sits in slot s (its row of the slot, every shard together), or -1 when
  // the slot's pattern does not select t for its head. The rows [0, row] of the slot are then the
  // keys the query at t attends to; row j is held by shard j % shards(), as its row j / shards().
  int64_t RowOf(const Slot& slot, int64_t t) const;

 private:
  LongNetConfig config_;
  int64_t max_context_ = 0;
  int shards_ = 1;
  int shard_ = 0;
  int64_t rows_per_layer_ = 0;
  std::vector<Slot> slots_;
};

// The argument checks of a decoder's calls, shared by this file's decoder and the GPU's
// (model/cuda/cuda_decoder.h); `decoder` names it in the messages ("decoder", "GPU decoder"). Each
// returns the first problem, naming the value: INVALID_ARGUMENT, or OUT_OF_RANGE past max_context,
// or FAILED_PRECONDITION for a prefill of a state that holds tokens.
// Every token of `call`'s tokens[0, n) in [0, vocab).
absl::Status CheckDecodeTokens(const char* decoder, const char* call, const int32_t* tokens,
                               int64_t n, int64_t vocab);
// Prefill of n tokens into a state (`ours`: made by this decoder) that holds `held` tokens.
absl::Status CheckPrefillArgs(const char* decoder, bool ours, int64_t held, const int32_t* tokens,
                              int64_t n, int64_t max_context, int64_t vocab);
// Score of n tokens into logprobs.
absl::Status CheckScoreArgs(const char* decoder, const int32_t* tokens, int64_t n,
                            const double* logprobs, int64_t max_context, int64_t vocab);
// Sequence j of a Step: its state (`ours`; `repeated`: passed earlier in the same call) at
// `position`, fed `token`.
absl::Status CheckStepSequence(const char* decoder, int64_t j, bool ours, bool repeated,
                               int64_t position, int64_t max_context, int32_t token, int64_t vocab);

template <typename T>
class Decoder;

// One sequence's cache and position. Move-only; made by Decoder::NewState and used with that
// decoder only.
template <typename T>
class DecodeState {
 public:
  DecodeState(DecodeState&& other) noexcept { *this = std::move(other); }
  DecodeState& operator=(DecodeState&& other) noexcept {
    if (this != &other) {
      Drop();
      owner_ = std::exchange(other.owner_, nullptr);
      id_ = std::exchange(other.id_, 0);
      dropped_ = std::move(other.dropped_);
      position_ = other.position_;
      k_ = std::move(other.k_);
      v_ = std::move(other.v_);
    }
    return *this;
  }
  ~DecodeState() { Drop(); }

  // Tokens the sequence holds so far (the position of the next one).
  int64_t position() const { return position_; }
  // Bytes of its cache (allocated whole at creation).
  int64_t cache_bytes() const { return static_cast<int64_t>((k_.size() + v_.size()) * sizeof(T)); }

 private:
  friend class Decoder<T>;
  DecodeState() = default;
  void Drop() {
    if (id_ != 0 && dropped_ != nullptr && dropped_->record) dropped_->ids.push_back(id_);
    id_ = 0;
  }
  const void* owner_ = nullptr;  // The decoder that made it.
  int64_t id_ = 0;               // Its decoder's number for it (1, 2, ...), the same on a ring.
  std::shared_ptr<DroppedStates> dropped_;
  int64_t position_ = 0;
  std::vector<T> k_, v_;  // [layer][rows_per_layer][head_dim]
};

template <typename T>
class Decoder {
 public:
  using State = DecodeState<T>;
  using Logit = T;

  // Borrows `model` (it must outlive the decoder). INVALID_ARGUMENT for max_context < 1; the
  // rotary plan's errors for a max_context it refuses (XPOS with too long a block). With `ring`
  // (borrowed, outliving the decoder; null or one rank: a single device) the decoder is that
  // rank's part of a ring (above): INVALID_ARGUMENT unless the ring is on host memory and its size
  // divides max_context; `model`'s attention must be the ring over the same communicator.
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(LongNetLM<T>* model, int64_t max_context,
                                                         comm::Communicator* ring = nullptr);

  const LongNetConfig& config() const { return model_->config(); }
  const KvCacheGeometry& geometry() const { return geometry_; }

  // A sequence with no tokens yet and its whole cache allocated (geometry().ElementsPerSequence()
  // values of T). RESOURCE_EXHAUSTED naming the bytes if they cannot be had.
  absl::StatusOr<DecodeState<T>> NewState() const;

  // Runs the prompt (n >= 1 tokens) through the model's batched forward pass, fills the state's
  // cache from it and writes the logits that predict token n into logits[0, vocab_size). The
  // state must hold no tokens yet (FAILED_PRECONDITION); n <= max_context (OUT_OF_RANGE).
  // Cost: the model's forward pass over n tokens (CountFlops) plus copying the cached rows (on a
  // ring: each rank's share of the forward pass over n' tokens, and the rows' transfers).
  absl::Status Prefill(const int32_t* tokens, int64_t n, DecodeState<T>* state, T* logits);

  // Feeds tokens[j] to states[j] (distinct states of this decoder, each with position <
  // max_context) and writes the logits that predict each one's next token into
  // logits[j * vocab_size, (j + 1) * vocab_size). Every state advances by one. FLOPs per
  // sequence: 2 (L (4 d^2 + 2 d F) + d V) for the layers and the head, plus 4 D per cached row
  // read (scores and values).
  absl::Status Step(absl::Span<DecodeState<T>* const> states, const int32_t* tokens, T* logits);

  // logprobs[i] := log p(tokens[i + 1] | tokens[0..i]) for i in [0, n - 1), from one forward pass
  // of the model over the n >= 2 tokens (no state, no cache; fp64 log-softmax of the logits). On a
  // ring the forward pass is split as Prefill's and each rank's log-probabilities all-gathered.
  // Errors: INVALID_ARGUMENT for n < 2 or a token outside the vocabulary (naming it and its
  // position), OUT_OF_RANGE for n > max_context; the model's.
  absl::Status Score(const int32_t* tokens, int64_t n, double* logprobs);

  // --- A ring driven by rank 0 alone (a serving loop).
  //
  // On a ring the calls above are collective: every rank makes them. A deployment instead has one
  // serving loop, on rank 0, which decides what runs (requests, sampling, cancels). After Lead()
  // on rank 0, each Prefill, Step and Score it makes first sends the call (its tokens
  // and its states' ids) to the other ranks, which are in Follow(): they make the same call on
  // their own states (created at a state's first use, dropped when rank 0's state is destroyed:
  // the ids of dropped states go with the next call) and go on listening. Rank 0 ends the
  // followers with Release() (their Follow returns OK). A follower waits for the next call at most
  // the communicator's timeout, so a leader with nothing to do calls KeepAlive(interval) often
  // (it sends a no-op when nothing was sent for `interval`; an interval under half the timeout
  // keeps the followers waiting). On one device Lead, KeepAlive and Release do nothing (there is
  // no one to follow). Errors: FAILED_PRECONDITION for Lead, KeepAlive or Release off rank 0, and
  // for Follow on rank 0 or on one device; the communicator's errors (a follower that
  // died: the leader's next call fails; a leader that died: Follow returns DEADLINE_EXCEEDED or
  // UNAVAILABLE); a follower's call that fails where the leader's succeeded ends its Follow with
  // that error, and the leader's next collective times out (the ring is then rebuilt whole).
  absl::Status Lead();
  absl::Status Follow();
  absl::Status KeepAlive(absl::Duration interval);
  absl::Status Release();
  bool leading() const { return calls_.leading(); }
  // The states a follower holds (those of rank 0's sequences that are still alive), updated at
  // each call it follows; 0 before Follow.
  int64_t follower_states() const { return calls_.follower_states(); }

 private:
  Decoder(LongNetLM<T>* model, KvCacheGeometry geometry, RotaryPlan rotary,
          comm::Communicator* ring, std::unique_ptr<DecoderCallWire> wire);
  absl::Status EnsureStepBuffers(int64_t rows);
  // Writes k and v ([d], host) of position t into the state's cache at layer l: the rows of the
  // slots that select t and this shard holds.
  void Append(DecodeState<T>& state, int64_t layer, int64_t t, const T* k, const T* v) const;
  // partial[s * (D + 2) ...] := slot s's partial softmax at position t of layer l for q (host,
  // [d]) over the rows this shard holds: its maximum score, its sum of exponentials relative to
  // that maximum and the D values of its unnormalized output ({-inf, 0, 0...} when the slot's
  // pattern does not select t or this shard holds none of its rows).
  void AttendPartial(const DecodeState<T>& state, int64_t layer, int64_t t, const T* q,
                     double* partial) const;
  // out[0, d) := the attention output from every shard's partials: shard r's of slot s at
  // partials[r * shard_stride + s * (D + 2)].
  void MergePartials(const double* partials, int64_t shard_stride, T* out) const;
  // Prefill's transfer of one layer's cached rows from the ranks that computed them (the forward
  // pass's rows [r n' / S, (r + 1) n' / S) on rank r; k and v on the model's device) to the ranks
  // that hold them, for a prompt of n tokens.
  absl::Status ShareLayerRows(int64_t layer, int64_t n, int64_t shard_len, const T* k, const T* v,
                              DecodeState<T>& state);
  // The checks and the collective parts of Prefill, Step and Score (after a leader's send); a
  // follower runs the same checks on the calls it receives.
  absl::Status CheckPrefill(const int32_t* tokens, int64_t n, const DecodeState<T>* state) const;
  absl::Status RunPrefill(const int32_t* tokens, int64_t n, DecodeState<T>* state, T* logits);
  absl::Status CheckStep(absl::Span<DecodeState<T>* const> states, const int32_t* tokens) const;
  absl::Status RunStep(absl::Span<DecodeState<T>* const> states, const int32_t* tokens, T* logits);
  absl::Status CheckScore(const int32_t* tokens, int64_t n, const double* logprobs) const;
  absl::Status RunScore(const int32_t* tokens, int64_t n, double* logprobs);
  // This rank's positions [begin, begin + len) of n tokens padded to a multiple of the ring's
  // size: len = ceil(n / S), begin = rank * len (one device: [0, n)).
  struct Shard {
    int64_t begin = 0;
    int64_t len = 0;
  };
  Shard ShardOf(int64_t n) const;
  // This rank's forward pass over `shard` of the n tokens (padding: token 0); `total` is the
  // positions' total (rotary's plan).
  absl::Status ShardForward(const int32_t* tokens, int64_t n, const Shard& shard, int64_t total);
  // Step's exchange of one layer's partial softmaxes: partials_[0, count) of every rank into
  // gathered_ at [rank * count, (rank + 1) * count).
  absl::Status ExchangePartials(int64_t count);

  LongNetLM<T>* const model_;
  comm::Communicator* const ring_;  // Null: one device.
  const int shards_;                // The ring's size (1 without one).
  const int64_t partial_width_;     // D + 2.
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
  // Step's partial softmaxes of one layer: this shard's [rows][slots][D + 2] and every shard's.
  std::vector<double> partials_, gathered_;

  // States' ids, Lead, Follow and the calls a leader sends (decoder_calls.h).
  RingCalls calls_;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_DECODER_H_
