// Sequence-parallel attention of a GPU rank: the ring engine (engine/ring/ring_attention.h) with
// the CUDA block kernels (engine/ring/cuda_block_kernels.h) behind the model's SequenceAttention
// (ring_sequence_attention.h), on the CUDA model's own stream. A rank of a sequence-parallel group
// of S GPUs makes its model with it (CudaModelOptions::attention_factory, or
// cuda_trainable_model.h's NewCudaTrainableModel(..., sp)) and is driven with TokenBatch::
// positions = {s N / S, N} (trainer.h does so with TrainerOptions::sequence_parallel = S).
//
// What runs where. The block kernels are created on `stream` (the model's, passed by the factory)
// and device `device`, so every attention kernel, pack and add is ordered between the model's own
// kernels with no host synchronization; the exchange runs on `sp`'s stream (NCCL point-to-point
// groups ordered after `stream` and waited for on it by events). The ring itself synchronizes the
// host twice per call, bounded by `sp`'s timeout: the agreement check (a small all-gather of the
// call's fingerprint, RingOptions::check_agreement, default on: a rank whose shapes differ is
// FAILED_PRECONDITION everywhere instead of a hang) and Communicator::Synchronize at the end of
// every Forward and Backward (so that a dead peer is DEADLINE_EXCEEDED or UNAVAILABLE naming it).
// That is two host waits per call, four per layer and step (six with activation checkpointing's
// recomputed forward): small against long sequences' attention, noticeable for short ones.
//
// Views. The kernels read q, k, v through any strides (the model's [B, n, H, dh] views into its
// [M, 3d] projection output, strides {n 3d, 3d, dh, 1}) and write out, lse, dq, dk, dv contiguous,
// as the model lays them out: no packing or copying of the model's tensors. Blocks of segments that
// span shards are packed by the ring into its exchange buffers (RingPlan::buffer_bytes, from the
// kernels' stream-ordered pool; PlanTrainingRankMemory counts them).
//
// Ownership: the result owns the kernels (and their pool); `sp` and `stream` are borrowed and must
// outlive it (the model destroys its attention before its stream). `sp` must carry only the ring's
// traffic while a call runs (the trainer's collective uses the world communicator). Errors at
// creation: INVALID_ARGUMENT for a null communicator or stream, FAILED_PRECONDITION for a
// communicator that is not on CUDA memory, NewCudaBlockKernels' (UNAVAILABLE without the device,
// FAILED_PRECONDITION before compute capability 9.0 or cuDNN 9); per call,
// ring_sequence_attention.h's and ring_attention.h's. Thread-safety: one call at a time.
#ifndef DATTN_MODEL_CUDA_CUDA_SEQUENCE_ATTENTION_H_
#define DATTN_MODEL_CUDA_CUDA_SEQUENCE_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/ring/ring_attention.h"
#include "model/sequence_attention.h"

namespace dattn {
namespace model {
namespace cuda {

absl::StatusOr<std::unique_ptr<SequenceAttention>> NewCudaRingSequenceAttention(
    comm::Communicator* sp, cudaStream_t stream, int device, ring::RingOptions options = {});

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_CUDA_SEQUENCE_ATTENTION_H_
