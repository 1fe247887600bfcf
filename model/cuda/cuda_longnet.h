// The LongNet language model on one GPU: bf16 compute on fp32 master weights.
//
// The same model as longnet.h (docs/MODEL.md: architecture, parameter layout and names, MAGNETO
// initialisation, RoPE/XPOS relative to a block reference, causal dilated attention in grouped or
// mixture mode), behind the same LanguageModel<float> interface, with its own wiring of the layers
// for the GPU:
//   - Parameters and gradients are flat fp32 device buffers of the model's ParamLayout, exactly as
//     on the CPU, so an optimizer (CudaAdamW, cuda_adamw.h), checkpoints and data-parallel
//     reductions work on them unchanged. Each Forward first refreshes a bf16 working copy of the
//     weights and linear biases (training_plan.h's WorkingCopyLayout: q, k, v stacked) that the
//     GEMMs read; LayerNorm gains and shifts are read in fp32 from the master buffer.
//   - GEMMs through cuBLASLt (gemm.h): bf16 operands, fp32 accumulation; biases and residual adds
//     in the GEMM's epilogue; weight gradients accumulated into the fp32 gradient buffer by the
//     GEMM itself (beta = 1); the logits in fp32.
//   - Activations in bf16; LayerNorm statistics, the attention's lse and the residual stream's
//     gradient in fp32 (a bf16 copy of the latter feeds the GEMMs). LayerNorm, GELU + LayerNorm,
//     rotary positions, cross-entropy, the embedding and the column sums of bias and norm
//     gradients are the fused kernels of model_kernels.h; every cross-row reduction is
//     deterministic, so gradients are the same bits run after run (and with or without
//     checkpointing: the recomputed block runs the same kernels on the same inputs).
//   - Attention through the engine's CUDA backend (our Hopper kernels for head dims 64 and 128),
//     causal, reading q, k, v in place from the [M, 3d] projection output (strided views); or,
//     with CudaModelOptions::attention_factory, through the attention it makes (a
//     sequence-parallel rank: the ring of cuda_sequence_attention.h over its group's NCCL
//     communicator, with TokenBatch::positions = {offset, total}: rotary positions start at the
//     offset, the causal mask and the dilated patterns are the whole sequence's).
// No loss scaling: bf16 has fp32's exponent range (model/optimizer.h on the model-io branch and
// docs/MODEL.md say why that suffices).
//
// Memory (training_plan.h has the formulas; PlanTrainingMemory the totals): per block the saved
// q, k, v, attention output, mid-block residual and FFN pre-activation (5 M d + M F bf16) plus,
// unless norms are recomputed, the four LayerNorm outputs (3 M d + M F); with
// ModelOptions::checkpoint_activations only each block's input and one block's set. Everything
// of one shape is one arena allocated at the first call of that shape (and freed when the shape
// changes); parameters, gradients and the working copy are allocated at Create.
//
// Asynchrony: calls enqueue on the model's stream. Forward with targets waits for the loss (it
// returns it); Backward returns without waiting; the copies to the host wait. An optimizer that
// updates params() or reads grads() must order its work on stream() (CudaAdamW does when created
// on it). Device errors of enqueued work surface at the next waiting call.
//
// Thread-safety: one call at a time. Errors: INVALID_ARGUMENT for a config the CUDA model cannot
// run (CheckCudaConfig) and for bad tokens (CheckTokenBatch), before anything is computed;
// FAILED_PRECONDITION for Backward without a Forward with targets; UNAVAILABLE without a usable
// GPU; RESOURCE_EXHAUSTED naming the bytes when memory runs out; other CUDA, cuBLASLt and
// attention errors naming the call (then activations and gradients are unspecified).
#ifndef DATTN_MODEL_CUDA_CUDA_LONGNET_H_
#define DATTN_MODEL_CUDA_CUDA_LONGNET_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/cuda/gemm.h"
#include "model/cuda/training_plan.h"
#include "model/language_model.h"
#include "model/longnet_params.h"
#include "model/param_layout.h"
#include "model/rotary.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {
namespace cuda {

// A bf16 value as its 16-bit pattern (model_kernels.h's alias, without its kernels' names).
using bf16_t = uint16_t;

// Makes the model's attention (sequence_attention.h) on the model's stream, once, at Create: what
// lets a sequence-parallel rank's model attend over its ring (cuda_sequence_attention.h's
// NewCudaRingSequenceAttention, whose kernels must run on `model_stream` so that they are ordered
// between the model's projections and output GEMMs). The attention must be on the CUDA device of
// CudaModelOptions::device, read the model's strided bf16 q, k, v views ([B, n, H, dh] with strides
// {n 3d, 3d, dh, 1} into the [M, 3d] projection output) and write contiguous outputs, as
// attention.h allows any backend to; the model owns it and destroys it before the stream.
using AttentionFactory =
    std::function<absl::StatusOr<std::unique_ptr<SequenceAttention>>(cudaStream_t model_stream)>;

struct CudaModelOptions {
  int device = 0;  // CUDA ordinal
  // Whether the backward pass recomputes the four LayerNorm outputs of each block instead of
  // keeping them: kAuto keeps them when PlanTrainingMemory (with the optimizer) fits in the
  // device's free memory at the first call of a shape, less 1 GiB.
  enum class Norms { kAuto, kKeep, kRecompute };
  Norms norms = Norms::kAuto;
  int64_t gemm_workspace_bytes = 32ll << 20;
  // Null (the default): the engine's CUDA backend on the model's stream, the whole sequence on
  // this GPU (NewLocalAttention). Otherwise called once at Create; its error is Create's, and a
  // null attention or one not on the CUDA device is INVALID_ARGUMENT. The model then creates no
  // CUDA backend of its own (memory().attention_pool_reserved_high stays 0: the factory's
  // attention owns its pool).
  AttentionFactory attention_factory;
};

// What the model holds on the device (bytes), for the memory planner's checks.
struct CudaModelMemory {
  int64_t params_grads_copy = 0;  // params, grads, working copy and their tables
  int64_t arena = 0;              // the current shape's activation arena
  int64_t arena_capacity = 0;  // the arena's allocation (larger when reserved for a larger shape)
  int64_t gemm_workspace = 0;
  int64_t attention_pool_reserved_high = 0;  // the engine's workspace pool high-water mark
};

class CudaLongNetLM final : public LanguageModel<float> {
 public:
  static absl::StatusOr<std::unique_ptr<CudaLongNetLM>> Create(
      const LongNetConfig& config, const ModelOptions& options,
      const CudaModelOptions& cuda_options = {});
  ~CudaLongNetLM() override;

  const LongNetConfig& config() const override { return config_; }
  const ModelOptions& options() const override { return options_; }
  const ParamLayout& layout() const override { return layout_; }
  // Where each tensor sits in layout() (longnet_params.h).
  const ModelOffsets& offsets() const { return offsets_; }
  Device device() const override { return Device::kCuda; }

  float* params() override { return params_; }
  const float* params() const override { return params_; }
  float* grads() override { return grads_; }
  const float* grads() const override { return grads_; }

  absl::Status InitParams(uint64_t seed) override;
  absl::Status CopyParamsFromHost(const float* host) override;
  absl::Status CopyParamsToHost(float* host) override;
  absl::Status CopyGradsToHost(float* host) override;

  // FLOPs: CountFlops(...).forward; bytes: the working copy refreshed (6 P), the activations
  // written once and read about once.
  absl::StatusOr<LossResult> Forward(const TokenBatch& batch) override;
  // FLOPs: CountFlops(...).backward; bytes: the saved activations read about twice, the scratch
  // written and read about twice, the gradients read and written once by their GEMMs.
  absl::Status Backward(const BackwardOptions& options = {}) override;
  absl::Status CopyLogitsToHost(float* host) override;
  // Rows [first_row, first_row + rows) of the last Forward's logits ([rows, vocab] fp32).
  // FAILED_PRECONDITION without a Forward; INVALID_ARGUMENT for rows outside the call's.
  absl::Status CopyLogitsToHost(float* host, int64_t first_row, int64_t rows);
  // host[t] := log p(target of row t) (0 for rows whose target is kIgnoreTarget), from the last
  // Forward with targets, batch x seq_len values. FAILED_PRECONDITION without one.
  absl::Status CopyTargetLogProbsToHost(float* host);

  // --- For incremental decoding (cuda_decoder.h), which runs the same layers a row at a time.
  // Called during each Forward, on the calling thread, once per block i after its rotary
  // positions: qkv is the block's [batch x seq_len, 3 d] bf16 projection output (q and k rotated)
  // on the device, valid for work the observer enqueues on stream(); an error it returns is
  // Forward's. Null: none (the default).
  using QkvObserver = std::function<absl::Status(int64_t block, const bf16_t* qkv)>;
  void set_qkv_observer(QkvObserver observer) { qkv_observer_ = std::move(observer); }
  // Refreshes the bf16 working copy from params() (every Forward does it first), so that a
  // decoder's steps read the current weights without a Forward.
  absl::Status RefreshWorkingCopy();
  const bf16_t* working_copy() const;
  const WorkingCopyLayout& working_layout() const { return working_; }
  // The model's cuBLASLt GEMMs, on stream() (one call at a time, as the model's).
  Gemm& gemm();

  cudaStream_t stream() const { return stream_; }
  int cuda_device() const { return cuda_options_.device; }
  int num_sms() const { return num_sms_; }
  absl::Status Synchronize();
  // Whether the current shape's arena recomputes norms (the kAuto choice once a Forward ran).
  bool recompute_norms() const { return recompute_norms_; }
  CudaModelMemory memory() const;
  // Allocates the activation arena of a batch x seq_len Forward now (RESOURCE_EXHAUSTED naming the
  // bytes if the device cannot hold it) and keeps it: from then on every shape whose arena fits in
  // it runs in it, without a new allocation (a server's prompts of any length up to its limit;
  // otherwise each new shape frees the arena and allocates its own). A larger shape later
  // replaces it with its own, then kept as the reservation.
  absl::Status ReserveActivations(int64_t batch, int64_t seq_len);

 private:
  CudaLongNetLM(const LongNetConfig& config, const ModelOptions& options,
                const CudaModelOptions& cuda_options, ParamLayout layout, ModelOffsets offsets,
                WorkingCopyLayout working);
  struct Impl;

  absl::Status Init();
  absl::Status EnsureArena(int64_t batch, int64_t seq_len);
  absl::Status UploadTokens(const TokenBatch& batch);
  absl::Status BlockForward(int64_t i, int64_t set, const void* x_in, void* x_out);
  absl::Status BlockBackward(int64_t i, int64_t set, const void* x_in);
  absl::Status RunBackward(const BackwardOptions& options);
  absl::Status RecomputeNorms(int64_t i, int64_t set, int which);
  absl::Status PoisonArena();
  absl::Status PoisonScratch();
  absl::Status UploadRotary(const RotaryPlan& plan);
  absl::Status Attention(int64_t set, bool backward);

  const LongNetConfig config_;
  const ModelOptions options_;
  const CudaModelOptions cuda_options_;
  const ParamLayout layout_;
  const ModelOffsets offsets_;
  const WorkingCopyLayout working_;
  std::unique_ptr<Impl> impl_;

  cudaStream_t stream_ = nullptr;
  int num_sms_ = 0;
  float* params_ = nullptr;
  float* grads_ = nullptr;

  // The current call's shape and state.
  int64_t batch_ = 0, seq_len_ = 0;
  SequencePositions positions_;
  bool recompute_norms_ = false;
  bool has_targets_ = false;
  bool ready_for_backward_ = false;
  bool logits_valid_ = false;
  int64_t num_targets_ = 0;
  int64_t emb_num_items_ = 0;
  QkvObserver qkv_observer_;
  bool in_backward_ = false;
  bool arena_reserved_ = false;
  int64_t arena_capacity_ = 0;  // bytes of the arena's allocation
};

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_CUDA_LONGNET_H_
