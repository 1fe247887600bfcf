#include "model/longnet.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/cpu_layer_ops.h"

namespace dattn {
namespace model {

#define MODEL_RETURN_IF_ERROR(expr)                \
  do {                                             \
    const ::absl::Status model_status_ = (expr);   \
    if (!model_status_.ok()) return model_status_; \
  } while (0)

template <typename T>
LongNetLM<T>::LongNetLM(const LongNetConfig& config, const ModelOptions& options,
                        ParamLayout layout, ModelOffsets offsets, std::unique_ptr<LayerOps<T>> ops,
                        std::unique_ptr<SequenceAttention> attention)
    : config_(config),
      options_(options),
      layout_(std::move(layout)),
      offsets_(std::move(offsets)),
      spec_(config.attention_spec()),
      ops_(std::move(ops)),
      attention_(std::move(attention)) {}

template <typename T>
absl::StatusOr<std::unique_ptr<LongNetLM<T>>> LongNetLM<T>::Create(
    const LongNetConfig& config, const ModelOptions& options, std::unique_ptr<LayerOps<T>> ops,
    std::unique_ptr<SequenceAttention> attention) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "T: float or double");
  if (ops == nullptr || attention == nullptr) {
    return absl::InvalidArgumentError("LongNetLM: ops and attention are required");
  }
  const DType want = std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
  if (ops->dtype() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("LongNetLM<", DTypeName(want), ">: layer ops of ", DTypeName(ops->dtype())));
  }
  if (ops->device() != attention->device()) {
    return absl::InvalidArgumentError(absl::StrCat("LongNetLM: layer ops on ",
                                                   DeviceName(ops->device()), ", attention on ",
                                                   DeviceName(attention->device())));
  }
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(config);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<ModelOffsets> offsets = ResolveOffsets(config, *layout);
  if (!offsets.ok()) return offsets.status();
  std::unique_ptr<LongNetLM> model(new LongNetLM(config, options, *std::move(layout),
                                                 *std::move(offsets), std::move(ops),
                                                 std::move(attention)));
  for (DeviceArray<T>* a : {&model->params_, &model->grads_}) {
    absl::StatusOr<DeviceArray<T>> array = model->ops_->Allocate(model->layout_.total());
    if (!array.ok()) return array.status();
    *a = *std::move(array);
  }
  return model;
}

template <typename T>
absl::StatusOr<std::unique_ptr<LongNetLM<T>>> LongNetLM<T>::CreateCpu(const LongNetConfig& config,
                                                                      const ModelOptions& options,
                                                                      int num_threads) {
  CpuLayerOpsOptions ops_options;
  ops_options.num_threads = num_threads;
  return Create(config, options, NewCpuLayerOps<T>(ops_options), NewCpuLocalAttention(num_threads));
}

template <typename T>
absl::Status LongNetLM<T>::InitParams(uint64_t seed) {
  std::vector<double> values(static_cast<size_t>(layout_.total()));
  MODEL_RETURN_IF_ERROR(InitMagneto(config_, layout_, seed, values.data()));
  std::vector<T> rounded(values.begin(), values.end());
  return CopyParamsFromHost(rounded.data());
}

template <typename T>
absl::Status LongNetLM<T>::CopyParamsFromHost(const T* host) {
  return ops_->CopyFromHost(host, layout_.total(), params_.data());
}
template <typename T>
absl::Status LongNetLM<T>::CopyParamsToHost(T* host) {
  return ops_->CopyToHost(params_.data(), layout_.total(), host);
}
template <typename T>
absl::Status LongNetLM<T>::CopyGradsToHost(T* host) {
  return ops_->CopyToHost(grads_.data(), layout_.total(), host);
}
template <typename T>
absl::Status LongNetLM<T>::CopyLogitsToHost(T* host) {
  if (logits_.data() == nullptr) {
    return absl::FailedPreconditionError("CopyLogitsToHost: no Forward has run");
  }
  return ops_->CopyToHost(logits_.data(), batch_ * seq_len_ * config_.vocab_size, host);
}

template <typename T>
absl::Status LongNetLM<T>::CheckTokens(const TokenBatch& b) const {
  return CheckTokenBatch(config_, b, static_cast<int64_t>(sizeof(T)));
}

template <typename T>
absl::Status LongNetLM<T>::AllocateActs(BlockActs* a) {
  const int64_t m = batch_ * seq_len_, d = config_.d_model, f = config_.ffn_dim;
  const int64_t lse = batch_ * config_.num_heads * seq_len_;
  const std::pair<DeviceArray<T>*, int64_t> plan[] = {
      {&a->ln1, m * d},  {&a->ln1_mean, m},  {&a->ln1_rstd, m},  {&a->q, m * d},
      {&a->k, m * d},    {&a->v, m * d},     {&a->attn, m * d},  {&a->lse, lse},
      {&a->sub1, m * d}, {&a->sub1_mean, m}, {&a->sub1_rstd, m}, {&a->x_mid, m * d},
      {&a->ln2, m * d},  {&a->ln2_mean, m},  {&a->ln2_rstd, m},  {&a->h1, m * f},
      {&a->g, m * f},    {&a->sub2, m * f},  {&a->sub2_mean, m}, {&a->sub2_rstd, m},
  };
  for (const auto& [array, n] : plan) {
    absl::StatusOr<DeviceArray<T>> fresh = ops_->Allocate(n);
    if (!fresh.ok()) return fresh.status();
    *array = *std::move(fresh);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status LongNetLM<T>::Poison(DeviceArray<T>* array) {
  return ops_->Fill(array->data(), array->size(), std::numeric_limits<double>::quiet_NaN());
}

template <typename T>
absl::Status LongNetLM<T>::PoisonActs(BlockActs* a) {
  for (DeviceArray<T>* array :
       {&a->ln1,       &a->ln1_mean, &a->ln1_rstd, &a->q,         &a->k,
        &a->v,         &a->attn,     &a->lse,      &a->sub1,      &a->sub1_mean,
        &a->sub1_rstd, &a->x_mid,    &a->ln2,      &a->ln2_mean,  &a->ln2_rstd,
        &a->h1,        &a->g,        &a->sub2,     &a->sub2_mean, &a->sub2_rstd}) {
    MODEL_RETURN_IF_ERROR(Poison(array));
  }
  return absl::OkStatus();
}

template <typename T>
int64_t LongNetLM<T>::BufferElements(const LongNetConfig& config, const ModelOptions& options,
                                     int64_t batch, int64_t seq_len) {
  const int64_t m = batch * seq_len, d = config.d_model, f = config.ffn_dim;
  const int64_t v = config.vocab_size, layers = config.num_layers, h = config.num_heads;
  // AllocateActs: 8 [M, d], 3 [M, F], the lse [B, H, N] and 8 statistics of M.
  const int64_t acts = 8 * m * d + 3 * m * f + m * h + 8 * m;
  const int64_t sets = options.checkpoint_activations ? 1 : layers;
  // EnsureBuffers: xs (L + 1 of [M, d]); the final norm [M, d] + 2 M; logits and their gradient
  // [M, V] each; row_lse M; dx, dtmp, dq, dk, dv, dattn [M, d]; dh, dh2 [M, F].
  return (layers + 1) * m * d + sets * acts + (m * d + 2 * m) + 2 * m * v + m + 6 * m * d +
         2 * m * f;
}

template <typename T>
absl::Status LongNetLM<T>::EnsureBuffers(int64_t batch, int64_t seq_len) {
  if (batch == buffer_batch_ && seq_len == buffer_seq_len_) return absl::OkStatus();
  // Free the old set first, so that a larger shape does not need both at once.
  buffer_batch_ = buffer_seq_len_ = 0;
  xs_.clear();
  acts_.clear();
  for (DeviceArray<T>* a : {&xf_, &xf_mean_, &xf_rstd_, &logits_, &row_lse_, &dx_, &dtmp_, &dq_,
                            &dk_, &dv_, &dattn_, &dh_, &dh2_, &dlogits_}) {
    *a = DeviceArray<T>();
  }
  const int64_t m = batch * seq_len, d = config_.d_model, f = config_.ffn_dim;
  const int64_t v = config_.vocab_size, layers = config_.num_layers;
  auto allocate = [&](DeviceArray<T>* array, int64_t n) -> absl::Status {
    absl::StatusOr<DeviceArray<T>> fresh = ops_->Allocate(n);
    if (!fresh.ok()) return fresh.status();
    *array = *std::move(fresh);
    return absl::OkStatus();
  };
  batch_ = batch;
  seq_len_ = seq_len;
  xs_.resize(static_cast<size_t>(layers + 1));
  for (DeviceArray<T>& x : xs_) MODEL_RETURN_IF_ERROR(allocate(&x, m * d));
  acts_.resize(options_.checkpoint_activations ? 1 : static_cast<size_t>(layers));
  for (BlockActs& a : acts_) MODEL_RETURN_IF_ERROR(AllocateActs(&a));
  const std::pair<DeviceArray<T>*, int64_t> plan[] = {
      {&xf_, m * d},    {&xf_mean_, m},  {&xf_rstd_, m}, {&logits_, m * v},  {&row_lse_, m},
      {&dx_, m * d},    {&dtmp_, m * d}, {&dq_, m * d},  {&dk_, m * d},      {&dv_, m * d},
      {&dattn_, m * d}, {&dh_, m * f},   {&dh2_, m * f}, {&dlogits_, m * v},
  };
  for (const auto& [array, n] : plan) MODEL_RETURN_IF_ERROR(allocate(array, n));
  buffer_batch_ = batch;
  buffer_seq_len_ = seq_len;
  return absl::OkStatus();
}

template <typename T>
TensorView LongNetLM<T>::View4(T* data) const {
  return TensorView::Contiguous(data, ops_->dtype(),
                                {batch_, seq_len_, config_.num_heads, config_.head_dim()},
                                ops_->device());
}

template <typename T>
TensorView LongNetLM<T>::LseView(T* data) const {
  return TensorView::Contiguous(data, ops_->dtype(), {batch_, config_.num_heads, seq_len_},
                                ops_->device());
}

template <typename T>
absl::Status LongNetLM<T>::BlockForward(int64_t i, BlockActs& a, const T* x_in, T* x_out,
                                        bool observe) {
  const BlockOffsets& o = offsets_.blocks[static_cast<size_t>(i)];
  const T* p = params_.data();
  const int64_t m = batch_ * seq_len_;
  LayerOps<T>& ops = *ops_;
  const BlockTensors<T> t = Tensors(a);
  MODEL_RETURN_IF_ERROR(BlockQkvForward(ops, config_, p, o, m, x_in, t));
  MODEL_RETURN_IF_ERROR(ops.RotaryForward(*rotary_, batch_, seq_len_, config_.num_heads,
                                          positions_.offset, t.q, t.k));
  if (observe && kv_observer_) MODEL_RETURN_IF_ERROR(kv_observer_(i, t.k, t.v));
  ForwardArgs fwd;
  fwd.q = View4(t.q);
  fwd.k = View4(t.k);
  fwd.v = View4(t.v);
  fwd.out = View4(t.attn);
  fwd.lse = LseView(a.lse.data());
  MODEL_RETURN_IF_ERROR(attention_->Forward(spec_, positions_, fwd));
  return BlockOutputForward(ops, config_, p, o, m, x_in, t, x_out);
}

template <typename T>
BlockTensors<T> LongNetLM<T>::Tensors(BlockActs& a) {
  BlockTensors<T> t;
  t.ln1 = a.ln1.data();
  t.ln1_mean = a.ln1_mean.data();
  t.ln1_rstd = a.ln1_rstd.data();
  t.q = a.q.data();
  t.k = a.k.data();
  t.v = a.v.data();
  t.attn = a.attn.data();
  t.sub1 = a.sub1.data();
  t.sub1_mean = a.sub1_mean.data();
  t.sub1_rstd = a.sub1_rstd.data();
  t.x_mid = a.x_mid.data();
  t.ln2 = a.ln2.data();
  t.ln2_mean = a.ln2_mean.data();
  t.ln2_rstd = a.ln2_rstd.data();
  t.h1 = a.h1.data();
  t.g = a.g.data();
  t.sub2 = a.sub2.data();
  t.sub2_mean = a.sub2_mean.data();
  t.sub2_rstd = a.sub2_rstd.data();
  return t;
}

template <typename T>
absl::Status LongNetLM<T>::BlockBackward(int64_t i, BlockActs& a, const T* x_in, T* dx) {
  const BlockOffsets& o = offsets_.blocks[static_cast<size_t>(i)];
  const T* p = params_.data();
  T* g = grads_.data();
  const int64_t m = batch_ * seq_len_, d = config_.d_model, f = config_.ffn_dim;
  LayerOps<T>& ops = *ops_;
  // Feed-forward branch: x_out = x_mid + fc2(sub2). dx is d x_out.
  MODEL_RETURN_IF_ERROR(
      ops.LinearBackwardParams(dx, a.sub2.data(), m, f, d, g + o.fc2.weight, g + o.fc2.bias));
  MODEL_RETURN_IF_ERROR(
      ops.LinearBackwardInput(dx, m, d, p + o.fc2.weight, f, dh_.data(), Accumulate::kOverwrite));
  MODEL_RETURN_IF_ERROR(ops.LayerNormBackward(
      dh_.data(), a.g.data(), a.sub2_mean.data(), a.sub2_rstd.data(), p + o.ffn_sub_norm.weight, m,
      f, dh2_.data(), Accumulate::kOverwrite, g + o.ffn_sub_norm.weight, g + o.ffn_sub_norm.bias));
  MODEL_RETURN_IF_ERROR(ops.GeluBackward(a.h1.data(), dh2_.data(), m * f, dh_.data()));
  MODEL_RETURN_IF_ERROR(ops.LinearBackwardParams(dh_.data(), a.ln2.data(), m, d, f,
                                                 g + o.fc1.weight, g + o.fc1.bias));
  MODEL_RETURN_IF_ERROR(ops.LinearBackwardInput(dh_.data(), m, f, p + o.fc1.weight, d, dtmp_.data(),
                                                Accumulate::kOverwrite));
  MODEL_RETURN_IF_ERROR(ops.LayerNormBackward(
      dtmp_.data(), a.x_mid.data(), a.ln2_mean.data(), a.ln2_rstd.data(), p + o.ffn_norm.weight, m,
      d, dx, Accumulate::kAdd, g + o.ffn_norm.weight, g + o.ffn_norm.bias));
  // Attention branch: x_mid = x_in + out_proj(sub1). dx is now d x_mid.
  MODEL_RETURN_IF_ERROR(ops.LinearBackwardParams(dx, a.sub1.data(), m, d, d, g + o.out_proj.weight,
                                                 g + o.out_proj.bias));
  MODEL_RETURN_IF_ERROR(ops.LinearBackwardInput(dx, m, d, p + o.out_proj.weight, d, dtmp_.data(),
                                                Accumulate::kOverwrite));
  MODEL_RETURN_IF_ERROR(
      ops.LayerNormBackward(dtmp_.data(), a.attn.data(), a.sub1_mean.data(), a.sub1_rstd.data(),
                            p + o.attn_sub_norm.weight, m, d, dattn_.data(), Accumulate::kOverwrite,
                            g + o.attn_sub_norm.weight, g + o.attn_sub_norm.bias));
  BackwardArgs bwd;
  bwd.q = View4(a.q.data());
  bwd.k = View4(a.k.data());
  bwd.v = View4(a.v.data());
  bwd.out = View4(a.attn.data());
  bwd.lse = LseView(a.lse.data());
  bwd.dout = View4(dattn_.data());
  bwd.dq = View4(dq_.data());
  bwd.dk = View4(dk_.data());
  bwd.dv = View4(dv_.data());
  MODEL_RETURN_IF_ERROR(attention_->Backward(spec_, positions_, bwd));
  MODEL_RETURN_IF_ERROR(ops.RotaryBackward(*rotary_, batch_, seq_len_, config_.num_heads,
                                           positions_.offset, dq_.data(), dk_.data()));
  const std::pair<const T*, const LinearOffsets*> projections[] = {
      {dq_.data(), &o.q_proj}, {dk_.data(), &o.k_proj}, {dv_.data(), &o.v_proj}};
  for (size_t j = 0; j < 3; ++j) {
    const auto& [dy, lin] = projections[j];
    MODEL_RETURN_IF_ERROR(
        ops.LinearBackwardParams(dy, a.ln1.data(), m, d, d, g + lin->weight, g + lin->bias));
    MODEL_RETURN_IF_ERROR(
        ops.LinearBackwardInput(dy, m, d, p + lin->weight, d, dtmp_.data(),
                                j == 0 ? Accumulate::kOverwrite : Accumulate::kAdd));
  }
  return ops.LayerNormBackward(dtmp_.data(), x_in, a.ln1_mean.data(), a.ln1_rstd.data(),
                               p + o.attn_norm.weight, m, d, dx, Accumulate::kAdd,
                               g + o.attn_norm.weight, g + o.attn_norm.bias);
}

template <typename T>
absl::StatusOr<LossResult> LongNetLM<T>::Forward(const TokenBatch& b) {
  ready_for_backward_ = false;
  MODEL_RETURN_IF_ERROR(CheckTokens(b));
  const SequencePositions positions =
      b.positions.total == 0 ? SequencePositions{0, b.seq_len} : b.positions;
  absl::StatusOr<RotaryPlan> rotary = RotaryPlan::Make(config_, positions.total);
  if (!rotary.ok()) return rotary.status();
  MODEL_RETURN_IF_ERROR(EnsureBuffers(b.batch, b.seq_len));
  rotary_ = std::make_unique<RotaryPlan>(*std::move(rotary));
  positions_ = positions;
  const int64_t m = b.batch * b.seq_len, d = config_.d_model, v = config_.vocab_size;
  tokens_.assign(b.tokens, b.tokens + m);
  has_targets_ = b.targets != nullptr;
  if (has_targets_) {
    targets_.assign(b.targets, b.targets + m);
  } else {
    targets_.clear();
  }
  if (options_.poison_scratch) {
    for (DeviceArray<T>& x : xs_) MODEL_RETURN_IF_ERROR(Poison(&x));
    for (BlockActs& a : acts_) MODEL_RETURN_IF_ERROR(PoisonActs(&a));
    for (DeviceArray<T>* a : {&xf_, &xf_mean_, &xf_rstd_, &logits_, &row_lse_}) {
      MODEL_RETURN_IF_ERROR(Poison(a));
    }
  }
  LayerOps<T>& ops = *ops_;
  const T* p = params_.data();
  MODEL_RETURN_IF_ERROR(
      ops.EmbeddingForward(tokens_.data(), m, p + offsets_.token_embedding, d, xs_[0].data()));
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    BlockActs& a = acts_[options_.checkpoint_activations ? 0 : static_cast<size_t>(i)];
    MODEL_RETURN_IF_ERROR(BlockForward(i, a, xs_[i].data(), xs_[i + 1].data(), /*observe=*/true));
  }
  MODEL_RETURN_IF_ERROR(ops.LayerNormForward(xs_[config_.num_layers].data(), m, d,
                                             p + offsets_.final_norm.weight,
                                             p + offsets_.final_norm.bias, config_.layer_norm_eps,
                                             xf_.data(), xf_mean_.data(), xf_rstd_.data()));
  const T* head = p + (config_.tie_embeddings ? offsets_.token_embedding : offsets_.lm_head);
  MODEL_RETURN_IF_ERROR(ops.LinearForward(xf_.data(), m, d, head, nullptr, v, logits_.data()));
  LossResult result;
  if (has_targets_) {
    MODEL_RETURN_IF_ERROR(ops.CrossEntropyForward(logits_.data(), targets_.data(), m, v,
                                                  row_lse_.data(), &result.loss_sum,
                                                  &result.num_targets));
    result.loss =
        result.num_targets > 0 ? result.loss_sum / static_cast<double>(result.num_targets) : 0.0;
    num_targets_ = result.num_targets;
    ready_for_backward_ = true;
  }
  return result;
}

template <typename T>
absl::Status LongNetLM<T>::Backward(const BackwardOptions& options) {
  if (!ready_for_backward_) {
    return absl::FailedPreconditionError(
        "Backward needs a successful Forward with targets since the last failure or creation");
  }
  if (!std::isfinite(options.loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Backward: loss_scale ", options.loss_scale, " is not finite"));
  }
  // A failure below leaves gradients (and, when checkpointing, activations) half-made.
  ready_for_backward_ = false;
  LayerOps<T>& ops = *ops_;
  const int64_t m = batch_ * seq_len_, d = config_.d_model, v = config_.vocab_size;
  const int64_t layers = config_.num_layers;
  if (options_.poison_scratch) {
    for (DeviceArray<T>* a : {&dx_, &dtmp_, &dq_, &dk_, &dv_, &dattn_, &dh_, &dh2_, &dlogits_}) {
      MODEL_RETURN_IF_ERROR(Poison(a));
    }
  }
  if (options.grads == Accumulate::kOverwrite) {
    MODEL_RETURN_IF_ERROR(ops.Fill(grads_.data(), layout_.total(), 0.0));
  }
  const T* p = params_.data();
  T* g = grads_.data();
  // Each range of the gradient is handed to options.on_grads_final once it is final.
  const std::vector<ElementRange> finish = BackwardFinishOrder(offsets_, layout_.total());
  auto finished = [&](int64_t k) {
    if (!options.on_grads_final) return absl::OkStatus();
    const ElementRange& r = finish[static_cast<size_t>(k)];
    return options.on_grads_final(r.begin, r.end);
  };
  const double scale =
      num_targets_ > 0 ? options.loss_scale / static_cast<double>(num_targets_) : 0.0;
  MODEL_RETURN_IF_ERROR(ops.CrossEntropyBackward(logits_.data(), row_lse_.data(), targets_.data(),
                                                 m, v, scale, dlogits_.data()));
  const int64_t head = config_.tie_embeddings ? offsets_.token_embedding : offsets_.lm_head;
  MODEL_RETURN_IF_ERROR(
      ops.LinearBackwardParams(dlogits_.data(), xf_.data(), m, d, v, g + head, nullptr));
  MODEL_RETURN_IF_ERROR(ops.LinearBackwardInput(dlogits_.data(), m, v, p + head, d, dtmp_.data(),
                                                Accumulate::kOverwrite));
  MODEL_RETURN_IF_ERROR(ops.LayerNormBackward(
      dtmp_.data(), xs_[layers].data(), xf_mean_.data(), xf_rstd_.data(),
      p + offsets_.final_norm.weight, m, d, dx_.data(), Accumulate::kOverwrite,
      g + offsets_.final_norm.weight, g + offsets_.final_norm.bias));
  MODEL_RETURN_IF_ERROR(finished(0));
  for (int64_t i = layers - 1; i >= 0; --i) {
    BlockActs* a;
    if (options_.checkpoint_activations) {
      // Recompute the block's activations from its saved input; its output xs_[i + 1] is
      // rewritten with the same values (block i + 1's backward, the last reader, is done).
      a = &acts_[0];
      if (options_.poison_scratch) MODEL_RETURN_IF_ERROR(PoisonActs(a));
      MODEL_RETURN_IF_ERROR(
          BlockForward(i, *a, xs_[i].data(), xs_[i + 1].data(), /*observe=*/false));
    } else {
      a = &acts_[static_cast<size_t>(i)];
    }
    MODEL_RETURN_IF_ERROR(BlockBackward(i, *a, xs_[i].data(), dx_.data()));
    MODEL_RETURN_IF_ERROR(finished(layers - i));
  }
  MODEL_RETURN_IF_ERROR(
      ops.EmbeddingBackward(tokens_.data(), m, dx_.data(), d, g + offsets_.token_embedding));
  MODEL_RETURN_IF_ERROR(finished(layers + 1));
  ready_for_backward_ = true;
  return absl::OkStatus();
}

#undef MODEL_RETURN_IF_ERROR

template class LongNetLM<float>;
template class LongNetLM<double>;

}  // namespace model
}  // namespace dattn
