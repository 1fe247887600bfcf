// The scheduler: a queue of jobs and the pass that starts those that fit.
//
// Policy
// ------
// * Order. Jobs are considered in JobQueue order (job_queue.h): strict priority, then tenants
//   taking turns least-recently-served first, then FIFO by submit_seq within a tenant.
// * Gang placement. A job starts with all its ranks or not at all; each rank takes one worker slot
//   and memory_per_rank_bytes of that worker's free memory, best fit (placement.h).
// * One pass, no over-commit. Schedule() walks the queue once against the workers it is given and
//   subtracts every placement's slots and memory before considering the next job, so the
//   placements of one pass fit together.
// * Backfill. A job that does not fit is skipped and later jobs may use what is free, so small
//   jobs are not held up behind a large one.
// * Anti-starvation reservation. Backfill alone could starve a large job forever. A job that does
//   not fit, has waited longer than `starvation_bound` (now - submit_time), and could fit the
//   cluster when idle (CheckFeasible) reserves every worker eligible for it (ready, its device
//   kind and dtype): no job after it in queue order is placed on those workers in this pass, so
//   they drain until the job fits. Workers it could never use (another device kind or dtype) keep
//   serving later jobs. Jobs before it in the order (higher priority, or earlier in the tenant
//   rotation) are unaffected. A starved job that could never fit the cluster reserves nothing:
//   the caller should fail it (CheckFeasible gives the reason).
// * A full cluster is skipped. When no ready worker has a free slot, a pass returns at once with no
//   placement and no reservation (nothing could be placed either way); the coordinator runs a pass
//   after every submit, and a long queue on a busy cluster is the common case.
// * Tenant quota on running ranks. With `tenant_max_running_ranks` > 0, a job is placed only while
//   its tenant's running ranks (given by the caller: ranks still held on workers) plus those placed
//   earlier in the pass plus its own stay within the quota. A job held back by its tenant's quota
//   is skipped like one that does not fit, but reserves nothing (only its own tenant's work frees
//   its way); last_quota_waits() lists it. A job asking for more ranks than the quota can never
//   start: the caller refuses it at submit.
// * Determinism. The same queue, workers, running ranks and `now` always give the same placements.
//
// Thread-safety: none. The owner serialises all calls (the coordinator holds its lock).
#ifndef DATTN_SCHEDULER_SCHEDULER_H_
#define DATTN_SCHEDULER_SCHEDULER_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/job_queue.h"
#include "scheduler/placement.h"
#include "scheduler/types.h"

namespace dattn {
namespace scheduler {

struct SchedulerOptions {
  // Waiting time after which a job that does not fit reserves its workers (see Policy).
  // absl::InfiniteDuration() turns reservation off (pure backfill).
  absl::Duration starvation_bound = absl::Minutes(10);
  // Most ranks one tenant's jobs hold at once (see Policy); 0: no quota.
  int tenant_max_running_ranks = 0;
};

// A job the last pass held back because of its tenant's quota on running ranks.
struct QuotaWait {
  std::string job_id;
  std::string tenant;
  int64_t tenant_ranks = 0;  // What the tenant held (running and placed in the pass) then.
  int num_ranks = 0;         // What the job asks for.
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options = SchedulerOptions()) : options_(options) {}

  // JobQueue::Enqueue: INVALID_ARGUMENT or ALREADY_EXISTS, queue unchanged on error. Enqueue does
  // not check feasibility; call CheckFeasible first to reject a job that could never run.
  absl::Status Enqueue(JobRequest job) { return queue_.Enqueue(std::move(job)); }

  // JobQueue::Remove (a cancel): NOT_FOUND if the job is not queued (it may have started already).
  absl::Status Remove(const std::string& job_id) { return queue_.Remove(job_id); }

  // One scheduling pass (see Policy) against `workers` as they are now, at time `now`. Returns the
  // placements made, in the order they were made; those jobs are gone from the queue and their
  // tenants count as served. The caller starts them, and re-enqueues (same submit_seq and
  // submit_time) any that fail to start. INVALID_ARGUMENT if ValidateWorkers fails, with the queue
  // unchanged; validate workers at registration so that this does not happen.
  // `running` gives each tenant's ranks held now, for the quota on running ranks.
  absl::StatusOr<std::vector<Placement>> Schedule(const std::vector<WorkerInfo>& workers,
                                                  absl::Time now, const TenantRanks& running = {});

  // The job ids that reserved workers in the last Schedule() call, in queue order (empty if none):
  // for status messages such as "waiting; workers reserved for job-7". A starved job whose workers
  // an earlier one already reserved is not listed.
  const std::vector<std::string>& last_reservations() const { return last_reservations_; }
  // The jobs the last pass that walked the queue held back for their tenant's quota on running
  // ranks, in queue order (a pass that returns at once on a full cluster leaves it as it was).
  const std::vector<QuotaWait>& last_quota_waits() const { return last_quota_waits_; }

  const JobQueue& queue() const { return queue_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  const SchedulerOptions options_;
  JobQueue queue_;
  std::vector<std::string> last_reservations_;
  std::vector<QuotaWait> last_quota_waits_;
};

}  // namespace scheduler
}  // namespace dattn

#endif  // DATTN_SCHEDULER_SCHEDULER_H_
