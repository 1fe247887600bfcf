// The communication a training step needs between the data-parallel ranks of a run, as the
// trainer (trainer.h) uses it; one process alone is NewSingleProcessCollective.
//
// A step of a data-parallel run of R ranks (ZeRO-1: each rank owns the optimizer state of one
// contiguous shard of the flat buffers, ShardRanges):
//   1. every rank computes the gradient of its rows of the global batch (scaled so that the sum
//      over ranks is the global mean's gradient);
//   2. ReduceScatterGradients: rank r's shard of grads() becomes the sum over ranks;
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

namespace dattn {
namespace model {

// Elements [begin, end) of a flat buffer.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

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
};

// One process: rank 0 of 1. The reductions have nothing to add (each is the identity on the
// buffers), AllGather and AllGatherBytes return their argument, Barrier returns at once.
std::unique_ptr<TrainerCollective> NewSingleProcessCollective();

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_COLLECTIVE_H_
