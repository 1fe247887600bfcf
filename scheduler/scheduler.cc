#include "scheduler/scheduler.h"

#include "absl/container/flat_hash_map.h"

namespace dattn {
namespace scheduler {

absl::StatusOr<std::vector<Placement>> Scheduler::Schedule(const std::vector<WorkerInfo>& workers,
                                                           absl::Time now,
                                                           const TenantRanks& running) {
  if (absl::Status s = ValidateWorkers(workers); !s.ok()) return s;
  last_reservations_.clear();
  // With no free slot on any ready worker nothing can be placed and nothing needs reserving: skip
  // the walk. A long queue on a full cluster is the common case, and the coordinator runs a pass
  // after every submit.
  bool any_free_slot = false;
  for (const WorkerInfo& w : workers) {
    any_free_slot |= w.state == WorkerState::kReady && w.free_ranks() > 0;
  }
  if (!any_free_slot) return std::vector<Placement>{};
  last_quota_waits_.clear();
  const int64_t quota = options_.tenant_max_running_ranks;
  TenantRanks held;  // With a quota: `running` plus this pass's placements.
  if (quota > 0) held = running;

  // What is still free in this pass: placements and reservations are subtracted from the copy.
  std::vector<WorkerInfo> pool = workers;
  absl::flat_hash_map<std::string, size_t> index;
  for (size_t i = 0; i < pool.size(); ++i) index[pool[i].id] = i;

  std::vector<bool> reserved(pool.size(), false);
  std::vector<Placement> placements;
  for (const JobRequest& job : queue_.Ordered()) {
    if (quota > 0) {
      const int64_t tenant_ranks = held[job.tenant];
      if (tenant_ranks + job.num_ranks > quota) {
        last_quota_waits_.push_back({job.job_id, job.tenant, tenant_ranks, job.num_ranks});
        continue;
      }
    }
    absl::StatusOr<std::optional<Placement>> placed = TryPlace(job, pool);
    // Jobs were validated by Enqueue and the pool stays valid, so an error here is a bug in this
    // file; report it rather than guess.
    if (!placed.ok()) return placed.status();
    if (placed->has_value()) {
      for (const std::string& id : (*placed)->worker_ids) {
        WorkerInfo& w = pool[index.at(id)];
        ++w.running_ranks;
        w.free_memory_bytes -= job.memory_per_rank_bytes;
      }
      if (quota > 0) held[job.tenant] += job.num_ranks;
      absl::StatusOr<JobRequest> dispatched = queue_.Dispatch(job.job_id);
      if (!dispatched.ok()) return dispatched.status();
      placements.push_back(std::move(**placed));
      continue;
    }
    const bool starved = job.submit_time + options_.starvation_bound < now;
    if (starved && CheckFeasible(job, workers).feasible) {
      // Taking every slot of the eligible workers keeps later jobs off them for the rest of the
      // pass. A job whose workers an earlier reservation already holds just waits behind it.
      bool reserved_any = false;
      for (size_t i = 0; i < pool.size(); ++i) {
        if (!IsEligible(pool[i], job) || reserved[i]) continue;
        reserved[i] = true;
        reserved_any = true;
        pool[i].running_ranks = pool[i].max_ranks;
      }
      if (reserved_any) last_reservations_.push_back(job.job_id);
    }
  }
  return placements;
}

}  // namespace scheduler
}  // namespace dattn
