// The coordinator: the thin owner that wires its roles together behind a C++ API of dattn.v1
// messages and absl::Status. The gRPC layer (grpc_service.h) is a shell over it; tests drive it
// directly, playing the workers' part through the same calls the WorkerRegistry service makes.
//
// Roles (each in its own files, each with its contract in its header, calls going one way: the
// coordinator calls them, a role calls only the roles listed after it, and nothing calls back):
//   - JobReader (job_reader.h): what clients read: job views, listings, watches, outputs;
//   - JobRunner (job_runner.h): a placed job's attempts: reports, cancels, lost workers, recovery;
//   - JobRecorder (job_recorder.h): commits the book's writes, follows the store's health,
//     retention;
//   - Dispatcher (dispatcher.h): the queue, feasibility, the scheduling pass and assignments;
//   - JobBook (job_book.h): the jobs not yet finished, their state machine and the queue of their
//     durable writes to the JobStore (job_store.h);
//   - WorkerRegistry (worker_registry.h): workers, liveness, drain, and the tasks placed on them;
//   - RingRendezvous (ring_rendezvous.h): a rendezvous store per ring attempt;
//   - WorkKinds (work_kind.h): what each kind of work means (attention_kind.h, training_kind.h,
//     deployment_kind.h);
//   - ResultStore (result_store.h): jobs' stored outputs;
//   - ModelRegistry (model_registry.h): registered models, each version a folder it wrote.
// The coordinator itself validates calls, owns the lifecycle (start, recovery, drain, close) and
// runs two threads: the scheduling loop and the monitor.
//
// Durability. The JobStore is the only durable state besides stored outputs and the registry's
// model folders. A call that changes a
// job returns OK only after the change is committed, so an acknowledged submit, cancel or report
// survives a crash. Changes of one job are written in the order they were decided, and watchers
// see only committed events. Everything else (workers, tasks, the queue, unpersisted progress)
// lives in memory and is rebuilt after a restart: queued jobs go back in the queue in submit
// order; placed and running jobs are requeued with a "coordinator_restarted" event and attempt + 1
// (their workers re-register and are told to stop the old tasks), so no acknowledged job is lost
// and no result is reported twice (reports of an older attempt, or from a worker registration that
// no longer holds the task, are answered stop = true and ignored).
//
// Store failure. If a write fails for a storage reason (disk full, I/O error, read-only file
// system) the store refuses every later write until a probe write commits again (job_store.h); the
// coordinator then answers every changing call with UNAVAILABLE, places nothing, and Health()
// reports the error (not ready). The monitor probes the store once a pass while it fails, and
// every `store_probe_interval` while it is idle (so that a store that can no longer be written is
// reported before a real write fails). Once a probe commits the coordinator is ready again: the
// writes decided meanwhile are committed in order, and a queued job whose submit reached the file
// although its client was told otherwise is taken into the queue.
//
// Jobs submitted while no worker is ready are accepted and queued: workers may register later. Once
// a worker is ready, a job that no ready worker could ever run is rejected with RESOURCE_EXHAUSTED
// and the planner's numbers. A job with several device kinds (DEVICE_PREFERENCE_ANY) runs on the
// first kind that can run it and that the ready workers could fit when it is queued.
//
// Unchecked jobs. A job accepted while no worker was ready (and every job queued again after a
// coordinator restart) has not been checked against any worker. Once at least one worker is ready
// and the set of ready workers has not changed for `feasibility_settle` (workers of a new cluster
// register one by one), each such job is checked once (dispatcher.h): one that the ready workers
// could never run fails with the planner's numbers; one they could run is checked for good and
// waits, whatever happens to the workers later.
//
// Rings. A job of P > 1 ranks is a gang of P ranks placed together (memory per rank: the largest
// rank's plan) on workers that join rings of its device kind. For each attempt the coordinator
// starts a rendezvous store (ring_rendezvous.h) and hands every rank a RingInfo; the store stops
// when the attempt ends. A rank's FAILED report ends the attempt: the other ranks are sent
// CancelTask, the job gets an event naming what failed ("ring_formation_failed" naming the ranks
// that never arrived and their workers, as the store shows them; or "ring_failed" with the rank,
// its worker and error, and the ring's members) and is requeued or failed as for any failure (a
// failed ring attempt is one attempt).
//
// Outputs. Ranks of a job that keeps its output upload their shards (UploadOutput) before their
// SUCCEEDED report; the job succeeds only once every shard is stored, and ReadOutput streams the
// assembled tensor. Finished jobs and their outputs are deleted by DeleteJob, or by the monitor
// once older than `retention` (Job.expire_time says when).
//
// A worker whose assignment stream broke (its process died, or its connection did) is not given new
// ranks until it opens a stream again: a killed worker's peers report the failure long before its
// heartbeats are missed, and the retry must not land on it.
//
// Attempts. Job.attempt is 0 until the first placement, 1 for the first run, and grows by one on
// each requeue. A failure (worker lost, rank failed with a retryable code) requeues the job while
// its own failed runs are fewer than max_attempts, else fails it with the reason. Requeues that
// are not the job's doing do not count: a coordinator restart or shutdown, and a rank its worker
// refused before starting it (TaskReport.refused: no free slot, draining, stopping); that worker
// then gets no new rank until its next heartbeat, and more than kMaxRefusals refusals in a row
// fail the job.
//
// Time. Every age, interval, deadline and timestamp comes from `options.clock` (base/clock.h), so
// tests run timeouts on a FakeClock; waits that poll a client's cancellation use real time.
//
// Threads and locking. Every public method may be called from any thread. One mutex guards every
// role: the state roles are held ABSL_GUARDED_BY it (so clang's -Wthread-safety checks each use),
// and the acting roles (reader, runner, recorder) share it by pointer and assert it where they
// need it held; store and network I/O happen without it. The coordinator runs two threads of its
// own: the scheduling loop (woken by submits, worker changes and task ends, and once a second) and
// the monitor (dead workers, store probes, stalled writes, retention). WatchJob, StreamAssignments,
// ReadOutput and UploadOutput block the calling thread for the stream's life.
#ifndef DATTN_SERVER_COORDINATOR_H_
#define DATTN_SERVER_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "dattn/v1/admin.pb.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"
#include "dattn/v1/worker.pb.h"
#include "server/attend_relay.h"
#include "server/coordinator_options.h"
#include "server/deployment_router.h"
#include "server/dispatcher.h"
#include "server/job_book.h"
#include "server/job_reader.h"
#include "server/job_recorder.h"
#include "server/job_runner.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/requests.h"
#include "server/result_store.h"
#include "server/ring_rendezvous.h"
#include "server/tenant_quotas.h"
#include "server/work_kind.h"
#include "server/worker_registry.h"

namespace dattn {
namespace server {

// Called by StreamAssignments for each command; false when it could not be delivered (the worker
// went away): the stream then ends. (JobEventSink, TensorChunkSink and CancelledFn: job_reader.h.)
using WorkerCommandSink = std::function<bool(const v1::WorkerCommand&)>;
// Reads the next message of a client stream into its argument; false at the end of the stream.
using UploadSource = std::function<bool(v1::UploadOutputRequest*)>;
// An Attend call's client stream: reads the next message; false at its end (the client
// half-closed, went away or the call was cancelled).
using AttendSource = std::function<bool(v1::AttendRequest*)>;
// Sends one message of an Attend call's answer; false when it could not be sent (the client went
// away). Called from another thread than AttendSource, never two calls at once.
using AttendSink = std::function<bool(const v1::AttendResponse&)>;
// A streamed rank's input chunks, to its worker (ReadInput); false when the worker went away.
using AttendChunkSink = std::function<bool(const v1::AttendChunk&)>;

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

  // Opens the store and the output folder, recovers the active jobs (see the top of this file),
  // removes outputs no job keeps, and starts the scheduling loop and the monitor; from then on the
  // coordinator serves. Errors: INVALID_ARGUMENT for bad options; the store's Open errors
  // (FAILED_PRECONDITION if another coordinator holds the data dir); UNAVAILABLE if a recovery
  // write fails. After an error the coordinator stays unstarted; call Close(). Call once.
  absl::Status Start();

  // --- JobService ------------------------------------------------------------------------------
  // Validates (requests.h), checks that a ready worker could ever run the job (RESOURCE_EXHAUSTED
  // with the planner's numbers otherwise; skipped while no worker is ready), stores it QUEUED with
  // a "submitted" event and queues it. A known idempotency_key with the same spec returns the
  // existing job (created = false); with another spec ALREADY_EXISTS. UNAVAILABLE while starting,
  // shutting down or when the store fails: nothing was stored, retry with the same key.
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request);
  // The job as last committed, with live progress and queue_position while QUEUED; events if asked.
  // No tensor: outputs are read with ReadOutput. NOT_FOUND naming the id.
  absl::StatusOr<v1::Job> GetJob(const v1::GetJobRequest& request);
  // The NOT_FOUND that GetJob answers for a job id that does not exist (what a user is told of
  // another tenant's job: the two must not be told apart).
  absl::Status JobNotFound(const std::string& job_id) const;
  // A page of job summaries, newest first (JobStore::List), showing active jobs as the coordinator
  // knows them now; no tensor. INVALID_ARGUMENT for a bad filter, page size or token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request);
  // QUEUED (or PLACED but not yet handed to a worker): CANCELLED now. PLACED/RUNNING: a
  // "cancel_requested" event is stored and each worker is sent CancelTask; the job ends CANCELLED
  // when every rank confirms, fails or its worker is lost; if every rank succeeds before the
  // cancel reaches it, the job SUCCEEDS (a ring with only some ranks finished ends CANCELLED and
  // drops their results). CANCELLED: OK, unchanged. SUCCEEDED/FAILED: FAILED_PRECONDITION. Returns
  // the job as it is after the call.
  absl::StatusOr<v1::Job> CancelJob(const v1::CancelJobRequest& request);
  // Emits the job's committed events with seq > after_seq (read from the store kWatchHistoryPage at
  // a time), then each new one as it commits, until the terminal event was emitted (OK), `emit`
  // returns false or `cancelled` returns true (CANCELLED), or the coordinator closes its streams
  // (UNAVAILABLE). NOT_FOUND for an unknown job; RESOURCE_EXHAUSTED when max_watch_streams watches
  // are open already.
  absl::Status WatchJob(const v1::WatchJobRequest& request, const JobEventSink& emit,
                        const CancelledFn& cancelled);
  // Streams the stored output of a SUCCEEDED job (header first, then chunks of at most
  // api::kMaxOutputChunkBytes). NOT_FOUND for an unknown job or one that kept no output;
  // FAILED_PRECONDITION for a job that has not succeeded; CANCELLED when `emit` fails; DATA_LOSS
  // when its files are damaged.
  absl::Status ReadOutput(const v1::ReadOutputRequest& request, const TensorChunkSink& emit);
  // Deletes a finished job, its history and its output. NOT_FOUND for an unknown job;
  // FAILED_PRECONDITION for one that has not finished.
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const v1::DeleteJobRequest& request);

  // The model registry (job_service.proto; model_registry.h). Tenants are as the request names
  // them (the gRPC edge scopes a user to its own). ImportModel copies a folder or a training job's
  // checkpoint (its final one, or training_job_step's) as the next version of `name`; DeleteModel
  // refuses a version that a deployment not yet ended serves (FAILED_PRECONDITION naming them).
  // `cancelled` (the caller went away) ends an import's copy CANCELLED.
  absl::StatusOr<v1::RegisteredModel> ImportModel(const v1::ImportModelRequest& request,
                                                  const std::function<bool()>& cancelled = nullptr);
  absl::StatusOr<v1::ListModelsResponse> ListModels(const v1::ListModelsRequest& request);
  absl::StatusOr<v1::DeleteModelResponse> DeleteModel(const v1::DeleteModelRequest& request);
  // Attention on the caller's tensors (job_service.proto, Attend; attend_relay.h): `first` is the
  // call's first message (start; its tenant already set by the edge), `next` reads the chunks,
  // `emit` sends the answer (accepted, output chunks, done). Submits a streamed attention job
  // (sized to the fewest ranks that fit when start.num_ranks is 0), relays every input chunk to
  // the rank that owns it and every output chunk back, and returns when the job has ended: OK
  // after `done`; the errors job_service.proto lists. `cancelled` (polled) or a failed `emit`
  // cancels the job. Blocks the calling thread for the call's life and runs `next` on a thread of
  // its own.
  // `end_call` (optional) ends the call so that a `next` blocked waiting for the client returns
  // false (ServerContext::TryCancel); it is called only when the call ends before the client sent
  // every input (a bad chunk, the job failed, the client went away).
  absl::Status Attend(const v1::AttendRequest& first, const AttendSource& next,
                      const AttendSink& emit, const CancelledFn& cancelled,
                      const std::function<void()>& end_call = nullptr);

  // Generate on a deployment (job_service.proto; deployment_router.h): checks the deployment
  // (NOT_FOUND unknown; FAILED_PRECONDITION not a deployment, or not serving), resolves
  // prompt_text and stop_text into tokens, then `emit`s accepted, each token and done as they
  // come. `timeout` (the call's deadline; InfiniteDuration: none) travels to the rank, which ends
  // the request DEADLINE_EXCEEDED. `cancelled` (polled) or a failed `emit` cancels the request.
  absl::Status Generate(const v1::GenerateRequest& request,
                        const std::function<bool(const v1::GenerateResponse&)>& emit,
                        const CancelledFn& cancelled, absl::Duration timeout);
  // Score on a deployment; errors as Generate's.
  absl::StatusOr<v1::ScoreResponse> Score(const v1::ScoreRequest& request,
                                          const CancelledFn& cancelled);
  // The deployment `job_id` if it serves now (Generate and Score are routed to its rank): its
  // vocabulary size. NOT_FOUND for an unknown job; FAILED_PRECONDITION for a job that is not a
  // deployment, or one queued, loading its model or ended (the message says which); UNAVAILABLE
  // while the coordinator is not taking calls.
  absl::StatusOr<int64_t> ServingDeployment(const std::string& job_id);

  // --- WorkerRegistry --------------------------------------------------------------------------
  // A new worker id per call. Another live registration under the same name is declared dead and
  // its jobs are recovered ("worker_lost", cause worker_reregistered). INVALID_ARGUMENT naming the
  // field for an empty name, max_ranks < 1, negative memory, no dtypes or an unknown dtype.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // Records liveness and free memory. reregister = true for an unknown or dead id; drain = true
  // while draining. A heartbeat with `draining` (a worker leaving) drains its worker. Tasks the
  // worker reports that the coordinator no longer wants get a CancelTask, and hold their slots
  // until a heartbeat no longer lists them (worker_registry.h, WorkerEntry::stopping).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // Sends the worker's commands (assignments, cancels) in order as they come, until: a newer stream
  // of the same worker replaces this one (ABORTED), the worker is drained and idle (OK), it is
  // declared dead (NOT_FOUND), `send` fails or `cancelled` (CANCELLED; an unsent command waits for
  // the next stream), or streams are closed (UNAVAILABLE). NOT_FOUND for an unknown worker.
  absl::Status StreamAssignments(const v1::StreamAssignmentsRequest& request,
                                 const WorkerCommandSink& send, const CancelledFn& cancelled);
  // Applies a task's report: one handler per state (see coordinator.cc). stop = true for a task the
  // coordinator does not (or no longer) want from this worker. INVALID_ARGUMENT for an unspecified
  // state or a SUCCEEDED report without its rank result.
  absl::StatusOr<v1::ReportTaskResponse> ReportTask(const v1::TaskReport& request);
  // Stores a rank's output shard: `first` is the stream's first message (worker, task, header),
  // `next` reads the rest. FAILED_PRECONDITION for a task whose job keeps no output or a header
  // that is not the rank's shard; INVALID_ARGUMENT for chunks out of order or over
  // api::kMaxOutputChunkBytes; stop = true for a task no longer wanted; UNAVAILABLE when the shard
  // cannot be written.
  absl::StatusOr<v1::UploadOutputResponse> UploadOutput(const v1::UploadOutputRequest& first,
                                                        const UploadSource& next);
  // Sends rank `task_id`'s input chunks of a streamed job as its client sends them (ReadInput),
  // until the last one (OK). FAILED_PRECONDITION for a task this worker does not hold or whose job
  // is not streamed; CANCELLED when the call ended first; `cancelled` (polled) ends it CANCELLED.
  absl::Status ReadInput(const v1::ReadInputRequest& request, const AttendChunkSink& send,
                         const CancelledFn& cancelled);
  // A deployment rank's Serve stream (worker.proto): `first` names the worker and the task and
  // carries the rank's status; `next` reads its updates and `send` writes its work until the
  // stream ends (deployment_router.h). FAILED_PRECONDITION for a task this worker does not hold
  // or whose job is not a deployment.
  absl::Status Serve(const v1::ServeUpdate& first,
                     const std::function<bool(v1::ServeUpdate*)>& next,
                     const std::function<bool(const v1::ServeWork&)>& send,
                     const CancelledFn& cancelled, const std::function<void()>& end_stream);
  // The name the worker `worker_id` registered under (live or dead); "" for an id never issued
  // (or forgotten). The gRPC edge checks it against the caller's certificate (access.h).
  std::string WorkerName(const std::string& worker_id);

  // --- AdminService ----------------------------------------------------------------------------
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const v1::ListWorkersRequest& request);
  // Stops placing work on the worker named by id (or, failing that, by name: its live
  // registration). Idempotent. NOT_FOUND naming the value; FAILED_PRECONDITION for a dead worker.
  absl::StatusOr<v1::Worker> DrainWorker(const v1::DrainWorkerRequest& request);
  // Lets a drained worker take work again (the worker learns it from its next heartbeat).
  // Idempotent. Errors as DrainWorker's.
  absl::StatusOr<v1::Worker> UndrainWorker(const v1::UndrainWorkerRequest& request);

  // --- Lifecycle (the order main follows) --------------------------------------------------------
  // Readiness: OK once started while the store can be written and the coordinator is not shutting
  // down; UNAVAILABLE saying why otherwise.
  absl::Status Health();
  // Submits answer UNAVAILABLE from now on and nothing new is placed; reports, heartbeats and reads
  // go on. Idempotent.
  void StopAccepting();
  // Waits up to `timeout` for every placed or running job to end (deployments, which never end by
  // themselves, are not waited for). Jobs still active then are requeued (attempt + 1, recovery
  // cause drain_timeout; CANCELLED if a cancel was requested) and their workers sent CancelTask;
  // waits up to a further second for the cancels to be delivered. Returns the store's error if a
  // write fails. Call after StopAccepting().
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

  absl::Status CheckPhaseLocked(bool submit) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitJob's body. `sizes`: the specs to try, in order, instead of the kind's Sizes (an Attend
  // call's ring sizes); `on_adopt` is called under the lock with a job this call created, just
  // before it enters the queue (an Attend call registers its relay session there, before any rank
  // can ask for it).
  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::SubmitJobRequest& request,
                                               std::vector<v1::JobSpec> sizes,
                                               const std::function<void(const v1::Job&)>& on_adopt);
  // Fills a deployment spec's model_config_json (and, from training_job_id, its checkpoint) at
  // submit: reads the checkpoint's manifest and model config (no checksums: the worker verifies
  // them when it loads). A step of a training job that has not ended is pinned first
  // (model::PinCheckpoint; DeploymentSpec.checkpoint_pinned): `new_pin` receives the pin's folder
  // when this call made it (the caller removes it unless a job was created). INVALID_ARGUMENT
  // naming the field; NOT_FOUND for an unknown training job; FAILED_PRECONDITION when the step
  // cannot be pinned (no write access to the job's checkpoint folder).
  // The job `job_id` of `tenant` (a deployment's or an import's training job): NOT_FOUND naming
  // `field` for a job that does not exist or is another tenant's (the same message).
  absl::StatusOr<v1::Job> TenantJob(const std::string& tenant, const std::string& job_id,
                                    const std::string& field);
  absl::Status ResolveDeployment(const std::string& idempotency_key, v1::JobSpec* spec,
                                 std::string* new_pin);
  // The task `task_id` of the current attempt of an active job, if worker `worker_id` holds it
  // (and *run, its job); nullptr otherwise: a report, upload or stream of it is not wanted.
  const TaskEntry* HeldTaskLocked(const std::string& worker_id, const std::string& task_id,
                                  const JobRun** run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's committed view once it has ended; nullopt while it is active (or on a read error).
  std::optional<v1::Job> EndedJob(const std::string& job_id);
  // The reason of the cancel requested for the active job `job_id` (dattn cancel), if one was.
  std::optional<std::string> CancelRequested(const std::string& job_id);
  // UNAVAILABLE while the store cannot be written (nothing is changed then).
  absl::Status CheckWritableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() const { return clock_->Now(); }
  std::string NewId(const char* prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Loads the active jobs at start-up (see "Durability" above).
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the checkpoint pins (SERVING.md, "Pinned steps") of deployments that ended while no
  // scheduling pass came after to remove them (the coordinator stopped first): every finished
  // deployment's pin that no active one (`active`, as Recover loaded them) holds. Runs once at
  // Start, after Recover; failures are logged, never fatal (a pin left behind costs disk only).
  void RemoveStalePins(const std::vector<StoredJob>& active) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a stored QUEUED job into the book and the queue; no-op if present.
  void AdoptLocked(const StoredJob& stored, const AnalyzedSpec& spec, bool checked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One scheduling pass: feasibility verdicts, placements (durably PLACED), then assignments.
  void SchedulePass() ABSL_LOCKS_EXCLUDED(mu_);
  void SchedulerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // One monitor pass: store probes, stalled writes, dead workers, retention.
  void MonitorPass() ABSL_LOCKS_EXCLUDED(mu_);
  void MonitorLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Destroys retired rendezvous stores (their threads are joined) and removes the checkpoint pins
  // of ended deployments (JobRunner::TakeRetiredPins), without the lock.
  void ReapStores() ABSL_LOCKS_EXCLUDED(mu_);

  const CoordinatorOptions options_;
  const Clock* const clock_;
  std::unique_ptr<Metrics> own_metrics_;
  Metrics* const metrics_;
  WorkKinds kinds_;  // Fixed after construction.
  // Set by Start() before the phase leaves kNew; thread-safe themselves.
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<ResultStore> outputs_;
  std::unique_ptr<ModelRegistry> registry_;
  // Held for reading while a deployment is resolved and submitted, for writing while DeleteModel
  // checks a version's users and removes it: a version is never removed under a submit that
  // resolved to it. Taken before mu_ (never while holding it).
  absl::Mutex model_use_mu_;
  AttendRelay relay_;        // Attend calls' sessions; thread-safe itself.
  DeploymentRouter router_;  // Deployments' Serve streams and their calls; thread-safe itself.

  mutable absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kNew;
  bool streams_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool threads_stop_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);  // Job and worker ids.
  absl::CondVar monitor_cv_;
  absl::CondVar drain_cv_;  // Signalled when a job leaves PLACED/RUNNING or a command is sent.

  // The state roles, guarded by mu_.
  JobBook book_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  RingRendezvous rings_ ABSL_GUARDED_BY(mu_);
  Dispatcher dispatcher_ ABSL_GUARDED_BY(mu_);
  TenantQuotas quotas_ ABSL_GUARDED_BY(mu_);
  // The acting roles: they hold mu_ and the state roles by pointer, and each method takes mu_ or
  // asserts that it is held (their headers say which).
  JobRunner runner_;
  JobRecorder recorder_;
  JobReader reader_;

  std::thread scheduler_thread_;
  std::thread monitor_thread_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_COORDINATOR_H_
