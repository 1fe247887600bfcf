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
                                                      int64_t max_context) {
  DECODER_RETURN_IF_ERROR(ValidateConfig(config));
  if (max_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder max_context ", max_context, " must be >= 1"));
  }
  KvCacheGeometry g;
  g.config_ = config;
  g.max_context_ = max_context;
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
      slot.first_row = g.rows_per_layer_;
      g.rows_per_layer_ += slot.capacity;
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
                                                               int64_t max_context) {
  if (model == nullptr) return absl::InvalidArgumentError("decoder: the model is null");
  absl::StatusOr<KvCacheGeometry> geometry = KvCacheGeometry::Make(model->config(), max_context);
  if (!geometry.ok()) return geometry.status();
  absl::StatusOr<RotaryPlan> rotary = RotaryPlan::Make(model->config(), max_context);
  if (!rotary.ok()) return rotary.status();
  return std::unique_ptr<Decoder<T>>(
      new Decoder<T>(model, *std::move(geometry), *std::move(rotary)));
}

template <typename T>
Decoder<T>::Decoder(LongNetLM<T>* model, KvCacheGeometry geometry, RotaryPlan rotary)
    : model_(model),
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
    if (row < 0) continue;
    const size_t at = static_cast<size_t>((layer_row + slot.first_row + row) * dh);
    std::memcpy(state.k_.data() + at, k + slot.head * dh, static_cast<size_t>(dh) * sizeof(T));
    std::memcpy(state.v_.data() + at, v + slot.head * dh, static_cast<size_t>(dh) * sizeof(T));
  }
}

template <typename T>
void Decoder<T>::Attend(const DecodeState<T>& state, int64_t layer, int64_t t, const T* q,
                        T* out) const {
  const LongNetConfig& c = config();
  const int64_t dh = c.head_dim(), heads = c.num_heads;
  const int g = spec_.num_patterns();
  const double scale = spec_.ScaleFor(dh);
  const int64_t layer_row = layer * geometry_.rows_per_layer();
  std::vector<double> acc(static_cast<size_t>(dh)), total(static_cast<size_t>(dh));
  std::vector<double> scores;
  for (int64_t h = 0; h < heads; ++h) {
    const T* qh = q + h * dh;
    // Each pattern that selects t for h: its output row (acc) and log-sum-exp, merged into
    // total with the running maximum L of the log-sum-exps (ENGINE.md's mixture rule; grouped
    // mode has one pattern per head and divides by G instead).
    double big_l = -std::numeric_limits<double>::infinity(), weight_sum = 0;
    std::fill(total.begin(), total.end(), 0.0);
    for (int i = 0; i < g; ++i) {
      const int64_t s = slot_of_[static_cast<size_t>(i * heads + h)];
      if (s < 0) continue;
      const KvCacheGeometry::Slot& slot = geometry_.slots()[static_cast<size_t>(s)];
      const int64_t last = geometry_.RowOf(slot, t);
      if (last < 0) continue;
      const int64_t rows = last + 1;
      const T* keys = state.k_.data() + (layer_row + slot.first_row) * dh;
      const T* values = state.v_.data() + (layer_row + slot.first_row) * dh;
      scores.resize(static_cast<size_t>(rows));
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < rows; ++j) {
        double dot = 0;
        for (int64_t c2 = 0; c2 < dh; ++c2) {
          dot += static_cast<double>(qh[c2]) * static_cast<double>(keys[j * dh + c2]);
        }
        scores[static_cast<size_t>(j)] = scale * dot;
        max_score = std::max(max_score, scale * dot);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < rows; ++j) {
        const double e = std::exp(scores[static_cast<size_t>(j)] - max_score);
        sum += e;
        for (int64_t c2 = 0; c2 < dh; ++c2) {
          acc[static_cast<size_t>(c2)] += e * static_cast<double>(values[j * dh + c2]);
        }
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
  const int64_t dh = c.head_dim(), d = c.d_model;
  LayerOps<T>& ops = model_->ops();
  // Each block's k and v: the selected rows of the prompt's last segment of every slot's
  // pattern, which are the rows a later token can still attend to.
  model_->set_kv_observer([&](int64_t layer, const T* k, const T* v) -> absl::Status {
    const int64_t layer_row = layer * geometry_.rows_per_layer();
    for (const KvCacheGeometry::Slot& slot : geometry_.slots()) {
      const int64_t w = c.segment_lengths[static_cast<size_t>(slot.pattern)];
      const int64_t r = c.dilation_rates[static_cast<size_t>(slot.pattern)];
      const int64_t start = (n - 1) / w * w;
      for (int64_t p = start + slot.offset, row = 0; p < n; p += r, ++row) {
        const size_t at = static_cast<size_t>((layer_row + slot.first_row + row) * dh);
        const int64_t from = p * d + slot.head * dh;
        DECODER_RETURN_IF_ERROR(ops.CopyToHost(k + from, dh, state->k_.data() + at));
        DECODER_RETURN_IF_ERROR(ops.CopyToHost(v + from, dh, state->v_.data() + at));
      }
    }
    return absl::OkStatus();
  });
  TokenBatch batch;
  batch.tokens = tokens;
  batch.batch = 1;
  batch.seq_len = n;
  batch.positions = {0, geometry_.max_context()};
  absl::StatusOr<LossResult> forward = model_->Forward(batch);
  model_->set_kv_observer(nullptr);
  if (!forward.ok()) return forward.status();
  DECODER_RETURN_IF_ERROR(
      ops.CopyToHost(model_->logits() + (n - 1) * c.vocab_size, c.vocab_size, logits));
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
      Attend(s, layer, s.position_, host_q_.data() + j * d, host_attn_.data() + j * d);
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
