// What to do when a running job fails: the coordinator's recovery decision as a pure function.
//
// The preference order follows docs/ARCHITECTURE.md "Failure handling, in order of preference".
// Releasing caches and retrying is the worker's own first step, before a failure reaches the
// coordinator (worker/oom_retry.h), so it is not here.
//
//   any failure, attempts >= max_attempts -> kFail ("recovery attempts exhausted ...")
//   oom:
//     1. micro_batch_size > 1 -> kSplitBatch (half the micro-batch, same placement)
//     2. allow_precision_fallback, dtype "fp32", every survivor supports "bf16"
//          -> kLowerPrecision (bf16, same placement)
//     3. allow_more_ranks, the smallest P' > P dividing seq_len whose memory_per_rank(P') places
//        on `cluster` -> kMoreRanks (a new placement of P' ranks)
//     4. otherwise -> kFail, naming the planner's estimate and the measured free memory
//   peer_lost, worker_dead, comm_timeout:
//     1. allow_shrink, the largest P' in [2, min(P - 1, surviving_ranks)] dividing seq_len whose
//        memory_per_rank(P') places on `survivors` -> kShrinkRing (a placement on survivors)
//     2. allow_single_device, P > 1, memory_per_rank(1) places on a survivor -> kSingleDevice
//     3. otherwise -> kRequeue (restart from the last checkpoint when next placed)
//
// The coordinator's work kinds switch every in-place action off (their attempts end on every rank
// when one fails): it uses the attempts check, kRequeue and kFail here, and runs the same fallbacks
// as new attempts instead: the out-of-memory ladder (server/job_runner.h LadderStep) and the ring
// shrink onto the workers left once they are known (JobRunner::ShrinkStranded).
//
// Every action carries a reason naming the numbers behind it; it is meant for the job's event
// history and for users unchanged. Thread-safety: DecideRecovery is pure; call it from any thread.
#ifndef DATTN_SCHEDULER_RECOVERY_H_
#define DATTN_SCHEDULER_RECOVERY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/types.h"

namespace dattn {
namespace scheduler {

enum class FailureKind {
  kOom,          // A rank ran out of device (or host) memory.
  kPeerLost,     // A ring peer's process or link failed (NCCL/Gloo async error).
  kWorkerDead,   // A worker stopped heartbeating.
  kCommTimeout,  // A collective did not finish by its deadline.
};
// "oom" | "peer_lost" | "worker_dead" | "comm_timeout".
const char* FailureKindName(FailureKind kind);
// Inverse of FailureKindName; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<FailureKind> ParseFailureKind(const std::string& name);

enum class RecoveryKind {
  kSplitBatch,      // Retry on the same placement with micro_batch_size halved.
  kLowerPrecision,  // Retry on the same placement in `dtype` (bf16).
  kMoreRanks,       // Restart on `worker_ids`: num_ranks > the failed attempt's ranks.
  kShrinkRing,      // Continue on the survivors: `worker_ids` (num_ranks < the failed attempt's).
  kSingleDevice,    // Continue on one survivor: `worker_ids` has one entry.
  kRequeue,         // Put the job back in the queue (same submit_seq) to restart from a checkpoint.
  kFail,            // Give up; `reason` says why.
};
// "split_batch" | "lower_precision" | "more_ranks" | "shrink_ring" | "single_device" | "requeue" |
// "fail".
const char* RecoveryKindName(RecoveryKind kind);

// Memory one rank needs when the job runs on `num_ranks` ranks, at the failed attempt's dtype and
// micro-batch (the engine's memory planner), or nullopt if the job cannot run on that many ranks.
using MemoryPerRankFn = std::function<std::optional<int64_t>(int num_ranks)>;

struct RecoveryInput {
  FailureKind failure = FailureKind::kPeerLost;
  int num_ranks = 1;             // P of the failed attempt, >= 1.
  int surviving_ranks = 0;       // Ranks of that attempt still healthy, in [0, P].
  int64_t seq_len = 1;           // N, >= 1; every ring size must divide it (docs/ENGINE.md).
  int64_t micro_batch_size = 1;  // Sequences a rank processes at once, >= 1.
  std::string dtype = "fp32";    // Of the failed attempt; non-empty.
  bool needs_gpu = true;
  int attempts = 0;      // Recoveries already made for this job, >= 0.
  int max_attempts = 3;  // >= 0.
  bool allow_shrink = true;
  bool allow_single_device = true;
  bool allow_precision_fallback = true;
  bool allow_more_ranks = true;
  // The workers that still hold healthy ranks of the job, with free memory and slots counted as
  // they will be once the failed attempt's own ranks have released theirs. For oom: all of the
  // job's workers (used to check bf16 support). Placements use only the ready ones.
  std::vector<WorkerInfo> survivors;
  // oom only: workers a larger ring may use, counted the same way (the job's own and idle ones).
  std::vector<WorkerInfo> cluster;
  MemoryPerRankFn memory_per_rank;  // Required.
  // oom only, for the failure message: free memory the failing rank measured when it ran out.
  int64_t oom_free_memory_bytes = 0;
};

struct RecoveryAction {
  RecoveryKind kind = RecoveryKind::kFail;
  int num_ranks = 0;  // Ranks of the next attempt (the failed attempt's for kFail).
  // Rank -> worker for kMoreRanks, kShrinkRing and kSingleDevice; empty otherwise.
  std::vector<std::string> worker_ids;
  std::string dtype;                  // Of the next attempt.
  int64_t micro_batch_size = 0;       // Of the next attempt.
  int64_t memory_per_rank_bytes = 0;  // Planner estimate for the next attempt (0 if not computed).
  std::string reason;
};

// The action to take, or INVALID_ARGUMENT naming the bad field (P < 1, surviving_ranks outside
// [0, P], seq_len or micro_batch_size < 1, empty dtype, negative attempts, missing memory_per_rank,
// an invalid worker list).
absl::StatusOr<RecoveryAction> DecideRecovery(const RecoveryInput& input);

}  // namespace scheduler
}  // namespace dattn

#endif  // DATTN_SCHEDULER_RECOVERY_H_
