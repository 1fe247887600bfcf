// The CUDA model (cuda_longnet.h: bf16 compute on fp32 master weights, one GPU) behind the
// trainer's seam (model/trainable_model.h), with CudaAdamW (cuda_adamw.h) as its ShardOptimizer:
// what makes `dattn-train-gpu --device cuda` and model::Trainer run on a GPU unchanged.
//
//   - params() and grads() are the model's flat fp32 device buffers, in the same layout as the CPU
//     model's, so a checkpoint written by the trainer on either device has the same
//     weights.safetensors and optimizer.safetensors (the fp32 master weights and both fp32 moments,
//     read back from the device) and loads on the other.
//   - ForwardBackward is CudaLongNetLM::Forward (waits for the loss) then Backward (enqueued);
//     Evaluate is Forward, and for predictions the fp32 logits copied to the host and their
//     argmax taken there (ties: the lower id).
//   - NewOptimizer is a CudaAdamW over [begin, end) owning that range's moments, its decay
//     predicate the trainer's: element i decays iff the given AdamW's Decays(i) (so
//     optimizer.decay_embeddings means the same on both devices). GradSumOfSquares is
//     CudaAdamW::SumOfSquares (fp64, a fixed partition: deterministic, but not the CPU's element
//     order, so the norm may differ from the CPU's in the last bits for the same gradient).
//   - Determinism: a step gives the same bits every time within a process (the kernels' reductions
//     have a fixed order); across processes it need not, since cuBLASLt's algorithm for each GEMM
//     shape is chosen by timing in each process, and cuDNN's attention backward (head dims other
//     than 64 and 128) may accumulate in another order. So a run resumed on a GPU continues from
//     the checkpoint's exact state (weights, moments, cursor, Rng) but is not bit-exact with the
//     uninterrupted run; on the CPU it is.
//   - The `num_threads` of NewTrainableModel is ignored (the host side of a step is one thread).
//   - A rank of a run of several GPUs (trainer.h's D x S ranks): its collective is
//     nccl_collective.h's NewCudaCollective over the world's NCCL communicator on the model's
//     stream (CudaTrainableModelStream), so that the reduce-scatter follows the backward pass and
//     precedes the optimizer on one stream; with S > 1 its attention is the ring over the
//     sequence-parallel group's communicator (the overload with `sp` below). docs/TRAINING.md,
//     "Training on several GPUs".
//
// Errors: CudaLongNetLM::Create's (UNAVAILABLE without a usable GPU, INVALID_ARGUMENT for a config
// CheckCudaConfig refuses, RESOURCE_EXHAUSTED naming the bytes); INVALID_ARGUMENT naming the value
// for bad ranges, spans and AdamW arguments (nothing enqueued then); CUDA errors naming the call.
// Device errors of enqueued work surface at the next call that waits (the loss, a sum of squares,
// a copy). Thread-safety: one call at a time per model, its optimizers from the same thread.
#ifndef DATTN_MODEL_CUDA_CUDA_TRAINABLE_MODEL_H_
#define DATTN_MODEL_CUDA_CUDA_TRAINABLE_MODEL_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/ring/ring_attention.h"
#include "model/config.h"
#include "model/cuda/cuda_longnet.h"
#include "model/language_model.h"
#include "model/trainable_model.h"

namespace dattn {
namespace model {
namespace cuda {

// The CUDA model on device cuda_options.device (CUDA_VISIBLE_DEVICES picks which GPU that is);
// its attention is cuda_options.attention_factory's when set (cuda_longnet.h).
absl::StatusOr<std::unique_ptr<TrainableModel>> NewCudaTrainableModel(
    const LongNetConfig& config, const ModelOptions& options,
    const CudaModelOptions& cuda_options = {});

// A sequence-parallel rank's model: the same, its attention the ring over `sp` (the rank's group
// of S GPUs, an NCCL communicator on device cuda_options.device; borrowed, it must outlive the
// model) through cuda_sequence_attention.h's NewCudaRingSequenceAttention on the model's stream.
// The trainer drives it with TrainerOptions::sequence_parallel = S (TokenBatch::positions = this
// rank's slice). sp null or of size 1: the local attention, as above. INVALID_ARGUMENT when
// cuda_options.attention_factory is also set; NewCudaRingSequenceAttention's errors; the above.
absl::StatusOr<std::unique_ptr<TrainableModel>> NewCudaTrainableModel(
    const LongNetConfig& config, const ModelOptions& options, const CudaModelOptions& cuda_options,
    comm::Communicator* sp, const ring::RingOptions& ring_options = {});

// The stream a model made by NewCudaTrainableModel enqueues all its work on: what a collective
// (nccl_collective.h's NewCudaCollective) or anything else that reads grads() or writes params()
// between the model's calls must order its work on (CudaAdamW, the model's optimizer, already
// does). INVALID_ARGUMENT for a model that is not this file's CUDA model.
absl::StatusOr<cudaStream_t> CudaTrainableModelStream(TrainableModel& model);

// Adds "cuda" (NewCudaTrainableModel on device 0) to TrainingDevices() and NewTrainableModel.
// Touches no GPU (a binary can register and still print --help without one). The registry's
// errors (INVALID_ARGUMENT when already registered).
absl::Status RegisterCudaTrainingDevice();

// The nominal dense bf16 tensor-core rate in FLOP/s of a GPU by its name and compute capability,
// the MFU denominator of a CUDA model: 989.4e12 for compute capability 9.0 (H100 SXM, H200,
// GH200), 756e12 for an "H100 PCIe" and 835e12 for an "H100 NVL"; 0 for any other device (no
// figure known: pass --peak-flops). Pure.
double NominalBf16PeakFlops(const std::string& device_name, int major, int minor);

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_CUDA_TRAINABLE_MODEL_H_
