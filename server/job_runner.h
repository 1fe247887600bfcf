// The job runner: what happens to a job's attempts once it is placed. It takes the ranks' reports
// (one handler per report state), ends attempts, and recovers failures: a lost worker, a failed or
// refused rank, a cancel. Recovery asks scheduler/recovery.h with what the job's kind allows
// (work_kind.h) and then requeues the job (attempt + 1) or fails it with the reason; a refusal or a
// coordinator restart is not counted as an attempt.
//
// Every change is a transition in the job book, whose writes the caller commits afterwards
// (JobRecorder::Flush with the tickets the runner appends). A job that reaches a terminal state
// loses its ring; one that leaves PLACED/RUNNING signals `activity` (Coordinator::Drain waits on
// it).
//
// Calls go one way: the runner calls the book, the worker registry, the ring rendezvous and the
// dispatcher (to requeue); nothing calls it back. Locking: it shares the coordinator's mutex (given
// at construction), which guards the roles it calls (ABSL_PT_GUARDED_BY). Every public method
// expects it held and asserts so (the analysis cannot tell that the coordinator's mu_ is the
// runner's *mu_, so they are not ABSL_EXCLUSIVE_LOCKS_REQUIRED); the private ones require it.
#ifndef DATTN_SERVER_JOB_RUNNER_H_
#define DATTN_SERVER_JOB_RUNNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "dattn/v1/worker.pb.h"
#include "scheduler/recovery.h"
#include "server/dispatcher.h"
#include "server/job_book.h"
#include "server/metrics.h"
#include "server/ring_rendezvous.h"
#include "server/worker_registry.h"

namespace dattn {
namespace server {

struct RunnerOptions {
  int max_attempts = 3;  // Most runs of one job that fail for its own reasons.
  // Progress reports update the job at once; "progress" events are written at most this often.
  absl::Duration progress_persist_interval = absl::Seconds(1);
  absl::Duration ring_formation_timeout = absl::Seconds(30);  // For messages.
};

// Refused attempts in a row after which a job fails (a worker that refuses everything must not keep
// a job cycling for ever).
inline constexpr int kMaxRefusals = 100;

class JobRunner {
 public:
  // None owned; all outlive the runner. `activity` is signalled when a job leaves PLACED/RUNNING.
  JobRunner(absl::Mutex* mu, JobBook* book, WorkerRegistry* workers, RingRendezvous* rings,
            Dispatcher* dispatcher, Metrics* metrics, const Clock* clock, absl::CondVar* activity,
            RunnerOptions options)
      : mu_(mu),
        book_(book),
        workers_(workers),
        rings_(rings),
        dispatcher_(dispatcher),
        metrics_(metrics),
        clock_(clock),
        activity_(activity),
        options_(options) {}
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // The book's transition (an empty ticket for one it forbids) and what follows from it.
  Ticket Transition(JobRun* run, v1::JobState state, const std::string& kind,
                    const std::string& message);
  // An event in the job's current state.
  Ticket Append(JobRun* run, v1::JobEvent event);
  // The checkpoint pins (DeploymentSpec.checkpoint_pinned) of deployments that reached a terminal
  // state since the last call, for the caller to remove without the lock (the coordinator's next
  // scheduling pass, normally after the terminal state was written).
  std::vector<std::string> TakeRetiredPins();
  // Queues a QUEUED job with the dispatcher.
  void Enqueue(JobRun* run);
  // The job goes back in the queue as attempt + 1 with an event of `kind`; a job that runs once
  // (JobAnalysis::runs_once: an Attend job) fails instead, saying why.
  void Requeue(JobRun* run, const std::string& kind, const std::string& message, Tickets* tickets);
  // Ends the current attempt (its tasks forgotten, CancelTask to those dispatched when
  // `cancel_tasks`, with CancelTask.abort when `abort`: the attempt failed and its ranks cannot
  // stop together; its ring ended).
  void Release(JobRun* run, bool cancel_tasks, const std::string& reason, bool abort = false);
  // Requeue (attempt + 1) or fail, per scheduler::DecideRecovery, after `failure`; CANCELLED
  // instead when a cancel was requested. `oom_free_bytes`: the failing worker's free memory.
  // Out of memory while running (a rank's RESOURCE_EXHAUSTED), a job with attempts left first
  // moves down its recovery ladder (LadderStep) and is requeued as that rung.
  void Recover(JobRun* run, scheduler::FailureKind failure, const std::string& why,
               const std::string& cause, int64_t oom_free_bytes, Tickets* tickets);
  // Out of memory while running: the first rung of the job's ladder (WorkKind::Ladder, as far as
  // its recovery policy allows) that needs less memory per rank, on the device kind that ran out,
  // than the spec that ran out, and that the ready workers can hold (and the tenant's running-rank
  // quota allows). Makes it the job's spec and analysis (the spec first asked for stays in
  // requested_spec) and returns the change with its numbers, for the event; nullopt when no rung
  // does (the spec is then unchanged).
  std::optional<std::string> LadderStep(JobRun* run);
  // Ring shrink: every QUEUED job that a ring failure requeued (JobRun::shrink_pending) and that
  // the ready workers can no longer hold as it ran (a worker it needs is gone) gets the first size
  // of fewer ranks (WorkKind::Shrinks, as its recovery policy allows) that they can hold: its spec
  // and analysis become that size's (the spec first asked for stays in requested_spec) with a
  // "shrunk" event naming both, or it waits with a "waiting" event saying why. Once per recovery.
  // The caller runs it only once the ready set has settled (Dispatcher::Settled), so that a worker
  // restarting within --feasibility-settle-ms gets its ranks back instead.
  void ShrinkStranded(Tickets* tickets);
  // Recovers (as a failed attempt, FailureKind::kCommTimeout) every RUNNING job whose slowest rank
  // has finished no step for longer than its RecoveryPolicy.stall_seconds (default
  // api::kDefaultStallSeconds) since it started running or last progressed: a "stalled" event,
  // then Recover's requeue or failure.
  void RecoverStalled(Tickets* tickets);
  // Counts a recovery of cause `kind` with `outcome` ("requeued", "resized", "failed",
  // "cancelled"; a requeue of a job that runs once counts as failed) and, for a requeue, starts the
  // job's time-to-recover clock (observed when it runs again).
  void NoteRecovery(JobRun* run, const std::string& kind, const char* outcome);
  // Declares the worker dead and recovers the jobs of its tasks.
  void KillWorker(WorkerEntry* worker, const std::string& why, const std::string& cause,
                  Tickets* tickets);
  // A cancel of a job that is not finished: QUEUED jobs (and ranks not yet handed out) end at
  // once; dispatched ranks are told to stop and the job ends when they confirm. Returns the job as
  // it is after the call (not yet durable: commit the tickets).
  v1::Job Cancel(JobRun* run, const std::string& reason, Tickets* tickets);

  // A current task's report (its attempt is the job's, on the registration holding it).
  struct Report {
    const v1::TaskReport* report = nullptr;
    TaskEntry* task = nullptr;
    JobRun* run = nullptr;
    WorkerEntry* worker = nullptr;
    // A failed ring rank whose ring had not formed: the ranks the rendezvous store lacks.
    std::optional<std::vector<int>> missing_ranks;
  };
  // Applies the report: one handler per state (STARTED, PROGRESS, SUCCEEDED, FAILED, CANCELLED).
  void TakeReport(const Report& report, Tickets* tickets);

 private:
  struct Context;
  void OnStarted(Context& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnProgress(Context& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnSucceeded(Context& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFailed(Context& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCancelled(Context& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The "ring_formation_failed" or "ring_failed" event of a failed ring rank; returns the failure
  // description to recover with.
  std::string RingFailed(Context& c, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets one task of the job (its worker's slot frees; no CancelTask).
  void DropTask(JobRun* run, const std::string& task_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank refused before it started: requeued without counting an attempt (failed after more
  // than kMaxRefusals in a row).
  void RequeueRefused(JobRun* run, const std::string& why, Tickets* tickets)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex* const mu_;
  std::vector<std::string> retired_pins_ ABSL_GUARDED_BY(mu_);
  JobBook* const book_ ABSL_PT_GUARDED_BY(mu_);
  WorkerRegistry* const workers_ ABSL_PT_GUARDED_BY(mu_);
  RingRendezvous* const rings_ ABSL_PT_GUARDED_BY(mu_);
  Dispatcher* const dispatcher_ ABSL_PT_GUARDED_BY(mu_);
  Metrics* const metrics_;
  const Clock* const clock_;
  absl::CondVar* const activity_;
  const RunnerOptions options_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_JOB_RUNNER_H_
