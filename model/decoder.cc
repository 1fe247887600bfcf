#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {

#define DECODER_RETURN_IF_ERROR(expr)  \
  do {                                 \
    absl::Status status_ = (expr);     \
    if (!status_.ok()) return status_; \
  } while (0)

namespace {

// The communicator's dtype of T (cache rows and logits).
template <typename T>
constexpr DType kStateDType = sizeof(T) == sizeof(double) ? DType::kFloat64 : DType::kFloat32;

}  // namespace

absl::StatusOr<KvCacheGeometry> KvCacheGeometry::Make(const LongNetConfig& config,
                                                      int64_t max_context, int shards, int shard) {
  DECODER_RETURN_IF_ERROR(ValidateConfig(config));
  if (max_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder max_context ", max_context, " must be >= 1"));
  }
  if (shards < 1 || shard < 0 || shard >= shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder cache shard ", shard, " of ", shards, " is outside [0, shards)"));
  }
  KvCacheGeometry g;
  g.config_ = config;
  g.max_context_ = max_context;
  g.shards_ = shards;
  g.shard_ = shard;
  const AttentionSpec spec = config.attention_spec();
  for (int i = 0; i < spec.num_patterns(); ++i) {
    const int64_t w = std::min(spec.segment_lengths[static_cast<size_t>(i)], max_context);
    const int64_t r = spec.dilation_rates[static_cast<size_t>(i)];
    for (int64_t h = 0; h < config.num_heads; ++h) {
      if (!dilation::HeadUsesPattern(spec, i, h, config.num_heads)) continue;
      Slot slot;
      slot.pattern = i;
      slot.head = h;
      slot.offset = dilation::PatternOffset(spec, i, h, config.num_heads);
      slot.capacity = dilation::SelectedCount(w, slot.offset, r);
      if (slot.capacity == 0) continue;  // The pattern selects nothing for this head.
      // Rows j = shard, shard + shards, ... below the capacity.
      slot.local_capacity = slot.capacity > shard ? (slot.capacity - shard - 1) / shards + 1 : 0;
      slot.first_row = g.rows_per_layer_;
      g.rows_per_layer_ += slot.local_capacity;
      g.slots_.push_back(slot);
    }
  }
  return g;
}

int64_t KvCacheGeometry::ElementsPerSequence() const {
  return config_.num_layers * 2 * rows_per_layer_ * config_.head_dim();
}

int64_t KvCacheGeometry::RowOf(const Slot& slot, int64_t t) const {
  const int64_t w = config_.segment_lengths[static_cast<size_t>(slot.pattern)];
  const int64_t r = config_.dilation_rates[static_cast<size_t>(slot.pattern)];
  const int64_t pos = t % w;  // Position inside t's segment.
  if (pos < slot.offset || (pos - slot.offset) % r != 0) return -1;
  return (pos - slot.offset) / r;
}

absl::Status CheckDecodeTokens(const char* decoder, const char* call, const int32_t* tokens,
                               int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(decoder, " ", call, ": token ", tokens[i],
                                                     " at position ", i, " is outside [0, ", vocab,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPrefillArgs(const char* decoder, bool ours, int64_t held, const int32_t* tokens,
                              int64_t n, int64_t max_context, int64_t vocab) {
  if (!ours) {
    return absl::InvalidArgumentError(
        absl::StrCat(decoder, " Prefill: the state was not made by this decoder"));
  }
  if (held != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(decoder, " Prefill: the state already holds ", held,
                     " tokens (prefill starts a sequence; use Step to extend one)"));
  }
  if (n < 1 || tokens == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(decoder, " Prefill: the prompt has ", n, " tokens (needs at least 1)"));
  }
  if (n > max_context) {
    return absl::OutOfRangeError(absl::StrCat(decoder, " Prefill: the prompt's ", n,
                                              " tokens pass the decoder's max_context of ",
                                              max_context));
  }
  return CheckDecodeTokens(decoder, "Prefill", tokens, n, vocab);
}

absl::Status CheckScoreArgs(const char* decoder, const int32_t* tokens, int64_t n,
                            const double* logprobs, int64_t max_context, int64_t vocab) {
  if (n < 2 || tokens == nullptr || logprobs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        decoder, " Score: ", n, " tokens given; scoring needs at least 2 (the first is context)"));
  }
  if (n > max_context) {
    return absl::OutOfRangeError(absl::StrCat(
        decoder, " Score: the ", n, " tokens pass the decoder's max_context of ", max_context));
  }
  return CheckDecodeTokens(decoder, "Score", tokens, n, vocab);
}

absl::Status CheckStepSequence(const char* decoder, int64_t j, bool ours, bool repeated,
                               int64_t position, int64_t max_context, int32_t token,
                               int64_t vocab) {
  if (!ours) {
    return absl::InvalidArgumentError(
        absl::StrCat(decoder, " Step: state ", j, " was not made by this decoder"));
  }
  if (repeated) {
    return absl::InvalidArgumentError(
        absl::StrCat(decoder, " Step: state ", j, " is passed twice (one token a sequence)"));
  }
  if (position >= max_context) {
    return absl::OutOfRangeError(absl::StrCat(decoder, " Step: sequence ", j, " holds ", position,
                                              " tokens, the decoder's max_context"
                                              " (no room for another)"));
  }
  if (token < 0 || token >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(decoder, " Step: token ", token, " of sequence ",
                                                   j, " is outside [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::unique_ptr<Decoder<T>>> Decoder<T>::Create(LongNetLM<T>* model,
                                                               int64_t max_context,
                                                               comm::Communicator* ring) {
  if (model == nullptr) return absl::InvalidArgumentError("decoder: the model is null");
  if (ring != nullptr && ring->size() == 1) ring = nullptr;  // One device.
  if (ring != nullptr) {
    if (ring->device() != Device::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decoder: the ring's communicator (", ring->name(),
          ") is not on host memory; the decoder's cache and transfers are (use Gloo)"));
    }
    if (max_context % ring->size() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("decoder max_context ", max_context, " must be a multiple of the ring's ",
                       ring->size(), " ranks (a prompt is split evenly over them)"));
    }
  }
  absl::StatusOr<KvCacheGeometry> geometry =
      KvCacheGeometry::Make(model->config(), max_context, ring == nullptr ? 1 : ring->size(),
                            ring == nullptr ? 0 : ring->rank());
  if (!geometry.ok()) return geometry.status();
  absl::StatusOr<RotaryPlan> rotary = RotaryPlan::Make(model->config(), max_context);
  if (!rotary.ok()) return rotary.status();
  std::unique_ptr<DecoderCallWire> wire;
  if (ring != nullptr) {
    absl::StatusOr<std::unique_ptr<DecoderCallWire>> made = NewHostCallWire(ring);
    if (!made.ok()) return made.status();
    wire = *std::move(made);
  }
  return std::unique_ptr<Decoder<T>>(
      new Decoder<T>(model, *std::move(geometry), *std::move(rotary), ring, std::move(wire)));
}

template <typename T>
Decoder<T>::Decoder(LongNetLM<T>* model, KvCacheGeometry geometry, RotaryPlan rotary,
                    comm::Communicator* ring, std::unique_ptr<DecoderCallWire> wire)
    : model_(model),
      ring_(ring),
      shards_(ring == nullptr ? 1 : ring->size()),
      partial_width_(model->config().head_dim() + 2),
      geometry_(std::move(geometry)),
      spec_(model->config().attention_spec()),
      rotary_(std::move(rotary)),
      calls_(std::move(wire), ring == nullptr ? 0 : ring->rank(), "decoder") {
  const int64_t heads = model->config().num_heads;
  slot_of_.assign(static_cast<size_t>(spec_.num_patterns() * heads), -1);
  for (size_t s = 0; s < geometry_.slots().size(); ++s) {
    const KvCacheGeometry::Slot& slot = geometry_.slots()[s];
    slot_of_[static_cast<size_t>(slot.pattern * heads + slot.head)] = static_cast<int64_t>(s);
  }
}

template <typename T>
absl::StatusOr<DecodeState<T>> Decoder<T>::NewState() const {
  const int64_t half = geometry_.ElementsPerSequence() / 2;
  DecodeState<T> state;
  state.owner_ = this;
  try {
    state.k_.assign(static_cast<size_t>(half), T(0));
    state.v_.assign(static_cast<size_t>(half), T(0));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("decoder: cannot allocate a sequence's cache of ",
                     2 * half * static_cast<int64_t>(sizeof(T)), " bytes"));
  }
  state.id_ = calls_.NewStateId();
  state.dropped_ = calls_.dropped();
  return state;
}

template <typename T>
void Decoder<T>::Append(DecodeState<T>& state, int64_t layer, int64_t t, const T* k,
                        const T* v) const {
  const int64_t dh = config().head_dim();
  const int64_t layer_row = layer * geometry_.rows_per_layer();
  for (const KvCacheGeometry::Slot& slot : geometry_.slots()) {
    const int64_t row = geometry_.RowOf(slot, t);
    if (row < 0 || row % shards_ != geometry_.shard()) continue;
    const size_t at = static_cast<size_t>((layer_row + slot.first_row + row / shards_) * dh);
    std::memcpy(state.k_.data() + at, k + slot.head * dh, static_cast<size_t>(dh) * sizeof(T));
    std::memcpy(state.v_.data() + at, v + slot.head * dh, static_cast<size_t>(dh) * sizeof(T));
  }
}

template <typename T>
void Decoder<T>::AttendPartial(const DecodeState<T>& state, int64_t layer, int64_t t, const T* q,
                               double* partial) const {
  const int64_t dh = config().head_dim();
  const double scale = spec_.ScaleFor(dh);
  const int64_t layer_row = layer * geometry_.rows_per_layer();
  const int64_t shard = geometry_.shard();
  std::vector<double> scores;
  for (size_t s = 0; s < geometry_.slots().size(); ++s) {
    const KvCacheGeometry::Slot& slot = geometry_.slots()[s];
    double* out = partial + static_cast<int64_t>(s) * partial_width_;
    out[0] = -std::numeric_limits<double>::infinity();  // Maximum score.
    out[1] = 0;                                         // Sum of exponentials.
    std::fill(out + 2, out + partial_width_, 0.0);      // Unnormalized output.
    const int64_t last = geometry_.RowOf(slot, t);
    // This shard's rows among the slot's rows [0, last]: j = shard, shard + S, ...
    const int64_t rows = last >= shard ? (last - shard) / shards_ + 1 : 0;
    if (rows == 0) continue;
    const T* qh = q + slot.head * dh;
    const T* keys = state.k_.data() + (layer_row + slot.first_row) * dh;
    const T* values = state.v_.data() + (layer_row + slot.first_row) * dh;
    scores.resize(static_cast<size_t>(rows));
    double max_score = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < rows; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < dh; ++c) {
        dot += static_cast<double>(qh[c]) * static_cast<double>(keys[j * dh + c]);
      }
      scores[static_cast<size_t>(j)] = scale * dot;
      max_score = std::max(max_score, scale * dot);
    }
    double sum = 0;
    for (int64_t j = 0; j < rows; ++j) {
      const double e = std::exp(scores[static_cast<size_t>(j)] - max_score);
      sum += e;
      for (int64_t c = 0; c < dh; ++c) out[2 + c] += e * static_cast<double>(values[j * dh + c]);
    }
    out[0] = max_score;
    out[1] = sum;
  }
}

template <typename T>
void Decoder<T>::MergePartials(const double* partials, int64_t shard_stride, T* out) const {
  const LongNetConfig& c = config();
  const int64_t dh = c.head_dim(), heads = c.num_heads;
  const int g = spec_.num_patterns();
  std::vector<double> acc(static_cast<size_t>(dh)), total(static_cast<size_t>(dh));
  for (int64_t h = 0; h < heads; ++h) {
    // Each pattern that selects t for h: its output row (acc) and log-sum-exp, merged into
    // total with the running maximum L of the log-sum-exps (ENGINE.md's mixture rule; grouped
    // mode has one pattern per head and divides by G instead).
    double big_l = -std::numeric_limits<double>::infinity(), weight_sum = 0;
    std::fill(total.begin(), total.end(), 0.0);
    for (int i = 0; i < g; ++i) {
      const int64_t s = slot_of_[static_cast<size_t>(i * heads + h)];
      if (s < 0) continue;
      // The shards' partials of the slot, merged in shard order to the largest maximum.
      double max_score = -std::numeric_limits<double>::infinity();
      for (int r = 0; r < shards_; ++r) {
        max_score = std::max(max_score, partials[r * shard_stride + s * partial_width_]);
      }
      if (std::isinf(max_score)) continue;  // The pattern does not select t for h.
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int r = 0; r < shards_; ++r) {
        const double* p = partials + r * shard_stride + s * partial_width_;
        if (std::isinf(p[0])) continue;  // This shard holds none of the rows.
        const double factor = std::exp(p[0] - max_score);
        sum += factor * p[1];
        for (int64_t c2 = 0; c2 < dh; ++c2) acc[static_cast<size_t>(c2)] += factor * p[2 + c2];
      }
      for (double& a : acc) a /= sum;
      if (spec_.mode == AttentionMode::kGrouped) {
        for (int64_t c2 = 0; c2 < dh; ++c2) total[static_cast<size_t>(c2)] = acc[c2] / g;
        weight_sum = 1;
        continue;
      }
      const double lse = max_score + std::log(sum);
      // Rescale what is merged so far to the new maximum.
      const double new_l = std::max(big_l, lse);
      const double old_factor = std::isinf(big_l) ? 0.0 : std::exp(big_l - new_l);
      const double factor = std::exp(lse - new_l);
      for (int64_t c2 = 0; c2 < dh; ++c2) {
        total[static_cast<size_t>(c2)] =
            total[static_cast<size_t>(c2)] * old_factor + factor * acc[static_cast<size_t>(c2)];
      }
      weight_sum = weight_sum * old_factor + factor;
      big_l = new_l;
    }
    for (int64_t c2 = 0; c2 < dh; ++c2) {
      out[h * dh + c2] =
          weight_sum > 0 ? static_cast<T>(total[static_cast<size_t>(c2)] / weight_sum) : T(0);
    }
  }
}

template <typename T>
absl::Status Decoder<T>::ShareLayerRows(int64_t layer, int64_t n, int64_t shard_len, const T* k,
                                        const T* v, DecodeState<T>& state) {
  const LongNetConfig& c = config();
  const int64_t dh = c.head_dim(), d = c.d_model;
  const int me = geometry_.shard();
  const int64_t my_begin = me * shard_len;
  LayerOps<T>& ops = model_->ops();
  T* cache_k = state.k_.data() + layer * geometry_.rows_per_layer() * dh;
  T* cache_v = state.v_.data() + layer * geometry_.rows_per_layer() * dh;
  // The rows a later token can still attend to: the selected rows of the prompt's last segment of
  // every slot's pattern. Every rank enumerates them in the same order, so the rows rank a sends
  // rank b are the rows b expects from a, in order. send[r]: k then v of each row this rank
  // computed for rank r; expect[r]: the cache rows here that rank r's rows fill.
  std::vector<std::vector<T>> send(static_cast<size_t>(shards_));
  std::vector<std::vector<int64_t>> expect(static_cast<size_t>(shards_));
  for (const KvCacheGeometry::Slot& slot : geometry_.slots()) {
    const int64_t w = c.segment_lengths[static_cast<size_t>(slot.pattern)];
    const int64_t r = c.dilation_rates[static_cast<size_t>(slot.pattern)];
    const int64_t start = (n - 1) / w * w;
    for (int64_t p = start + slot.offset, row = 0; p < n; p += r, ++row) {
      const int computer = static_cast<int>(p / shard_len);
      const int owner = static_cast<int>(row % shards_);
      const int64_t local = slot.first_row + row / shards_;  // Its row on the owner.
      if (computer == me) {
        const int64_t from = (p - my_begin) * d + slot.head * dh;
        if (owner == me) {
          DECODER_RETURN_IF_ERROR(ops.CopyToHost(k + from, dh, cache_k + local * dh));
          DECODER_RETURN_IF_ERROR(ops.CopyToHost(v + from, dh, cache_v + local * dh));
          continue;
        }
        std::vector<T>& out = send[static_cast<size_t>(owner)];
        out.resize(out.size() + static_cast<size_t>(2 * dh));
        DECODER_RETURN_IF_ERROR(ops.CopyToHost(k + from, dh, out.data() + out.size() - 2 * dh));
        DECODER_RETURN_IF_ERROR(ops.CopyToHost(v + from, dh, out.data() + out.size() - dh));
      } else if (owner == me) {
        expect[static_cast<size_t>(computer)].push_back(local);
      }
    }
  }
  if (ring_ == nullptr) return absl::OkStatus();
  const DType dtype = kStateDType<T>;
  std::vector<std::vector<T>> received(static_cast<size_t>(shards_));
  std::vector<comm::P2POp> transfers;
  for (int peer = 0; peer < shards_; ++peer) {
    const auto at = static_cast<size_t>(peer);
    if (peer == me) continue;
    if (!send[at].empty()) {
      transfers.push_back(
          comm::P2POp::Send(peer, send[at].data(), static_cast<int64_t>(send[at].size()), dtype));
    }
    if (!expect[at].empty()) {
      received[at].resize(expect[at].size() * static_cast<size_t>(2 * dh));
      transfers.push_back(comm::P2POp::Recv(peer, received[at].data(),
                                            static_cast<int64_t>(received[at].size()), dtype));
    }
  }
  if (transfers.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<comm::Work>> work = ring_->StartGroup(transfers, comm::Stream{});
  if (!work.ok()) return work.status();
  DECODER_RETURN_IF_ERROR((*work)->Wait(comm::Stream{}));
  for (int peer = 0; peer < shards_; ++peer) {
    const auto at = static_cast<size_t>(peer);
    for (size_t q = 0; q < expect[at].size(); ++q) {
      const T* row = received[at].data() + q * static_cast<size_t>(2 * dh);
      const int64_t local = expect[at][q];
      std::memcpy(cache_k + local * dh, row, static_cast<size_t>(dh) * sizeof(T));
      std::memcpy(cache_v + local * dh, row + dh, static_cast<size_t>(dh) * sizeof(T));
    }
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Decoder<T>::CheckPrefill(const int32_t* tokens, int64_t n,
                                      const DecodeState<T>* state) const {
  // The tokens are checked whole before anything runs: on a ring a rank refusing only its own
  // shard would leave the others waiting.
  return CheckPrefillArgs("decoder", state != nullptr && state->owner_ == this,
                          state != nullptr ? state->position_ : 0, tokens, n,
                          geometry_.max_context(), config().vocab_size);
}

template <typename T>
typename Decoder<T>::Shard Decoder<T>::ShardOf(int64_t n) const {
  Shard shard;
  shard.len = (n + shards_ - 1) / shards_;
  shard.begin = geometry_.shard() * shard.len;
  return shard;
}

template <typename T>
absl::Status Decoder<T>::ShardForward(const int32_t* tokens, int64_t n, const Shard& shard,
                                      int64_t total) {
  // Padding is token 0, after the tokens, so it changes none of their rows.
  std::vector<int32_t> mine(static_cast<size_t>(shard.len), 0);
  if (shard.begin < n) {
    std::copy(tokens + shard.begin, tokens + std::min(n, shard.begin + shard.len), mine.begin());
  }
  TokenBatch batch;
  batch.tokens = mine.data();
  batch.batch = 1;
  batch.seq_len = shard.len;
  batch.positions = {shard.begin, total};
  return model_->Forward(batch).status();
}

template <typename T>
absl::Status Decoder<T>::Prefill(const int32_t* tokens, int64_t n, DecodeState<T>* state,
                                 T* logits) {
  DECODER_RETURN_IF_ERROR(CheckPrefill(tokens, n, state));
  DECODER_RETURN_IF_ERROR(calls_.SendIfLeading(PrefillCall(state->id_, tokens, n)));
  return RunPrefill(tokens, n, state, logits);
}

template <typename T>
absl::Status Decoder<T>::RunPrefill(const int32_t* tokens, int64_t n, DecodeState<T>* state,
                                    T* logits) {
  const Shard shard = ShardOf(n);
  model_->set_kv_observer([&](int64_t layer, const T* k, const T* v) -> absl::Status {
    return ShareLayerRows(layer, n, shard.len, k, v, *state);
  });
  // The prompt as the first positions of a max_context-long sequence (rotary's plan).
  absl::Status forward = ShardForward(tokens, n, shard, geometry_.max_context());
  model_->set_kv_observer(nullptr);
  if (!forward.ok()) return forward;
  const int64_t begin = shard.begin;
  // The logits of position n - 1, from the rank that computed it.
  const int holder = static_cast<int>((n - 1) / shard.len);
  const int64_t vocab = config().vocab_size;
  LayerOps<T>& ops = model_->ops();
  if (ring_ == nullptr) {
    DECODER_RETURN_IF_ERROR(ops.CopyToHost(model_->logits() + (n - 1) * vocab, vocab, logits));
  } else {
    std::vector<T> mine(static_cast<size_t>(vocab), T(0));
    if (holder == geometry_.shard()) {
      DECODER_RETURN_IF_ERROR(
          ops.CopyToHost(model_->logits() + (n - 1 - begin) * vocab, vocab, mine.data()));
    }
    std::vector<T> all(static_cast<size_t>(shards_ * vocab));
    DECODER_RETURN_IF_ERROR(
        ring_->AllGather(mine.data(), all.data(), vocab, kStateDType<T>, comm::Stream{}));
    std::copy(all.begin() + holder * vocab, all.begin() + (holder + 1) * vocab, logits);
  }
  state->position_ = n;
  return absl::OkStatus();
}

template <typename T>
absl::Status Decoder<T>::CheckScore(const int32_t* tokens, int64_t n,
                                    const double* logprobs) const {
  return CheckScoreArgs("decoder", tokens, n, logprobs, geometry_.max_context(),
                        config().vocab_size);
}

template <typename T>
absl::Status Decoder<T>::Score(const int32_t* tokens, int64_t n, double* logprobs) {
  DECODER_RETURN_IF_ERROR(CheckScore(tokens, n, logprobs));
  DECODER_RETURN_IF_ERROR(calls_.SendIfLeading(ScoreCall(tokens, n)));
  return RunScore(tokens, n, logprobs);
}

template <typename T>
absl::Status Decoder<T>::RunScore(const int32_t* tokens, int64_t n, double* logprobs) {
  // The plain forward pass over the n tokens (rotary planned for n, or for the padded length the
  // ring splits evenly).
  const Shard shard = ShardOf(n);
  DECODER_RETURN_IF_ERROR(ShardForward(tokens, n, shard, shard.len * shards_));
  const int64_t begin = shard.begin, shard_len = shard.len;
  const int64_t vocab = config().vocab_size;
  std::vector<T> logits(static_cast<size_t>(shard_len * vocab));
  DECODER_RETURN_IF_ERROR(
      model_->ops().CopyToHost(model_->logits(), shard_len * vocab, logits.data()));
  // log p(tokens[g + 1] | ...) for this rank's positions g < n - 1; rank-major order is position
  // order, so the all-gather lays them out as they are returned.
  std::vector<double> mine(static_cast<size_t>(shard_len), 0.0);
  for (int64_t i = 0; i < shard_len && begin + i + 1 < n; ++i) {
    const T* row = logits.data() + i * vocab;
    double max_z = row[0];
    for (int64_t k = 1; k < vocab; ++k) max_z = std::max<double>(max_z, row[k]);
    double z = 0;
    for (int64_t k = 0; k < vocab; ++k) z += std::exp(static_cast<double>(row[k]) - max_z);
    mine[static_cast<size_t>(i)] =
        static_cast<double>(row[tokens[begin + i + 1]]) - max_z - std::log(z);
  }
  if (ring_ == nullptr) {
    std::copy(mine.begin(), mine.begin() + (n - 1), logprobs);
    return absl::OkStatus();
  }
  std::vector<double> all(static_cast<size_t>(shards_ * shard_len));
  DECODER_RETURN_IF_ERROR(
      ring_->AllGather(mine.data(), all.data(), shard_len, DType::kFloat64, comm::Stream{}));
  std::copy(all.begin(), all.begin() + (n - 1), logprobs);
  return absl::OkStatus();
}

template <typename T>
absl::Status Decoder<T>::ExchangePartials(int64_t count) {
  // Every rank sends its partials to every other one at once: one hop of S - 1 concurrent
  // transfers each way, where a ring all-gather takes S - 1 hops one after the other (a decoding
  // step is latency-bound: one exchange a layer). Each rank's lands at its rank's place.
  const int me = geometry_.shard();
  std::copy(partials_.begin(), partials_.begin() + count, gathered_.begin() + me * count);
  std::vector<comm::P2POp> transfers;
  for (int peer = 0; peer < shards_; ++peer) {
    if (peer == me) continue;
    transfers.push_back(comm::P2POp::Send(peer, partials_.data(), count, DType::kFloat64));
    transfers.push_back(
        comm::P2POp::Recv(peer, gathered_.data() + peer * count, count, DType::kFloat64));
  }
  absl::StatusOr<std::unique_ptr<comm::Work>> work = ring_->StartGroup(transfers, comm::Stream{});
  if (!work.ok()) return work.status();
  return (*work)->Wait(comm::Stream{});
}

template <typename T>
absl::Status Decoder<T>::Lead() {
  return calls_.Lead();
}

template <typename T>
absl::Status Decoder<T>::KeepAlive(absl::Duration interval) {
  return calls_.KeepAlive(interval);
}

template <typename T>
absl::Status Decoder<T>::Release() {
  return calls_.Release();
}

template <typename T>
absl::Status Decoder<T>::Follow() {
  return calls_.Follow(*this);
}

template <typename T>
absl::Status Decoder<T>::EnsureStepBuffers(int64_t rows) {
  if (rows <= step_rows_) return absl::OkStatus();
  const LongNetConfig& c = config();
  const int64_t d = c.d_model, f = c.ffn_dim;
  std::vector<DeviceArray<T>> arrays;
  std::vector<T*> pointers;
  // Widths of the buffers in the order they are handed out below.
  const int64_t widths[] = {d, 1, 1, d, d, d, d, d, 1, 1, d, d,           1,
                            1, f, f, f, 1, 1, d, d, d, 1, 1, c.vocab_size};
  for (int64_t width : widths) {
    absl::StatusOr<DeviceArray<T>> a = model_->ops().Allocate(rows * width);
    if (!a.ok()) return a.status();
    pointers.push_back(a->data());
    arrays.push_back(*std::move(a));
  }
  size_t k = 0;
  BlockTensors<T> t;
  for (T** field : {&t.ln1, &t.ln1_mean, &t.ln1_rstd, &t.q, &t.k, &t.v, &t.attn, &t.sub1,
                    &t.sub1_mean, &t.sub1_rstd, &t.x_mid, &t.ln2, &t.ln2_mean, &t.ln2_rstd, &t.h1,
                    &t.g, &t.sub2, &t.sub2_mean, &t.sub2_rstd}) {
    *field = pointers[k++];
  }
  x_ = pointers[k++];
  x_next_ = pointers[k++];
  xf_ = pointers[k++];
  xf_mean_ = pointers[k++];
  xf_rstd_ = pointers[k++];
  logits_ = pointers[k++];
  step_ = t;
  step_arrays_ = std::move(arrays);
  step_rows_ = rows;
  host_q_.resize(static_cast<size_t>(rows * d));
  host_k_.resize(static_cast<size_t>(rows * d));
  host_v_.resize(static_cast<size_t>(rows * d));
  host_attn_.resize(static_cast<size_t>(rows * d));
  return absl::OkStatus();
}

template <typename T>
absl::Status Decoder<T>::Step(absl::Span<DecodeState<T>* const> states, const int32_t* tokens,
                              T* logits) {
  if (states.empty()) return absl::OkStatus();
  if (tokens == nullptr || logits == nullptr) {
    return absl::InvalidArgumentError("decoder Step: tokens and logits must be given");
  }
  DECODER_RETURN_IF_ERROR(CheckStep(states, tokens));
  if (calls_.leading()) {
    std::vector<int64_t> ids;
    for (const DecodeState<T>* s : states) ids.push_back(s->id_);
    DECODER_RETURN_IF_ERROR(calls_.SendIfLeading(StepCall(ids, tokens)));
  }
  return RunStep(states, tokens, logits);
}

template <typename T>
absl::Status Decoder<T>::CheckStep(absl::Span<DecodeState<T>* const> states,
                                   const int32_t* tokens) const {
  absl::flat_hash_set<const DecodeState<T>*> seen;
  for (size_t j = 0; j < states.size(); ++j) {
    const DecodeState<T>* s = states[j];
    const bool ours = s != nullptr && s->owner_ == this;
    DECODER_RETURN_IF_ERROR(CheckStepSequence(
        "decoder", static_cast<int64_t>(j), ours, ours && !seen.insert(s).second,
        ours ? s->position_ : 0, geometry_.max_context(), tokens[j], config().vocab_size));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Decoder<T>::RunStep(absl::Span<DecodeState<T>* const> states, const int32_t* tokens,
                                 T* logits) {
  const LongNetConfig& c = config();
  const int64_t rows = static_cast<int64_t>(states.size());
  DECODER_RETURN_IF_ERROR(EnsureStepBuffers(rows));
  const int64_t sequence_width = static_cast<int64_t>(geometry_.slots().size()) * partial_width_;
  partials_.resize(static_cast<size_t>(rows * sequence_width));
  if (ring_ != nullptr) gathered_.resize(static_cast<size_t>(shards_ * rows * sequence_width));
  LayerOps<T>& ops = model_->ops();
  const T* p = model_->params();
  const ModelOffsets& offsets = model_->offsets();
  const int64_t d = c.d_model;
  DECODER_RETURN_IF_ERROR(ops.EmbeddingForward(tokens, rows, p + offsets.token_embedding, d, x_));
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const BlockOffsets& o = offsets.blocks[static_cast<size_t>(layer)];
    DECODER_RETURN_IF_ERROR(BlockQkvForward(ops, c, p, o, rows, x_, step_));
    for (int64_t j = 0; j < rows; ++j) {
      DECODER_RETURN_IF_ERROR(ops.RotaryForward(rotary_, 1, 1, c.num_heads,
                                                states[static_cast<size_t>(j)]->position_,
                                                step_.q + j * d, step_.k + j * d));
    }
    DECODER_RETURN_IF_ERROR(ops.CopyToHost(step_.q, rows * d, host_q_.data()));
    DECODER_RETURN_IF_ERROR(ops.CopyToHost(step_.k, rows * d, host_k_.data()));
    DECODER_RETURN_IF_ERROR(ops.CopyToHost(step_.v, rows * d, host_v_.data()));
    for (int64_t j = 0; j < rows; ++j) {
      DecodeState<T>& s = *states[static_cast<size_t>(j)];
      Append(s, layer, s.position_, host_k_.data() + j * d, host_v_.data() + j * d);
      AttendPartial(s, layer, s.position_, host_q_.data() + j * d,
                    partials_.data() + j * sequence_width);
    }
    // partials of sequence j, shard r: at r * shard_stride + j * sequence_width.
    const double* all = partials_.data();
    int64_t shard_stride = 0;
    if (ring_ != nullptr) {
      DECODER_RETURN_IF_ERROR(ExchangePartials(rows * sequence_width));
      all = gathered_.data();
      shard_stride = rows * sequence_width;
    }
    for (int64_t j = 0; j < rows; ++j) {
      MergePartials(all + j * sequence_width, shard_stride, host_attn_.data() + j * d);
    }
    DECODER_RETURN_IF_ERROR(ops.CopyFromHost(host_attn_.data(), rows * d, step_.attn));
    DECODER_RETURN_IF_ERROR(BlockOutputForward(ops, c, p, o, rows, x_, step_, x_next_));
    std::swap(x_, x_next_);
  }
  DECODER_RETURN_IF_ERROR(ops.LayerNormForward(x_, rows, d, p + offsets.final_norm.weight,
                                               p + offsets.final_norm.bias, c.layer_norm_eps, xf_,
                                               xf_mean_, xf_rstd_));
  const T* head = p + (c.tie_embeddings ? offsets.token_embedding : offsets.lm_head);
  DECODER_RETURN_IF_ERROR(ops.LinearForward(xf_, rows, d, head, nullptr, c.vocab_size, logits_));
  DECODER_RETURN_IF_ERROR(ops.CopyToHost(logits_, rows * c.vocab_size, logits));
  for (DecodeState<T>* s : states) ++s->position_;
  return absl::OkStatus();
}

#undef DECODER_RETURN_IF_ERROR

template class Decoder<float>;
template class Decoder<double>;

}  // namespace model
}  // namespace dattn
