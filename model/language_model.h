// What a trainer needs of a LongNet language model on some device, whatever computes it: the types
// of a call (TokenBatch, LossResult, BackwardOptions, ModelOptions), the FLOP count of a call, the
// checks every implementation makes on its tokens, and the interface LanguageModel<T> that both
// the layer-ops model (longnet.h: LongNetLM<float|double>, CPU) and the CUDA model
// (cuda/cuda_longnet.h: CudaLongNetLM, bf16 compute on fp32 master weights) implement.
//
// Parameters and gradients are flat buffers of T described by layout() (param_layout.h,
// longnet_params.h), on the model's device: an optimizer, a checkpoint or a data-parallel
// reduction works on them without knowing which model made them.
//
// Thread-safety: a model is used by one thread at a time. Errors: absl::Status, as each
// implementation's header states; INVALID_ARGUMENT for bad tokens is common to all
// (CheckTokenBatch).
#ifndef DATTN_MODEL_LANGUAGE_MODEL_H_
#define DATTN_MODEL_LANGUAGE_MODEL_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "model/config.h"
#include "model/layer_ops.h"
#include "model/param_layout.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {

struct ModelOptions {
  // Activation checkpointing of every block: the forward pass keeps only each block's input; the
  // backward pass recomputes the block's forward from it, then runs its backward. Gradients are
  // bit-identical to a run without it; costs one more forward of the blocks.
  bool checkpoint_activations = false;
  // Fill every activation and scratch buffer with NaN at the start of each Forward and Backward
  // (and before each recomputed block), so that anything read before it is written this call
  // shows up as NaN in the loss, logits or gradients. For tests; costs a pass over the memory.
  bool poison_scratch = false;
};

// One call's tokens: `batch` sequences of `seq_len` token ids each, row-major, host memory, read
// during Forward only (the model keeps a copy for Backward).
struct TokenBatch {
  const int32_t* tokens = nullptr;   // Each in [0, vocab_size).
  const int32_t* targets = nullptr;  // Each in [0, vocab_size) or kIgnoreTarget; null: no loss.
  int64_t batch = 0;
  int64_t seq_len = 0;
  // Where the rows sit in the whole sequence (sequence parallelism); total == 0 means the whole
  // sequence is here: {0, seq_len}. Rotary positions are offset + t.
  SequencePositions positions;
};

struct LossResult {
  double loss = 0;          // loss_sum / num_targets; 0 when there are no targets.
  double loss_sum = 0;      // Sum over targeted positions of -log p(target), in fp64.
  int64_t num_targets = 0;  // Positions whose target is not kIgnoreTarget.
};

struct BackwardOptions {
  // The gradient computed is that of loss_scale * loss (the mean): 1/k for k accumulated micro-
  // batches, or num_targets / global_targets for a rank of a sequence-parallel ring.
  double loss_scale = 1.0;
  // kOverwrite: grads() := the gradient (every element written); kAdd: grads() += the gradient.
  Accumulate grads = Accumulate::kOverwrite;
  // When set, Backward calls it, on the calling thread, each time a range [begin, end) of grads()
  // (elements of layout()) is final for this call: in the order of longnet_params.h's
  // BackwardFinishOrder (the head, the blocks from the last to the first, the embedding), each
  // range once, together covering [0, total). The work that writes the range has been done (CPU)
  // or enqueued on the model's stream (CUDA): work ordered after the call sees the final values,
  // and nothing later in this Backward writes the range. This is what lets a data-parallel rank
  // start reducing a block's gradients while the backward of the blocks below it runs (trainer.h).
  // An error it returns stops the backward, which returns it (grads() are then unspecified).
  std::function<absl::Status(int64_t begin, int64_t end)> on_grads_final;
};

// FLOPs of one call (multiply-add = 2): the linear layers and LM head exactly, attention as the
// engine's nominal count (engine/attention_spec.h: 4 B heads N D w/r^2 per pattern, halved when
// causal). LayerNorm, GELU, rotary, softmax and residual adds (O(M d) each) are not counted.
struct ModelFlops {
  double forward = 0;   // L (2 M (4 d^2 + 2 d F) + attention) + 2 M d V.
  double backward = 0;  // Twice the linear FLOPs, 2.5 times attention's; with checkpointing, plus
                        // the blocks' forward again.
};
ModelFlops CountFlops(const LongNetConfig& config, int64_t batch, int64_t seq_len,
                      bool checkpoint_activations);

// The checks every model makes on a call's tokens before computing anything: batch, seq_len >= 1;
// tokens given; every buffer of M = batch x seq_len rows of the widest layer (d, F, V or H) in
// int64 bytes of `element_bytes`; positions inside the whole sequence; every token in
// [0, vocab_size) and every target too or kIgnoreTarget. INVALID_ARGUMENT naming the first bad
// value with its (sequence, position).
absl::Status CheckTokenBatch(const LongNetConfig& config, const TokenBatch& batch,
                             int64_t element_bytes);

// A LongNet language model on one device (or one rank's shard of a sequence), as a trainer sees
// it. T is the type of the parameters and gradients (fp32 for every device; fp64 on the CPU).
template <typename T>
class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  virtual const LongNetConfig& config() const = 0;
  virtual const ModelOptions& options() const = 0;
  virtual const ParamLayout& layout() const = 0;
  // Where params() and grads() live.
  virtual Device device() const = 0;

  // The flat parameter and gradient buffers, layout().total() elements each, on device(). Owned by
  // the model; valid for its lifetime. An optimizer may update params() in place between calls;
  // the next Forward sees the update.
  virtual T* params() = 0;
  virtual const T* params() const = 0;
  virtual T* grads() = 0;
  virtual const T* grads() const = 0;

  // MAGNETO initialisation (longnet_params.h's InitMagneto), computed in fp64 and rounded to T.
  virtual absl::Status InitParams(uint64_t seed) = 0;
  // Copies of the whole flat buffers to and from host arrays of layout().total() elements.
  virtual absl::Status CopyParamsFromHost(const T* host) = 0;
  virtual absl::Status CopyParamsToHost(T* host) = 0;
  virtual absl::Status CopyGradsToHost(T* host) = 0;

  // Runs the model on `batch`: logits for every position and, when targets are given, the loss.
  // Keeps what Backward needs.
  virtual absl::StatusOr<LossResult> Forward(const TokenBatch& batch) = 0;
  // Gradients of options.loss_scale * (the last Forward's loss) with respect to params(), into
  // grads() (or added to them). Needs a successful Forward with targets since; may be repeated.
  virtual absl::Status Backward(const BackwardOptions& options) = 0;
  // The last Forward's logits, [batch * seq_len, vocab_size], converted to T, into host memory.
  // FAILED_PRECONDITION before any Forward.
  virtual absl::Status CopyLogitsToHost(T* host) = 0;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_LANGUAGE_MODEL_H_
