// The host memory one CPU training rank needs, before anything is allocated: the coordinator
// reserves this figure on the worker that runs the rank, and the worker can refuse a task that does
// not fit. A rank of a run of W = D x S ranks (trainer.h: D data-parallel groups of S sequence
// ranks) on the CPU model (fp32) with config.threads threads.
//
// What is counted (bytes), the memory the rank adds to its process:
//   persistent   the fp32 parameters and gradients, whole (2 x 4 P), and this rank's AdamW moments
//                (2 x 4 x its ZeRO-1 shard, ceil(P / W) elements);
//   step         the model's buffers for one micro-batch of (batch_size / micro_batches / D) rows x
//                (N / S) positions (LongNetLM::BufferElements: per block 9 M d + 3 M F + M (H + 8)
//                elements, or with checkpoint_activations M d per block plus one block's set; the
//                final norm, logits and their gradient 2 M V, backward scratch 6 M d + 2 M F),
//                its token copies, and the retrieval evaluation's buffers too when that shape
//                differs (the allocator may keep the freed set; validation batches are assumed to
//                have the training micro-batch's shape, which they have unless the held-out split
//                holds fewer windows than a global micro-batch); the attention engine's workspace
//                and, for S > 1, the ring's exchange buffers of the largest rank (engine/
//                rank_memory_plan.h's PlanLargestRankMemory for the micro-batch, forward and
//                backward); the trainer's host batches; the layer ops' per-call scratch;
//   save         on top of the step's (a checkpoint is written with the buffers in place): W = 1,
//                version 1: copies of the weights and both moments (12 P) and the largest file
//                mapped for its digest (8 P); W > 1: this rank's weights range and moment shard
//                copied and the larger of its two files mapped (checkpoint.h);
//   resume       before the first step (no activations yet): a copy of the weights (4 P) and of
//                this rank's moments, the checkpoint's weights read through their mapping (4 P) and
//                its moment range, or, while the digests are verified, the largest file mapped
//                (bounded by 8 P: a version 1 checkpoint's optimizer file);
//   runtime      an allowance for what the libraries keep: kRuntimeBaseBytes, plus
//                kRuntimePerThreadBytes per thread (OpenBLAS's packing buffers, thread stacks,
//                malloc arenas) and, for W > 1, kRuntimePerPeerBytes per peer (Gloo's pairs).
// total = persistent + max(step + save, resume) + runtime.
//
// model/training_memory_test holds the figure to the peak resident memory that ranks add to their
// processes (VmHWM) over a resume, a step, an evaluation and a save, at 1x1, 1x2 and 2x1: never
// under it and at most 25% over; and the model's part to its allocations exactly.
//
// Pure and thread-safe.
#ifndef DATTN_MODEL_TRAINING_MEMORY_H_
#define DATTN_MODEL_TRAINING_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/trainer_config.h"

namespace dattn {
namespace model {

inline constexpr int64_t kRuntimeBaseBytes = int64_t{16} << 20;
inline constexpr int64_t kRuntimePerThreadBytes = int64_t{6} << 20;
inline constexpr int64_t kRuntimePerPeerBytes = int64_t{1} << 20;

struct CpuTrainingRankMemory {
  int64_t params_bytes = 0;      // 4 P.
  int64_t grads_bytes = 0;       // 4 P.
  int64_t moments_bytes = 0;     // 8 x this rank's shard (the largest shard).
  int64_t activation_bytes = 0;  // The model's buffers and token copies, training (+ retrieval).
  int64_t attention_bytes = 0;   // The engine's workspace (CPU backend or ring kernels).
  int64_t ring_bytes = 0;        // The ring's exchange buffers (S > 1), largest rank.
  int64_t trainer_bytes = 0;     // Host batches and layer-ops scratch.
  int64_t save_bytes = 0;        // Transient during a save (on top of the step's).
  int64_t resume_bytes = 0;      // Transient during a resume (before the first step).
  int64_t runtime_bytes = 0;     // The libraries' allowance.
  int64_t total_bytes = 0;
  // One line: "params 1.00 MiB + grads 1.00 MiB + moments ... = total".
  std::string breakdown;
};

// The plan for one rank of a run of data_parallel x sequence_parallel ranks with `config`
// (config.threads threads; 0: the machine's cores). INVALID_ARGUMENT naming the value for a config
// ValidateTrainerConfig refuses, degrees < 1, a seq_len (or retrieval.seq_len) that S does not
// divide, a batch_size that micro_batches x D does not divide, or byte counts past int64; the
// attention planner's errors.
absl::StatusOr<CpuTrainingRankMemory> PlanCpuTrainingRankMemory(const TrainerConfig& config,
                                                                int data_parallel,
                                                                int sequence_parallel);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TRAINING_MEMORY_H_
