#include "server/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/engine_convert.h"
#include "server/log.h"
#include "server/proto_time.h"

namespace dattn {
namespace server {
namespace {

v1::WorkerState ToProto(scheduler::WorkerState state) {
  switch (state) {
    case scheduler::WorkerState::kReady:
      return v1::WORKER_STATE_READY;
    case scheduler::WorkerState::kDraining:
      return v1::WORKER_STATE_DRAINING;
    case scheduler::WorkerState::kDead:
      return v1::WORKER_STATE_DEAD;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

constexpr size_t kMaxWorkerNameLength = 256;

}  // namespace

absl::Status WorkerRegistry::ValidateRegistration(const v1::RegisterWorkerRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("name: required");
  if (request.name().size() > kMaxWorkerNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("name: must be at most ", kMaxWorkerNameLength,
                                                   " characters, got ", request.name().size()));
  }
  const v1::WorkerCapabilities& caps = request.capabilities();
  if (caps.max_ranks() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("capabilities.max_ranks: must be >= 1, got ", caps.max_ranks()));
  }
  if (caps.total_memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capabilities.total_memory_bytes: must be >= 0, got ", caps.total_memory_bytes()));
  }
  if (caps.dtypes_size() == 0) {
    return absl::InvalidArgumentError(
        "capabilities.dtypes: required (the element types the worker's engine runs)");
  }
  for (int i = 0; i < caps.dtypes_size(); ++i) {
    absl::StatusOr<DType> d = api::ToEngineDType(static_cast<v1::DType>(caps.dtypes(i)),
                                                 absl::StrCat("capabilities.dtypes[", i, "]"));
    if (!d.ok()) return d.status();
  }
  for (int i = 0; i < caps.head_dims_size(); ++i) {
    if (caps.head_dims(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("capabilities.head_dims[", i, "]: must be >= 1, got ", caps.head_dims(i)));
    }
  }
  return absl::OkStatus();
}

// ---- Workers -----------------------------------------------------------------------------------

std::vector<WorkerEntry*> WorkerRegistry::LiveNamed(const std::string& name) {
  std::vector<WorkerEntry*> out;
  for (auto& [id, worker] : workers_) {
    if (worker->info.name() == name && worker->state != scheduler::WorkerState::kDead) {
      out.push_back(worker.get());
    }
  }
  return out;
}

WorkerEntry* WorkerRegistry::Add(const v1::RegisterWorkerRequest& request, const std::string& id,
                                 absl::Time now) {
  auto worker = std::make_unique<WorkerEntry>();
  worker->info.set_worker_id(id);
  worker->info.set_name(request.name());
  worker->info.set_address(request.address());
  *worker->info.mutable_capabilities() = request.capabilities();
  worker->info.set_version(request.version());
  worker->info.set_free_memory_bytes(request.capabilities().total_memory_bytes());
  worker->last_heartbeat = now;
  WorkerEntry* raw = worker.get();
  workers_[id] = std::move(worker);
  UpdateMetrics(*raw);
  UpdateGauges();
  return raw;
}

WorkerEntry* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second.get();
}

WorkerEntry* WorkerRegistry::FindByIdOrName(const std::string& id_or_name) {
  WorkerEntry* worker = Find(id_or_name);
  if (worker != nullptr) return worker;
  for (auto& [id, entry] : workers_) {
    if (entry->info.name() != id_or_name) continue;
    if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) worker = entry.get();
  }
  return worker;
}

std::string WorkerRegistry::Describe(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return worker_id;
  return absl::StrCat(worker_id, " (", it->second->info.name(), ")");
}

std::string WorkerRegistry::DescribeRanks(const v1::Job& job) const {
  std::vector<std::string> ranks;
  for (int r = 0; r < job.worker_ids_size(); ++r) {
    ranks.push_back(absl::StrCat("rank ", r, " on ", Describe(job.worker_ids(r))));
  }
  return absl::StrJoin(ranks, ", ");
}

std::vector<std::string> WorkerRegistry::MarkDead(WorkerEntry* worker, absl::Time now) {
  worker->state = scheduler::WorkerState::kDead;
  worker->dead_since = now;
  worker->outbox.clear();
  worker->cv->SignalAll();
  std::vector<std::string> tasks(worker->task_ids.begin(), worker->task_ids.end());
  worker->task_ids.clear();
  UpdateGauges();
  return tasks;
}

absl::StatusOr<v1::Worker> WorkerRegistry::SetDraining(WorkerEntry* worker, bool draining) {
  if (worker->state == scheduler::WorkerState::kDead) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker->info.worker_id(), " (", worker->info.name(), ") is dead"));
  }
  worker->state = draining ? scheduler::WorkerState::kDraining : scheduler::WorkerState::kReady;
  worker->cv->SignalAll();
  UpdateGauges();
  return Public(*worker);
}

std::vector<WorkerEntry*> WorkerRegistry::Silent(absl::Time now, absl::Duration dead_after) {
  std::vector<WorkerEntry*> out;
  for (auto& [id, worker] : workers_) {
    if (worker->state != scheduler::WorkerState::kDead &&
        now - worker->last_heartbeat > dead_after) {
      out.push_back(worker.get());
    }
  }
  return out;
}

void WorkerRegistry::ForgetDead(absl::Time now, absl::Duration retention) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    WorkerEntry* worker = it->second.get();
    if (worker->state != scheduler::WorkerState::kDead || worker->streams > 0 ||
        now - worker->dead_since <= retention) {
      ++it;
      continue;
    }
    const std::string name = worker->info.name();
    it = workers_.erase(it);
    bool named_again = false;
    for (const auto& [id, other] : workers_) named_again |= other->info.name() == name;
    if (!named_again) metrics_->RemoveWorker(name);
    UpdateGauges();
  }
}

std::vector<TaskEntry*> WorkerRegistry::Heartbeat(WorkerEntry* worker,
                                                  const v1::HeartbeatRequest& request,
                                                  absl::Time now, absl::Duration interval) {
  worker->last_heartbeat = now;
  worker->info.set_free_memory_bytes(std::max<int64_t>(0, request.free_memory_bytes()));
  worker->refused_since_heartbeat = false;
  // Bounded: a worker's message is kept for listings, not its whole text.
  const std::string device_error = request.device_error().substr(0, 1024);
  if (device_error != worker->info.device_error()) {
    Log(device_error.empty()
            ? absl::StrCat("worker ", Describe(worker->info.worker_id()),
                           ": its device works again; it takes ranks again")
            : absl::StrCat("worker ", Describe(worker->info.worker_id()), ": its device failed (",
                           device_error, "); no new ranks until it works again"));
    worker->info.set_device_error(device_error);
    UpdateGauges();
  }
  std::set<std::string> listed;
  for (const v1::RunningTask& task : request.tasks()) listed.insert(task.task_id());
  // An assignment written to a stream that broke right after may never have reached the worker:
  // one it neither started nor lists two heartbeats after it was sent goes out again (workers
  // ignore a task id they already run or ran).
  std::vector<TaskEntry*> resend;
  for (const std::string& task_id : worker->task_ids) {
    auto it = tasks_.find(task_id);
    if (it == tasks_.end() || !it->second.dispatched || it->second.started ||
        listed.count(task_id) > 0 || now - it->second.dispatched_at < 2 * interval) {
      continue;
    }
    // Without an open stream the assignment still waits in the outbox; it goes out when one opens.
    if (worker->streams == 0) continue;
    const bool queued =
        std::any_of(worker->outbox.begin(), worker->outbox.end(), [&](const v1::WorkerCommand& c) {
          return c.has_assign() && c.assign().task_id() == task_id;
        });
    if (queued) {
      it->second.dispatched_at = now;
    } else {
      resend.push_back(&it->second);
    }
  }
  // What the worker still runs that the coordinator does not: those hold their slots.
  worker->stopping.clear();
  for (const v1::RunningTask& task : request.tasks()) {
    auto it = tasks_.find(task.task_id());
    if (it == tasks_.end() || it->second.worker_id != worker->info.worker_id()) {
      worker->stopping.insert(task.task_id());
    }
  }
  for (const v1::RunningTask& task : request.tasks()) {
    auto it = tasks_.find(task.task_id());
    if (it != tasks_.end() && it->second.worker_id == worker->info.worker_id()) {
      it->second.steps_done = std::max(it->second.steps_done, task.steps_done());
      if (task.phase() != v1::RANK_PHASE_UNSPECIFIED) it->second.phase = task.phase();
      continue;
    }
    v1::WorkerCommand command;
    command.mutable_cancel()->set_task_id(task.task_id());
    command.mutable_cancel()->set_reason(
        "the coordinator no longer runs this task on this worker (cancelled, finished, or "
        "reassigned)");
    Push(worker, std::move(command));
  }
  UpdateMetrics(*worker);
  return resend;
}

bool WorkerRegistry::TakesWork(const WorkerEntry& worker) {
  return worker.state == scheduler::WorkerState::kReady && !worker.stream_lost &&
         worker.info.device_error().empty();
}

int64_t WorkerRegistry::ReadyCount() const {
  int64_t ready = 0;
  for (const auto& [id, worker] : workers_) ready += TakesWork(*worker);
  return ready;
}

std::string WorkerRegistry::ReadySet() const {
  std::vector<std::string> ready;
  for (const auto& [id, worker] : workers_) {
    if (TakesWork(*worker)) ready.push_back(id);
  }
  return absl::StrJoin(ready, ",");
}

int64_t WorkerRegistry::Reserved(const WorkerEntry& worker) const {
  int64_t reserved = 0;
  for (const std::string& task_id : worker.task_ids) {
    auto it = tasks_.find(task_id);
    if (it != tasks_.end()) reserved += it->second.memory_bytes;
  }
  return reserved;
}

std::vector<scheduler::WorkerInfo> WorkerRegistry::View(bool for_placement) const {
  std::vector<scheduler::WorkerInfo> out;
  for (const auto& [id, worker] : workers_) {
    // A worker whose stream broke cannot receive an assignment; it comes back with a new stream.
    if (worker->state == scheduler::WorkerState::kDead || worker->stream_lost) continue;
    // A failed device runs nothing: the worker neither takes ranks nor counts toward what the
    // cluster could ever run until it reports its device working again.
    if (!worker->info.device_error().empty()) continue;
    if (for_placement && worker->refused_since_heartbeat) continue;
    const v1::WorkerCapabilities& caps = worker->info.capabilities();
    scheduler::WorkerInfo info;
    info.id = id;
    info.total_memory_bytes = caps.total_memory_bytes();
    // The last heartbeat's free memory does not yet show tasks placed since; the reservations of
    // every task held do. The smaller of the two is what a new rank can count on.
    info.free_memory_bytes = std::clamp<int64_t>(
        std::min(worker->info.free_memory_bytes(), info.total_memory_bytes - Reserved(*worker)), 0,
        info.total_memory_bytes);
    info.is_gpu = caps.is_gpu();
    info.device_name = caps.device_name();
    for (int d : caps.dtypes()) {
      absl::StatusOr<DType> dtype = api::ToEngineDType(static_cast<v1::DType>(d), "dtypes");
      if (dtype.ok()) info.dtypes.push_back(DTypeName(*dtype));
    }
    info.head_dims.assign(caps.head_dims().begin(), caps.head_dims().end());
    info.state = worker->state;
    const char* ring_backend = caps.is_gpu() ? "nccl" : "gloo";
    info.joins_rings = std::find(caps.ring_backends().begin(), caps.ring_backends().end(),
                                 ring_backend) != caps.ring_backends().end();
    info.max_ranks = caps.max_ranks();
    info.running_ranks = std::min<int>(
        static_cast<int>(worker->task_ids.size() + worker->stopping.size()), info.max_ranks);
    out.push_back(std::move(info));
  }
  return out;
}

v1::ListWorkersResponse WorkerRegistry::List(bool include_dead) const {
  std::vector<const WorkerEntry*> list;
  for (const auto& [id, worker] : workers_) {
    if (worker->state == scheduler::WorkerState::kDead && !include_dead) continue;
    list.push_back(worker.get());
  }
  std::sort(list.begin(), list.end(), [](const WorkerEntry* a, const WorkerEntry* b) {
    if (a->info.name() != b->info.name()) return a->info.name() < b->info.name();
    return a->info.worker_id() < b->info.worker_id();
  });
  v1::ListWorkersResponse response;
  for (const WorkerEntry* worker : list) *response.add_workers() = Public(*worker);
  return response;
}

v1::Worker WorkerRegistry::Public(const WorkerEntry& worker) const {
  v1::Worker out = worker.info;
  out.set_state(ToProto(worker.state));
  *out.mutable_last_heartbeat() = ToTimestamp(worker.last_heartbeat);
  out.clear_task_ids();
  for (const std::string& id : worker.task_ids) out.add_task_ids(id);
  return out;
}

// ---- Tasks -------------------------------------------------------------------------------------

TaskEntry* WorkerRegistry::AddTask(TaskEntry task) {
  const std::string id = task.task_id;
  TaskEntry& stored = tasks_[id] = std::move(task);
  if (WorkerEntry* worker = Find(stored.worker_id); worker != nullptr) {
    worker->task_ids.insert(id);
    UpdateMetrics(*worker);
  }
  return &stored;
}

scheduler::TenantRanks WorkerRegistry::RanksByTenant() const {
  scheduler::TenantRanks ranks;
  for (const auto& [id, task] : tasks_) ++ranks[task.tenant];
  return ranks;
}

TaskEntry* WorkerRegistry::FindTask(const std::string& task_id) {
  auto it = tasks_.find(task_id);
  return it == tasks_.end() ? nullptr : &it->second;
}

void WorkerRegistry::EraseTask(const std::string& task_id, bool cancel, const std::string& reason,
                               bool abort) {
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return;
  WorkerEntry* worker = Find(it->second.worker_id);
  if (worker != nullptr) {
    worker->task_ids.erase(task_id);
    if (cancel && it->second.dispatched && worker->state != scheduler::WorkerState::kDead) {
      v1::WorkerCommand command;
      command.mutable_cancel()->set_task_id(task_id);
      command.mutable_cancel()->set_reason(reason);
      command.mutable_cancel()->set_abort(abort);
      Push(worker, std::move(command));
      worker->stopping.insert(task_id);
    }
    worker->cv->SignalAll();  // A draining worker may now be idle.
  }
  tasks_.erase(it);
  if (worker != nullptr) UpdateMetrics(*worker);
}

void WorkerRegistry::StoppedTask(WorkerEntry* worker, const std::string& task_id) {
  if (worker->stopping.erase(task_id) > 0) worker->cv->SignalAll();
}

void WorkerRegistry::Dispatch(TaskEntry* task, v1::WorkerCommand command, absl::Time now) {
  task->dispatched = true;
  task->dispatched_at = now;
  if (WorkerEntry* worker = Find(task->worker_id); worker != nullptr) {
    Push(worker, std::move(command));
  }
}

// ---- Streams -----------------------------------------------------------------------------------

void WorkerRegistry::Push(WorkerEntry* worker, v1::WorkerCommand command) {
  worker->outbox.push_back(std::move(command));
  worker->cv->SignalAll();
}

uint64_t WorkerRegistry::OpenStream(WorkerEntry* worker) {
  const uint64_t generation = ++worker->stream_generation;
  worker->cv->SignalAll();  // An older stream of this worker ends.
  ++worker->streams;
  worker->stream_lost = false;
  return generation;
}

void WorkerRegistry::CloseStream(WorkerEntry* worker) { --worker->streams; }

StreamStep WorkerRegistry::NextStep(WorkerEntry* worker, uint64_t generation, bool closed) {
  StreamStep step;
  const std::string& id = worker->info.worker_id();
  if (closed) {
    step.kind = StreamStep::Kind::kEnd;
    step.end = absl::UnavailableError(
        "the coordinator is shutting down; reconnect to the next one when it is back");
  } else if (worker->state == scheduler::WorkerState::kDead) {
    step.kind = StreamStep::Kind::kEnd;
    step.end =
        absl::NotFoundError(absl::StrCat("worker ", id, " was declared dead; register again"));
  } else if (worker->stream_generation != generation) {
    step.kind = StreamStep::Kind::kEnd;
    step.end = absl::AbortedError(
        absl::StrCat("a newer StreamAssignments call of worker ", id, " replaced this one"));
  } else if (!worker->outbox.empty()) {
    step.kind = StreamStep::Kind::kSend;
    step.command = std::move(worker->outbox.front());
    worker->outbox.pop_front();
  } else if (worker->state == scheduler::WorkerState::kDraining && worker->task_ids.empty()) {
    step.kind = StreamStep::Kind::kEnd;
    step.end = absl::OkStatus();
  }
  return step;
}

void WorkerRegistry::Requeue(WorkerEntry* worker, v1::WorkerCommand command) {
  if (worker->state != scheduler::WorkerState::kDead) {
    worker->outbox.push_front(std::move(command));
  }
}

bool WorkerRegistry::MarkStreamLost(WorkerEntry* worker, uint64_t generation) {
  if (worker->stream_generation != generation || worker->streams != 1 ||
      worker->state == scheduler::WorkerState::kDead) {
    return false;
  }
  worker->stream_lost = true;
  Log(absl::StrCat("worker ", Describe(worker->info.worker_id()),
                   " lost its assignment stream; no new ranks until it reconnects"));
  return true;
}

bool WorkerRegistry::AnyUndelivered() const {
  for (const auto& [id, worker] : workers_) {
    if (worker->streams > 0 && !worker->outbox.empty()) return true;
  }
  return false;
}

void WorkerRegistry::WakeAll() {
  for (auto& [id, worker] : workers_) worker->cv->SignalAll();
}

// ---- Metrics -----------------------------------------------------------------------------------

void WorkerRegistry::UpdateMetrics(const WorkerEntry& worker) const {
  metrics_->SetWorkerMemory(worker.info.name(), worker.info.capabilities().total_memory_bytes(),
                            worker.info.free_memory_bytes(), Reserved(worker));
}

void WorkerRegistry::UpdateGauges() const {
  int64_t ready = 0, draining = 0, dead = 0, device_failed = 0;
  for (const auto& [id, worker] : workers_) {
    if (worker->state != scheduler::WorkerState::kDead && !worker->info.device_error().empty()) {
      ++device_failed;
      continue;
    }
    switch (worker->state) {
      case scheduler::WorkerState::kReady:
        ++ready;
        break;
      case scheduler::WorkerState::kDraining:
        ++draining;
        break;
      case scheduler::WorkerState::kDead:
        ++dead;
        break;
    }
  }
  metrics_->SetWorkers(ready, draining, dead, device_failed);
}

}  // namespace server
}  // namespace dattn
