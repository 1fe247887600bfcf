// Builders for workers and jobs, and an independent check that placements fit, for the scheduler's
// tests only.
#ifndef DATTN_SCHEDULER_TEST_UTIL_H_
#define DATTN_SCHEDULER_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/types.h"

namespace dattn {
namespace scheduler {
namespace testing {

constexpr int64_t kGiB = int64_t{1} << 30;

// A ready GPU worker with one slot, free of everything, supporting fp32 and bf16.
WorkerInfo Gpu(const std::string& id, int64_t total_bytes, int64_t free_bytes = -1);
// A ready CPU worker with `slots` slots, all free, supporting fp32 only.
WorkerInfo Cpu(const std::string& id, int slots, int64_t total_bytes, int64_t free_bytes = -1);

// A GPU job in fp32 of tenant "t", priority 0.
JobRequest Job(const std::string& id, int num_ranks, int64_t memory_per_rank_bytes,
               int64_t submit_seq = 0);

// Ranks of `job` that `workers` hold now (at most num_ranks per worker), counted rank by rank
// without the scheduler's code: the job fits exactly when this is >= num_ranks.
int64_t RanksThatFitNow(const JobRequest& job, const std::vector<WorkerInfo>& workers);

// Checks, without using the scheduler's code, that `placements` (all made against `workers` as
// given) place each job whole on eligible workers, and that together they use no worker beyond its
// free slots or free memory. Returns "" if so, else every violation found, one per line.
std::string CheckPlacements(const std::vector<WorkerInfo>& workers,
                            const std::vector<JobRequest>& jobs,
                            const std::vector<Placement>& placements);

}  // namespace testing
}  // namespace scheduler
}  // namespace dattn

#endif  // DATTN_SCHEDULER_TEST_UTIL_H_
