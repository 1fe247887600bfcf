// The job book: every job the coordinator has not finished, in memory, with its state machine and
// the durable record of its changes in the job store.
//
// A job enters the book when it is submitted (or reloaded from the store at start-up) and leaves it
// once its terminal state is committed; from then on the store answers for it. Each change of a
// job is a transition (or an event in the same state) decided in memory and queued as a write of
// the job's row plus its event; writes of one job are committed in the order they were decided
// (the job's WriteQueue), and readers see only what is committed: Public() shows the committed
// job with its live progress, and watchers receive events as they commit.
//
// Committing is the coordinator's I/O, done without its lock: it takes a Ticket's queue
// flush_mu, asks NextWrite() for the next write (under its lock), calls JobStore::Update (without
// it), and reports the outcome with WriteCommitted() or WriteFailed() (under its lock again). A
// write that failed transiently (UNAVAILABLE: a lock held elsewhere, a full disk, an I/O error)
// stays first in its job's queue and the queue is listed in Stalled() until a later flush commits
// it; any other failure (a transition the store forbids: a coordinator bug) sticks to the job, and
// its later writes fail with it.
//
// Thread-safety: none of its own. The coordinator holds the book ABSL_GUARDED_BY its mutex, so
// every call is made (and checked by clang's -Wthread-safety) with that mutex held. JobRun
// pointers stay valid while the caller holds the mutex, and across releases until the job's
// terminal write commits.
#ifndef DATTN_SERVER_JOB_BOOK_H_
#define DATTN_SERVER_JOB_BOOK_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dattn/v1/job.pb.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

class JobBook;

// One write: the job's row as it is after a change, and the change's event.
struct PendingWrite {
  v1::Job job;
  v1::JobEvent event;
};

// A job's writes not yet committed, in decision order. Only the book reads or changes its contents;
// flush_mu is whoever commits the job's writes.
class WriteQueue {
 public:
  // Held by the one thread committing this job's writes; taken before the coordinator's mutex,
  // never while holding it.
  absl::Mutex flush_mu;

 private:
  friend class JobBook;
  std::deque<PendingWrite> pending;
  uint64_t enqueued = 0;  // Writes ever queued; a caller's ticket is the count after its own.
  uint64_t durable = 0;   // Writes committed, in order.
  absl::Status error;     // A write the store refused for good; every later flush fails with it.
  bool stalled = false;   // Listed in the book's stalled queues.
};

// A caller's claim on one queued write: it is durable once the queue has committed `seq` writes.
// An empty ticket (no queue) stands for nothing to wait for.
struct Ticket {
  std::shared_ptr<WriteQueue> queue;
  uint64_t seq = 0;
};
using Tickets = std::vector<Ticket>;

// A job the coordinator has not finished: its record (the book's) and its current attempt (the
// coordinator's to keep, under the same mutex).
struct JobRun {
  v1::Job job;      // Current state: ahead of the store by the writes still queued.
  v1::Job durable;  // As last committed: what readers see.
  int64_t submit_seq = 0;
  const WorkKind* kind = nullptr;
  std::shared_ptr<const JobAnalysis> analysis;
  size_t device = 0;  // Index into analysis->devices: the kind it is queued for, or runs on.
  absl::Time queued_since;

  // The current attempt.
  std::vector<std::string> task_ids;        // Its tasks still running.
  std::unique_ptr<AttemptResults> results;  // Its succeeded ranks; null before the first placement.
  // Checked against a non-empty set of ready workers (see coordinator.h, "Unchecked jobs").
  bool checked = false;
  // It was placed before: it fitted this cluster once.
  bool placed_before = false;
  // A ring failure (a rank, its worker or a collective lost) requeued it and it has not been
  // placed since: the next scheduling pass after the ready set settles shrinks it onto the workers
  // left when they cannot hold it as it ran (JobRunner::ShrinkStranded), once.
  bool shrink_pending = false;
  int free_requeues = 0;  // Requeues that were not the job's doing: not counted as attempts.
  int refusals = 0;       // Refused attempts since the last one that started.
  bool cancel_requested = false;
  std::string cancel_reason;
  absl::Time last_progress_write = absl::InfinitePast();
  // When the job last started RUNNING or its slowest rank last finished a step (the stall clock,
  // RecoveryPolicy.stall_seconds); InfinitePast while it is not running.
  absl::Time last_step = absl::InfinitePast();
  // The cause of the recovery that requeued it, and when: the time to recover is observed when it
  // next runs (dattn_recovery_seconds); InfinitePast when none is pending.
  std::string recovery_kind;
  absl::Time recovery_since = absl::InfinitePast();
  bool terminal = false;  // Ended; kept until its last write commits.

 private:
  friend class JobBook;
  std::shared_ptr<WriteQueue> writes = std::make_shared<WriteQueue>();
};

// Receives a job's committed events (WatchJob): the watcher owns it, the book fills it.
struct Watcher {
  std::deque<v1::JobEvent> events;
  absl::CondVar cv;  // Signalled when events arrive or the book wakes every watcher.
};

class JobBook {
 public:
  // `metrics` (not owned, must outlive the book) counts jobs by state.
  explicit JobBook(Metrics* metrics) : metrics_(metrics) {}
  JobBook(const JobBook&) = delete;
  JobBook& operator=(const JobBook&) = delete;

  // --- Jobs ------------------------------------------------------------------------------------
  // Takes a stored job into memory (its committed state is `stored.job`). The job must not be in
  // the book.
  JobRun* Add(const StoredJob& stored, const WorkKind* kind,
              std::shared_ptr<const JobAnalysis> analysis);
  JobRun* Find(const std::string& job_id);
  // Every job in memory (terminal ones whose last write is in flight included), in id order.
  std::vector<JobRun*> Runs();
  // Whether some job that ends by itself is PLACED or RUNNING and not ended: resident jobs
  // (deployments, JobAnalysis::resident) do not count, so a drain does not wait for them.
  bool AnyActiveRun() const;
  size_t size() const { return runs_.size(); }

  // --- The state machine -------------------------------------------------------------------------
  // Moves `run` to `state` with an event of `kind`, in memory, and queues the write. A transition
  // that job_state.h forbids is a coordinator bug: it is logged and nothing changes (empty
  // ticket). Terminal states set end_time and mark the run terminal. Counts dattn_jobs.
  Ticket Transition(JobRun* run, v1::JobState state, const std::string& kind,
                    const std::string& message, absl::Time now);
  // Queues an event in the job's current state (progress, cancel_requested, ring events).
  Ticket Append(JobRun* run, v1::JobEvent event, absl::Time now);

  // --- Committing (see the top of the file) ------------------------------------------------------
  // The next write to commit for `ticket`, or false when there is none: *done is then OK (the
  // ticket's write is durable) or the queue's sticky error.
  bool NextWrite(const Ticket& ticket, PendingWrite* write, absl::Status* done);
  // `write` (from NextWrite) committed as event `seq`: it becomes what readers see, its event goes
  // to the job's watchers, and a job whose terminal write this was leaves the book.
  void WriteCommitted(const Ticket& ticket, PendingWrite write, int64_t seq);
  // `write` failed with `error`: transient (UNAVAILABLE) failures put it back first in line and
  // list the queue in Stalled(); others stick to the queue. Returns the UNAVAILABLE error to give
  // the caller ("cannot record job ...").
  absl::Status WriteFailed(const Ticket& ticket, PendingWrite write, const absl::Status& error);
  // A ticket for everything queued so far in each stalled queue, oldest stall first.
  std::vector<Ticket> Stalled() const;
  // The queue of `ticket` committed everything (or failed for good): it is no longer stalled.
  void Unstall(const Ticket& ticket);
  // The job id of a stalled ticket's first write, for logs ("" if none is left).
  std::string FirstPendingJob(const Ticket& ticket) const;

  // --- Readers -----------------------------------------------------------------------------------
  // The job as GetJob/ListJobs show it: the committed state, with the live progress while the
  // committed state and attempt are the current ones; queue_position 0 (the dispatcher knows it).
  v1::Job Public(const JobRun& run) const;

  // Watchers of a job receive its events as they commit. The watcher must be unsubscribed before
  // it is destroyed.
  void Subscribe(const std::string& job_id, Watcher* watcher);
  void Unsubscribe(const std::string& job_id, Watcher* watcher);
  size_t watchers() const { return watchers_.size(); }
  // Takes the events that arrived for `watcher`.
  std::deque<v1::JobEvent> TakeEvents(Watcher* watcher);
  // Signals every watcher (the coordinator is closing its streams).
  void WakeWatchers();

 private:
  Ticket Queue(JobRun* run, v1::JobEvent event, absl::Time now);

  Metrics* const metrics_;
  std::map<std::string, std::unique_ptr<JobRun>> runs_;
  std::multimap<std::string, Watcher*> watchers_;  // job_id -> watchers.
  std::vector<std::shared_ptr<WriteQueue>> stalled_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_BOOK_H_
