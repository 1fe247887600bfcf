#include "server/coordinator.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/memory_plan.h"
#include "scheduler/placement.h"
#include "scheduler/recovery.h"
#include "server/job_state.h"
#include "worker/ring_join.h"

namespace dattn {
namespace server {
namespace {

using scheduler::FailureKind;

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  google::protobuf::Timestamp ts;
  const int64_t ns = absl::ToUnixNanos(t);
  int64_t seconds = ns / 1000000000;
  int64_t nanos = ns % 1000000000;
  if (nanos < 0) {
    nanos += 1000000000;
    --seconds;
  }
  ts.set_seconds(seconds);
  ts.set_nanos(static_cast<int32_t>(nanos));
  return ts;
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

std::string TaskId(const std::string& job_id, int attempt, int rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

bool IsActiveRun(v1::JobState state) {
  return state == v1::JOB_STATE_PLACED || state == v1::JOB_STATE_RUNNING;
}

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

// Failure class of a rank's FAILED report (error_code is a google.rpc.Code), or nullopt when
// retrying cannot help (a bad spec, an engine bug): the job then fails at once.
std::optional<FailureKind> ClassifyTaskError(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kResourceExhausted:
      return FailureKind::kOom;
    case absl::StatusCode::kDeadlineExceeded:
      return FailureKind::kCommTimeout;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      return FailureKind::kPeerLost;
    default:
      return std::nullopt;
  }
}

void Log(const std::string& message) {
  std::fprintf(stderr, "dattn-coordinator: %s\n", message.c_str());
}

bool IsIpv4(const std::string& host) {
  in_addr addr{};
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

const char* PhaseName(v1::RankPhase phase) {
  switch (phase) {
    case v1::RANK_PHASE_PREPARING:
      return "preparing (allocating and generating inputs)";
    case v1::RANK_PHASE_FORMING_RING:
      return "waiting for its peers";
    case v1::RANK_PHASE_RUNNING:
      return "running";
    case v1::RANK_PHASE_FINISHED:
      return "finished";
    default:
      return "not yet seen by its worker";
  }
}

// The ranks of ring `ring_id` (of `size`) whose arrival key is missing from the store at
// `address`, or nullopt when the store cannot be asked. A loopback round trip per rank to the
// coordinator's own store: called without the coordinator's lock.
std::optional<std::vector<int>> ProbeMissingRanks(const std::string& address,
                                                  const std::string& ring_id, int size) {
  absl::StatusOr<std::unique_ptr<comm::TcpStore>> store =
      comm::TcpStore::Connect(address, absl::Seconds(1), absl::Seconds(1));
  if (!store.ok()) return std::nullopt;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::string> got =
        (*store)->Get(worker::JoinedKey(ring_id, r), absl::ZeroDuration());
    if (got.ok()) continue;
    if (!absl::IsDeadlineExceeded(got.status())) return std::nullopt;
    missing.push_back(r);
  }
  return missing;
}

const char* kShuttingDown =
    "the coordinator is shutting down; retry (with the same idempotency_key) once it is back";

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Metrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics != nullptr ? metrics : (own_metrics_ = std::make_unique<Metrics>()).get()),
      scheduler_(scheduler::SchedulerOptions{options_.starvation_bound}),
      rng_(std::random_device{}()) {}

Coordinator::~Coordinator() { Close().IgnoreError(); }

// -------------------------------------------------------------------------------------------------
// Lifecycle.

absl::Status Coordinator::Start() {
  if (options_.data_dir.empty()) return absl::InvalidArgumentError("data_dir: required");
  if (options_.dead_after <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dead_after: must be > 0, got ", absl::FormatDuration(options_.dead_after)));
  }
  if (options_.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_interval: must be > 0, got ",
                     absl::FormatDuration(options_.heartbeat_interval)));
  }
  if (options_.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be >= 1, got ", options_.max_attempts));
  }
  if (!IsIpv4(options_.rendezvous_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous_host: must be a numeric IPv4 address, got \"", options_.rendezvous_host, "\""));
  }
  if (!options_.rendezvous_advertise.empty() && !IsIpv4(options_.rendezvous_advertise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous_advertise: must be a numeric IPv4 address, got \"",
                     options_.rendezvous_advertise, "\""));
  }
  if (options_.rendezvous_advertise.empty() && options_.rendezvous_host == "0.0.0.0") {
    return absl::InvalidArgumentError(
        "rendezvous_advertise: required when the rendezvous stores listen on 0.0.0.0 (workers "
        "need an address they can dial)");
  }
  if (options_.ring_formation_timeout <= absl::ZeroDuration() ||
      options_.ring_comm_timeout <= absl::ZeroDuration() ||
      options_.feasibility_settle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring_formation_timeout and ring_comm_timeout must be > 0 and feasibility_settle >= 0, "
        "got ",
        absl::FormatDuration(options_.ring_formation_timeout), ", ",
        absl::FormatDuration(options_.ring_comm_timeout), ", ",
        absl::FormatDuration(options_.feasibility_settle)));
  }
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kNew || store_ != nullptr) {
      return absl::FailedPreconditionError("Coordinator::Start called twice");
    }
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(options_.data_dir + "/jobs.db", options_.store);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);

  absl::StatusOr<std::map<v1::JobState, int64_t>> counts = store_->CountByState();
  if (!counts.ok()) return counts.status();
  for (v1::JobState state :
       {v1::JOB_STATE_QUEUED, v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
        v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    auto it = counts->find(state);
    metrics_->SetJobCount("attention", state, it == counts->end() ? 0 : it->second);
  }
  if (absl::Status s = Recover(); !s.ok()) return s;

  {
    absl::MutexLock lock(&mu_);
    phase_ = Phase::kServing;
    UpdateGaugesLocked();
  }
  scheduler_thread_ = std::thread([this] { SchedulerLoop(); });
  monitor_thread_ = std::thread([this] { MonitorLoop(); });
  return absl::OkStatus();
}

absl::Status Coordinator::Recover() {
  absl::StatusOr<std::vector<StoredJob>> active = store_->LoadActive();
  if (!active.ok()) return active.status();
  Tickets tickets;
  for (const StoredJob& stored : *active) {
    const v1::JobState state = stored.job.state();
    // A cancel requested before the restart still holds: such jobs end rather than run again.
    // A job placed before (attempt > 0) also gets back what its history says about earlier runs.
    bool cancel_requested = false;
    bool placed_before = false;
    int free_requeues = 0;
    if (IsActiveRun(state) || stored.job.attempt() > 0) {
      absl::StatusOr<std::vector<v1::JobEvent>> events = store_->Events(stored.job.job_id(), 0, 0);
      if (!events.ok()) return events.status();
      for (const v1::JobEvent& e : *events) {
        cancel_requested |= e.kind() == "cancel_requested";
        placed_before |= e.kind() == "placed";
        free_requeues += e.kind() == "coordinator_restarted" || e.kind() == "coordinator_stopped";
      }
    }
    absl::MutexLock lock(&mu_);
    absl::StatusOr<AttentionJobInfo> info = AnalyzeJobSpec(stored.job.spec());
    auto job = std::make_unique<ActiveJob>();
    job->job = stored.job;
    job->durable = stored.job;
    job->submit_seq = stored.submit_seq;
    job->queued_since = absl::Now();
    ActiveJob* raw = job.get();
    jobs_[stored.job.job_id()] = std::move(job);
    if (!info.ok()) {
      // Only a newer binary's stricter rules can get here; the job cannot run, so say why.
      tickets.push_back(
          TransitionLocked(raw, v1::JOB_STATE_FAILED, "failed",
                           absl::StrCat("the stored spec is not valid for this coordinator: ",
                                        info.status().message())));
      continue;
    }
    raw->info = *std::move(info);
    raw->placed_before = placed_before;
    raw->free_requeues = free_requeues;
    if (state == v1::JOB_STATE_QUEUED) {
      EnqueueLocked(raw);
      continue;
    }
    const std::string where = absl::StrCat("attempt ", raw->job.attempt(), " on ",
                                           absl::StrJoin(raw->job.worker_ids(), ", "));
    if (cancel_requested) {
      tickets.push_back(TransitionLocked(
          raw, v1::JOB_STATE_CANCELLED, "cancelled",
          absl::StrCat(
              "cancelled: the coordinator restarted while a requested cancel was pending (", where,
              ")")));
      continue;
    }
    metrics_->CountRecovery("coordinator_restarted");
    ++raw->free_requeues;
    RequeueLocked(raw, "coordinator_restarted",
                  absl::StrCat("the coordinator restarted while the job was ", StateName(state),
                               " (", where, "); requeued as attempt ", raw->job.attempt() + 1),
                  &tickets);
  }
  return Flush(tickets);
}

absl::Status Coordinator::Health() {
  {
    absl::MutexLock lock(&mu_);
    switch (phase_) {
      case Phase::kNew:
        return absl::UnavailableError("starting: the job store is not open yet");
      case Phase::kDraining:
        return absl::UnavailableError("shutting down");
      case Phase::kClosed:
        return absl::UnavailableError("closed");
      case Phase::kServing:
        break;
    }
    if (!store_error_.ok()) return store_error_;
  }
  return store_->Health();
}

void Coordinator::StopAccepting() {
  absl::MutexLock lock(&mu_);
  if (phase_ == Phase::kServing) phase_ = Phase::kDraining;
}

absl::Status Coordinator::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    auto running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const auto& [id, job] : jobs_) {
        if (!job->terminal && IsActiveRun(job->job.state())) return true;
      }
      return false;
    };
    while (running() && !drain_cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    std::vector<ActiveJob*> left;
    for (const auto& [id, job] : jobs_) {
      if (!job->terminal && IsActiveRun(job->job.state())) left.push_back(job.get());
    }
    for (ActiveJob* job : left) {
      metrics_->CountRecovery("drain_timeout");
      const std::string why = absl::StrCat("the coordinator shut down before the job finished (",
                                           "drain timeout ", Seconds(timeout), ")");
      ReleaseTasksLocked(job, /*cancel_tasks=*/true, why);
      if (job->cancel_requested) {
        tickets.push_back(TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                                           absl::StrCat("cancelled: ", job->cancel_reason)));
      } else {
        ++job->free_requeues;
        RequeueLocked(job, "coordinator_stopped",
                      absl::StrCat(why, "; requeued as attempt ", job->job.attempt() + 1),
                      &tickets);
      }
    }
  }
  absl::Status status = Flush(tickets);
  // Give connected streams a moment to deliver the cancels just queued.
  absl::MutexLock lock(&mu_);
  const absl::Time cancel_deadline = absl::Now() + absl::Seconds(1);
  auto undelivered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, worker] : workers_) {
      if (worker->streams > 0 && !worker->outbox.empty()) return true;
    }
    return false;
  };
  while (undelivered() && !streams_closed_ && !drain_cv_.WaitWithDeadline(&mu_, cancel_deadline)) {
  }
  return status;
}

void Coordinator::CloseStreams() {
  absl::MutexLock lock(&mu_);
  streams_closed_ = true;
  for (auto& [id, worker] : workers_) worker->cv->SignalAll();
  for (auto& [id, watcher] : watchers_) watcher->cv.SignalAll();
}

absl::Status Coordinator::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return close_status_;
    phase_ = Phase::kClosed;
    closed_ = true;
    threads_stop_ = true;
    streams_closed_ = true;
    schedule_cv_.SignalAll();
    monitor_cv_.SignalAll();
    drain_cv_.SignalAll();
    for (auto& [id, worker] : workers_) worker->cv->SignalAll();
    for (auto& [id, watcher] : watchers_) watcher->cv.SignalAll();
  }
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  if (monitor_thread_.joinable()) monitor_thread_.join();
  {
    // Rings still placed lose their rendezvous: ranks still forming fail at once.
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) EndRingLocked(job.get(), "");
  }
  ReapStores();
  absl::Status status = store_ != nullptr ? store_->Close() : absl::OkStatus();
  absl::MutexLock lock(&mu_);
  close_status_ = status;
  return status;
}

absl::Status Coordinator::CheckPhaseLocked(bool submit) const {
  switch (phase_) {
    case Phase::kNew:
      return absl::UnavailableError("the coordinator is starting (opening the job store); retry");
    case Phase::kClosed:
      return absl::UnavailableError("the coordinator has stopped");
    case Phase::kDraining:
      if (submit) return absl::UnavailableError(kShuttingDown);
      break;
    case Phase::kServing:
      break;
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckWritableLocked() const {
  if (!store_error_.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the job store failed; the coordinator must restart: ", store_error_.message()));
  }
  return absl::OkStatus();
}

// -------------------------------------------------------------------------------------------------
// Durable writes.

Coordinator::Ticket Coordinator::QueueWriteLocked(ActiveJob* job, v1::JobEvent event) {
  event.set_job_id(job->job.job_id());
  event.set_state(job->job.state());
  if (!event.has_time()) *event.mutable_time() = ToTimestamp(absl::Now());
  PendingWrite write;
  write.job = job->job;
  write.job.clear_events();
  write.job.set_queue_position(0);
  write.event = std::move(event);
  job->writer->pending.push_back(std::move(write));
  return {job->writer, ++job->writer->enqueued};
}

Coordinator::Ticket Coordinator::TransitionLocked(ActiveJob* job, v1::JobState state,
                                                  const std::string& kind,
                                                  const std::string& message) {
  const v1::JobState from = job->job.state();
  if (absl::Status s = CheckTransition(from, state); !s.ok()) {
    // Every caller checks the state first; reaching this is a coordinator bug, not a user error.
    Log(absl::StrCat("internal error: job ", job->job.job_id(), " event ", kind, ": ",
                     s.message()));
    return {nullptr, 0};
  }
  const absl::Time now = absl::Now();
  job->job.set_state(state);
  if (from != state) job->job.set_state_reason(message);
  if (IsTerminal(state)) {
    EndRingLocked(job, "");
    job->terminal = true;
    *job->job.mutable_end_time() = ToTimestamp(now);
    if (job->job.has_start_time()) {
      metrics_->ObserveJobDuration(
          JobKind(job->job.spec()),
          absl::ToDoubleSeconds(now - FromTimestamp(job->job.start_time())));
    }
  }
  metrics_->JobTransition(JobKind(job->job.spec()), from, state);
  if (IsActiveRun(from) && !IsActiveRun(state)) drain_cv_.SignalAll();
  v1::JobEvent event;
  event.set_kind(kind);
  event.set_message(message);
  *event.mutable_time() = ToTimestamp(now);
  return QueueWriteLocked(job, std::move(event));
}

absl::Status Coordinator::Flush(const Tickets& tickets) {
  absl::Status first;
  for (const Ticket& ticket : tickets) {
    absl::Status s = FlushOne(ticket);
    if (first.ok()) first = s;
  }
  return first;
}

absl::Status Coordinator::FlushOne(const Ticket& ticket) {
  JobWriter* writer = ticket.first.get();
  if (writer == nullptr) return absl::OkStatus();
  absl::MutexLock flush_lock(&writer->flush_mu);
  for (;;) {
    PendingWrite write;
    {
      absl::MutexLock lock(&mu_);
      if (writer->durable >= ticket.second) return absl::OkStatus();
      if (!writer->error.ok()) return writer->error;
      write = std::move(writer->pending.front());
      writer->pending.pop_front();
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<int64_t> seq = store_->Update(write.job, write.event);
    metrics_->ObserveStoreCommit(absl::ToDoubleSeconds(absl::Now() - start));
    absl::MutexLock lock(&mu_);
    if (!seq.ok()) {
      absl::Status failed = absl::UnavailableError(
          absl::StrCat("cannot record job ", write.job.job_id(), ": ", seq.status().message()));
      if (absl::IsUnavailable(seq.status())) {
        // Transient, or the store is broken: the write stays first in line (nothing decided is
        // lost) and is tried again by the next flush of this job and by the monitor. Unready
        // until a restart only when the store itself says it is broken; a lock held by another
        // process past the busy timeout is UNAVAILABLE too, and the store stays usable after it.
        writer->pending.push_front(std::move(write));
        if (std::find(stalled_writers_.begin(), stalled_writers_.end(), ticket.first) ==
            stalled_writers_.end()) {
          stalled_writers_.push_back(ticket.first);
        }
        if (store_error_.ok() && !store_->Health().ok()) store_error_ = seq.status();
      } else {
        writer->error = seq.status();
        Log(absl::StrCat("internal error: store rejected an update of job ", write.job.job_id(),
                         " (", write.event.kind(), "): ", seq.status().message()));
      }
      return failed;
    }
    ++writer->durable;
    write.event.set_seq(*seq);
    PublishLocked(write.event);
    auto it = jobs_.find(write.job.job_id());
    if (it != jobs_.end() && it->second->writer.get() == writer) {
      it->second->durable = std::move(write.job);
      if (it->second->terminal && writer->pending.empty()) {
        jobs_.erase(it);  // Its terminal event is durable: the store answers for it from now on.
      }
    }
  }
}

void Coordinator::PublishLocked(const v1::JobEvent& event) {
  auto range = watchers_.equal_range(event.job_id());
  for (auto it = range.first; it != range.second; ++it) {
    it->second->events.push_back(event);
    it->second->cv.Signal();
  }
}

// -------------------------------------------------------------------------------------------------
// Jobs in memory, the queue and workers.

Coordinator::ActiveJob* Coordinator::FindJobLocked(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

Coordinator::WorkerEntry* Coordinator::FindWorkerLocked(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second.get();
}

std::string Coordinator::NewId(const char* prefix) {
  return absl::StrCat(prefix, absl::Hex(rng_(), absl::kZeroPad16));
}

std::string Coordinator::DescribeWorkerLocked(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return worker_id;
  return absl::StrCat(worker_id, " (", it->second->info.name(), ")");
}

bool Coordinator::TakesWorkLocked(const WorkerEntry& worker) const {
  return worker.state == scheduler::WorkerState::kReady && !worker.stream_lost;
}

int64_t Coordinator::ReadyWorkersLocked() const {
  int64_t ready = 0;
  for (const auto& [id, worker] : workers_) ready += TakesWorkLocked(*worker);
  return ready;
}

std::vector<scheduler::WorkerInfo> Coordinator::SchedulerWorkersLocked(int64_t head_dim) const {
  std::vector<scheduler::WorkerInfo> out;
  for (const auto& [id, worker] : workers_) {
    // A worker whose stream broke cannot receive an assignment; it comes back with a new stream.
    if (worker->state == scheduler::WorkerState::kDead || worker->stream_lost) continue;
    const v1::WorkerCapabilities& caps = worker->info.capabilities();
    if (head_dim > 0 && caps.head_dims_size() > 0 &&
        std::find(caps.head_dims().begin(), caps.head_dims().end(), head_dim) ==
            caps.head_dims().end()) {
      continue;
    }
    scheduler::WorkerInfo info;
    info.id = id;
    info.total_memory_bytes = caps.total_memory_bytes();
    // The last heartbeat's free memory does not yet show tasks placed since; the reservations of
    // every task held do. The smaller of the two is what a new rank can count on.
    int64_t reserved = 0;
    for (const std::string& task_id : worker->task_ids) {
      auto it = tasks_.find(task_id);
      if (it != tasks_.end()) reserved += it->second.memory_bytes;
    }
    info.free_memory_bytes = std::clamp<int64_t>(
        std::min(worker->info.free_memory_bytes(), info.total_memory_bytes - reserved), 0,
        info.total_memory_bytes);
    info.is_gpu = caps.is_gpu();
    info.device_name = caps.device_name();
    for (int d : caps.dtypes()) {
      absl::StatusOr<DType> dtype = ToEngineDType(static_cast<v1::DType>(d), "dtypes");
      if (dtype.ok()) info.dtypes.push_back(DTypeName(*dtype));
    }
    info.state = worker->state;
    const char* ring_backend = caps.is_gpu() ? "nccl" : "gloo";
    info.joins_rings = std::find(caps.ring_backends().begin(), caps.ring_backends().end(),
                                 ring_backend) != caps.ring_backends().end();
    info.max_ranks = caps.max_ranks();
    info.running_ranks = std::min<int>(static_cast<int>(worker->task_ids.size()), info.max_ranks);
    out.push_back(std::move(info));
  }
  return out;
}

namespace {

scheduler::JobRequest MakeRequest(const v1::Job& job, int64_t submit_seq,
                                  const AttentionJobInfo& info, const DeviceVariant& variant) {
  scheduler::JobRequest request;
  request.job_id = job.job_id();
  request.tenant = job.spec().tenant().empty() ? "default" : job.spec().tenant();
  request.priority = job.spec().priority();
  request.submit_seq = submit_seq;
  request.submit_time = FromTimestamp(job.create_time());
  request.num_ranks = info.num_ranks;
  request.memory_per_rank_bytes = variant.memory_per_rank_bytes;
  request.dtype = DTypeName(info.dtype);
  request.needs_gpu = variant.gpu;
  return request;
}

}  // namespace

absl::Status Coordinator::CheckFeasibleLocked(const AttentionJobInfo& info) const {
  // Workers may register later: with none ready, everything waits in the queue.
  if (ReadyWorkersLocked() == 0) return absl::OkStatus();
  const std::vector<scheduler::WorkerInfo> workers = SchedulerWorkersLocked(info.head_dim);
  std::vector<std::string> reasons;
  v1::Job probe;
  probe.set_job_id("submitted-job");
  for (const DeviceVariant& variant : info.variants) {
    const scheduler::Feasibility f =
        scheduler::CheckFeasible(MakeRequest(probe, 1, info, variant), workers);
    if (f.feasible) return absl::OkStatus();
    reasons.push_back(absl::StrCat(f.reason, " (memory plan per rank: ", variant.memory_plan, ")"));
  }
  return absl::ResourceExhaustedError(absl::StrCat("the job can never run on the ready workers: ",
                                                   absl::StrJoin(reasons, "; or ")));
}

void Coordinator::EnqueueLocked(ActiveJob* job) {
  // DEVICE_PREFERENCE_ANY: the first device kind the ready workers could fit; with no ready
  // worker, or none that fits, the kind it had (the first, for a new job).
  if (job->info.variants.size() > 1 && ReadyWorkersLocked() > 0) {
    const std::vector<scheduler::WorkerInfo> workers = SchedulerWorkersLocked(job->info.head_dim);
    for (size_t i = 0; i < job->info.variants.size(); ++i) {
      if (scheduler::CheckFeasible(
              MakeRequest(job->job, job->submit_seq, job->info, job->info.variants[i]), workers)
              .feasible) {
        job->variant = i;
        break;
      }
    }
  }
  absl::Status s = scheduler_.Enqueue(
      MakeRequest(job->job, job->submit_seq, job->info, job->info.variants[job->variant]));
  if (!s.ok() && !absl::IsAlreadyExists(s)) {
    Log(absl::StrCat("internal error: cannot queue job ", job->job.job_id(), ": ", s.message()));
  }
  KickSchedulerLocked();
  UpdateGaugesLocked();
}

void Coordinator::CheckQueuedJobsLocked(absl::Time now, Tickets* tickets) {
  std::vector<std::string> ready;
  for (const auto& [id, worker] : workers_) {
    if (TakesWorkLocked(*worker)) ready.push_back(id);
  }
  const std::string set = absl::StrJoin(ready, ",");  // workers_ is ordered: a canonical form.
  if (set != ready_set_) {
    ready_set_ = set;
    ready_set_since_ = now;
  }
  if (ready.empty() || now - ready_set_since_ < options_.feasibility_settle) return;
  std::vector<ActiveJob*> unchecked;
  for (const auto& [id, job] : jobs_) {
    if (!job->checked && !job->terminal && job->job.state() == v1::JOB_STATE_QUEUED) {
      unchecked.push_back(job.get());
    }
  }
  for (ActiveJob* job : unchecked) {
    const std::vector<scheduler::WorkerInfo> workers = SchedulerWorkersLocked(job->info.head_dim);
    std::vector<std::string> reasons;
    std::optional<size_t> fits;
    for (size_t i = 0; i < job->info.variants.size() && !fits.has_value(); ++i) {
      const DeviceVariant& variant = job->info.variants[i];
      const scheduler::Feasibility f = scheduler::CheckFeasible(
          MakeRequest(job->job, job->submit_seq, job->info, variant), workers);
      if (f.feasible) {
        fits = i;
      } else {
        reasons.push_back(
            absl::StrCat(f.reason, " (memory plan per rank: ", variant.memory_plan, ")"));
      }
    }
    if (!fits.has_value() && job->placed_before) {
      // It ran on this cluster before: the workers it needs may not have re-registered yet (after
      // a restart they come back as their cancelled tasks stop). It waits, unchecked.
      continue;
    }
    scheduler_.Remove(job->job.job_id()).IgnoreError();
    if (!fits.has_value()) {
      tickets->push_back(TransitionLocked(
          job, v1::JOB_STATE_FAILED, "failed",
          absl::StrCat("the job can never run on the ready workers (it was queued before they "
                       "were checked): ",
                       absl::StrJoin(reasons, "; or "))));
      continue;
    }
    // Queued again for the device kind that fits (DEVICE_PREFERENCE_ANY), in its old place.
    job->checked = true;
    job->variant = *fits;
    absl::Status s = scheduler_.Enqueue(
        MakeRequest(job->job, job->submit_seq, job->info, job->info.variants[job->variant]));
    if (!s.ok()) {
      Log(absl::StrCat("internal error: cannot queue job ", job->job.job_id(), ": ", s.message()));
    }
  }
  if (!unchecked.empty()) UpdateGaugesLocked();
}

absl::Status Coordinator::StartRingLocked(ActiveJob* job) {
  absl::StatusOr<std::unique_ptr<comm::TcpStoreServer>> store =
      comm::TcpStoreServer::Start(options_.rendezvous_host, 0);
  if (!store.ok()) return store.status();
  auto ring = std::make_unique<RingState>();
  ring->id = absl::StrCat(job->job.job_id(), "/", job->job.attempt());
  ring->backend = job->info.variants[job->variant].ring_backend;
  const std::string host = options_.rendezvous_advertise.empty() ? options_.rendezvous_host
                                                                 : options_.rendezvous_advertise;
  ring->address = absl::StrCat(host, ":", (*store)->port());
  ring->store = *std::move(store);
  job->ring = std::move(ring);
  return absl::OkStatus();
}

void Coordinator::EndRingLocked(ActiveJob* job, const std::string& unformed_outcome) {
  if (job->ring == nullptr) return;
  RingState& ring = *job->ring;
  if (!ring.formation_counted && !unformed_outcome.empty()) {
    metrics_->CountRingFormation(ring.backend, unformed_outcome, -1);
    ring.formation_counted = true;
  }
  if (ring.store != nullptr) retired_stores_.push_back(std::move(ring.store));
  job->ring.reset();
  KickSchedulerLocked();  // The scheduling loop destroys the retired store.
}

void Coordinator::ReapStores() {
  std::vector<std::unique_ptr<comm::TcpStoreServer>> stores;
  {
    absl::MutexLock lock(&mu_);
    stores.swap(retired_stores_);
  }
  stores.clear();  // Closes their connections and joins their threads.
}

void Coordinator::UpdateWorkerMetricsLocked(const WorkerEntry& worker) {
  int64_t reserved = 0;
  for (const std::string& task_id : worker.task_ids) {
    auto it = tasks_.find(task_id);
    if (it != tasks_.end()) reserved += it->second.memory_bytes;
  }
  metrics_->SetWorkerMemory(worker.info.name(), worker.info.capabilities().total_memory_bytes(),
                            worker.info.free_memory_bytes(), reserved);
}

std::string Coordinator::DescribeRanksLocked(const ActiveJob& job) const {
  std::vector<std::string> ranks;
  for (int r = 0; r < job.job.worker_ids_size(); ++r) {
    ranks.push_back(absl::StrCat("rank ", r, " on ", DescribeWorkerLocked(job.job.worker_ids(r))));
  }
  return absl::StrJoin(ranks, ", ");
}

void Coordinator::KickSchedulerLocked() {
  schedule_kicked_ = true;
  schedule_cv_.Signal();
}

void Coordinator::UpdateGaugesLocked() {
  int64_t ready = 0, draining = 0, dead = 0;
  for (const auto& [id, worker] : workers_) {
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
  metrics_->SetWorkers(ready, draining, dead);
  metrics_->SetQueueDepth(static_cast<int64_t>(scheduler_.queue().size()));
}

v1::Job Coordinator::PublicJobLocked(const ActiveJob& job) const {
  // The committed state, so that a reader never sees a state that a crash could take back, nor a
  // state whose event is not yet in the history; progress is the live figure (its writes are rate
  // limited) while the attempt is the committed one.
  v1::Job out = job.durable;
  out.clear_events();
  out.set_queue_position(0);
  if (out.state() == job.job.state() && out.attempt() == job.job.attempt()) {
    *out.mutable_progress() = job.job.progress();
  }
  if (out.state() == v1::JOB_STATE_QUEUED && job.job.state() == v1::JOB_STATE_QUEUED) {
    std::optional<size_t> position = scheduler_.queue().Position(out.job_id());
    if (position.has_value()) out.set_queue_position(static_cast<int64_t>(*position) + 1);
  }
  return out;
}

v1::Worker Coordinator::PublicWorkerLocked(const WorkerEntry& worker) const {
  v1::Worker out = worker.info;
  out.set_state(ToProto(worker.state));
  *out.mutable_last_heartbeat() = ToTimestamp(worker.last_heartbeat);
  out.clear_task_ids();
  for (const std::string& id : worker.task_ids) out.add_task_ids(id);
  return out;
}

void Coordinator::PushCommandLocked(WorkerEntry* worker, v1::WorkerCommand command) {
  worker->outbox.push_back(std::move(command));
  worker->cv->SignalAll();
}

void Coordinator::EraseTaskLocked(const std::string& task_id, bool cancel,
                                  const std::string& reason) {
  auto it = tasks_.find(task_id);
  if (it == tasks_.end()) return;
  WorkerEntry* worker = FindWorkerLocked(it->second.worker_id);
  if (worker != nullptr) {
    worker->task_ids.erase(task_id);
    if (cancel && it->second.dispatched && worker->state != scheduler::WorkerState::kDead) {
      v1::WorkerCommand command;
      command.mutable_cancel()->set_task_id(task_id);
      command.mutable_cancel()->set_reason(reason);
      PushCommandLocked(worker, std::move(command));
    }
    worker->cv->SignalAll();  // A draining worker may now be idle.
  }
  tasks_.erase(it);
  if (worker != nullptr) UpdateWorkerMetricsLocked(*worker);
  KickSchedulerLocked();
}

void Coordinator::ReleaseTasksLocked(ActiveJob* job, bool cancel_tasks, const std::string& reason) {
  for (const std::string& task_id : job->task_ids) EraseTaskLocked(task_id, cancel_tasks, reason);
  job->task_ids.clear();
  job->results.clear();
  job->outputs.clear();
  EndRingLocked(job, "");
}

void Coordinator::RequeueLocked(ActiveJob* job, const std::string& kind, const std::string& message,
                                Tickets* tickets) {
  job->job.set_attempt(job->job.attempt() + 1);
  job->job.mutable_progress()->set_steps_done(0);
  tickets->push_back(TransitionLocked(job, v1::JOB_STATE_QUEUED, kind, message));
  job->queued_since = absl::Now();
  EnqueueLocked(job);
}

void Coordinator::RecoverJobLocked(ActiveJob* job, FailureKind failure, const std::string& why,
                                   const std::string& cause, int64_t oom_free_bytes,
                                   Tickets* tickets) {
  metrics_->CountRecovery(cause);
  // A ring that had not formed yet failed to: counted as such unless the caller already did.
  EndRingLocked(job, job->cancel_requested ? "" : "failed");
  ReleaseTasksLocked(job, /*cancel_tasks=*/true, why);
  if (job->cancel_requested) {
    tickets->push_back(
        TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                         absl::StrCat("cancelled: ", job->cancel_reason, " (then ", why, ")")));
    return;
  }
  const DeviceVariant& variant = job->info.variants[job->variant];
  scheduler::RecoveryInput input;
  input.failure = failure;
  input.num_ranks = job->info.num_ranks;
  input.surviving_ranks = 0;
  input.seq_len = job->info.seq_len;
  input.micro_batch_size = 1;
  input.dtype = DTypeName(job->info.dtype);
  input.needs_gpu = variant.gpu;
  // Runs that ended because the coordinator restarted or stopped were not the job's failures.
  input.attempts = std::max(1, job->job.attempt() - job->free_requeues);
  input.max_attempts = options_.max_attempts;
  // An attention job's shape, precision and ring size are what the user asked to measure: only a
  // rerun of the same job is a faithful recovery.
  input.allow_shrink = false;
  input.allow_single_device = false;
  input.allow_precision_fallback = false;
  input.allow_more_ranks = false;
  const int planned_ranks = job->info.num_ranks;
  const int64_t planned_bytes = variant.memory_per_rank_bytes;
  input.memory_per_rank = [planned_ranks, planned_bytes](int ranks) -> std::optional<int64_t> {
    if (ranks != planned_ranks) return std::nullopt;
    return planned_bytes;
  };
  input.oom_free_memory_bytes = oom_free_bytes;
  absl::StatusOr<scheduler::RecoveryAction> action = scheduler::DecideRecovery(input);
  if (!action.ok()) {
    tickets->push_back(
        TransitionLocked(job, v1::JOB_STATE_FAILED, "failed",
                         absl::StrCat(why, "; no recovery possible: ", action.status().message())));
    return;
  }
  if (action->kind == scheduler::RecoveryKind::kFail) {
    tickets->push_back(TransitionLocked(job, v1::JOB_STATE_FAILED, "failed",
                                        absl::StrCat(why, "; ", action->reason)));
    return;
  }
  // With every in-place recovery turned off above, the only other answer is a requeue.
  RequeueLocked(job, "requeued", absl::StrCat(why, "; ", action->reason), tickets);
}

void Coordinator::KillWorkerLocked(WorkerEntry* worker, const std::string& why,
                                   const std::string& cause, Tickets* tickets) {
  worker->state = scheduler::WorkerState::kDead;
  worker->dead_since = absl::Now();
  worker->outbox.clear();
  worker->cv->SignalAll();
  std::set<std::string> job_ids;
  for (const std::string& task_id : worker->task_ids) {
    auto it = tasks_.find(task_id);
    if (it != tasks_.end()) job_ids.insert(it->second.job_id);
  }
  const std::string message =
      absl::StrCat("worker ", worker->info.worker_id(), " (", worker->info.name(), ") lost: ", why);
  for (const std::string& job_id : job_ids) {
    ActiveJob* job = FindJobLocked(job_id);
    if (job == nullptr || job->terminal) continue;
    tickets->push_back(TransitionLocked(job, job->job.state(), "worker_lost", message));
    RecoverJobLocked(job, FailureKind::kWorkerDead, message, cause, 0, tickets);
  }
  worker->task_ids.clear();
  UpdateGaugesLocked();
}

// -------------------------------------------------------------------------------------------------
// JobService.

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitJob(const v1::SubmitJobRequest& request) {
  absl::StatusOr<AttentionJobInfo> info = ValidateSubmitJobRequest(request);
  if (!info.ok()) return info.status();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/true); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
  }
  // A retry of an accepted job is answered whatever the cluster looks like now.
  absl::StatusOr<StoredJob> existing = store_->GetJobByKey(request.idempotency_key());
  if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();

  v1::Job job;
  v1::JobEvent event;
  bool checked = false;  // Found feasible against ready workers (not merely accepted for later).
  {
    absl::MutexLock lock(&mu_);
    if (!existing.ok()) {
      if (absl::Status s = CheckFeasibleLocked(*info); !s.ok()) return s;
      checked = ReadyWorkersLocked() > 0;
    }
    job.set_job_id(NewId("j-"));
  }
  const absl::Time now = absl::Now();
  job.set_idempotency_key(request.idempotency_key());
  *job.mutable_spec() = request.spec();
  job.set_state(v1::JOB_STATE_QUEUED);
  *job.mutable_create_time() = ToTimestamp(now);
  job.mutable_progress()->set_steps_total(info->iterations);
  const v1::AttentionJobSpec& a = request.spec().attention();
  event.set_kind("submitted");
  event.set_message(absl::StrCat(
      "queued: attention ", info->spec.DebugString(), " on (B, N, H, D) = (", info->batch, ", ",
      info->seq_len, ", ", info->num_heads, ", ", info->head_dim, ") ", DTypeName(info->dtype),
      ", ", info->num_ranks, info->num_ranks == 1 ? " rank, " : " ranks, ", info->iterations,
      a.pass() == v1::PASS_FORWARD_BACKWARD ? " forward+backward" : " forward",
      info->iterations == 1 ? " step" : " steps"));
  *event.mutable_time() = ToTimestamp(now);

  const absl::Time start = absl::Now();
  absl::StatusOr<SubmitOutcome> outcome = store_->Submit(job, event);
  metrics_->ObserveStoreCommit(absl::ToDoubleSeconds(absl::Now() - start));
  absl::MutexLock lock(&mu_);
  if (!outcome.ok()) {
    if (absl::IsUnavailable(outcome.status()) && store_error_.ok() && !store_->Health().ok()) {
      store_error_ = outcome.status();
    }
    return outcome.status();
  }
  v1::SubmitJobResponse response;
  response.set_created(outcome->created);
  if (outcome->created) metrics_->JobSubmitted(JobKind(outcome->job.spec()));
  const std::string& id = outcome->job.job_id();
  // Only the call that created the job adopts it. A retry that found the stored row may race with
  // that job ending (cancel, feasibility failure) and would bring back a stale QUEUED copy.
  if (outcome->created && FindJobLocked(id) == nullptr &&
      outcome->job.state() == v1::JOB_STATE_QUEUED) {
    StoredJob stored{outcome->job, outcome->submit_seq};
    AdoptLocked(stored, *info, checked);
  }
  const ActiveJob* active = FindJobLocked(id);
  *response.mutable_job() = active != nullptr ? PublicJobLocked(*active) : outcome->job;
  return response;
}

void Coordinator::AdoptLocked(const StoredJob& stored, const AttentionJobInfo& info, bool checked) {
  if (FindJobLocked(stored.job.job_id()) != nullptr) return;
  if (stored.job.state() != v1::JOB_STATE_QUEUED) {
    Log(absl::StrCat("internal error: job ", stored.job.job_id(), " is ",
                     StateName(stored.job.state()), " in the store but unknown in memory"));
    return;
  }
  auto job = std::make_unique<ActiveJob>();
  job->job = stored.job;
  job->durable = stored.job;
  job->submit_seq = stored.submit_seq;
  job->info = info;
  job->checked = checked;
  job->queued_since = FromTimestamp(stored.job.create_time());
  ActiveJob* raw = job.get();
  jobs_[stored.job.job_id()] = std::move(job);
  EnqueueLocked(raw);
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const v1::GetJobRequest& request) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.max_events() < 0 || request.max_events() > kMaxEvents) {
    return absl::InvalidArgumentError(absl::StrCat("max_events: must be 0 (the default, ",
                                                   kDefaultMaxEvents, ") to ", kMaxEvents, ", got ",
                                                   request.max_events()));
  }
  v1::Job job;
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (const ActiveJob* active = FindJobLocked(request.job_id()); active != nullptr) {
      job = PublicJobLocked(*active);
      found = true;
    }
  }
  if (!found) {
    absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
    if (!stored.ok()) return stored.status();
    job = std::move(stored->job);
  }
  if (request.include_events()) {
    const int limit = request.max_events() == 0 ? kDefaultMaxEvents : request.max_events();
    absl::StatusOr<std::vector<v1::JobEvent>> events =
        store_->LatestEvents(request.job_id(), limit);
    if (!events.ok()) return events.status();
    // Sequence numbers count a job's events from 1 without gaps.
    if (!events->empty()) job.set_events_omitted(events->front().seq() - 1);
    for (v1::JobEvent& e : *events) *job.add_events() = std::move(e);
  }
  return job;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  if (absl::Status s = ValidateListJobsRequest(request); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  ListFilter filter;
  for (int state : request.states()) filter.states.push_back(static_cast<v1::JobState>(state));
  filter.tenant = request.tenant();
  filter.kind = request.kind();
  absl::StatusOr<ListPage> page = store_->List(filter, request.page_size(), request.page_token());
  if (!page.ok()) return page.status();
  v1::ListJobsResponse response;
  absl::MutexLock lock(&mu_);
  for (StoredJob& stored : page->jobs) {
    const ActiveJob* active = FindJobLocked(stored.job.job_id());
    *response.add_jobs() = active != nullptr ? PublicJobLocked(*active) : std::move(stored.job);
  }
  response.set_next_page_token(page->next_page_token);
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const v1::CancelJobRequest& request) {
  if (absl::Status s = ValidateCancelJobRequest(request); !s.ok()) return s;
  const std::string reason = request.reason().empty() ? "cancelled by request" : request.reason();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
  }
  auto terminal_answer = [&](const v1::Job& job) -> absl::StatusOr<v1::Job> {
    if (job.state() == v1::JOB_STATE_CANCELLED) return job;
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.job_id(), " already ", StateName(job.state()),
                     "; only queued, placed or running jobs can be cancelled"));
  };
  Tickets tickets;
  v1::Job answer;
  {
    absl::MutexLock lock(&mu_);
    ActiveJob* job = FindJobLocked(request.job_id());
    if (job == nullptr) {
      mu_.Unlock();
      absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
      mu_.Lock();
      if (!stored.ok()) return stored.status();
      if (IsTerminal(stored->job.state())) return terminal_answer(stored->job);
      job = FindJobLocked(request.job_id());
      if (job == nullptr) {
        // Stored but not yet in memory: its SubmitJob is between the store and the queue.
        absl::StatusOr<AttentionJobInfo> info = AnalyzeJobSpec(stored->job.spec());
        if (!info.ok()) return info.status();
        AdoptLocked(*stored, *info, /*checked=*/false);
        job = FindJobLocked(request.job_id());
        if (job == nullptr) {
          return absl::UnavailableError(
              absl::StrCat("job ", request.job_id(), " is changing state; retry"));
        }
      }
    }
    // Ended in memory, its last write in flight: answer from what it has become.
    if (job->terminal) return terminal_answer(job->job);
    switch (job->job.state()) {
      case v1::JOB_STATE_QUEUED:
        scheduler_.Remove(job->job.job_id()).IgnoreError();
        UpdateGaugesLocked();
        tickets.push_back(TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                                           absl::StrCat("cancelled: ", reason)));
        break;
      case v1::JOB_STATE_PLACED:
      case v1::JOB_STATE_RUNNING: {
        if (job->cancel_requested) break;
        job->cancel_requested = true;
        job->cancel_reason = reason;
        // Tasks not yet handed to a worker end here; the others when their workers confirm.
        std::vector<std::string> keep;
        for (const std::string& task_id : job->task_ids) {
          auto it = tasks_.find(task_id);
          if (it != tasks_.end() && it->second.dispatched) {
            keep.push_back(task_id);
            WorkerEntry* worker = FindWorkerLocked(it->second.worker_id);
            if (worker != nullptr) {
              v1::WorkerCommand command;
              command.mutable_cancel()->set_task_id(task_id);
              command.mutable_cancel()->set_reason(absl::StrCat("job cancelled: ", reason));
              PushCommandLocked(worker, std::move(command));
            }
          } else {
            EraseTaskLocked(task_id, /*cancel=*/false, reason);
          }
        }
        job->task_ids = keep;
        if (keep.empty()) {
          ReleaseTasksLocked(job, false, reason);
          tickets.push_back(TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                                             absl::StrCat("cancelled: ", reason)));
        } else {
          v1::JobEvent event;
          event.set_kind("cancel_requested");
          event.set_message(absl::StrCat("cancel requested (", reason, "); waiting for ",
                                         keep.size(), keep.size() == 1 ? " rank" : " ranks",
                                         " to stop"));
          tickets.push_back(QueueWriteLocked(job, std::move(event)));
        }
        break;
      }
      default:
        return absl::InternalError(absl::StrCat("job ", job->job.job_id(), " in unexpected state ",
                                                StateName(job->job.state())));
    }
    // Durable once the flush below succeeds; PublicJobLocked would still show the state before.
    answer = job->job;
    answer.clear_events();
    answer.set_queue_position(0);
  }
  if (absl::Status s = Flush(tickets); !s.ok()) return s;
  return answer;
}

absl::Status Coordinator::WatchJob(const v1::WatchJobRequest& request, const JobEventSink& emit,
                                   const CancelledFn& cancelled) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.after_seq() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("after_seq: must be >= 0, got ", request.after_seq()));
  }
  // Subscribe before reading the history: an event committed in between is then in one or both, and
  // duplicates are dropped by seq.
  Watcher watcher;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (streams_closed_) return absl::UnavailableError(kShuttingDown);
    watchers_.emplace(request.job_id(), &watcher);
  }
  struct Unsubscribe {
    Coordinator* self;
    const std::string& id;
    Watcher* watcher;
    ~Unsubscribe() {
      absl::MutexLock lock(&self->mu_);
      auto range = self->watchers_.equal_range(id);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == watcher) {
          self->watchers_.erase(it);
          break;
        }
      }
    }
  } unsubscribe{this, request.job_id(), &watcher};

  absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
  if (!stored.ok()) return stored.status();
  absl::StatusOr<std::vector<v1::JobEvent>> history =
      store_->Events(request.job_id(), request.after_seq(), 0);
  if (!history.ok()) return history.status();
  int64_t last = request.after_seq();
  for (const v1::JobEvent& event : *history) {
    if (!emit(event)) return absl::CancelledError("the watcher went away");
    last = event.seq();
    if (IsTerminal(event.state())) return absl::OkStatus();
  }
  if (IsTerminal(stored->job.state())) return absl::OkStatus();  // Its end is before after_seq.

  for (;;) {
    std::deque<v1::JobEvent> events;
    {
      absl::MutexLock lock(&mu_);
      while (watcher.events.empty()) {
        if (streams_closed_) return absl::UnavailableError(kShuttingDown);
        if (cancelled && cancelled()) return absl::CancelledError("the watcher cancelled");
        watcher.cv.WaitWithTimeout(&mu_, options_.stream_poll_interval);
      }
      events.swap(watcher.events);
    }
    for (const v1::JobEvent& event : events) {
      if (event.seq() <= last) continue;
      if (!emit(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (IsTerminal(event.state())) return absl::OkStatus();
    }
  }
}

// -------------------------------------------------------------------------------------------------
// WorkerRegistry.

namespace {

absl::Status ValidateRegistration(const v1::RegisterWorkerRequest& request) {
  if (request.name().empty()) return absl::InvalidArgumentError("name: required");
  if (request.name().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: must be at most 256 characters, got ", request.name().size()));
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
    absl::StatusOr<DType> d = ToEngineDType(static_cast<v1::DType>(caps.dtypes(i)),
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

}  // namespace

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (absl::Status s = ValidateRegistration(request); !s.ok()) return s;
  Tickets tickets;
  v1::RegisterWorkerResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
    const std::string id = NewId("w-");
    for (auto& [other_id, other] : workers_) {
      if (other->info.name() == request.name() && other->state != scheduler::WorkerState::kDead) {
        KillWorkerLocked(other.get(),
                         absl::StrCat("the worker registered again as ", id, " (it restarted)"),
                         "worker_reregistered", &tickets);
      }
    }
    auto worker = std::make_unique<WorkerEntry>();
    worker->info.set_worker_id(id);
    worker->info.set_name(request.name());
    worker->info.set_address(request.address());
    *worker->info.mutable_capabilities() = request.capabilities();
    worker->info.set_version(request.version());
    worker->info.set_free_memory_bytes(request.capabilities().total_memory_bytes());
    worker->last_heartbeat = absl::Now();
    UpdateWorkerMetricsLocked(*worker);
    workers_[id] = std::move(worker);
    UpdateGaugesLocked();
    KickSchedulerLocked();
    response.set_worker_id(id);
    response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  }
  if (absl::Status s = Flush(tickets); !s.ok()) return s;
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  WorkerEntry* worker = FindWorkerLocked(request.worker_id());
  if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) {
    response.set_reregister(true);
    return response;
  }
  // A worker runs at most max_ranks tasks and lists them until their final reports are taken; far
  // more is not a worker's heartbeat, and each unknown id would queue a CancelTask.
  const int max_listed = 4 * std::max(1, worker->info.capabilities().max_ranks()) + 64;
  if (request.tasks_size() > max_listed) {
    return absl::InvalidArgumentError(absl::StrCat("tasks: a heartbeat lists at most ", max_listed,
                                                   " tasks for worker ", worker->info.name(),
                                                   ", got ", request.tasks_size()));
  }
  const absl::Time now = absl::Now();
  worker->last_heartbeat = now;
  worker->info.set_free_memory_bytes(std::max<int64_t>(0, request.free_memory_bytes()));
  std::set<std::string> listed;
  for (const v1::RunningTask& task : request.tasks()) listed.insert(task.task_id());
  // An assignment written to a stream that broke right after may never have reached the worker:
  // one it neither started nor lists two heartbeats after it was sent is sent again (workers ignore
  // a task id they already run or ran).
  for (const std::string& task_id : worker->task_ids) {
    auto it = tasks_.find(task_id);
    if (it == tasks_.end() || !it->second.dispatched || it->second.started ||
        listed.count(task_id) > 0 ||
        now - it->second.dispatched_at < 2 * options_.heartbeat_interval) {
      continue;
    }
    const ActiveJob* job = FindJobLocked(it->second.job_id);
    if (job == nullptr || job->terminal) continue;
    // Without an open stream the assignment still waits in the outbox; it goes out when one opens.
    if (worker->streams == 0) continue;
    const bool queued =
        std::any_of(worker->outbox.begin(), worker->outbox.end(), [&](const v1::WorkerCommand& c) {
          return c.has_assign() && c.assign().task_id() == task_id;
        });
    it->second.dispatched_at = now;
    if (!queued) PushCommandLocked(worker, AssignmentLocked(*job, it->second));
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
    PushCommandLocked(worker, std::move(command));
  }
  response.set_drain(worker->state == scheduler::WorkerState::kDraining);
  UpdateWorkerMetricsLocked(*worker);
  if (!scheduler_.queue().empty()) KickSchedulerLocked();
  return response;
}

absl::Status Coordinator::StreamAssignments(const v1::StreamAssignmentsRequest& request,
                                            const WorkerCommandSink& send,
                                            const CancelledFn& cancelled) {
  const std::string& id = request.worker_id();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  if (streams_closed_) return absl::UnavailableError(kShuttingDown);
  WorkerEntry* worker = FindWorkerLocked(id);
  if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) {
    return absl::NotFoundError(absl::StrCat("unknown worker id \"", id, "\"; register again"));
  }
  const uint64_t generation = ++worker->stream_generation;
  worker->cv->SignalAll();  // An older stream of this worker ends.
  ++worker->streams;
  if (worker->stream_lost) {
    worker->stream_lost = false;
    KickSchedulerLocked();  // It takes work again.
  }
  struct StreamCount {
    WorkerEntry* worker;
    ~StreamCount() { --worker->streams; }
  } count{worker};  // Worker entries are erased only when dead and stream-less (MonitorPass).
  // The worker went away (its process died, or its connection): until it opens a stream again it
  // can receive nothing, so it gets no new ranks. A stream replaced by a newer one is not lost.
  auto lost = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (worker->stream_generation == generation && worker->streams == 1 &&
        worker->state != scheduler::WorkerState::kDead) {
      worker->stream_lost = true;
      Log(absl::StrCat("worker ", DescribeWorkerLocked(id),
                       " lost its assignment stream; no new ranks until it reconnects"));
    }
  };
  for (;;) {
    for (;;) {
      if (streams_closed_) return absl::UnavailableError(kShuttingDown);
      if (worker->state == scheduler::WorkerState::kDead) {
        return absl::NotFoundError(
            absl::StrCat("worker ", id, " was declared dead; register again"));
      }
      if (worker->stream_generation != generation) {
        return absl::AbortedError(
            absl::StrCat("a newer StreamAssignments call of worker ", id, " replaced this one"));
      }
      if (cancelled && cancelled()) {
        lost();
        return absl::CancelledError("the worker went away");
      }
      if (!worker->outbox.empty()) break;
      if (worker->state == scheduler::WorkerState::kDraining && worker->task_ids.empty()) {
        return absl::OkStatus();
      }
      worker->cv->WaitWithTimeout(&mu_, options_.stream_poll_interval);
    }
    v1::WorkerCommand command = std::move(worker->outbox.front());
    worker->outbox.pop_front();
    mu_.Unlock();
    const bool sent = send(command);
    mu_.Lock();
    drain_cv_.SignalAll();
    if (!sent) {
      // The next stream of this worker delivers it.
      if (worker->state != scheduler::WorkerState::kDead) {
        worker->outbox.push_front(std::move(command));
      }
      lost();
      return absl::CancelledError("the worker's stream broke");
    }
  }
}

absl::StatusOr<v1::ReportTaskResponse> Coordinator::ReportTask(const v1::TaskReport& request) {
  if (request.state() == v1::TASK_STATE_UNSPECIFIED || !v1::TaskState_IsValid(request.state())) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: must be a task state (STARTED .. CANCELLED), got ", request.state()));
  }
  if (request.state() == v1::TASK_STATE_SUCCEEDED && !request.has_rank_result()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank_result: required with state SUCCEEDED (task ", request.task_id(), ")"));
  }
  // A ring rank that failed before its ring formed: ask the ring's store which ranks never
  // arrived, before taking the lock for the report itself (the answer is only used if the task is
  // still current then).
  std::optional<std::vector<int>> missing_ranks;
  if (request.state() == v1::TASK_STATE_FAILED && request.ring_formation_seconds() <= 0) {
    std::string address, ring_id;
    int size = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = tasks_.find(request.task_id());
      const ActiveJob* job = it != tasks_.end() ? FindJobLocked(it->second.job_id) : nullptr;
      if (job != nullptr && job->ring != nullptr && job->job.attempt() == it->second.attempt &&
          static_cast<int>(job->ring->formed.size()) < job->info.num_ranks) {
        address = job->ring->address;
        ring_id = job->ring->id;
        size = job->info.num_ranks;
      }
    }
    if (!address.empty()) missing_ranks = ProbeMissingRanks(address, ring_id, size);
  }
  v1::ReportTaskResponse response;
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
    auto task_it = tasks_.find(request.task_id());
    WorkerEntry* worker = FindWorkerLocked(request.worker_id());
    // Stale: unknown task, one that moved to another registration, or an older attempt's (those are
    // forgotten when their attempt ends, so they are unknown here too).
    if (task_it == tasks_.end() || task_it->second.worker_id != request.worker_id() ||
        worker == nullptr || worker->state == scheduler::WorkerState::kDead) {
      response.set_stop(true);
      return response;
    }
    TaskEntry& task = task_it->second;
    ActiveJob* job = FindJobLocked(task.job_id);
    if (job == nullptr || job->terminal || job->job.attempt() != task.attempt) {
      response.set_stop(true);
      return response;
    }
    const std::string where =
        absl::StrCat("rank ", task.rank, " on ", DescribeWorkerLocked(task.worker_id));
    // Every report of a formed ring rank says so; the ring is formed when every rank has.
    if (request.ring_formation_seconds() > 0) {
      task.formation_seconds = request.ring_formation_seconds();
      if (job->ring != nullptr && job->ring->formed.insert(task.rank).second) {
        RingState& ring = *job->ring;
        ring.formation_seconds = std::max(ring.formation_seconds, task.formation_seconds);
        if (static_cast<int>(ring.formed.size()) == job->info.num_ranks &&
            !ring.formation_counted) {
          metrics_->CountRingFormation(ring.backend, "formed", ring.formation_seconds);
          ring.formation_counted = true;
        }
      }
    }
    auto mark_started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      task.started = true;
      if (job->job.state() == v1::JOB_STATE_PLACED) {
        if (!job->job.has_start_time()) *job->job.mutable_start_time() = ToTimestamp(absl::Now());
        tickets.push_back(
            TransitionLocked(job, v1::JOB_STATE_RUNNING, "started",
                             absl::StrCat(where, " started (attempt ", job->job.attempt(), ")")));
      }
    };
    switch (request.state()) {
      case v1::TASK_STATE_STARTED:
        mark_started();
        // A cancel in progress is not a "stop": the worker got a CancelTask and must still send its
        // final CANCELLED report, which is what ends the job (stop would silence that report).
        break;
      case v1::TASK_STATE_PROGRESS: {
        mark_started();
        task.steps_done = std::max(task.steps_done, request.progress().steps_done());
        int64_t done = task.steps_done;
        for (const std::string& other : job->task_ids) {
          auto it = tasks_.find(other);
          if (it != tasks_.end()) done = std::min(done, it->second.steps_done);
        }
        v1::JobProgress* progress = job->job.mutable_progress();
        progress->set_steps_done(std::min(done, job->info.iterations));
        progress->set_steps_total(job->info.iterations);
        const absl::Time now = absl::Now();
        if (now - job->last_progress_write >= options_.progress_persist_interval) {
          job->last_progress_write = now;
          v1::JobEvent event;
          event.set_kind("progress");
          event.set_message(
              absl::StrCat(progress->steps_done(), " of ", progress->steps_total(), " steps"));
          *event.mutable_progress() = *progress;
          tickets.push_back(QueueWriteLocked(job, std::move(event)));
        }
        break;
      }
      case v1::TASK_STATE_SUCCEEDED: {
        mark_started();
        v1::RankResult result = request.rank_result();
        result.set_rank(task.rank);
        result.set_worker_id(task.worker_id);
        if (result.ring_formation_seconds() <= 0) {
          result.set_ring_formation_seconds(task.formation_seconds);
        }
        // The rank's share of the job's FLOPs: its rate times its step time, over every step.
        metrics_->ObserveRank(worker->info.name(), result.seconds_per_step(),
                              result.tflops() * 1e12 * result.seconds_per_step() *
                                  static_cast<double>(job->info.iterations),
                              result.tflops());
        job->results.push_back(std::move(result));
        if (request.has_output()) job->outputs[task.rank] = request.output();
        const std::string task_id = task.task_id;
        job->task_ids.erase(std::remove(job->task_ids.begin(), job->task_ids.end(), task_id),
                            job->task_ids.end());
        EraseTaskLocked(task_id, /*cancel=*/false, "");
        if (!job->task_ids.empty()) break;
        // Every rank has ended. With a cancel in flight some of them may have ended CANCELLED (a
        // ring's ranks race the cancel): a job succeeds only with every rank's result; otherwise
        // the cancel wins and the partial results are dropped.
        if (static_cast<int>(job->results.size()) < job->info.num_ranks) {
          const size_t finished = job->results.size();
          ReleaseTasksLocked(job, /*cancel_tasks=*/false, "");
          tickets.push_back(
              TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                               absl::StrCat("cancelled: ", job->cancel_reason, " (", finished,
                                            " of ", job->info.num_ranks, " ranks had finished)")));
          break;
        }
        const bool return_output = job->job.spec().attention().return_output();
        v1::Tensor output;
        std::string output_problem;
        if (return_output) {
          absl::StatusOr<v1::Tensor> assembled = AssembleOutput(job->info, job->outputs);
          if (assembled.ok()) {
            output = *std::move(assembled);
          } else {
            output_problem = std::string(assembled.status().message());
          }
        }
        v1::AttentionJobResult result_all = CombineRankResults(job->info, std::move(job->results),
                                                               std::move(output), return_output);
        job->results.clear();
        job->outputs.clear();
        EndRingLocked(job, "");
        metrics_->ObserveAttentionJob(job->info.variants[job->variant].gpu ? "gpu" : "cpu",
                                      result_all.tflops(), result_all.seconds_per_step());
        std::string message = absl::StrFormat("%d of %d ranks succeeded: %.6g s/step, %.4g TFLOP/s",
                                              job->info.num_ranks, job->info.num_ranks,
                                              result_all.seconds_per_step(), result_all.tflops());
        if (return_output && !result_all.has_output()) {
          absl::StrAppend(&message, " (no output tensor: ", output_problem, ")");
        }
        if (job->cancel_requested) absl::StrAppend(&message, " (it finished before the cancel)");
        *job->job.mutable_result()->mutable_attention() = std::move(result_all);
        job->job.mutable_progress()->set_steps_done(job->info.iterations);
        metrics_->AddAttentionWork(
            job->info.tokens, job->info.flops_per_step * static_cast<double>(job->info.iterations));
        tickets.push_back(TransitionLocked(job, v1::JOB_STATE_SUCCEEDED, "succeeded", message));
        break;
      }
      case v1::TASK_STATE_FAILED: {
        const absl::StatusCode code = static_cast<absl::StatusCode>(request.error_code());
        std::string why = absl::StrCat(
            where, " failed: ", request.error().empty() ? "no error given" : request.error(),
            " (code ", absl::StatusCodeToString(code), ")");
        if (job->ring != nullptr && !job->cancel_requested) {
          RingState& ring = *job->ring;
          if (request.ring_formation_seconds() <= 0 &&
              static_cast<int>(ring.formed.size()) < job->info.num_ranks) {
            // The ring never formed: name the ranks the store never saw, and where they were.
            std::vector<std::string> absent;
            for (int r : missing_ranks.value_or(std::vector<int>())) {
              if (r >= job->job.worker_ids_size()) continue;
              auto peer = tasks_.find(TaskId(job->job.job_id(), job->job.attempt(), r));
              const v1::RankPhase phase =
                  peer != tasks_.end() ? peer->second.phase : v1::RANK_PHASE_UNSPECIFIED;
              absent.push_back(absl::StrCat("rank ", r, " on ",
                                            DescribeWorkerLocked(job->job.worker_ids(r)), " (",
                                            PhaseName(phase), ")"));
            }
            // A timeout is the missing ranks' doing; another failure (a refused rank, a store that
            // cannot be reached) is the reporting rank's, and the others simply had not come yet.
            const bool timed_out = code == absl::StatusCode::kDeadlineExceeded;
            std::string message = absl::StrCat("ring ", ring.id, " did not form: ");
            if (!absent.empty()) {
              const std::string list = absl::StrJoin(absent, ", ");
              if (timed_out) {
                absl::StrAppend(&message, list, " never arrived within ",
                                Seconds(options_.ring_formation_timeout), "; ");
                why = absl::StrCat("ring formation failed: ", list, " never arrived");
              } else {
                absl::StrAppend(&message, list, " had not arrived yet; ");
              }
            }
            absl::StrAppend(&message, where, " reported: ", request.error());
            tickets.push_back(
                TransitionLocked(job, job->job.state(), "ring_formation_failed", message));
            EndRingLocked(job, timed_out ? "timed_out" : "failed");
          } else {
            tickets.push_back(TransitionLocked(
                job, job->job.state(), "ring_failed",
                absl::StrCat(why, "; the ring ", ring.id, ": ", DescribeRanksLocked(*job))));
          }
        }
        const int64_t free_bytes = worker->info.free_memory_bytes();
        std::optional<FailureKind> failure = ClassifyTaskError(request.error_code());
        // The reporting rank has stopped already: no CancelTask for it, only for its peers.
        const std::string task_id = task.task_id;
        job->task_ids.erase(std::remove(job->task_ids.begin(), job->task_ids.end(), task_id),
                            job->task_ids.end());
        EraseTaskLocked(task_id, /*cancel=*/false, "");
        if (job->cancel_requested || !failure.has_value()) {
          ReleaseTasksLocked(job, /*cancel_tasks=*/true, why);
          if (job->cancel_requested) {
            tickets.push_back(
                TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                                 absl::StrCat("cancelled: ", job->cancel_reason, " (", why, ")")));
          } else {
            tickets.push_back(TransitionLocked(
                job, v1::JOB_STATE_FAILED, "failed",
                absl::StrCat(why, "; not retried: the error does not depend on the worker")));
          }
        } else {
          RecoverJobLocked(job, *failure, why, "task_failed", free_bytes, &tickets);
        }
        break;
      }
      case v1::TASK_STATE_CANCELLED: {
        const std::string task_id = task.task_id;
        if (job->cancel_requested) {
          job->task_ids.erase(std::remove(job->task_ids.begin(), job->task_ids.end(), task_id),
                              job->task_ids.end());
          EraseTaskLocked(task_id, /*cancel=*/false, "");
          if (job->task_ids.empty()) {
            ReleaseTasksLocked(job, false, "");
            tickets.push_back(TransitionLocked(job, v1::JOB_STATE_CANCELLED, "cancelled",
                                               absl::StrCat("cancelled: ", job->cancel_reason)));
          }
        } else {
          job->task_ids.erase(std::remove(job->task_ids.begin(), job->task_ids.end(), task_id),
                              job->task_ids.end());
          EraseTaskLocked(task_id, /*cancel=*/false, "");
          RecoverJobLocked(job, FailureKind::kPeerLost,
                           absl::StrCat(where, " was cancelled by its worker"), "task_failed", 0,
                           &tickets);
        }
        break;
      }
      default:
        break;
    }
  }
  if (absl::Status s = Flush(tickets); !s.ok()) return s;
  return response;
}

// -------------------------------------------------------------------------------------------------
// AdminService.

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkers(
    const v1::ListWorkersRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  std::vector<const WorkerEntry*> list;
  for (const auto& [id, worker] : workers_) {
    if (worker->state == scheduler::WorkerState::kDead && !request.include_dead()) continue;
    list.push_back(worker.get());
  }
  std::sort(list.begin(), list.end(), [](const WorkerEntry* a, const WorkerEntry* b) {
    if (a->info.name() != b->info.name()) return a->info.name() < b->info.name();
    return a->info.worker_id() < b->info.worker_id();
  });
  v1::ListWorkersResponse response;
  for (const WorkerEntry* worker : list) *response.add_workers() = PublicWorkerLocked(*worker);
  return response;
}

absl::StatusOr<v1::Worker> Coordinator::DrainWorker(const v1::DrainWorkerRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  WorkerEntry* worker = FindWorkerLocked(request.worker_id());
  if (worker == nullptr) {
    // By name: its live registration, else its most recent dead one (for the error).
    for (auto& [id, entry] : workers_) {
      if (entry->info.name() != request.worker_id()) continue;
      if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) worker = entry.get();
    }
  }
  if (worker == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no worker with id or name \"", request.worker_id(), "\""));
  }
  if (worker->state == scheduler::WorkerState::kDead) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker->info.worker_id(), " (", worker->info.name(), ") is dead"));
  }
  worker->state = scheduler::WorkerState::kDraining;
  worker->cv->SignalAll();
  UpdateGaugesLocked();
  return PublicWorkerLocked(*worker);
}

absl::StatusOr<v1::Worker> Coordinator::UndrainWorker(const v1::UndrainWorkerRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  WorkerEntry* worker = FindWorkerLocked(request.worker_id());
  if (worker == nullptr) {
    // By name: its live registration, else its most recent dead one (for the error).
    for (auto& [id, entry] : workers_) {
      if (entry->info.name() != request.worker_id()) continue;
      if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) worker = entry.get();
    }
  }
  if (worker == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no worker with id or name \"", request.worker_id(), "\""));
  }
  if (worker->state == scheduler::WorkerState::kDead) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker->info.worker_id(), " (", worker->info.name(), ") is dead"));
  }
  if (worker->state == scheduler::WorkerState::kDraining) {
    worker->state = scheduler::WorkerState::kReady;
    worker->cv->SignalAll();
    UpdateGaugesLocked();
    KickSchedulerLocked();  // It takes work again.
  }
  return PublicWorkerLocked(*worker);
}

// -------------------------------------------------------------------------------------------------
// Threads.

void Coordinator::SchedulePass() {
  ReapStores();
  Tickets tickets;
  std::vector<std::pair<std::string, Ticket>> placed;  // Each job with its "placed" write.
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kServing || !store_error_.ok()) return;
    const absl::Time now = absl::Now();
    CheckQueuedJobsLocked(now, &tickets);
    absl::StatusOr<std::vector<scheduler::Placement>> placements =
        scheduler_.queue().empty() ? std::vector<scheduler::Placement>()
                                   : scheduler_.Schedule(SchedulerWorkersLocked(0), now);
    if (!placements.ok()) {
      Log(absl::StrCat("internal error: scheduling pass failed: ", placements.status().message()));
      placements = std::vector<scheduler::Placement>();
    }
    for (const scheduler::Placement& placement : *placements) {
      ActiveJob* job = FindJobLocked(placement.job_id);
      if (job == nullptr || job->terminal || job->job.state() != v1::JOB_STATE_QUEUED) continue;
      if (job->job.attempt() == 0) job->job.set_attempt(1);
      job->placed_before = true;
      if (job->info.num_ranks > 1) {
        if (absl::Status s = StartRingLocked(job); !s.ok()) {
          // Back in the queue, in its place, for the next pass (once a second).
          Log(absl::StrCat("cannot start the rendezvous store of job ", job->job.job_id(), ": ",
                           s.message(), "; it stays queued"));
          scheduler_
              .Enqueue(MakeRequest(job->job, job->submit_seq, job->info,
                                   job->info.variants[job->variant]))
              .IgnoreError();
          continue;
        }
      }
      const int64_t memory = job->info.variants[job->variant].memory_per_rank_bytes;
      job->job.clear_worker_ids();
      job->task_ids.clear();
      std::vector<std::string> names;
      for (size_t rank = 0; rank < placement.worker_ids.size(); ++rank) {
        const std::string& worker_id = placement.worker_ids[rank];
        TaskEntry task;
        task.task_id = TaskId(job->job.job_id(), job->job.attempt(), static_cast<int>(rank));
        task.job_id = job->job.job_id();
        task.worker_id = worker_id;
        task.attempt = job->job.attempt();
        task.rank = static_cast<int>(rank);
        task.memory_bytes = memory;
        const std::string task_id = task.task_id;
        job->task_ids.push_back(task_id);
        job->job.add_worker_ids(worker_id);
        names.push_back(DescribeWorkerLocked(worker_id));
        tasks_[task_id] = std::move(task);
        if (WorkerEntry* worker = FindWorkerLocked(worker_id); worker != nullptr) {
          worker->task_ids.insert(task_id);
          UpdateWorkerMetricsLocked(*worker);
        }
      }
      metrics_->ObserveQueueWait(JobKind(job->job.spec()),
                                 absl::ToDoubleSeconds(now - job->queued_since));
      std::string where = absl::StrJoin(names, ", ");
      if (job->ring != nullptr) {
        where = absl::StrCat(DescribeRanksLocked(*job), " (", job->ring->backend, " ring ",
                             job->ring->id, ", rendezvous ", job->ring->address, ")");
      }
      Ticket ticket =
          TransitionLocked(job, v1::JOB_STATE_PLACED, "placed",
                           absl::StrCat("attempt ", job->job.attempt(), " placed on ", where));
      tickets.push_back(ticket);
      placed.emplace_back(job->job.job_id(), std::move(ticket));
    }
    UpdateGaugesLocked();
  }
  // Workers hear of a placement only once it is durable: after a crash in between, the restarted
  // coordinator neither loses the job nor has a worker running a placement it does not know. One
  // job's failed write (logged by FlushOne) holds back that job only, not the rest of the pass.
  Flush(tickets).IgnoreError();
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, ticket] : placed) {
    if (ticket.first != nullptr && ticket.first->durable < ticket.second) continue;
    ActiveJob* job = FindJobLocked(job_id);
    // Cancelled, or its worker lost, meanwhile: those paths released the tasks.
    if (job == nullptr || job->terminal || job->job.state() != v1::JOB_STATE_PLACED) continue;
    for (const std::string& task_id : job->task_ids) {
      auto it = tasks_.find(task_id);
      if (it == tasks_.end() || it->second.dispatched) continue;
      WorkerEntry* worker = FindWorkerLocked(it->second.worker_id);
      if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) continue;
      it->second.dispatched = true;
      it->second.dispatched_at = absl::Now();
      PushCommandLocked(worker, AssignmentLocked(*job, it->second));
    }
  }
}

v1::WorkerCommand Coordinator::AssignmentLocked(const ActiveJob& job, const TaskEntry& task) const {
  v1::WorkerCommand command;
  v1::TaskAssignment* assign = command.mutable_assign();
  assign->set_task_id(task.task_id);
  assign->set_job_id(task.job_id);
  assign->set_attempt(task.attempt);
  assign->set_rank(task.rank);
  *assign->mutable_spec() = job.job.spec();
  if (job.ring != nullptr) {
    v1::RingInfo* ring = assign->mutable_ring();
    ring->set_ring_id(job.ring->id);
    ring->set_rank(task.rank);
    ring->set_size(job.info.num_ranks);
    ring->set_backend(job.ring->backend);
    ring->set_store_address(job.ring->address);
    ring->set_formation_timeout_ms(absl::ToInt64Milliseconds(options_.ring_formation_timeout));
    ring->set_comm_timeout_ms(absl::ToInt64Milliseconds(options_.ring_comm_timeout));
  }
  return command;
}

void Coordinator::SchedulerLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!schedule_kicked_ && !threads_stop_) schedule_cv_.WaitWithTimeout(&mu_, absl::Seconds(1));
      if (threads_stop_) return;
      schedule_kicked_ = false;
    }
    SchedulePass();
  }
}

void Coordinator::MonitorPass() {
  ReapStores();
  RetryStalledWrites();
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kNew || phase_ == Phase::kClosed || !store_error_.ok()) return;
    const absl::Time now = absl::Now();
    for (auto it = workers_.begin(); it != workers_.end();) {
      WorkerEntry* worker = it->second.get();
      if (worker->state != scheduler::WorkerState::kDead &&
          now - worker->last_heartbeat > options_.dead_after) {
        KillWorkerLocked(worker,
                         absl::StrCat("no heartbeat for ", Seconds(now - worker->last_heartbeat),
                                      " (dead after ", Seconds(options_.dead_after), ")"),
                         "worker_lost", &tickets);
      }
      if (worker->state == scheduler::WorkerState::kDead && worker->streams == 0 &&
          now - worker->dead_since > options_.dead_worker_retention) {
        const std::string name = worker->info.name();
        it = workers_.erase(it);
        bool named_again = false;
        for (const auto& [id, other] : workers_) named_again |= other->info.name() == name;
        if (!named_again) metrics_->RemoveWorker(name);
        UpdateGaugesLocked();
      } else {
        ++it;
      }
    }
  }
  Flush(tickets).IgnoreError();  // A failed write is sticky in store_error_ and shows in Health().
}

void Coordinator::RetryStalledWrites() {
  std::vector<std::pair<Ticket, std::string>> stalled;  // with the job's id, for the log
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kNew || phase_ == Phase::kClosed) return;
    for (const std::shared_ptr<JobWriter>& writer : stalled_writers_) {
      stalled.push_back({{writer, writer->enqueued},
                         writer->pending.empty() ? "" : writer->pending.front().job.job_id()});
    }
  }
  for (const auto& [ticket, job_id] : stalled) {
    absl::Status s = FlushOne(ticket);
    absl::MutexLock lock(&mu_);
    if (s.ok() || !ticket.first->error.ok()) {
      stalled_writers_.erase(
          std::remove(stalled_writers_.begin(), stalled_writers_.end(), ticket.first),
          stalled_writers_.end());
      if (s.ok()) Log(absl::StrCat("job ", job_id, ": the writes that had failed are recorded"));
    } else {
      // Still failing: the others most likely would too, and each try can wait the store's busy
      // timeout; the next pass goes on.
      break;
    }
  }
}

void Coordinator::MonitorLoop() {
  const absl::Duration interval =
      std::clamp(options_.dead_after / 4, absl::Milliseconds(10), absl::Seconds(1));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!threads_stop_) monitor_cv_.WaitWithTimeout(&mu_, interval);
      if (threads_stop_) return;
    }
    MonitorPass();
  }
}

}  // namespace server
}  // namespace dattn
