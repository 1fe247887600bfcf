// Gang placement of one job on a set of workers, and whether a job could ever fit the cluster.
//
// A rank needs one free slot on a worker and memory_per_rank_bytes of that worker's memory; k ranks
// on one worker need k slots and k * memory_per_rank_bytes. Only ready workers of the job's device
// kind that support its dtype are used (IsEligible in types.h).
//
// All functions are pure and may be called from any thread.
#ifndef DATTN_SCHEDULER_PLACEMENT_H_
#define DATTN_SCHEDULER_PLACEMENT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/types.h"

namespace dattn {
namespace scheduler {

// Places all of `job`'s ranks on `workers` as they are now (free memory, free slots), or none.
//
// Best fit: ranks go first to the eligible worker with the least free memory that still holds one
// more rank (ties: smaller worker id), and a worker takes as many ranks as it can before the next
// is used. This keeps large workers free for large jobs, packs a CPU job's ranks onto few hosts,
// and is deterministic. Because ranks are identical, it finds a placement whenever one exists.
//
// Returns a Placement with job.num_ranks entries (ranks on one worker are consecutive), nullopt if
// the job does not fit now, or INVALID_ARGUMENT if the job or a worker fails validation (types.h).
absl::StatusOr<std::optional<Placement>> TryPlace(const JobRequest& job,
                                                  const std::vector<WorkerInfo>& workers);

// Whether a job could ever fit the cluster: placement against each ready worker's total memory and
// max_ranks, as if nothing else ran. Draining and dead workers do not count; an empty cluster fits
// nothing (a caller that accepts jobs before any worker registers should not reject on this).
struct Feasibility {
  bool feasible = false;
  // Most ranks of this job the cluster could host at once, counting whole workers (0 if none).
  int max_ranks = 0;
  // Why, with numbers, for a user. Infeasible: "needs 4 ranks x 3.2 GiB (GPU, bf16); at most 2
  // ranks can ever fit: 2 of 3 ready GPU workers supporting bf16 have >= 3.2 GiB total memory
  // (largest 8 GiB), room for 2 ranks in all". Feasible: "fits: up to 8 ranks on 8 ready GPU
  // workers supporting bf16".
  std::string reason;
};
// An invalid job or worker list is infeasible, with the validation error as the reason.
Feasibility CheckFeasible(const JobRequest& job, const std::vector<WorkerInfo>& workers);

}  // namespace scheduler
}  // namespace dattn

#endif  // DATTN_SCHEDULER_PLACEMENT_H_
