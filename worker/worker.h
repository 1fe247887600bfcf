// The worker: joins a coordinator, receives attention tasks, runs them, reports them.
//
// Lifecycle of one Worker object:
//   Start() spawns three threads and returns at once; the worker then, until Stop():
//   - session thread: RegisterWorker (retried with exponential backoff, forever: a coordinator that
//   is
//     down or restarting is waited for, never a reason to exit), then Heartbeat every interval with
//     MemAvailable (or the advertised budget left) and every task whose final report is not yet
//     acknowledged. `reregister` (or NOT_FOUND) cancels running tasks without reporting them (the
//     coordinator has already recovered them) and registers again; `drain` (the coordinator places
//     no new work here) is mirrored in readiness until a heartbeat lifts it, and lifting it reopens
//     a closed assignment stream at once instead of after its backoff.
//   - stream thread: holds StreamAssignments open for the current registration and reopens it with
//     backoff whenever it ends. An assignment starts a task thread (up to max_ranks at once); one
//     that cannot run now is answered at once with a FAILED report marked `refused` (UNAVAILABLE
//     when all slots are busy or while stopping): the coordinator places it again without
//     counting an attempt. A drain does not refuse assignments: the coordinator places nothing on
//     a draining worker, so one that arrives was placed before the drain (and finishes like the
//     running tasks) or after an undrain this worker has not heard of yet. A task's slot is free
//     before its final report is queued. A CancelTask stops its task before its next step; a ring
//     rank's communicator is aborted at once, so a step waiting for peers ends too.
//   - reporter thread: sends TaskReports in order. STARTED and PROGRESS (at most one per
//     progress_interval per task) are best effort: dropped if the coordinator cannot take them. A
//     final report (SUCCEEDED / FAILED / CANCELLED) is retried with backoff while the coordinator
//     is unavailable, for as long as the worker lives (Stop bounds it by shutdown_report_deadline).
//     A response with `stop` cancels the task and silences its later reports.
// Task threads run RunAttentionTask (attention_task.h) on the worker's device (task_device.h): the
// host (CPU backend, Gloo rings) unless WorkerOptions::device says otherwise (a GPU). Heartbeats
// list every task with its steps and phase (preparing, forming its ring, running, finished).
//
// Memory. With WorkerOptions::memory_bytes, a task's budget is that figure less the plans of the
// tasks assigned before it. Without it, a task checks its plan (rank_memory_plan.h) when it starts,
// against the device's free bytes (MemAvailable, cudaMemGetInfo) less the claims of the worker's
// other tasks. A task's claim is its plan less the tensors it has allocated so far: from admission
// (its plan fitted) until it finishes. The free figure already shows allocated tensors, but not the
// rest of a plan (engine workspace and ring buffers, which come and go within each step), so that
// rest stays claimed while the task runs. The read of free bytes, the sum of claims and the
// admission happen in one step under the worker's lock, so the plans admitted never add up to more
// than was free. A plan that does not fit is refused at once (FAILED, RESOURCE_EXHAUSTED naming
// the plan and the bytes left for it), never queued.
//
// Cancels mark a task under the worker's lock but abort its ring communicator after releasing it
// (under the task's own communicator lock): an abort (ncclCommAbort) can take seconds, and must
// not hold up heartbeats, reports or assignments meanwhile.
//
// Thread-safety: every public method may be called from any thread. Callbacks in WorkerOptions run
// on the worker's threads and must not call Stop().
#ifndef DATTN_WORKER_WORKER_H_
#define DATTN_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "dattn/v1/worker.grpc.pb.h"
#include "engine/attention.h"
#include "engine/comm/communicator.h"
#include "engine/comm/tcp_store.h"
#include "grpcpp/grpcpp.h"
#include "worker/attention_task.h"
#include "worker/task_device.h"

namespace dattn {
namespace worker {

// Reported in RegisterWorkerRequest.version.
extern const char kWorkerVersion[];

struct WorkerOptions {
  // Required. Where the coordinator's WorkerRegistry listens: "host:port" or "unix:/path".
  std::string coordinator_address;
  // Required. Stable worker name (host:pid, pod name); re-registering under it replaces the old
  // entry.
  std::string name;
  // Where this worker's health endpoint listens, for the coordinator's records (may be empty).
  std::string address;
  // Ranks run at once; >= 1.
  int max_ranks = 1;
  // Engine threads of each task's backend; 0 means max(1, hardware threads / max_ranks).
  int threads_per_task = 0;
  // Zero: the coordinator's interval. Positive: this, or the coordinator's when that is shorter
  // (the coordinator's dead-after is derived from its own figure, so heartbeating less often is
  // unsafe).
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // Positive: advertise this many bytes of memory (instead of MemTotal) and budget tasks against it
  // (minus what running tasks planned) instead of against MemAvailable.
  int64_t memory_bytes = 0;
  // Deadline of each unary RPC, which waits for the coordinator to be reachable within it rather
  // than failing at once (reports carrying an output get 1 s more per 8 MiB).
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Reconnect / retry backoff: doubles from initial to max, with +-20% jitter.
  absl::Duration backoff_initial = absl::Milliseconds(200);
  absl::Duration backoff_max = absl::Seconds(10);
  // Least time between two PROGRESS reports of one task.
  absl::Duration progress_interval = absl::Milliseconds(500);
  // How long Stop() keeps trying to deliver final reports.
  absl::Duration shutdown_report_deadline = absl::Seconds(10);
  // The device tasks run on; null: the host (NewCpuDevice with ring_address).
  std::shared_ptr<TaskDevice> device;
  // Address Gloo listens on for ring peers when the device is the default host device.
  std::string ring_address = "127.0.0.1";
  // Longest wait for a ring peer when an assignment's RingInfo leaves it 0.
  absl::Duration default_comm_timeout = absl::Seconds(120);
  // Mutual TLS to the rings' rendezvous stores (engine/comm/tcp_store.h): the cluster CA, and this
  // worker's certificate and key signed by it; the files are read at each ring join. Empty:
  // plaintext (a coordinator whose stores use TLS then refuses this worker's ranks).
  comm::StoreTls store_tls;
  // Called when readiness (registered, not draining, not stopping) changes; on a worker thread.
  std::function<void(bool ready)> on_ready_change;
  // Called once for every assignment this worker took or refused, when its outcome is known and
  // before its final report is queued (also for a rank the coordinator silenced, whose report is
  // then never sent): the assignment, the final report (state, error and error_code, rank_result,
  // ring_formation_seconds, refused; worker_id and time not yet set) and the last phase the rank
  // reached (PREPARING, FORMING_RING or RUNNING; UNSPECIFIED for a refusal). On the task's thread,
  // or the stream thread for a refusal, without the worker's lock; it must not block for long or
  // call the worker (worker_metrics.h counts outcomes here).
  std::function<void(const v1::TaskAssignment& assignment, const v1::TaskReport& report,
                     v1::RankPhase last_phase)>
      on_task_end;
  // Called when a rank's set-up ran out of memory and was retried once after releasing the
  // device's caches (oom_retry.h), whether the retry fit; on the task's thread, without the
  // worker's lock (worker_metrics.h counts them here).
  std::function<void(bool recovered)> on_out_of_memory_retry;
  // The clock of heartbeat intervals, backoffs, progress rate limits, the shutdown report deadline
  // and report timestamps (base/clock.h); not owned; nullptr: the real clock. RPC deadlines and
  // ring waits stay on real time (they bound waits on other processes).
  const Clock* clock = nullptr;
  // Channel credentials; default insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  // Calls Stop().
  ~Worker();

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Validates the options, reads the host's capabilities and starts the worker's threads. Returns
  // without waiting for the coordinator. INVALID_ARGUMENT naming a bad option; FAILED_PRECONDITION
  // if called twice or after Stop(). On error nothing is started.
  absl::Status Start();

  // Shutdown, in order: refuse new assignments and close the assignment stream; cancel running
  // tasks (each stops before its next step and reports CANCELLED); wait for the task threads;
  // deliver pending final reports until shutdown_report_deadline (what is left is logged and
  // dropped); stop heartbeats. Blocks until done; idempotent; a no-op before Start().
  void Stop();

  // Leaving gracefully (dattn-worker's SIGTERM with --drain-wait-s), before Stop(): readiness turns
  // off and every heartbeat from now on (the first at once) asks the coordinator to drain this
  // worker (HeartbeatRequest.draining), so that nothing new is placed here; then waits up to `wait`
  // until the coordinator has answered with the drain (or cannot be reached: not registered, or
  // heartbeats failing) and no task is left running. Returns true when that happened in time,
  // false at the deadline (Stop() then cancels what is left).
  bool Leave(absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_);

  // Introspection, for tests and the health endpoint.
  std::string worker_id() const;  // Empty while not registered.
  bool registered() const;
  bool draining() const;
  int64_t registrations() const;  // Successful RegisterWorker calls so far.
  int running_tasks() const;      // Task threads alive.
  const v1::WorkerCapabilities& capabilities() const { return capabilities_; }
  // The ranks held here by phase, the bytes planned for those, readiness, drain and registrations:
  // one consistent snapshot (for the metrics endpoint: a scrape that shows the worker ready also
  // counts the registration that made it so).
  struct Load {
    int preparing = 0;
    int forming_ring = 0;
    int running = 0;
    int finished = 0;            // Ended; the final report not yet taken by the coordinator.
    int64_t reserved_bytes = 0;  // Planned bytes of the ranks not yet ended.
    bool ready = false;          // Registered and accepting work (the readiness probe's answer).
    bool draining = false;
    int64_t registrations = 0;  // Successful RegisterWorker calls so far.
  };
  Load load() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Task;
  class ActiveCall;
  class StreamCall;
  class ServeStream;
  struct PendingReport {
    v1::TaskReport report;
    bool final = false;
    int rejections = 0;  // Non-retryable failures so far (final reports only).
  };

  void SessionLoop();
  void StreamLoop();
  void ReporterLoop();
  void RunTask(std::shared_ptr<Task> task);

  absl::Status Register();
  void Heartbeat();
  void HandleAssign(const v1::TaskAssignment& assign);
  void HandleCancel(const v1::CancelTask& cancel);
  // Queues a report; PROGRESS replaces a queued PROGRESS of the same task.
  void Enqueue(v1::TaskReport report, bool final) ABSL_LOCKS_EXCLUDED(mu_);
  void EnqueueLocked(v1::TaskReport report, bool final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefuseTask(const v1::TaskAssignment& assign, absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);
  // Uploads a finished task's output shard (WorkerRegistry.UploadOutput, chunks of
  // api::kMaxOutputChunkBytes) before its SUCCEEDED report: retried with backoff while the
  // coordinator cannot take it, as a final report is, until the worker stops. OK; CANCELLED when
  // the coordinator no longer wants the task (it is then silenced) or the worker stops; the
  // coordinator's refusal otherwise (the task then fails with it).
  absl::Status UploadOutput(Task& task, const v1::Tensor& output) ABSL_LOCKS_EXCLUDED(mu_);
  // A streamed task's inputs (WorkerRegistry.ReadInput), each chunk handed to `write` as it comes;
  // and one of its outputs (UploadOutput with the output's tensor), read by `read` a chunk at a
  // time. Neither is retried: the coordinator relays every chunk once (server/attend_relay.h).
  absl::Status ReadInputs(Task& task, const AttentionTaskOptions::ChunkWriter& write)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UploadStreamed(Task& task, v1::AttendTensor tensor, const v1::TensorHeader& header,
                              const AttentionTaskOptions::ShardReader& read)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks every running task cancelled; `silent` ones send no further report. The caller passes
  // `to_abort` to AbortComms once it has released mu_.
  void CancelAllLocked(bool silent, const char* why, std::vector<std::shared_ptr<Task>>* to_abort)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapLocked(std::vector<std::thread>* to_join) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborts the ring communicator of each task, if it has one, under the task's comm_mu (which keeps
  // the communicator alive meanwhile). Without mu_: an abort may take seconds on a GPU.
  void AbortComms(const std::vector<std::shared_ptr<Task>>& tasks, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // AttentionTaskOptions::reserve_memory of `task`: the device's free bytes less the claims of the
  // other tasks (see Memory above); admits `task` with `planned_bytes` when they fit.
  absl::StatusOr<int64_t> ReserveMemory(Task* task, int64_t planned_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t FreeMemoryBytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps up to `d` with mu_ released, returning early once `wake` (checked on every signal of
  // cv_, with mu_ held) is true.
  void SleepLocked(absl::Duration d, const std::function<bool()>& wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wait before retry number `attempt` (0-based).
  absl::Duration Backoff(int attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyReady() ABSL_LOCKS_EXCLUDED(mu_);

  // Fixed after Start().
  const WorkerOptions options_;
  const Clock* const clock_;
  std::shared_ptr<TaskDevice> device_;
  int threads_per_task_ = 1;
  v1::WorkerCapabilities capabilities_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerRegistry::Stub> stub_;
  std::thread session_thread_, stream_thread_, reporter_thread_;

  absl::Mutex stop_mu_;    // Serialises Stop() calls.
  absl::Mutex notify_mu_;  // Serialises on_ready_change calls, so they arrive in order.
  bool ready_notified_ ABSL_GUARDED_BY(notify_mu_) =
      false;  // Last value passed to on_ready_change.

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(stop_mu_, notify_mu_);
  absl::CondVar cv_;  // Signalled on every change of the state below.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;       // Stop() began: no new work.
  bool stop_session_ ABSL_GUARDED_BY(mu_) = false;   // Session and stream threads exit.
  bool stop_reporter_ ABSL_GUARDED_BY(mu_) = false;  // Reporter exits.
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Registrations so far.
  bool reregister_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;        // Leave() was called.
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;  // Send the next heartbeat without waiting.
  // The device's last health check (TaskDevice::Health) failed with this; empty while it works.
  std::string device_error_ ABSL_GUARDED_BY(mu_);
  bool reopen_stream_now_ ABSL_GUARDED_BY(mu_) = false;  // A drain was lifted: skip the backoff.
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(2);
  grpc::ClientContext* stream_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::set<grpc::ClientContext*> unary_contexts_ ABSL_GUARDED_BY(mu_);  // Calls in flight.
  bool cancel_unary_ ABSL_GUARDED_BY(mu_) = false;  // Stop() cancels every unary call from now.
  std::map<std::string, std::shared_ptr<Task>> tasks_ ABSL_GUARDED_BY(mu_);  // Threads not joined.
  // Tasks whose final report is queued or in flight: still listed in heartbeats.
  std::map<std::string, int64_t> unreported_ ABSL_GUARDED_BY(mu_);  // task_id -> steps_done.
  std::set<std::string> silenced_ ABSL_GUARDED_BY(mu_);  // Coordinator said stop: report no more.
  std::deque<std::string> finished_order_ ABSL_GUARDED_BY(mu_);  // Recently finished ids, bounded.
  std::set<std::string> finished_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Planned bytes of running tasks.
  std::deque<PendingReport> reports_ ABSL_GUARDED_BY(mu_);
  bool report_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t jitter_state_ ABSL_GUARDED_BY(mu_) = 0;
  std::string heartbeat_error_ ABSL_GUARDED_BY(mu_);  // Last logged heartbeat failure.
};

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_WORKER_H_
