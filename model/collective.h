// The communication a training step needs between the data-parallel ranks of a run, as the
// trainer (trainer.h) uses it; one process alone is NewSingleProcessCollective.
//
// A step of a data-parallel run of R ranks (ZeRO-1: each rank owns the optimizer state of one
// contiguous shard of the flat buffers, ShardRanges):
//   1. every rank computes the gradient of its rows of the global batch (scaled so that the sum
//      over ranks is the global mean's gradient);
//   2. ReduceScatterGradients: rank r's shard of grads() becomes the sum over ranks (or the same
//      handed over range by range while the backward runs: BeginGradientReduction below);
//   3. each rank's sum of squares of its shard (ShardOptimizer::GradSumOfSquares), AllGather'ed
//      and added in rank order (optimizer.h's GlobalNorm): every rank gets the same norm, hence
//      the same clipping factor;
//   4. each rank updates its shard (ShardOptimizer::Update);
//   5. AllGatherParameters: every rank's params() becomes the whole updated buffer.
// The loss and target counts are AllGather'ed the same way (fp64, added in rank order), so every
// rank reports the same loss. With sequence parallelism (trainer.h, TrainerOptions::
// sequence_parallel) the collective spans every rank of the run, data-parallel and sequence ranks
// alike: each rank's gradient is a partial sum over its slice of positions of the same parameters,
// so the reduce-scatter adds them all, and the optimizer state is sharded over the whole world.
// The attention exchange inside a sequence-parallel group is the model's business
// (sequence_attention.h, ring_sequence_attention.h), not this interface's. Sharded checkpoints use
// AllGatherBytes (each rank's file names, sizes and digests) and Barrier.
//
// Implementations: NewSingleProcessCollective (here), NewCommunicatorCollective
// (comm_collective.h: any comm::Communicator on host memory, e.g. Gloo).
//
// Buffers are the model's (TrainableModel::params()/grads(): fp32, on its device). Errors are the
// transport's; after one, the run stops (buffers are unspecified).
// Thread-safety: one call at a time; every rank makes the same calls in the same order.
#ifndef DATTN_MODEL_COLLECTIVE_H_
#define DATTN_MODEL_COLLECTIVE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/param_layout.h"

namespace dattn {
namespace model {

// Elements [begin, end) of a flat buffer (param_layout.h).
using ShardRange = ElementRange;

// `world` contiguous shards covering [0, total): shard r is [r * total / world, (r + 1) * total /
// world) (rounded down), so sizes differ by at most one. total >= world >= 1.
std::vector<ShardRange> ShardRanges(int64_t total, int world);

class TrainerCollective {
 public:
  virtual ~TrainerCollective() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;

  // On return, grads[shards[rank()]] holds the sum over ranks of that range of every rank's grads
  // (n elements; other ranges are unspecified). An all-reduce also satisfies this.
  virtual absl::Status ReduceScatterGradients(float* grads, int64_t n,
                                              absl::Span<const ShardRange> shards) = 0;
  // On return, params[shards[r]] holds rank r's values of that range for every r.
  virtual absl::Status AllGatherParameters(float* params, int64_t n,
                                           absl::Span<const ShardRange> shards) = 0;
  // Every rank's `values` (the same count on every rank), rank-major: result[r * k + i] is rank
  // r's values[i].
  virtual absl::StatusOr<std::vector<double>> AllGather(absl::Span<const double> values) = 0;
  // Every rank's `bytes` (any length, which may differ between ranks), by rank: result[r] is rank
  // r's. For small messages (checkpoint file lists, statuses): each rank holds every message.
  virtual absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes) = 0;
  // Returns once every rank has called Barrier.
  virtual absl::Status Barrier() = 0;

  // --- The gradient reduction handed over range by range, as the backward finishes them.
  //
  // Instead of ReduceScatterGradients after the backward, a step may call
  //   BeginGradientReduction(grads, n, shards);  // before the (last micro-batch's) backward
  //   GradientsFinal(begin, end);                // for each range, once, when it is final
  //                                              // (BackwardOptions::on_grads_final)
  //   FinishGradientReduction();                 // after the backward
  // and an implementation that can (reduces_ranges_early(): nccl_collective.h) starts moving a
  // range while the backward of the blocks below it still runs. On return from Finish the buffer
  // is what ReduceScatterGradients(grads, n, shards) leaves, bit for bit: each element is the same
  // sum in rank order whichever range carried it. Ranges never handed are reduced by Finish (a
  // model that hands none gives the plain reduce-scatter). Every rank hands the same ranges in the
  // same order. The others (the default: NewSingleProcessCollective, comm_collective.h) only check
  // the ranges and reduce the whole buffer in Finish.
  //
  // Begin discards a reduction a failed step left open (communicating nothing for it).
  // Errors: FAILED_PRECONDITION for GradientsFinal / Finish without an open reduction;
  // INVALID_ARGUMENT naming the value for Begin's arguments (as CheckShardArguments)
  // and for a range that is empty, leaves [0, n) or overlaps one already handed (nothing is
  // reduced for it); the transport's errors, as ReduceScatterGradients's. Finish closes the
  // reduction whatever it returns; after a transport error the buffer is unspecified.
  absl::Status BeginGradientReduction(float* grads, int64_t n, absl::Span<const ShardRange> shards);
  absl::Status GradientsFinal(int64_t begin, int64_t end);
  absl::Status FinishGradientReduction();
  // Whether GradientsFinal starts the range's reduction at once (true) or everything waits for
  // Finish (false). A trainer hands ranges only to a collective that reduces them early.
  virtual bool reduces_ranges_early() const { return false; }

 protected:
  // With reduces_ranges_early(): start reducing [begin, end) of `grads` (sharded as `shards`),
  // called with checked, disjoint ranges, by GradientsFinal and then by Finish for the ranges never
  // handed, in ascending order. The default returns UNIMPLEMENTED.
  virtual absl::Status ReduceGradientRange(float* grads, int64_t begin, int64_t end,
                                           absl::Span<const ShardRange> shards);
  // With reduces_ranges_early(): after every range has been started, complete them all (on return
  // the buffer is as ReduceScatterGradients's return leaves it). The default returns OK.
  virtual absl::Status FinishGradientRanges();

 private:
  bool reduction_open_ = false;
  float* reduction_grads_ = nullptr;
  int64_t reduction_n_ = 0;
  std::vector<ShardRange> reduction_shards_;
  std::vector<ElementRange> handed_;  // Sorted by begin, disjoint.
};

// The checks of ReduceScatterGradients', AllGatherParameters' and BeginGradientReduction's
// arguments: a buffer (not null, n >= 0) and `world` shards that tile [0, n) in rank order.
// INVALID_ARGUMENT naming `call` and the bad value.
absl::Status CheckShardArguments(const char* call, const float* buffer, int64_t n,
                                 absl::Span<const ShardRange> shards, int world);

// One process: rank 0 of 1. The reductions have nothing to add (each is the identity on the
// buffers), AllGather and AllGatherBytes return their argument, Barrier returns at once.
std::unique_ptr<TrainerCollective> NewSingleProcessCollective();

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_COLLECTIVE_H_
