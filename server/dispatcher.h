// The dispatcher: the queue of jobs waiting for workers and the scheduling pass that places them.
//
// It turns a job's analysis (work_kind.h) into the scheduler's resource request on one of the
// job's device kinds, keeps the queue (scheduler/scheduler.h: priorities, per-tenant fairness,
// gang placement, backfill, anti-starvation), checks whether a job could ever run on the workers
// it is shown, and runs the pass: placements become tasks on the workers (WorkerRegistry), a
// rendezvous store per ring (RingRendezvous) and PLACED transitions (JobBook), and once those are
// durable, the ranks' assignments. Calls go one way: the dispatcher calls those roles, which never
// call it. It does no I/O of its own (a ring's store binds a socket in RingRendezvous).
//
// Device kinds. A job lists its device kinds in preference order (DEVICE_PREFERENCE_ANY: GPU, then
// CPU). It is queued for the first kind the workers it is shown could fit, or its first kind when
// none could; once checked against ready workers (Check below) that kind is fixed.
//
// Unchecked jobs. A job accepted while no worker was ready (and every job reloaded after a
// restart) was checked against no worker. Check() looks at them once some worker is ready and the
// ready set has stayed the same for `feasibility_settle` (workers of a new cluster register one by
// one): each either fits (it is marked checked, queued for the kind that fits, in its old place)
// or is reported as never able to run, with the scheduler's reasons and the memory plans; a job
// placed before, or found to fit the ready workers before (Job.fitted_cluster: at submit, or by an
// earlier check), is left unchecked instead (its workers may not have re-registered yet, or a dead
// one may restart): a coordinator restarted while a worker is down does not fail the queue.
//
// Thread-safety: none of its own; the coordinator holds it ABSL_GUARDED_BY its mutex, which also
// guards the roles it is attached to.
#ifndef DATTN_SERVER_DISPATCHER_H_
#define DATTN_SERVER_DISPATCHER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/scheduler.h"
#include "scheduler/types.h"
#include "server/job_book.h"
#include "server/metrics.h"
#include "server/ring_rendezvous.h"
#include "server/work_kind.h"
#include "server/worker_registry.h"

namespace dattn {
namespace server {

struct DispatcherOptions {
  absl::Duration starvation_bound = absl::Minutes(10);  // scheduler.h, "Anti-starvation".
  absl::Duration feasibility_settle = absl::Seconds(5);
  // scheduler.h, "Tenant quota on running ranks" (--tenant-max-running-ranks); 0: none.
  int tenant_max_running_ranks = 0;
};

class Dispatcher {
 public:
  // `metrics` (not owned) gets the queue depth.
  Dispatcher(DispatcherOptions options, Metrics* metrics);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // RESOURCE_EXHAUSTED ("the job can never run on the ready workers: ..." with the scheduler's
  // reasons and each device kind's memory plan) when none of the job's device kinds fits
  // `workers`; OK when it fits or `ready_workers` is 0 (workers may register later).
  absl::Status CheckFeasible(const JobAnalysis& analysis,
                             const std::vector<scheduler::WorkerInfo>& workers,
                             int64_t ready_workers) const;

  // Queues `run` (QUEUED, not in the queue) for a device kind as described at the top.
  void Enqueue(JobRun* run, const std::vector<scheduler::WorkerInfo>& workers,
               int64_t ready_workers);
  // Takes the job out of the queue, if it is there.
  void Remove(const std::string& job_id);
  // --tenant-max-running-ranks (0: none): a job of more ranks can never run.
  int tenant_max_running_ranks() const { return options_.tenant_max_running_ranks; }
  // 1-based position while queued.
  std::optional<size_t> Position(const std::string& job_id) const;
  bool empty() const { return scheduler_.queue().empty(); }

  // A job that can never run (see "Unchecked jobs").
  struct Verdict {
    JobRun* run = nullptr;
    std::string reason;
  };
  // Checks the unchecked queued jobs among `runs` once the ready set `ready_set` (a canonical
  // string; empty when no worker is ready) has been stable for feasibility_settle at `now`.
  std::vector<Verdict> Check(absl::Time now, const std::string& ready_set,
                             const std::vector<JobRun*>& runs,
                             const std::vector<scheduler::WorkerInfo>& workers);
  // Whether, as of the last Check, some worker is ready and the ready set has stayed the same for
  // feasibility_settle at `now`: what a job stranded by a lost worker waits for before it is
  // shrunk (JobRunner::ShrinkStranded).
  bool Settled(absl::Time now) const;

  // One scheduling pass (scheduler.h) against `workers` at `now`, with `running` the ranks each
  // tenant holds (Place gives WorkerRegistry::RanksByTenant): the placements made; those jobs left
  // the queue. INVALID_ARGUMENT for an invalid worker list (nothing placed).
  absl::StatusOr<std::vector<scheduler::Placement>> Schedule(
      const std::vector<scheduler::WorkerInfo>& workers, absl::Time now,
      const scheduler::TenantRanks& running = {});
  // Why a queued job waits, when the last pass that walked the queue held it back for its
  // tenant's quota on running ranks ("waiting: tenant ... holds 3 ranks of its quota of 4
  // (--tenant-max-running-ranks), the job asks for 2"); "" otherwise.
  std::string QuotaWait(const std::string& job_id) const;

  // One pass applied (needs Attach): the placements of Schedule() become tasks on their workers, a
  // rendezvous store for each multi-rank job, and each job's PLACED transition (its write's ticket
  // appended to `tickets`). A job whose store cannot start goes back in the queue for the next
  // pass.
  void Place(absl::Time now, Tickets* tickets);
  // Queues the assignment of every rank not yet handed out of every PLACED job whose "placed"
  // write is durable (call after committing Place's tickets): workers hear of a placement only
  // once a restarted coordinator would know it too.
  void Dispatch(absl::Time now);
  // The assignment of `task`, a rank of `run`'s current attempt: the spec, the kind's rank plan
  // and, on a ring, the rank's RingInfo.
  v1::WorkerCommand Assignment(const JobRun& run, const TaskEntry& task) const;

  // The roles Place and Dispatch work on (not owned; they outlive the dispatcher).
  void Attach(JobBook* book, WorkerRegistry* workers, RingRendezvous* rings) {
    book_ = book;
    workers_ = workers;
    rings_ = rings;
  }

  // Wakes the scheduling loop for another pass soon (a submit, a freed slot, a new worker).
  void Kick() {
    kicked_ = true;
    kick_cv_.Signal();
  }
  // Whether a pass was asked for since the last call; clears the request.
  bool TakeKick() { return std::exchange(kicked_, false); }
  // What the scheduling loop waits on (with the coordinator's mutex).
  absl::CondVar* kick_cv() { return &kick_cv_; }

 private:
  scheduler::JobRequest Request(const JobRun& run, const JobAnalysis& analysis,
                                size_t device) const;
  void UpdateDepth() const;

  const DispatcherOptions options_;
  Metrics* const metrics_;
  scheduler::Scheduler scheduler_;
  absl::flat_hash_map<std::string, std::string> quota_waits_;  // QuotaWait's answers.
  std::string ready_set_;                                      // As of the last Check.
  absl::Time ready_set_since_ = absl::InfinitePast();
  bool kicked_ = false;
  absl::CondVar kick_cv_;
  JobBook* book_ = nullptr;
  WorkerRegistry* workers_ = nullptr;
  RingRendezvous* rings_ = nullptr;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_DISPATCHER_H_
