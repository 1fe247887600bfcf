// The trainer's collective (model/collective.h) on GPUs: the communication of a data-parallel (and
// sequence-parallel) training step between the W ranks of a run, one GPU per rank, over a CUDA
// communicator of the engine (engine/comm/nccl_communicator.h), working in place on the CUDA
// model's fp32 device buffers (TrainableModel::params()/grads()). The GPU sibling of
// comm_collective.h (host memory, Gloo), with the same arithmetic.
//
// Streams. Every call is ordered on `stream`, the model's stream (CudaTrainableModelStream) (the
// ranges handed during a backward on a stream of the collective's own, below): the
// transfers start after the work queued there (the backward pass, the optimizer's update) and
// what follows on it (the optimizer, the next forward) sees their results, through events, with
// no host synchronization for the ordering itself. Point-to-point groups run on the
// communicator's own stream (Communicator::StartGroup(ops, after = stream), then Work::Wait
// (stream)); the add kernel runs on `stream`.
//
// Deterministic, and bit-identical to comm_collective.h. The reductions are written from
// point-to-point operations instead of NCCL's all-reduce:
//   ReduceScatterGradients: every rank sends each other rank r its copy of rank r's shard (one
//     StartGroup of W - 1 sends and W - 1 receives per chunk round); the owner adds the W copies
//     element by element in fp32, in rank order (SumInRankOrder, collective_kernels.h):
//       shard = ((g_0 + g_1) + g_2) + ... + g_{W-1}
//     its own copy at its own place in that order. The sum depends on W only, never on timing,
//     topology, message size or the NCCL version, and equals the host loop of comm_collective.h
//     bit for bit (a run on Gloo and one on NCCL reduce the same gradients to the same bits).
//     Each rank moves (W - 1) / W of the buffer each way, half of what an all-reduce moves.
//   The same, range by range while the backward runs (collective.h's BeginGradientReduction,
//     GradientsFinal, FinishGradientReduction; reduces_ranges_early() is true for W > 1): a
//     handed range [a, b) is reduced as above with each rank's part of it being [a, b) cut to
//     its shard, on the collective's own stream (created with the collective), which waits for
//     the model's stream up to the hand-over (an event) and never for the rest of the backward.
//     So a block's gradients move, and are added, while the backward of the blocks below it
//     computes. FinishGradientReduction reduces the ranges never handed, then makes the model's
//     stream wait for the collective's (an event) and ends as ReduceScatterGradients does. The
//     bits are those of ReduceScatterGradients: the same sum in rank order per element. The
//     receive buffer is the same (slots sized for a whole shard), reused in stream order.
//   AllGatherParameters: every rank sends its shard to every other rank, which receives it in
//     place (shards differ in size by at most one, ShardRanges, so NCCL's equal-count all-gather
//     does not fit). Copies are exact, so every rank ends with the same bits.
//   AllGather (doubles), AllGatherBytes: host values through a device staging buffer and
//     Communicator::AllGather on `stream` (bytes: the lengths first, then every message padded to
//     the longest, moved as fp64 words: copies, no arithmetic), each wait Communicator::
//     Synchronize(stream): a host wait bounded by the communicator's timeout.
//   Barrier: Communicator::Barrier.
// Why not NCCL's all-reduce (which the contract allows: every rank gets the same bits): its order
// of addition is NCCL's choice of algorithm (ring, tree, NVLS, CollNet), protocol, channel count
// and chunking, which follow the message size, the topology, the NCCL version and NCCL_ALGO /
// NCCL_PROTO; NCCL documents its results as reproducible only when all of these are the same. So a
// resumed run on another machine, another W's chunking or another NCCL could add in another order,
// and a run on Gloo would differ from one on NCCL. It also moves twice the bytes of a
// reduce-scatter. The cost of writing it ourselves: W - 1 concurrent peers per group (NCCL's
// all-to-all pattern) and one small add kernel per chunk.
//
// Host waits. AllGather, AllGatherBytes and Barrier return host values, so they wait (bounded, as
// above). ReduceScatterGradients and AllGatherParameters end with Communicator::Synchronize
// (stream) when options.wait_on_host (the default): the trainer reads on the host right after
// each (the reduced shard's sum of squares; the next forward's loss), so the wait costs about a
// launch latency, and it turns a dead or stuck peer into DEADLINE_EXCEEDED or UNAVAILABLE from the
// collective, naming it, instead of a cudaStreamSynchronize in the model or the optimizer that
// never returns. With wait_on_host false they only enqueue and return (errors then surface at
// the next Synchronize of the communicator, e.g. in the next AllGather).
//
// Memory (cudaMalloc, on the stream's device): ReduceScatterGradients' receive buffer of
// (W - 1) x chunk fp32, chunk = CollectiveChunkElements(largest shard, W, options.max_temp_bytes)
// (training_plan.h), allocated at the first call and kept (at most max(max_temp_bytes, (W - 1) x
// 4 KiB), 64 MiB by default); the staging buffer of host values, kCollectiveStagingBytes at
// creation, grown for larger messages. CollectiveDeviceBytes counts both; PlanTrainingRankMemory
// adds them to a rank's plan. AllGatherParameters needs nothing (it receives into the
// parameters).
//
// Collective contract (collective.h): every rank calls the same methods in the same order with the
// same n and shards (ShardRanges(n, W)). `world` and `stream` are borrowed: they must stay valid
// while calls are made, and not longer (the destructor uses neither: the trainer borrows the
// collective and owns the model, whose stream may therefore go first; cudaFree of the buffers may
// wait for the device, so abort a broken communicator before destroying the collective). `world`
// must not be used by anything else while a call runs (a sequence-parallel group's ring attention
// uses a communicator of its own). Each call makes the stream's device current on the calling
// thread.
//
// Errors: INVALID_ARGUMENT for a null communicator or stream at creation, and naming the value for
// shards that do not tile [0, n) in W pieces (nothing is communicated then); FAILED_PRECONDITION
// for a communicator whose buffers are not CUDA memory; CUDA errors naming the call
// (RESOURCE_EXHAUSTED when memory runs out); the communicator's errors (UNAVAILABLE,
// DEADLINE_EXCEEDED, ABORTED, naming the peer), prefixed with the call. A communicator error is
// sticky: every later call fails the same way and the buffers are unspecified; the run stops.
// Thread-safety: one call at a time, like the communicator.
#ifndef DATTN_MODEL_CUDA_NCCL_COLLECTIVE_H_
#define DATTN_MODEL_CUDA_NCCL_COLLECTIVE_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "model/collective.h"
#include "model/cuda/training_plan.h"

namespace dattn {
namespace model {
namespace cuda {

// rank() and world() are the communicator's. Allocates the staging buffer on the stream's device.
absl::StatusOr<std::unique_ptr<TrainerCollective>> NewCudaCollective(
    comm::Communicator* world, cudaStream_t stream, const CudaCollectiveOptions& options = {});

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_NCCL_COLLECTIVE_H_
