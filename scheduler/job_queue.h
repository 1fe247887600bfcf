// The queue of jobs waiting for placement, and the order in which the scheduler considers them.
//
// Order (the same order Ordered() reports and Scheduler::Schedule() walks):
//   1. Strict priority: every job of a higher priority comes before every job of a lower one.
//   2. Within one priority, tenants take turns, one job per turn (round-robin). The turn order is
//      least-recently-served first: a tenant that has never had a job dispatched goes before all
//      that have, and otherwise the tenant whose last dispatch is oldest goes first; ties go to the
//      tenant whose first waiting job was submitted earliest, then to the smaller tenant name. A
//      tenant with one job waiting cannot be pushed back behind another tenant's flood of jobs.
//      Fairness counts jobs, not ranks or device time: a tenant of 8-rank jobs and one of 1-rank
//      jobs alternate jobs.
//   3. Within one tenant and priority: FIFO by submit_seq, ties by job_id.
// Only Dispatch() counts as serving a tenant; Remove() (a cancel) does not. The record of when
// tenants were served is bounded: beyond twice the tenants with queued jobs (+64), the longest-idle
// tenants with nothing queued are forgotten and count as never served if they return. The record is
// not persisted: a restarted coordinator starts with every tenant unserved, which only affects the
// order of the first turns.
//
// Thread-safety: none. A JobQueue is a plain object; the owner serialises all calls (the
// coordinator holds its lock around them).
#ifndef DATTN_SCHEDULER_JOB_QUEUE_H_
#define DATTN_SCHEDULER_JOB_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/types.h"

namespace dattn {
namespace scheduler {

class JobQueue {
 public:
  JobQueue() = default;
  JobQueue(const JobQueue&) = default;
  JobQueue& operator=(const JobQueue&) = default;

  // Adds `job`. INVALID_ARGUMENT if ValidateJob fails, ALREADY_EXISTS naming the id if a job with
  // the same job_id is queued; the queue is unchanged on error. To requeue a job after a failed
  // start, enqueue it again with its original submit_seq and submit_time: it returns to its old
  // place.
  absl::Status Enqueue(JobRequest job);

  // Removes a queued job without counting it as served (a cancel). NOT_FOUND naming the id
  // otherwise.
  absl::Status Remove(const std::string& job_id);

  // Removes a queued job and records its tenant as served now (the job is starting). Returns the
  // job, or NOT_FOUND naming the id.
  absl::StatusOr<JobRequest> Dispatch(const std::string& job_id);

  // The queued job with this id, or nullptr. The pointer is valid until the next non-const call.
  const JobRequest* Find(const std::string& job_id) const;
  bool Contains(const std::string& job_id) const { return Find(job_id) != nullptr; }

  size_t size() const { return jobs_.size(); }
  // Tenants whose last service is remembered (bounded; see PruneLastServed).
  size_t remembered_tenants() const { return last_served_.size(); }
  bool empty() const { return jobs_.empty(); }

  // Every queued job in the order described at the top of this file (a snapshot; O(n log n)).
  std::vector<JobRequest> Ordered() const;

  // 0-based place of the job in Ordered(), or nullopt if it is not queued.
  std::optional<size_t> Position(const std::string& job_id) const;

 private:
  // FIFO key within one (priority, tenant).
  using FifoKey = std::pair<int64_t, std::string>;  // (submit_seq, job_id)
  using TenantQueues = std::map<std::string, std::set<FifoKey>>;

  void Erase(const JobRequest& job);

  absl::flat_hash_map<std::string, JobRequest> jobs_;
  std::map<int, TenantQueues, std::greater<int>> by_priority_;  // Highest priority first.
  // Drops last_served_ entries that no longer matter (see the .cc), keeping it bounded by the
  // number of tenants with queued jobs rather than by every tenant name ever served.
  void PruneLastServed();

  // Tenant -> value of serve_clock_ at its last Dispatch; absent means never served.
  absl::flat_hash_map<std::string, uint64_t> last_served_;
  uint64_t serve_clock_ = 0;
};

}  // namespace scheduler
}  // namespace dattn

#endif  // DATTN_SCHEDULER_JOB_QUEUE_H_
