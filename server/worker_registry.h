// The worker registry: the workers the coordinator knows, their liveness, drain state, device
// health and free memory, the ranks (tasks) placed on them, and the commands waiting for their
// assignment streams.
//
// A registration gets a new id per RegisterWorker call; its name is stable across a worker's
// restarts. A worker is READY (takes ranks), DRAINING (finishes what it runs, takes nothing new;
// undrained back to READY) or DEAD (missed heartbeats for dead_after, replaced by a registration
// under the same name, or its process gone): a dead worker holds nothing, and is forgotten after
// a retention. A worker whose assignment stream broke takes no new ranks until it opens another
// one, one that refused a rank takes none until its next heartbeat, and one whose heartbeats say
// its device failed (HeartbeatRequest.device_error: a GPU's sticky CUDA error) takes none, and
// counts for nothing the cluster could run, until a heartbeat says the device works again.
//
// A task is one rank of one attempt of a job, placed on one worker: the registry keeps its
// reservation (the worker's memory counted as used while the task lives), whether its assignment
// went out, and what the worker last said of it (started, steps, phase, ring formation).
//
// The registry decides nothing about jobs: it reports what it saw (the tasks of a worker declared
// dead, tasks whose assignment must be sent again) and the coordinator decides. It writes only
// metrics (the worker gauges).
//
// Thread-safety: none of its own. The coordinator holds it ABSL_GUARDED_BY its mutex; every call
// is made with that mutex held, and the condition variables it hands out are waited on with it.
// WorkerEntry and TaskEntry pointers stay valid while the mutex is held (a dead worker's entry also
// while a stream of it is open: Forget waits for streams to end).
#ifndef DATTN_SERVER_WORKER_REGISTRY_H_
#define DATTN_SERVER_WORKER_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dattn/v1/admin.pb.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/worker.pb.h"
#include "scheduler/types.h"
#include "server/metrics.h"

namespace dattn {
namespace server {

struct TaskEntry {
  std::string task_id;  // job_id + "/" + attempt + "/" + rank.
  std::string job_id;
  std::string tenant;  // The job's (api::TenantOrDefault), for the quota on running ranks.
  std::string worker_id;
  int attempt = 0;
  int rank = 0;
  int64_t memory_bytes = 0;  // Reserved on the worker while the task lives.
  bool dispatched = false;   // Its assignment was queued for the worker's stream.
  absl::Time dispatched_at;  // When it was last queued (heartbeats re-send a lost one).
  bool started = false;
  int64_t steps_done = 0;
  v1::RankPhase phase = v1::RANK_PHASE_UNSPECIFIED;  // As the worker last reported it.
  double formation_seconds = 0;                      // > 0 once the rank's ring is formed.
  bool output_uploaded = false;                      // Its output shard is stored.
};

struct WorkerEntry {
  v1::Worker info;  // As ListWorkers shows it (task_ids and times are filled on read).
  scheduler::WorkerState state = scheduler::WorkerState::kReady;
  absl::Time last_heartbeat;
  absl::Time dead_since = absl::InfinitePast();
  std::set<std::string> task_ids;
  std::deque<v1::WorkerCommand> outbox;
  uint64_t stream_generation = 0;  // Bumped by each new stream; an older stream then ends.
  int streams = 0;                 // StreamAssignments calls inside; the entry outlives them.
  bool stream_lost = false;        // Its last stream broke: no new ranks until one is open again.
  bool refused_since_heartbeat = false;  // It refused a rank: no new rank until a heartbeat.
  // Tasks the coordinator no longer runs here that the worker may still be stopping (cancelled
  // ones, and those its last heartbeat listed without an entry here): each holds a slot until the
  // worker's heartbeat no longer lists it or its final report comes. A cancelled training rank
  // takes a step and a checkpoint to stop; placing a new rank on its slot meanwhile would only be
  // refused.
  std::set<std::string> stopping;
  std::unique_ptr<absl::CondVar> cv = std::make_unique<absl::CondVar>();
};

// What one StreamAssignments call should do next.
struct StreamStep {
  enum class Kind { kSend, kWait, kEnd } kind = Kind::kWait;
  v1::WorkerCommand command;  // kSend: taken from the outbox (Requeue it if it cannot be sent).
  absl::Status end;           // kEnd: the call's status.
};

class WorkerRegistry {
 public:
  // `metrics` (not owned) gets the worker gauges.
  explicit WorkerRegistry(Metrics* metrics) : metrics_(metrics) {}
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // INVALID_ARGUMENT naming the field for an empty or overlong name, max_ranks < 1, negative
  // memory, no dtypes or an unknown dtype, a head_dim < 1.
  static absl::Status ValidateRegistration(const v1::RegisterWorkerRequest& request);

  // --- Workers ---------------------------------------------------------------------------------
  // The live (not dead) registrations named `name`: a new registration of the name replaces them
  // (the caller declares them dead first).
  std::vector<WorkerEntry*> LiveNamed(const std::string& name);
  // Adds a registration with id `id` (from the caller), READY, heartbeating as of `now`.
  WorkerEntry* Add(const v1::RegisterWorkerRequest& request, const std::string& id, absl::Time now);
  WorkerEntry* Find(const std::string& id);
  // By id, or else by name (its live registration, else its latest dead one).
  WorkerEntry* FindByIdOrName(const std::string& id_or_name);
  // "w-0123... (name)" for messages (the bare id when unknown).
  std::string Describe(const std::string& worker_id) const;
  // "rank 0 on w-... (name), rank 1 on ..." for the job's current placement.
  std::string DescribeRanks(const v1::Job& job) const;
  // Marks the worker dead as of `now`, drops its queued commands and its tasks' links, and returns
  // the ids of the tasks it held (the caller recovers their jobs and erases the tasks).
  std::vector<std::string> MarkDead(WorkerEntry* worker, absl::Time now);
  // READY <-> DRAINING. FAILED_PRECONDITION for a dead worker.
  absl::StatusOr<v1::Worker> SetDraining(WorkerEntry* worker, bool draining);
  // The workers that missed their heartbeats for longer than `dead_after` (live ones only).
  std::vector<WorkerEntry*> Silent(absl::Time now, absl::Duration dead_after);
  // Forgets workers dead for longer than `retention` with no stream open (and their metric
  // series, unless the name registered again).
  void ForgetDead(absl::Time now, absl::Duration retention);

  // Heartbeat of `worker`: liveness, free memory and device health as of `now` (a worker whose
  // device failed takes no ranks and is left out of View() until a heartbeat says it works), the
  // steps and phases of its listed tasks; a CancelTask for every listed task it does not hold.
  // Returns the tasks whose assignment should be sent again: dispatched, not started, not listed,
  // sent more than 2 x `interval` ago, while a stream is open and the command is not still in the
  // outbox (the caller sends them if their job still wants them, with Resend).
  std::vector<TaskEntry*> Heartbeat(WorkerEntry* worker, const v1::HeartbeatRequest& request,
                                    absl::Time now, absl::Duration interval);
  // Whether the worker takes new ranks: READY, its device working, with an assignment stream not
  // known to be broken.
  static bool TakesWork(const WorkerEntry& worker);
  int64_t ReadyCount() const;
  // The ids of the workers taking work, sorted and joined: a canonical form of the ready set.
  std::string ReadySet() const;
  // Every live worker as the scheduler sees it; `for_placement` also leaves out those that refused
  // a rank since their last heartbeat (feasibility checks count them).
  std::vector<scheduler::WorkerInfo> View(bool for_placement) const;
  v1::ListWorkersResponse List(bool include_dead) const;
  v1::Worker Public(const WorkerEntry& worker) const;

  // --- Tasks -----------------------------------------------------------------------------------
  // Adds a task and links it to its worker (which must exist).
  TaskEntry* AddTask(TaskEntry task);
  TaskEntry* FindTask(const std::string& task_id);
  // Ranks (live tasks, started or not, until their final report or their worker's death) per
  // tenant: what the tenants hold, for the scheduler's quota on running ranks.
  scheduler::TenantRanks RanksByTenant() const;
  // Forgets a task (freeing its reservation), sending CancelTask with `reason` (and `abort`,
  // worker.proto) when `cancel` and it was dispatched to a live worker; its slot stays taken
  // (WorkerEntry::stopping) until the worker says the task ended.
  void EraseTask(const std::string& task_id, bool cancel, const std::string& reason,
                 bool abort = false);
  // A final report of task `task_id`, which the coordinator no longer runs, came from `worker`:
  // its slot is free.
  void StoppedTask(WorkerEntry* worker, const std::string& task_id);
  // Queues the task's assignment (`command`) for its worker's stream and marks it dispatched.
  void Dispatch(TaskEntry* task, v1::WorkerCommand command, absl::Time now);

  // --- Streams -----------------------------------------------------------------------------------
  void Push(WorkerEntry* worker, v1::WorkerCommand command);
  // A new stream of `worker`: returns its generation (an older stream of the worker then ends).
  uint64_t OpenStream(WorkerEntry* worker);
  void CloseStream(WorkerEntry* worker);
  // What stream `generation` of `worker` does next; `closed` when the coordinator closes its
  // streams. kEnd statuses: UNAVAILABLE (closing), NOT_FOUND (declared dead), ABORTED (replaced by
  // a newer stream), OK (drained and idle).
  StreamStep NextStep(WorkerEntry* worker, uint64_t generation, bool closed);
  // A command taken by NextStep could not be sent: it goes first in line again (unless the worker
  // died) and the stream counts as lost when it was the worker's only one.
  void Requeue(WorkerEntry* worker, v1::WorkerCommand command);
  // Stream `generation` ended because its worker went away: unless a newer stream replaced it,
  // the worker takes no new ranks until it opens another. Returns whether it was marked lost.
  bool MarkStreamLost(WorkerEntry* worker, uint64_t generation);
  // Whether some worker with an open stream still has commands to receive.
  bool AnyUndelivered() const;
  // Signals every worker's condition variable (streams re-check their state).
  void WakeAll();

 private:
  void UpdateMetrics(const WorkerEntry& worker) const;
  void UpdateGauges() const;
  int64_t Reserved(const WorkerEntry& worker) const;

  Metrics* const metrics_;
  std::map<std::string, std::unique_ptr<WorkerEntry>> workers_;  // Ordered: ReadySet is canonical.
  absl::flat_hash_map<std::string, TaskEntry> tasks_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_WORKER_REGISTRY_H_
