// The coordinator's core: jobs, workers, scheduling and recovery behind a C++ API of dattn.v1
// messages and absl::Status. The gRPC layer (grpc_service.h) is a thin shell over it; tests drive
// it directly, playing the workers' part through the same calls the WorkerRegistry service makes.
//
// Durability. The JobStore (job_store.h) is the only durable state. A call that changes a job
// returns OK only after the change is committed, so an acknowledged submit, cancel or report
// survives a crash. Changes of one job are written in the order they were decided (a per-job write
// queue), and event watchers see only committed events. Everything else (workers, tasks, the queue,
// unpersisted progress) lives in memory and is rebuilt after a restart: queued jobs go back in the
// queue in submit order; placed and running jobs are requeued with a "coordinator_restarted" event
// and attempt + 1 (their workers re-register and are told to stop the old tasks), so no
// acknowledged job is lost and no result is reported twice (reports of an older attempt, or from a
// worker registration that no longer holds the task, are answered stop = true and ignored).
//
// Store failure. If a write fails the store refuses every later write (job_store.h); the
// coordinator then answers every changing call with UNAVAILABLE and Health() reports the error,
// until a restart.
//
// Jobs submitted while no worker is ready are accepted and queued: workers may register later. Once
// a worker is ready, a job that no ready worker could ever run is rejected with RESOURCE_EXHAUSTED
// and the planner's numbers. DEVICE_PREFERENCE_ANY runs on the first device kind (GPU, then CPU)
// that can run the job and that the ready workers could fit when it is queued.
//
// Unchecked jobs. A job accepted while no worker was ready (and every job queued again after a
// coordinator restart) has not been checked against any worker. Once at least one worker is ready
// and the set of ready workers has not changed for `feasibility_settle` (workers of a new cluster
// register one by one), each such job is checked once: one that the ready workers could never run
// fails with the planner's numbers (RESOURCE_EXHAUSTED's message, in a "failed" event); one they
// could run is checked for good (its device kind for DEVICE_PREFERENCE_ANY resolved then) and
// waits, whatever happens to the workers later: a job that fitted the cluster once is not failed
// because workers went away for a while.
//
// Rings. A job of num_ranks P > 1 is a gang of P ranks placed together (memory per rank: the
// largest rank's plan, job_spec.h) on workers that join rings of its device kind. For each attempt
// the coordinator starts a rendezvous store of its own (a TcpStore server on `rendezvous_host`,
// ephemeral port, ring id "JOB_ID/ATTEMPT"), hands every rank a RingInfo with the store's address
// and the ring timeouts, and stops the store when the attempt ends (any rank still waiting in it
// then fails at once). Workers rendezvous as worker/ring_join.h describes. A rank's FAILED report
// ends the attempt: the other ranks are sent CancelTask, the job gets an event naming what failed
// ("ring_formation_failed" naming the ranks that never arrived and their workers, as the store
// shows them; or "ring_failed" with the rank, its worker and error, and the ring's members) and is
// requeued or failed as for any failure (a failed ring attempt is one attempt). The job's result
// combines its ranks' results, and its output is assembled from every rank's shard.
//
// A worker whose assignment stream broke (its process died, or its connection did) is not given new
// ranks until it opens a stream again: a killed worker's peers report the failure long before its
// heartbeats are missed, and the retry must not land on it.
//
// Attempts. Job.attempt is 0 until the first placement, 1 for the first run, and grows by one on
// each requeue. A failure (worker lost, rank failed with a retryable code) requeues the job while
// attempt < max_attempts, else fails it with the reason; so a job runs at most max_attempts times.
// A coordinator restart requeues without consulting that limit (the job did not fail).
//
// Threads. Every public method may be called from any thread. The coordinator runs two threads of
// its own: the scheduling loop (woken by submits, worker changes and task ends, and once a second)
// and the dead-worker monitor. WatchJob and StreamAssignments block the calling thread for the
// stream's life.
#ifndef DATTN_SERVER_COORDINATOR_H_
#define DATTN_SERVER_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dattn/v1/admin.pb.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "dattn/v1/worker.pb.h"
#include "engine/comm/tcp_store.h"
#include "scheduler/recovery.h"
#include "scheduler/scheduler.h"
#include "server/job_spec.h"
#include "server/job_store.h"
#include "server/metrics.h"

namespace dattn {
namespace server {

struct CoordinatorOptions {
  // Folder of the durable state (created if missing); the job store is `data_dir`/jobs.db.
  std::string data_dir = "./dattn-data";
  JobStoreOptions store;
  // A worker whose last heartbeat is older than this is DEAD and its jobs are recovered.
  absl::Duration dead_after = absl::Seconds(10);
  // What workers are told to use (RegisterWorkerResponse); should be well below dead_after.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // Most runs of one job (see "Attempts" above); >= 1.
  int max_attempts = 3;
  // Progress reports update the job in memory at once but are written (as "progress" events) at
  // most this often per job.
  absl::Duration progress_persist_interval = absl::Seconds(1);
  // DEAD workers stay in ListWorkers(include_dead) this long, then are forgotten.
  absl::Duration dead_worker_retention = absl::Minutes(10);
  // Passed to the scheduler (scheduler.h): waiting time after which a job that does not fit
  // reserves the workers it could use.
  absl::Duration starvation_bound = absl::Minutes(10);
  // How long blocked streams sleep between checks of their caller's cancellation.
  absl::Duration stream_poll_interval = absl::Milliseconds(200);
  // Numeric IPv4 address the rings' rendezvous stores listen on (each on an ephemeral port).
  std::string rendezvous_host = "127.0.0.1";
  // Address workers are told to dial for the stores; empty: rendezvous_host (which must then not
  // be 0.0.0.0).
  std::string rendezvous_advertise;
  // How long the ranks of a ring wait for each other before the formation fails.
  absl::Duration ring_formation_timeout = absl::Seconds(30);
  // Longest wait for a peer once a ring is formed (RingInfo.comm_timeout_ms).
  absl::Duration ring_comm_timeout = absl::Seconds(120);
  // How long the set of ready workers must stay unchanged before unchecked queued jobs are checked
  // against it (see "Unchecked jobs" above).
  absl::Duration feasibility_settle = absl::Seconds(5);
};

// Called by WatchJob / StreamAssignments for each message; return false when the message could not
// be delivered (the client went away): the stream then ends.
using JobEventSink = std::function<bool(const v1::JobEvent&)>;
using WorkerCommandSink = std::function<bool(const v1::WorkerCommand&)>;
// Polled while a stream waits; true ends the stream with CANCELLED (the client cancelled).
using CancelledFn = std::function<bool()>;

// GetJob's event limits (GetJobRequest.max_events).
inline constexpr int kDefaultMaxEvents = 1000;
inline constexpr int kMaxEvents = 10000;

class Coordinator {
 public:
  // A coordinator that is not started: every call but Start(), Health() and Close() answers
  // UNAVAILABLE ("starting"). `metrics` is not owned and must outlive the coordinator; nullptr
  // gives the coordinator private metrics (see metrics()).
  Coordinator(CoordinatorOptions options, Metrics* metrics);
  // Close()s.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Opens the store, recovers the active jobs (see the top of this file), and starts the scheduling
  // loop and the dead-worker monitor; from then on the coordinator serves. Errors: INVALID_ARGUMENT
  // for bad options; the store's Open errors (FAILED_PRECONDITION if another coordinator holds the
  // data dir); UNAVAILABLE if a recovery write fails. After an error the coordinator stays
  // unstarted; call Close() (or destroy it). Call once.
  absl::Status Start();

  // --- JobService ------------------------------------------------------------------------------
  // Validates (job_spec.h), checks that a ready worker could ever run the job (RESOURCE_EXHAUSTED
  // with the planner's numbers otherwise; skipped while no worker is ready), stores it QUEUED with
  // a "submitted" event and queues it. A known idempotency_key with the same spec returns the
  // existing job (created = false); with another spec ALREADY_EXISTS. UNAVAILABLE while starting,
  // shutting down or when the store fails: nothing was stored, retry with the same key.
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request);
  // The job as last committed, with live progress and queue_position while QUEUED; events if asked.
  // NOT_FOUND naming the id.
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  // A page of jobs, newest first (JobStore::List), showing active jobs as the coordinator knows
  // them now. INVALID_ARGUMENT for a bad filter, page size or token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  // QUEUED (or PLACED but not yet handed to a worker): CANCELLED now. PLACED/RUNNING: a
  // "cancel_requested" event is stored and each worker is sent CancelTask; the job ends CANCELLED
  // when every rank confirms, fails or its worker is lost; if every rank succeeds before the
  // cancel reaches it, the job SUCCEEDS (a ring with only some ranks finished ends CANCELLED and
  // drops their results). CANCELLED: OK, unchanged. SUCCEEDED/FAILED: FAILED_PRECONDITION. Returns
  // the job as it is after the call.
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request);
  // Emits the job's committed events with seq > after_seq, then each new one as it commits, until
  // the terminal event was emitted (OK), `emit` returns false or `cancelled` returns true
  // (CANCELLED), or the coordinator closes its streams (UNAVAILABLE). NOT_FOUND for an unknown job.
  absl::Status WatchJob(const v1::WatchJobRequest& request, const JobEventSink& emit,
                        const CancelledFn& cancelled);

  // --- WorkerRegistry --------------------------------------------------------------------------
  // A new worker id per call. Another live registration under the same name is declared dead and
  // its jobs are recovered ("worker_lost", cause worker_reregistered). INVALID_ARGUMENT naming the
  // field for an empty name, max_ranks < 1, negative memory, no dtypes or an unknown dtype.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // Records liveness and free memory. reregister = true for an unknown or dead id; drain = true
  // while draining. Tasks the worker reports that the coordinator no longer wants get a CancelTask.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // Sends the worker's commands (assignments, cancels) in order as they come, until: a newer stream
  // of the same worker replaces this one (ABORTED), the worker is drained and idle (OK), it is
  // declared dead (NOT_FOUND), `send` fails or `cancelled` (CANCELLED; an unsent command waits for
  // the next stream), or streams are closed (UNAVAILABLE). NOT_FOUND for an unknown worker.
  absl::Status StreamAssignments(const v1::StreamAssignmentsRequest& request,
                                 const WorkerCommandSink& send, const CancelledFn& cancelled);
  // Applies a task's report (STARTED -> job RUNNING; PROGRESS; SUCCEEDED -> the rank's result and
  // output shard, and the job SUCCEEDED with the combined result and assembled output when every
  // rank has one; FAILED -> a ring event for a ring rank (see "Rings" above), then recovery or
  // FAILED; CANCELLED). A report with ring_formation_seconds > 0 marks its rank formed. For a ring
  // rank that failed before its ring formed, the ring's store is asked (without the lock) which
  // ranks never arrived. stop = true for a task the coordinator does not (or no longer) want from
  // this worker. INVALID_ARGUMENT for an unspecified state or a SUCCEEDED report without its rank
  // result.
  absl::StatusOr<v1::ReportTaskResponse> ReportTask(const v1::TaskReport& request);

  // --- AdminService ----------------------------------------------------------------------------
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request);
  // Stops placing work on the worker named by id (or, failing that, by name: its live
  // registration). Idempotent. NOT_FOUND naming the value; FAILED_PRECONDITION for a dead worker.
  absl::StatusOr<v1::Worker> DrainWorker(const v1::DrainWorkerRequest& request);
  // Lifts a drain (found as DrainWorker finds it): DRAINING -> READY and a scheduling pass; the
  // worker hears it as HeartbeatResponse.drain = false. Idempotent (READY stays READY). NOT_FOUND
  // naming the value; FAILED_PRECONDITION for a dead worker.
  absl::StatusOr<v1::Worker> UndrainWorker(const v1::UndrainWorkerRequest& request);

  // --- Lifecycle (the order main follows) --------------------------------------------------------
  // Readiness: OK once started while the store is healthy and the coordinator is not shutting down;
  // UNAVAILABLE saying why otherwise.
  absl::Status Health();
  // Submits answer UNAVAILABLE from now on and nothing new is placed; reports, heartbeats and reads
  // go on. Idempotent.
  void StopAccepting();
  // Waits up to `timeout` for every placed or running job to end. Jobs still active then are
  // requeued (attempt + 1, recovery cause drain_timeout; CANCELLED if a cancel was requested) and
  // their workers sent CancelTask; waits up to a further second for the cancels to be delivered.
  // Returns the store's error if a write fails. Call after StopAccepting().
  absl::Status Drain(absl::Duration timeout);
  // Ends every WatchJob and StreamAssignments call (UNAVAILABLE) and makes new ones fail at once.
  void CloseStreams();
  // Stops the coordinator's threads and closes the store (which commits what is queued). Every
  // later call answers UNAVAILABLE. Returns the store's sticky error, if any. Idempotent. Callers
  // must not be inside other methods (stop the gRPC server first).
  absl::Status Close();

  Metrics* metrics() const { return metrics_; }
  const CoordinatorOptions& options() const { return options_; }

 private:
  enum class Phase { kNew, kServing, kDraining, kClosed };

  // One queued store write of a job and the per-job queue that keeps them in decision order.
  struct PendingWrite {
    v1::Job job;
    v1::JobEvent event;
  };
  struct JobWriter {
    absl::Mutex flush_mu;  // Held while writing; acquired before Coordinator::mu_, never after.
    // Guarded by Coordinator::mu_ (not expressible as an annotation across classes):
    std::deque<PendingWrite> pending;
    uint64_t enqueued = 0;  // Writes ever queued; a caller's ticket is the count after its own.
    uint64_t durable = 0;   // Writes committed, in order.
    // A write the store refused for good (anything but UNAVAILABLE: a coordinator bug); every later
    // flush of this job fails with it. A transient failure (UNAVAILABLE: a lock held by another
    // process past the busy timeout, a full disk, an I/O error) leaves the write first in line
    // instead, for the next flush of the job or the monitor's retry.
    absl::Status error;
  };
  using Ticket = std::pair<std::shared_ptr<JobWriter>, uint64_t>;
  using Tickets = std::vector<Ticket>;

  struct TaskEntry {
    std::string task_id;  // job_id + "/" + attempt + "/" + rank.
    std::string job_id;
    std::string worker_id;
    int attempt = 0;
    int rank = 0;
    int64_t memory_bytes = 0;  // Reserved on the worker while the task lives.
    bool dispatched = false;   // The assignment was queued for the worker's stream.
    absl::Time dispatched_at;  // When it was last queued (heartbeats re-send a lost one).
    bool started = false;
    int64_t steps_done = 0;
    v1::RankPhase phase = v1::RANK_PHASE_UNSPECIFIED;  // As the worker last reported it.
    double formation_seconds = 0;                      // > 0 once the rank's ring is formed.
  };

  // The ring of a multi-rank job's current attempt.
  struct RingState {
    std::string id;       // JOB_ID/ATTEMPT.
    std::string backend;  // "gloo" | "nccl".
    std::unique_ptr<comm::TcpStoreServer> store;
    std::string address;             // What workers dial.
    std::set<int> formed;            // Ranks that reported their communicator formed.
    double formation_seconds = 0;    // The longest of their formation times.
    bool formation_counted = false;  // dattn_ring_formations_total has this ring.
  };

  struct ActiveJob {
    v1::Job job;      // Current state (ahead of the store by the writes still queued in `writer`).
    v1::Job durable;  // As last committed: what readers see (PublicJobLocked).
    int64_t submit_seq = 0;
    AttentionJobInfo info;
    size_t variant = 0;                   // Index into info.variants: the kind it is queued for.
    absl::Time queued_since;              // Entered QUEUED (for the queue-wait histogram).
    std::vector<std::string> task_ids;    // Tasks of the current attempt still running.
    std::vector<v1::RankResult> results;  // Of the current attempt.
    std::map<int, v1::Tensor> outputs;    // Output shards by rank, when asked for.
    std::unique_ptr<RingState> ring;      // Multi-rank jobs while an attempt is placed.
    // Checked against a non-empty set of ready workers (see "Unchecked jobs" above).
    bool checked = false;
    // It was placed before (a "placed" event exists): it fitted this cluster once, so a feasibility
    // check against a partly re-registered cluster after a restart never fails it.
    bool placed_before = false;
    // Requeues that were not the job's doing (coordinator restarts and shutdowns): they do not
    // count against max_attempts.
    int free_requeues = 0;
    bool cancel_requested = false;
    std::string cancel_reason;
    absl::Time last_progress_write = absl::InfinitePast();
    bool terminal = false;  // Ended; kept until its last write commits.
    std::shared_ptr<JobWriter> writer = std::make_shared<JobWriter>();
  };

  // The assignment command of `task` (a task of `job`'s current attempt).
  v1::WorkerCommand AssignmentLocked(const ActiveJob& job, const TaskEntry& task) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct WorkerEntry {
    v1::Worker info;  // Fields as ListWorkers shows them (task_ids and times are filled on read).
    scheduler::WorkerState state = scheduler::WorkerState::kReady;
    absl::Time last_heartbeat;
    absl::Time dead_since = absl::InfinitePast();
    std::set<std::string> task_ids;
    std::deque<v1::WorkerCommand> outbox;
    uint64_t stream_generation = 0;  // Bumped by each new stream; an older stream then ends.
    int streams = 0;                 // StreamAssignments calls inside; the entry outlives them.
    // Its last stream broke (the worker went away): no new ranks until a stream is open again.
    bool stream_lost = false;
    std::unique_ptr<absl::CondVar> cv = std::make_unique<absl::CondVar>();
  };

  struct Watcher {
    std::deque<v1::JobEvent> events;
    absl::CondVar cv;
  };

  // UNAVAILABLE unless the phase allows the call (submits only while serving; the rest also while
  // draining).
  absl::Status CheckPhaseLocked(bool submit) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE once a store write has failed.
  absl::Status CheckWritableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status Recover();
  // Adds a stored QUEUED job to memory and to the queue; no-op if present. `checked`: it was found
  // feasible against ready workers.
  void AdoptLocked(const StoredJob& stored, const AttentionJobInfo& info, bool checked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueLocked(ActiveJob* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckFeasibleLocked(const AttentionJobInfo& info) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<scheduler::WorkerInfo> SchedulerWorkersLocked(int64_t head_dim) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Workers that may take new ranks: READY, with an assignment stream not known to be broken.
  bool TakesWorkLocked(const WorkerEntry& worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ReadyWorkersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks the unchecked queued jobs once the ready workers have settled (see the top of this
  // file); fails those that can never run. Appends the tickets of the writes.
  void CheckQueuedJobsLocked(absl::Time now, Tickets* tickets) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the rendezvous store of a multi-rank job's new attempt.
  absl::Status StartRingLocked(ActiveJob* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the attempt's ring: its store is retired (destroyed outside the lock) and, if the ring
  // never formed and `unformed_outcome` is not empty, the formation is counted with that outcome.
  void EndRingLocked(ActiveJob* job, const std::string& unformed_outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys retired rendezvous stores (their threads are joined).
  void ReapStores() ABSL_LOCKS_EXCLUDED(mu_);
  // Worker gauges (memory, reservations) from the entry as it is now.
  void UpdateWorkerMetricsLocked(const WorkerEntry& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "rank 2 on w-... (name)" for every rank of the job's current attempt.
  std::string DescribeRanksLocked(const ActiveJob& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Moves `job` to `state` (CheckTransition first) with an event of `kind`, in memory, and queues
  // the store write; returns the ticket to flush. The job is marked terminal when `state` is.
  Ticket TransitionLocked(ActiveJob* job, v1::JobState state, const std::string& kind,
                          const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Ticket QueueWriteLocked(ActiveJob* job, v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the queued writes of each ticket's job, in order; OK when each ticket's own write
  // committed. Never called with mu_ held.
  absl::Status Flush(const Tickets& tickets) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status FlushOne(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets one task (freeing its worker's slot), sending CancelTask when `cancel` and it was
  // dispatched to a live worker. The job's task list is the caller's to update.
  void EraseTaskLocked(const std::string& task_id, bool cancel, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job's current attempt: forgets its tasks (freeing their workers' slots), sending
  // CancelTask for those dispatched to a live worker when `cancel_tasks`.
  void ReleaseTasksLocked(ActiveJob* job, bool cancel_tasks, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeue (attempt + 1) or fail, per DecideRecovery, after `failure`; CANCELLED instead when a
  // cancel was requested. Appends the tickets of the writes.
  // `oom_free_bytes`: the failing worker's free memory, for an out-of-memory failure's message.
  void RecoverJobLocked(ActiveJob* job, scheduler::FailureKind failure, const std::string& why,
                        const std::string& cause, int64_t oom_free_bytes, Tickets* tickets)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RequeueLocked(ActiveJob* job, const std::string& kind, const std::string& message,
                     Tickets* tickets) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the worker dead and recovers its jobs.
  void KillWorkerLocked(WorkerEntry* worker, const std::string& why, const std::string& cause,
                        Tickets* tickets) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushCommandLocked(WorkerEntry* worker, v1::WorkerCommand command)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked(const v1::JobEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KickSchedulerLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job as GetJob/ListJobs show it: the committed state with live progress and queue position.
  v1::Job PublicJobLocked(const ActiveJob& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Worker PublicWorkerLocked(const WorkerEntry& worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkerEntry* FindWorkerLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "w-0123... (name)" for messages.
  std::string DescribeWorkerLocked(const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ActiveJob* FindJobLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string NewId(const char* prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One scheduling pass: placements become PLACED (durably), then their assignments are queued.
  void SchedulePass() ABSL_LOCKS_EXCLUDED(mu_);
  void SchedulerLoop();
  // One monitor pass: dead workers, forgetting old dead workers.
  void MonitorPass() ABSL_LOCKS_EXCLUDED(mu_);
  // Flushes the writers whose writes failed transiently, in order, until one still fails.
  void RetryStalledWrites() ABSL_LOCKS_EXCLUDED(mu_);
  void MonitorLoop();

  const CoordinatorOptions options_;
  std::unique_ptr<Metrics> own_metrics_;
  Metrics* const metrics_;
  std::unique_ptr<JobStore>
      store_;  // Set by Start() before the phase leaves kNew; closed by Close().

  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kNew;
  bool streams_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool threads_stop_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  absl::Status store_error_ ABSL_GUARDED_BY(mu_);  // Sticky: the first failed write.
  // Writers whose head write failed transiently; the monitor flushes them again each pass.
  std::vector<std::shared_ptr<JobWriter>> stalled_writers_ ABSL_GUARDED_BY(mu_);
  scheduler::Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<ActiveJob>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TaskEntry> tasks_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<WorkerEntry>> workers_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, Watcher*> watchers_ ABSL_GUARDED_BY(mu_);  // job_id -> watchers.
  // Rendezvous stores of ended ring attempts, destroyed by the coordinator's threads outside mu_.
  std::vector<std::unique_ptr<comm::TcpStoreServer>> retired_stores_ ABSL_GUARDED_BY(mu_);
  std::string ready_set_ ABSL_GUARDED_BY(mu_);  // Ids of the workers taking work, sorted.
  absl::Time ready_set_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);  // Job and worker ids.
  bool schedule_kicked_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar schedule_cv_;
  absl::CondVar monitor_cv_;
  absl::CondVar drain_cv_;  // Signalled when a job leaves PLACED/RUNNING.

  std::thread scheduler_thread_;
  std::thread monitor_thread_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_COORDINATOR_H_
