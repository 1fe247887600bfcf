// The trainer's collective (collective.h) over a communicator of the engine (engine/comm): the
// communication of a data-parallel (and sequence-parallel) training step between the W ranks of a
// run, one rank per process, on host memory (the Gloo communicator, gloo_communicator.h).
//
// Deterministic whatever the transport does. The reductions are written here from point-to-point
// operations (Communicator::StartGroup) rather than left to the transport's all-reduce, so that the
// order of every floating-point addition is fixed and documented, and a run gives the same bits
// every time on the same ranks:
//   ReduceScatterGradients: every rank sends each other rank r its copy of rank r's shard; the
//     owner adds, element by element in fp32, the W copies in rank order:
//       shard = ((g_0 + g_1) + g_2) + ... + g_{W-1}
//     (its own copy at its own place in that order). The sum depends on W, never on timing.
//   AllGatherParameters: every rank sends its shard to every other rank, which receives it in
//     place; shards may differ in size by one (ShardRanges), so the equal-count AllGather of the
//     communicator is not used. Copies are exact.
//   AllGather (doubles): Communicator::AllGather in fp64 (copies, no arithmetic).
//   AllGatherBytes: the lengths through AllGather, then every message padded to the longest.
//   Barrier: Communicator::Barrier.
//
// Memory. ReduceScatterGradients works on its shard in chunks: per chunk it receives one copy from
// each of the W - 1 peers and accumulates into one more buffer, so its temporary memory is
// W x chunk floats, chunk = max(1024, options.max_temp_bytes / 4 / W) elements (at most the
// largest shard): at most max(max_temp_bytes, W x 4 KiB) bytes, 64 MiB by default. A chunk round is
// one StartGroup of W - 1 sends and W - 1 receives. AllGatherParameters needs no temporary
// memory (it receives into the parameters). AllGatherBytes holds W x the longest message.
//
// Collective contract: every rank calls the same methods in the same order with the same n and
// shards (ShardRanges(n, W)). The communicator is borrowed (it must outlive the collective), its
// buffers must be host memory (device() kCpu: FAILED_PRECONDITION from every call otherwise), and
// it must not be used by anything else while a call runs (ring attention of a sequence-parallel
// group uses a communicator of its own).
//
// Errors: INVALID_ARGUMENT naming the value for shards that do not tile [0, n) in W pieces; the
// communicator's errors (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, naming the peer), prefixed with
// the call. A communicator error is sticky (communicator.h): every later call fails the same way
// and the buffers are unspecified; the run stops.
// Thread-safety: one call at a time, like the communicator.
#ifndef DATTN_MODEL_COMM_COLLECTIVE_H_
#define DATTN_MODEL_COMM_COLLECTIVE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

#include "engine/comm/communicator.h"
#include "model/collective.h"

namespace dattn {
namespace model {

struct CommCollectiveOptions {
  // Bound on ReduceScatterGradients' temporary buffers (see above); at least W x 4 KiB is used.
  int64_t max_temp_bytes = int64_t{64} << 20;
};

// rank() and world() are the communicator's rank and size.
std::unique_ptr<TrainerCollective> NewCommunicatorCollective(
    comm::Communicator* world, const CommCollectiveOptions& options = {});

// What the collectives over a communicator share, host and GPU (cuda/nccl_collective.h), besides
// collective.h's CheckShardArguments.
//
// The point-to-point operations of round `round` of a reduce-scatter for rank `me`, which moves
// each rank's part of `buffer` in chunks of `chunk` elements: parts[r] is what rank r sums this
// time (its shard, or its shard cut to a range of the buffer: cuda/nccl_collective.h). Round j
// sends every other rank p the j-th chunk of parts[p] and receives the j-th chunk of parts[me] from
// every other rank p into slot(p); `ops` is replaced by them. Returns the length of that chunk of
// parts[me], which starts at parts[me].begin + round * chunk (0: nothing is received this round).
// Every rank computes the same chunks from the same parts, so each send meets its receive.
int64_t ReduceScatterRoundOps(float* buffer, absl::Span<const ShardRange> parts, int me,
                              int64_t round, int64_t chunk,
                              const std::function<float*(int peer)>& slot,
                              std::vector<comm::P2POp>* ops);
// The point-to-point operations of AllGatherParameters for rank `me`: its shard of `buffer` sent to
// every other rank, and each other rank's shard received in place (empty shards move nothing).
std::vector<comm::P2POp> AllGatherShardOps(float* buffer, absl::Span<const ShardRange> shards,
                                           int me);
// AllGatherBytes in terms of an all-gather of fp64 words, `gather(send, k, out)` (out holding
// world x k words, rank-major): the lengths first (exact in fp64 below 2^53), then every message
// padded to the longest and moved as raw words (an all-gather does no arithmetic on them).
using WordGather = std::function<absl::Status(const double* send, int64_t k, double* out)>;
absl::StatusOr<std::vector<std::string>> AllGatherBytesAsWords(const std::string& bytes, int world,
                                                               const WordGather& gather);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_COMM_COLLECTIVE_H_
