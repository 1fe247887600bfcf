// The LongNet language model (decoder-only): forward, loss and backward on one device.
//
// Architecture (docs/MODEL.md has the full story and the numbers):
//   x = token_embedding[tokens]
//   L blocks:  a = SubLN(Attn(RoPE/XPOS(q_proj(LN(x))), RoPE/XPOS(k_proj(LN(x))), v_proj(LN(x))))
//              x = x + out_proj(a)
//              x = x + fc2(SubLN(GELU(fc1(LN(x)))))
//   logits = FinalLN(x) W_head^T   (W_head = token_embedding when tied; no bias)
//   loss = mean over targeted positions of -log softmax(logits)[target]
// Attn is the engine's dilated attention (grouped or mixture mode, causal, scale 1/sqrt(D)) over
// (B, N, H, D) views; every linear layer but the head has a bias; LN is LayerNorm with gain and
// shift; GELU is the erf form.
//
// Layers are computed by a LayerOps<T> (the device's layer math) and attention by a
// SequenceAttention (one device, or later a rank of the ring engine holding a shard of positions);
// this class only wires them. Parameters and gradients are each one flat device buffer described
// by layout() (longnet_params.h names the entries), so an optimizer and checkpoints work on them
// without knowing the model.
//
// Memory: the parameters, the gradients, and for a call of M = batch x seq_len tokens the
// activations Backward needs: per block 9 M d + 3 M F values (its input; the normalised input,
// q, k, v, the attention output and its sub-norm, the residual in between and its norm; the FFN's
// pre-activation, GELU output and sub-norm) plus M (H + 8) statistics; with
// checkpoint_activations only each block's input (M d) is kept and one block's set is recomputed
// in the backward pass. Plus the final norm (M d), logits and their gradient (2 M V) and backward
// scratch (6 M d + 2 M F).
// Buffers are allocated at the first call of a shape and kept while the shape does not change.
//
// Thread-safety: one call at a time per instance. Errors: INVALID_ARGUMENT naming the bad value
// for inputs (checked before anything is computed); FAILED_PRECONDITION for Backward without a
// Forward with targets; device and attention errors as their layers return them (then the
// activations and gradients are unspecified and Backward needs a new Forward).
#ifndef DATTN_MODEL_LONGNET_H_
#define DATTN_MODEL_LONGNET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/attention_spec.h"
#include "model/block_forward.h"
#include "model/config.h"
#include "model/language_model.h"
#include "model/layer_ops.h"
#include "model/longnet_params.h"
#include "model/param_layout.h"
#include "model/rotary.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {

// ModelOptions, TokenBatch, LossResult, BackwardOptions and CountFlops are in language_model.h.
//
// T is float or double, the type of the parameters, gradients and activations.
template <typename T>
class LongNetLM final : public LanguageModel<T> {
 public:
  // A model with uninitialised parameters (call InitParams or CopyParamsFromHost). The ops and
  // the attention must be on the same device and the ops' dtype must be T. INVALID_ARGUMENT for a
  // config ValidateConfig refuses or a device or dtype mismatch; the ops' Allocate errors for the
  // parameter and gradient buffers.
  static absl::StatusOr<std::unique_ptr<LongNetLM>> Create(
      const LongNetConfig& config, const ModelOptions& options, std::unique_ptr<LayerOps<T>> ops,
      std::unique_ptr<SequenceAttention> attention);
  // On the CPU: NewCpuLayerOps and the engine's CPU backend, both with `num_threads` (0: all).
  static absl::StatusOr<std::unique_ptr<LongNetLM>> CreateCpu(const LongNetConfig& config,
                                                              const ModelOptions& options,
                                                              int num_threads = 0);

  // The elements of T that Forward allocates for a call of `batch` x `seq_len` tokens (the
  // activations, logits and backward scratch of the file comment; EnsureBuffers), beyond the
  // parameters and gradients (2 x layout().total()). Kept until the shape changes. Memory plans
  // (training_memory.h) count with it; training_memory_test checks it against the allocations.
  static int64_t BufferElements(const LongNetConfig& config, const ModelOptions& options,
                                int64_t batch, int64_t seq_len);

  const LongNetConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  const ParamLayout& layout() const override { return layout_; }
  Device device() const override { return ops_->device(); }
  const ModelOffsets& offsets() const { return offsets_; }
  LayerOps<T>& ops() { return *ops_; }

  // The flat parameter and gradient buffers, layout().total() elements each, on the ops' device
  // (host memory on the CPU). Owned by the model; valid for its lifetime. An optimizer may update
  // params() in place between calls.
  T* params() override { return params_.data(); }
  const T* params() const override { return params_.data(); }
  T* grads() override { return grads_.data(); }
  const T* grads() const override { return grads_.data(); }

  // MAGNETO initialisation (longnet_params.h's InitMagneto), computed in fp64 and rounded to T.
  absl::Status InitParams(uint64_t seed) override;
  // Copies of the whole flat buffers to and from host arrays of layout().total() elements.
  absl::Status CopyParamsFromHost(const T* host) override;
  absl::Status CopyParamsToHost(T* host) override;
  absl::Status CopyGradsToHost(T* host) override;

  // Runs the model on `batch`: logits for every position and, when targets are given, the loss.
  // Keeps what Backward needs. Errors as in the file comment; tokens and targets are checked and
  // the first bad one named with its (sequence, position). FLOPs: CountFlops(...).forward; bytes:
  // the parameters read about once per use, the activations of the file comment written once and
  // read a few times.
  absl::StatusOr<LossResult> Forward(const TokenBatch& batch) override;

  // Gradients of options.loss_scale * (the last Forward's loss) with respect to params(), into
  // grads(). Needs a successful Forward with targets since; may be repeated. FLOPs:
  // CountFlops(...).backward; bytes: the activations read about twice, the gradients written once
  // (plus the recomputed blocks' forward with checkpointing).
  absl::Status Backward(const BackwardOptions& options = {}) override;

  // The last Forward's logits, [batch * seq_len, vocab_size] on the device; null before any.
  const T* logits() const { return logits_.data(); }
  absl::Status CopyLogitsToHost(T* host) override;

  // Incremental decoding (decoder.h) fills its cache from a prompt's forward pass: while set,
  // Forward calls `observer(block, k, v)` after block `block`'s q and k are rotated, with that
  // block's k and v ([batch, seq_len, H, D] on the device; valid during the call only). An error
  // it returns stops the Forward, which returns it. Null (the default) calls nothing.
  using KvObserver = std::function<absl::Status(int64_t block, const T* k, const T* v)>;
  void set_kv_observer(KvObserver observer) { kv_observer_ = std::move(observer); }

 private:
  // One block's saved activations ([M, width] unless noted).
  struct BlockActs {
    DeviceArray<T> ln1, ln1_mean, ln1_rstd;     // d; [M]
    DeviceArray<T> q, k, v;                     // d, (B, N, H, D); q and k rotated
    DeviceArray<T> attn, lse;                   // d; lse (B, H, N)
    DeviceArray<T> sub1, sub1_mean, sub1_rstd;  // d
    DeviceArray<T> x_mid;                       // d: input + attention branch
    DeviceArray<T> ln2, ln2_mean, ln2_rstd;     // d
    DeviceArray<T> h1, g;                       // F: fc1 output, GELU(h1)
    DeviceArray<T> sub2, sub2_mean, sub2_rstd;  // F
  };

  LongNetLM(const LongNetConfig& config, const ModelOptions& options, ParamLayout layout,
            ModelOffsets offsets, std::unique_ptr<LayerOps<T>> ops,
            std::unique_ptr<SequenceAttention> attention);

  absl::Status EnsureBuffers(int64_t batch, int64_t seq_len);
  absl::Status AllocateActs(BlockActs* acts);
  absl::Status PoisonActs(BlockActs* acts);
  absl::Status Poison(DeviceArray<T>* array);
  absl::Status CheckTokens(const TokenBatch& batch) const;

  // x_out := block i applied to x_in, saving activations in acts; `observe`: call the KV
  // observer (Forward does; the backward pass's recomputation does not).
  absl::Status BlockForward(int64_t i, BlockActs& acts, const T* x_in, T* x_out, bool observe);
  // dx holds the gradient of block i's output; on return, that of its input x_in. Adds the
  // block's parameter gradients into grads().
  absl::Status BlockBackward(int64_t i, BlockActs& acts, const T* x_in, T* dx);

  static BlockTensors<T> Tensors(BlockActs& acts);
  TensorView View4(T* data) const;
  TensorView LseView(T* data) const;

  const LongNetConfig config_;
  const ModelOptions options_;
  const ParamLayout layout_;
  const ModelOffsets offsets_;
  const AttentionSpec spec_;
  const std::unique_ptr<LayerOps<T>> ops_;
  const std::unique_ptr<SequenceAttention> attention_;

  DeviceArray<T> params_, grads_;

  // The current call's shape and state.
  int64_t batch_ = 0, seq_len_ = 0;
  SequencePositions positions_;
  std::vector<int32_t> tokens_, targets_;
  bool has_targets_ = false;
  bool ready_for_backward_ = false;
  int64_t num_targets_ = 0;
  std::unique_ptr<RotaryPlan> rotary_;
  KvObserver kv_observer_;

  // Activations: xs_[i] is block i's input, xs_[L] the last block's output.
  int64_t buffer_batch_ = 0, buffer_seq_len_ = 0;
  std::vector<DeviceArray<T>> xs_;
  std::vector<BlockActs> acts_;  // One per block, or one shared set when checkpointing.
  DeviceArray<T> xf_, xf_mean_, xf_rstd_, logits_, row_lse_;
  // Backward scratch.
  DeviceArray<T> dx_, dtmp_, dq_, dk_, dv_, dattn_, dh_, dh2_, dlogits_;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_LONGNET_H_
