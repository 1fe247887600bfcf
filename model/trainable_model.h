// What the trainer needs of a model on one device, and of the optimizer that updates it there: the
// seam between the training loop (trainer.h, written once) and a device's model (the CPU model
// here, NewCpuTrainableModel; the CUDA model in cuda/cuda_trainable_model.h,
// NewCudaTrainableModel).
//
// TrainableModel: forward and backward on a batch of tokens returning the loss, forward alone for
// evaluation, and the flat fp32 parameter and gradient buffers that layout() describes
// (model/param_layout.h; for the LongNet model, longnet_params.h's BuildParamLayout). Whatever the
// compute type (fp32 on the CPU, bf16 products on a GPU), params() are the fp32 master weights
// and grads() fp32 gradients, so the optimizer, the gradient reduction and the checkpoints are the
// same for every device.
//
// ShardOptimizer: AdamW (optimizer.h's formula, bit for bit on the CPU) over one contiguous range
// [begin, end) of those buffers, owning the two fp32 moments of that range on the model's device.
// A single process uses one shard covering everything; a ZeRO-1 rank of a data-parallel ring
// uses its own range after a reduce-scatter of the gradients (collective.h), and every rank's
// clipping factor comes from the per-shard sums of squares (GradSumOfSquares) added in rank order.
//
// Implementing it for another device:
//   - ForwardBackward must leave grads() = (or +=, BackwardOptions::grads) loss_scale times the
//     gradient of the mean loss over the batch's scored targets, in fp32, and return the fp64
//     loss sum and target count of the batch (LongNetLM::Forward's LossResult); and call
//     BackwardOptions::on_grads_final for each range of grads() as it becomes final (both models
//     here do, per block). A model that never calls it still trains: the trainer's reduction
//     then takes the whole buffer after the backward (collective.h).
//   - params()/grads() are device pointers; ReadParams/WriteParams copy ranges to and from host
//     memory (checkpoints, initialisation from the host).
//   - NewOptimizer returns the device's AdamW over a range; its Update must follow optimizer.h's
//     formula with the per-step factors computed in fp64 and rounded to fp32 (the CPU's result is
//     the reference; a fused kernel may differ from it in the last bit where it contracts a
//     multiply and an add, which breaks only CPU-vs-GPU bit equality, never resume).
//
// Errors: INVALID_ARGUMENT naming the bad value for bad inputs (checked before anything changes),
// the device's errors otherwise (then grads() and, for Update, the shard's parameters and moments
// are unspecified: the trainer stops).
// Thread-safety: one call at a time per model, and the model's optimizers are used from the same
// thread as the model (they share its buffers and device). The device registry
// (RegisterTrainingDevice, TrainingDevices, NewTrainableModel) is thread-safe.
//
// Devices of a build: "cpu" always. Others are registered by the binary that links them, before
// it parses a config: dattn-train-gpu's main calls cuda::RegisterCudaTrainingDevice(), which adds
// "cuda"; dattn-train links no CUDA library and so has only "cpu" (its error for "cuda" names
// dattn-train-gpu). No static initialiser registers anything.
#ifndef DATTN_MODEL_TRAINABLE_MODEL_H_
#define DATTN_MODEL_TRAINABLE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/config.h"
#include "model/longnet.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {

// AdamW over elements [begin(), end()) of a model's flat buffers; the moments of that range are
// owned here (zero when created) and live on the model's device.
class ShardOptimizer {
 public:
  virtual ~ShardOptimizer() = default;

  virtual int64_t begin() const = 0;
  virtual int64_t end() const = 0;

  // Sum of g^2 over grads()[begin, end), in fp64 in element order (optimizer.h's SumOfSquares):
  // this shard's share of the squared global norm. Call it once grads()[begin, end) holds the
  // reduced gradient.
  virtual absl::StatusOr<double> GradSumOfSquares() = 0;

  // One AdamW update (optimizer.h) of params()[begin, end) from grads()[begin, end) and this
  // shard's moments. INVALID_ARGUMENT for bad args (AdamW::Update's rules), nothing written then.
  virtual absl::Status Update(const AdamWStepArgs& args) = 0;

  // Copies of the moments to and from host arrays of end() - begin() elements (checkpoints).
  // INVALID_ARGUMENT for spans of another length.
  virtual absl::Status ReadMoments(absl::Span<float> m, absl::Span<float> v) = 0;
  virtual absl::Status WriteMoments(absl::Span<const float> m, absl::Span<const float> v) = 0;
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;

  virtual const LongNetConfig& config() const = 0;
  // The layout of params() and grads(): layout().total() fp32 elements each.
  virtual const ParamLayout& layout() const = 0;
  // Whether blocks are recomputed in the backward pass (ModelOptions::checkpoint_activations).
  virtual bool checkpoint_activations() const = 0;
  // A short description for logs, e.g. "cpu fp32, 2 threads".
  virtual std::string description() const = 0;

  // FLOPs of ForwardBackward (forward + backward) on `batch` sequences of `seq_len` tokens, as
  // LongNetLM's CountFlops counts them (the work the model does, recomputation included).
  virtual double TrainingFlops(int64_t batch, int64_t seq_len) const = 0;

  // The device's nominal dense peak in FLOP/s for the model's compute type (a GPU: its bf16 tensor
  // core rate), the default denominator of MFU; 0 when there is no such figure (the CPU, whose
  // rate dattn-train measures instead).
  virtual double NominalPeakFlops() const { return 0; }

  // MAGNETO initialisation from `seed` (longnet_params.h's InitMagneto, rounded to fp32).
  virtual absl::Status InitParams(uint64_t seed) = 0;

  // Forward with targets, then backward: grads() := (kOverwrite) or += (kAdd) options.loss_scale
  // times the gradient of the batch's mean loss. Returns the batch's loss. batch.targets must not
  // be null.
  virtual absl::StatusOr<LossResult> ForwardBackward(const TokenBatch& batch,
                                                     const BackwardOptions& options) = 0;

  // Forward only. The loss when batch.targets is given (else a zero LossResult). When
  // `predictions` is not empty it must hold batch * seq_len elements and receives, per position,
  // the id of the largest logit (ties: the lower id). grads() are not touched.
  virtual absl::StatusOr<LossResult> Evaluate(const TokenBatch& batch,
                                              absl::Span<int32_t> predictions) = 0;

  // The fp32 master weights and their gradients on the model's device, layout().total() elements
  // each; owned by the model and valid for its lifetime. A collective (collective.h) reads and
  // writes them in place between calls.
  virtual float* params() = 0;
  virtual float* grads() = 0;

  // Copies of params()[begin, begin + n) to and from host memory. INVALID_ARGUMENT naming the range
  // when it does not lie in [0, layout().total()).
  virtual absl::Status ReadParams(int64_t begin, absl::Span<float> out) = 0;
  virtual absl::Status WriteParams(int64_t begin, absl::Span<const float> in) = 0;

  // AdamW over [begin, end) of this model's buffers, with zero moments. `adamw` is copied.
  // INVALID_ARGUMENT for a range outside [0, layout().total()] or empty, or an `adamw` made for
  // another number of elements.
  virtual absl::StatusOr<std::unique_ptr<ShardOptimizer>> NewOptimizer(const AdamW& adamw,
                                                                       int64_t begin,
                                                                       int64_t end) = 0;
};

// The CPU model (LongNetLM<float> on OpenBLAS and the engine's CPU backend) with `num_threads`
// threads (0: all cores); its optimizer runs AdamW::Update on the host buffers. Errors are
// LongNetLM::CreateCpu's.
absl::StatusOr<std::unique_ptr<TrainableModel>> NewCpuTrainableModel(const LongNetConfig& config,
                                                                     const ModelOptions& options,
                                                                     int num_threads);

// The same CPU model with its attention given (owned by the model): a sequence-parallel rank's
// model is made with ring_sequence_attention.h's NewCpuRingSequenceAttention over the rank's
// sequence-parallel communicator, and is then driven by the trainer with TrainerOptions::
// sequence_parallel set. The attention must be on the CPU. Errors are LongNetLM::Create's
// (INVALID_ARGUMENT for a null attention or one on another device).
absl::StatusOr<std::unique_ptr<TrainableModel>> NewCpuTrainableModel(
    const LongNetConfig& config, const ModelOptions& options, int num_threads,
    std::unique_ptr<SequenceAttention> attention);

// Makes a model on one device: (config, options, CPU threads) -> model.
using TrainableModelFactory = std::function<absl::StatusOr<std::unique_ptr<TrainableModel>>(
    const LongNetConfig& config, const ModelOptions& options, int num_threads)>;

// Adds `name` to TrainingDevices() and NewTrainableModel, for this process. INVALID_ARGUMENT naming
// the name for an empty one, "cpu", or one already registered; for a null factory.
absl::Status RegisterTrainingDevice(const std::string& name, TrainableModelFactory factory);

// The devices NewTrainableModel can make a model for in this process: "cpu", then the registered
// ones in the order they were registered.
std::vector<std::string> TrainingDevices();

// Why `device` cannot be used here: "\"<device>\" is not available in this build (cpu, ...)", and
// for "cuda" in a process that did not register it, where GPU training is (dattn-train-gpu).
std::string UnavailableDeviceMessage(const std::string& device);

// A model on `device` (one of TrainingDevices()). INVALID_ARGUMENT with UnavailableDeviceMessage
// otherwise; the device's creation errors.
absl::StatusOr<std::unique_ptr<TrainableModel>> NewTrainableModel(const std::string& device,
                                                                  const LongNetConfig& config,
                                                                  const ModelOptions& options,
                                                                  int num_threads);

// The ShardOptimizer of a model whose buffers are host memory: AdamW::Update and SumOfSquares on
// params[begin, end) and grads[begin, end) (both borrowed: they must outlive the optimizer).
// INVALID_ARGUMENT as for NewOptimizer.
absl::StatusOr<std::unique_ptr<ShardOptimizer>> NewHostShardOptimizer(const AdamW& adamw,
                                                                      float* params,
                                                                      const float* grads,
                                                                      int64_t begin, int64_t end);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TRAINABLE_MODEL_H_
