#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
  return std::unique_ptr<Decoder<T>>(
      new Decoder<T>(model, *std::move(geometry), *std::move(rotary), ring));
}

template <typename T>
Decoder<T>::Decoder(LongNetLM<T>* model, KvCacheGeometry geometry, RotaryPlan rotary,
                    comm::Communicator* ring)
    : model_(model),
      ring_(ring),
      shards_(ring == nullptr ? 1 : ring->size()),
      partial_width_(model->config().head_dim() + 2),
      geometry_(std::move(geometry)),
      spec_(model->config().attention_spec()),
      rotary_(std::move(rotary)) {
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
  const DType dtype = sizeof(T) == sizeof(double) ? DType::kFloat64 : DType::kFloat32;
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
absl::Status Decoder<T>::Prefill(const int32_t* tokens, int64_t n, DecodeState<T>* state,
                                 T* logits) {
  if (state == nullptr || state->owner_ != this) {
    return absl::InvalidArgumentError("decoder Prefill: the state was not made by this decoder");
  }
  if (state->position_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("decoder Prefill: the state already holds ", state->position_,
                     " tokens (prefill starts a sequence; use Step to extend one)"));
  }
  if (n < 1 || tokens == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder Prefill: the prompt has ", n, " tokens (needs at least 1)"));
  }
  if (n > geometry_.max_context()) {
    return absl::OutOfRangeError(absl::StrCat("decoder Prefill: the prompt's ", n,
                                              " tokens pass the decoder's max_context of ",
                                              geometry_.max_context()));
  }
  const LongNetConfig& c = config();
  // Checked whole before anything runs: on a ring a rank refusing only its own shard would leave
  // the others waiting.
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("decoder Prefill: token ", tokens[i],
                                                     " at position ", i, " is outside [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  // This rank's positions [begin, begin + shard_len) of the prompt padded to a multiple of the
  // ring's size (padding: token 0, after the prompt, so it changes none of the prompt's rows).
  const int64_t shard_len = (n + shards_ - 1) / shards_;
  const int64_t begin = geometry_.shard() * shard_len;
  std::vector<int32_t> shard(static_cast<size_t>(shard_len), 0);
  if (begin < n) {
    std::copy(tokens + begin, tokens + std::min(n, begin + shard_len), shard.begin());
  }
  model_->set_kv_observer([&](int64_t layer, const T* k, const T* v) -> absl::Status {
    return ShareLayerRows(layer, n, shard_len, k, v, *state);
  });
  TokenBatch batch;
  batch.tokens = shard.data();
  batch.batch = 1;
  batch.seq_len = shard_len;
  batch.positions = {begin, geometry_.max_context()};
  absl::StatusOr<LossResult> forward = model_->Forward(batch);
  model_->set_kv_observer(nullptr);
  if (!forward.ok()) return forward.status();
  // The logits of position n - 1, from the rank that computed it.
  const int holder = static_cast<int>((n - 1) / shard_len);
  const int64_t vocab = c.vocab_size;
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
    DECODER_RETURN_IF_ERROR(ring_->AllGather(
        mine.data(), all.data(), vocab,
        sizeof(T) == sizeof(double) ? DType::kFloat64 : DType::kFloat32, comm::Stream{}));
    std::copy(all.begin() + holder * vocab, all.begin() + (holder + 1) * vocab, logits);
  }
  state->position_ = n;
  return absl::OkStatus();
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
  const LongNetConfig& c = config();
  const int64_t rows = static_cast<int64_t>(states.size());
  if (rows == 0) return absl::OkStatus();
  if (tokens == nullptr || logits == nullptr) {
    return absl::InvalidArgumentError("decoder Step: tokens and logits must be given");
  }
  absl::flat_hash_set<const DecodeState<T>*> seen;
  for (int64_t j = 0; j < rows; ++j) {
    const DecodeState<T>* s = states[static_cast<size_t>(j)];
    if (s == nullptr || s->owner_ != this) {
      return absl::InvalidArgumentError(
          absl::StrCat("decoder Step: state ", j, " was not made by this decoder"));
    }
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("decoder Step: state ", j, " is passed twice (one token a sequence)"));
    }
    if (s->position_ >= geometry_.max_context()) {
      return absl::OutOfRangeError(absl::StrCat("decoder Step: sequence ", j, " holds ",
                                                s->position_,
                                                " tokens, the decoder's max_context"
                                                " (no room for another)"));
    }
    if (tokens[j] < 0 || tokens[j] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("decoder Step: token ", tokens[j],
                                                     " of sequence ", j, " is outside [0, ",
                                                     c.vocab_size, ")"));
    }
  }
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
      DECODER_RETURN_IF_ERROR(ring_->AllGather(partials_.data(), gathered_.data(),
                                               rows * sequence_width, DType::kFloat64,
                                               comm::Stream{}));
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
