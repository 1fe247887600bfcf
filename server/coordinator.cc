#include "server/coordinator.h"

#include <arpa/inet.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "api/limits.h"
#include "server/attention_kind.h"
#include "server/job_state.h"
#include "server/log.h"
#include "server/proto_time.h"

namespace dattn {
namespace server {
namespace {

using scheduler::FailureKind;

std::string TaskId(const std::string& job_id, int attempt, int rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

bool IsActiveRun(v1::JobState state) {
  return state == v1::JOB_STATE_PLACED || state == v1::JOB_STATE_RUNNING;
}

bool IsIpv4(const std::string& host) {
  in_addr addr{};
  return ::inet_pton(AF_INET, host.c_str(), &addr) == 1;
}

const char* const kShuttingDown =
    "the coordinator is shutting down; retry (with the same idempotency_key) once it is back";

// Finished jobs the monitor deletes per pass once their retention is over.
constexpr int kExpireBatch = 100;

// The job as a listing shows it: no tensor (a job stored before outputs moved out of the result
// carries one; ReadOutput still serves it).
void StripTensors(v1::Job* job) {
  if (job->result().has_attention()) job->mutable_result()->mutable_attention()->clear_output();
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Metrics* metrics)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      metrics_(metrics != nullptr ? metrics : (own_metrics_ = std::make_unique<Metrics>()).get()),
      book_(metrics_),
      workers_(metrics_),
      rings_(RingOptions{options_.rendezvous_host, options_.rendezvous_advertise,
                         options_.ring_formation_timeout, options_.ring_comm_timeout},
             metrics_),
      dispatcher_(DispatcherOptions{options_.starvation_bound, options_.feasibility_settle},
                  metrics_),
      rng_(std::random_device{}()) {
  // The kinds of work this coordinator runs: adding a kind is one line here.
  kinds_.Add(std::make_unique<AttentionKind>(metrics_));
}

Coordinator::~Coordinator() { Close().IgnoreError(); }

// -------------------------------------------------------------------------------------------------
// Lifecycle.

absl::Status Coordinator::Start() {
  const CoordinatorOptions& o = options_;
  if (o.data_dir.empty()) return absl::InvalidArgumentError("data_dir: required");
  const std::pair<const char*, absl::Duration> positive[] = {
      {"dead_after", o.dead_after},
      {"heartbeat_interval", o.heartbeat_interval},
      {"ring_formation_timeout", o.ring_formation_timeout},
      {"ring_comm_timeout", o.ring_comm_timeout},
      {"store_probe_interval", o.store_probe_interval},
      {"retention", o.retention}};
  for (const auto& [name, value] : positive) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be > 0, got ", absl::FormatDuration(value)));
    }
  }
  if (o.feasibility_settle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("feasibility_settle: must be >= 0, got ",
                                                   absl::FormatDuration(o.feasibility_settle)));
  }
  if (o.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be >= 1, got ", o.max_attempts));
  }
  if (o.max_watch_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_watch_streams: must be >= 1, got ", o.max_watch_streams));
  }
  if (!IsIpv4(o.rendezvous_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous_host: must be a numeric IPv4 address, got \"", o.rendezvous_host, "\""));
  }
  if (!o.rendezvous_advertise.empty() && !IsIpv4(o.rendezvous_advertise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous_advertise: must be a numeric IPv4 address, got \"",
                     o.rendezvous_advertise, "\""));
  }
  if (o.rendezvous_advertise.empty() && o.rendezvous_host == "0.0.0.0") {
    return absl::InvalidArgumentError(
        "rendezvous_advertise: required when the rendezvous stores listen on 0.0.0.0 (workers "
        "need an address they can dial)");
  }
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kNew || store_ != nullptr) {
      return absl::FailedPreconditionError("Coordinator::Start called twice");
    }
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(o.data_dir + "/jobs.db", o.store);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  absl::StatusOr<std::unique_ptr<ResultStore>> outputs = ResultStore::Open(o.data_dir + "/outputs");
  if (!outputs.ok()) return outputs.status();
  outputs_ = *std::move(outputs);

  absl::StatusOr<std::map<v1::JobState, int64_t>> counts = store_->CountByState();
  if (!counts.ok()) return counts.status();
  for (v1::JobState state :
       {v1::JOB_STATE_QUEUED, v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
        v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    auto it = counts->find(state);
    metrics_->SetJobCount("attention", state, it == counts->end() ? 0 : it->second);
  }
  if (absl::Status s = Recover(); !s.ok()) return s;
  CollectOutputs();

  {
    absl::MutexLock lock(&mu_);
    phase_ = Phase::kServing;
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
        free_requeues += e.kind() == "coordinator_restarted" || e.kind() == "coordinator_stopped" ||
                         e.kind() == "refused";
      }
    }
    absl::MutexLock lock(&mu_);
    absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(stored.job.spec(), kinds_);
    if (!spec.ok()) {
      // Only a newer binary's stricter rules (or a kind it no longer runs) get here; the job
      // cannot run, so say why. It is recorded under the first kind for its metrics.
      AnalyzedSpec any;
      any.kind = kinds_.Named("attention");
      JobRun* run = book_.Add(stored, any.kind, nullptr);
      tickets.push_back(
          TransitionLocked(run, v1::JOB_STATE_FAILED, "failed",
                           absl::StrCat("the stored spec is not valid for this coordinator: ",
                                        spec.status().message())));
      continue;
    }
    JobRun* run = book_.Add(stored, spec->kind, spec->analysis);
    run->queued_since = Now();
    run->placed_before = placed_before;
    run->free_requeues = free_requeues;
    if (state == v1::JOB_STATE_QUEUED) {
      EnqueueLocked(run);
      continue;
    }
    const std::string where = absl::StrCat("attempt ", run->job.attempt(), " on ",
                                           absl::StrJoin(run->job.worker_ids(), ", "));
    if (cancel_requested) {
      tickets.push_back(TransitionLocked(
          run, v1::JOB_STATE_CANCELLED, "cancelled",
          absl::StrCat(
              "cancelled: the coordinator restarted while a requested cancel was pending (", where,
              ")")));
      continue;
    }
    metrics_->CountRecovery("coordinator_restarted");
    ++run->free_requeues;
    RequeueLocked(run, "coordinator_restarted",
                  absl::StrCat("the coordinator restarted while the job was ", StateName(state),
                               " (", where, "); requeued as attempt ", run->job.attempt() + 1),
                  &tickets);
  }
  return Flush(tickets);
}

void Coordinator::CollectOutputs() {
  // An attempt's shards outlive the attempt only as a succeeded job's output.
  for (const std::string& job_id : outputs_->Jobs()) {
    absl::StatusOr<StoredJob> stored = store_->GetJob(job_id);
    if (!stored.ok()) {
      if (absl::IsNotFound(stored.status())) outputs_->Discard(job_id, -1);
      continue;
    }
    const bool kept = stored->job.state() == v1::JOB_STATE_SUCCEEDED &&
                      stored->job.result().attention().has_output_info();
    outputs_->Discard(job_id, kept ? stored->job.attempt() : -1);
  }
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
  const absl::Time deadline = Now() + timeout;
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    while (book_.AnyActiveRun() && !clock_->WaitUntil(&drain_cv_, &mu_, deadline)) {
    }
    for (JobRun* run : book_.Runs()) {
      if (run->terminal || !IsActiveRun(run->job.state())) continue;
      metrics_->CountRecovery("drain_timeout");
      const std::string why = absl::StrCat("the coordinator shut down before the job finished (",
                                           "drain timeout ", Seconds(timeout), ")");
      ReleaseTasksLocked(run, /*cancel_tasks=*/true, why);
      if (run->cancel_requested) {
        tickets.push_back(TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                           absl::StrCat("cancelled: ", run->cancel_reason)));
      } else {
        ++run->free_requeues;
        RequeueLocked(run, "coordinator_stopped",
                      absl::StrCat(why, "; requeued as attempt ", run->job.attempt() + 1),
                      &tickets);
      }
    }
  }
  absl::Status status = Flush(tickets);
  // Give connected streams a moment to deliver the cancels just queued.
  absl::MutexLock lock(&mu_);
  const absl::Time cancel_deadline = Now() + absl::Seconds(1);
  while (workers_.AnyUndelivered() && !streams_closed_ &&
         !clock_->WaitUntil(&drain_cv_, &mu_, cancel_deadline)) {
  }
  return status;
}

void Coordinator::CloseStreams() {
  absl::MutexLock lock(&mu_);
  streams_closed_ = true;
  workers_.WakeAll();
  book_.WakeWatchers();
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
    workers_.WakeAll();
    book_.WakeWatchers();
  }
  if (scheduler_thread_.joinable()) scheduler_thread_.join();
  if (monitor_thread_.joinable()) monitor_thread_.join();
  {
    // Rings still placed lose their rendezvous: ranks still forming fail at once.
    absl::MutexLock lock(&mu_);
    for (JobRun* run : book_.Runs()) rings_.End(run->job.job_id(), "");
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
    return absl::UnavailableError(
        absl::StrCat("the job store cannot be written now (nothing was changed; retry once it "
                     "recovers): ",
                     store_error_.message()));
  }
  return absl::OkStatus();
}

std::string Coordinator::NewId(const char* prefix) {
  return absl::StrCat(prefix, absl::Hex(rng_(), absl::kZeroPad16));
}

void Coordinator::KickSchedulerLocked() {
  schedule_kicked_ = true;
  schedule_cv_.Signal();
}

std::string Coordinator::DescribeRanksLocked(const JobRun& run) const {
  std::vector<std::string> ranks;
  for (int r = 0; r < run.job.worker_ids_size(); ++r) {
    ranks.push_back(absl::StrCat("rank ", r, " on ", workers_.Describe(run.job.worker_ids(r))));
  }
  return absl::StrJoin(ranks, ", ");
}

v1::Job Coordinator::PublicLocked(const JobRun& run) const {
  v1::Job out = book_.Public(run);
  if (out.state() == v1::JOB_STATE_QUEUED && run.job.state() == v1::JOB_STATE_QUEUED) {
    std::optional<size_t> position = dispatcher_.Position(out.job_id());
    if (position.has_value()) out.set_queue_position(static_cast<int64_t>(*position));
  }
  StripTensors(&out);
  return out;
}

v1::WorkerCommand Coordinator::AssignmentLocked(const JobRun& run, const TaskEntry& task) const {
  v1::WorkerCommand command;
  v1::TaskAssignment* assign = command.mutable_assign();
  assign->set_task_id(task.task_id);
  assign->set_job_id(task.job_id);
  assign->set_attempt(task.attempt);
  assign->set_rank(task.rank);
  *assign->mutable_spec() = run.job.spec();
  run.kind->PlanRank(*run.analysis, run.device, task.rank, assign);
  if (run.analysis->num_ranks > 1 && rings_.Find(run.job.job_id()) != nullptr) {
    *assign->mutable_ring() = rings_.Info(run.job.job_id(), task.rank);
  }
  return command;
}

// -------------------------------------------------------------------------------------------------
// Durable writes.

Ticket Coordinator::TransitionLocked(JobRun* run, v1::JobState state, const std::string& kind,
                                     const std::string& message) {
  const v1::JobState from = run->job.state();
  Ticket ticket = book_.Transition(run, state, kind, message, Now());
  if (ticket.queue == nullptr) return ticket;
  if (IsTerminal(state)) {
    rings_.End(run->job.job_id(), "");
    KickSchedulerLocked();  // The scheduling loop destroys the retired store.
  }
  if (IsActiveRun(from) && !IsActiveRun(state)) drain_cv_.SignalAll();
  return ticket;
}

Ticket Coordinator::AppendLocked(JobRun* run, v1::JobEvent event) {
  return book_.Append(run, std::move(event), Now());
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
  if (ticket.queue == nullptr) return absl::OkStatus();
  absl::MutexLock flush_lock(&ticket.queue->flush_mu);
  for (;;) {
    PendingWrite write;
    {
      absl::MutexLock lock(&mu_);
      absl::Status done;
      if (!book_.NextWrite(ticket, &write, &done)) return done;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<int64_t> seq = store_->Update(write.job, write.event);
    metrics_->ObserveStoreCommit(absl::ToDoubleSeconds(absl::Now() - start));
    if (seq.ok() && IsTerminal(write.job.state())) {
      // The job's end is durable: of its stored shards only a succeeded job's output stays (the
      // shards of attempts that were requeued go with the rest).
      const bool kept = write.job.state() == v1::JOB_STATE_SUCCEEDED &&
                        write.job.result().attention().has_output_info();
      outputs_->Discard(write.job.job_id(), kept ? write.job.attempt() : -1);
    }
    absl::MutexLock lock(&mu_);
    if (!seq.ok()) {
      // Unready while the store itself says it cannot be written (a lock held by another process
      // past the busy timeout is UNAVAILABLE too, and leaves the store healthy).
      if (absl::IsUnavailable(seq.status()) && store_error_.ok() && !store_->Health().ok()) {
        store_error_ = seq.status();
      }
      return book_.WriteFailed(ticket, std::move(write), seq.status());
    }
    book_.WriteCommitted(ticket, std::move(write), *seq);
  }
}

void Coordinator::RetryStalledWrites() {
  std::vector<std::pair<Ticket, std::string>> stalled;  // with the job's id, for the log
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kNew || phase_ == Phase::kClosed) return;
    for (const Ticket& ticket : book_.Stalled()) {
      stalled.push_back({ticket, book_.FirstPendingJob(ticket)});
    }
  }
  for (const auto& [ticket, job_id] : stalled) {
    absl::Status s = FlushOne(ticket);
    absl::MutexLock lock(&mu_);
    if (s.ok() || !absl::IsUnavailable(s)) {
      book_.Unstall(ticket);
      if (s.ok()) Log(absl::StrCat("job ", job_id, ": the writes that had failed are recorded"));
    } else {
      // Still failing: the others most likely would too, and each try can wait the store's busy
      // timeout; the next pass goes on.
      break;
    }
  }
}

// -------------------------------------------------------------------------------------------------
// Jobs in memory and the queue.

void Coordinator::AdoptLocked(const StoredJob& stored, const AnalyzedSpec& spec, bool checked) {
  if (book_.Find(stored.job.job_id()) != nullptr) return;
  if (stored.job.state() != v1::JOB_STATE_QUEUED) {
    Log(absl::StrCat("internal error: job ", stored.job.job_id(), " is ",
                     StateName(stored.job.state()), " in the store but unknown in memory"));
    return;
  }
  JobRun* run = book_.Add(stored, spec.kind, spec.analysis);
  run->checked = checked;
  run->queued_since = FromTimestamp(stored.job.create_time());
  EnqueueLocked(run);
}

void Coordinator::EnqueueLocked(JobRun* run) {
  dispatcher_.Enqueue(run, workers_.View(/*for_placement=*/false), workers_.ReadyCount());
  KickSchedulerLocked();
}

void Coordinator::DropTaskLocked(JobRun* run, const std::string& task_id) {
  run->task_ids.erase(std::remove(run->task_ids.begin(), run->task_ids.end(), task_id),
                      run->task_ids.end());
  workers_.EraseTask(task_id, /*cancel=*/false, "");
  KickSchedulerLocked();
}

void Coordinator::ReleaseTasksLocked(JobRun* run, bool cancel_tasks, const std::string& reason) {
  for (const std::string& task_id : run->task_ids)
    workers_.EraseTask(task_id, cancel_tasks, reason);
  run->task_ids.clear();
  run->results.reset();
  rings_.End(run->job.job_id(), "");
  KickSchedulerLocked();
}

void Coordinator::RequeueLocked(JobRun* run, const std::string& kind, const std::string& message,
                                Tickets* tickets) {
  run->job.set_attempt(run->job.attempt() + 1);
  run->job.mutable_progress()->set_steps_done(0);
  tickets->push_back(TransitionLocked(run, v1::JOB_STATE_QUEUED, kind, message));
  run->queued_since = Now();
  EnqueueLocked(run);
}

void Coordinator::RequeueRefusedLocked(JobRun* run, const std::string& why, Tickets* tickets) {
  metrics_->CountRecovery("rank_refused");
  ReleaseTasksLocked(run, /*cancel_tasks=*/true, why);
  if (++run->refusals > kMaxRefusals) {
    tickets->push_back(
        TransitionLocked(run, v1::JOB_STATE_FAILED, "failed",
                         absl::StrCat(why, "; the job's ranks were refused ", run->refusals,
                                      " times in a row (at most ", kMaxRefusals, ")")));
    return;
  }
  ++run->free_requeues;
  RequeueLocked(run, "refused",
                absl::StrCat(why, "; requeued as attempt ", run->job.attempt() + 1,
                             " (a refusal is not a failed attempt)"),
                tickets);
}

void Coordinator::RecoverJobLocked(JobRun* run, FailureKind failure, const std::string& why,
                                   const std::string& cause, int64_t oom_free_bytes,
                                   Tickets* tickets) {
  metrics_->CountRecovery(cause);
  // A ring that had not formed yet failed to: counted as such unless the caller already did.
  rings_.End(run->job.job_id(), run->cancel_requested ? "" : "failed");
  ReleaseTasksLocked(run, /*cancel_tasks=*/true, why);
  if (run->cancel_requested) {
    tickets->push_back(
        TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                         absl::StrCat("cancelled: ", run->cancel_reason, " (then ", why, ")")));
    return;
  }
  scheduler::RecoveryInput input;
  run->kind->DescribeRecovery(*run->analysis, run->device, &input);
  input.failure = failure;
  // Runs that ended because the coordinator restarted or stopped were not the job's failures.
  input.attempts = std::max(1, run->job.attempt() - run->free_requeues);
  input.max_attempts = options_.max_attempts;
  input.oom_free_memory_bytes = oom_free_bytes;
  absl::StatusOr<scheduler::RecoveryAction> action = scheduler::DecideRecovery(input);
  if (!action.ok()) {
    tickets->push_back(
        TransitionLocked(run, v1::JOB_STATE_FAILED, "failed",
                         absl::StrCat(why, "; no recovery possible: ", action.status().message())));
    return;
  }
  if (action->kind == scheduler::RecoveryKind::kFail) {
    tickets->push_back(TransitionLocked(run, v1::JOB_STATE_FAILED, "failed",
                                        absl::StrCat(why, "; ", action->reason)));
    return;
  }
  // The kinds that allow no in-place recovery get a requeue as the only other answer; a kind that
  // allows one gets the scheduler's action applied here once such a kind exists.
  RequeueLocked(run, "requeued", absl::StrCat(why, "; ", action->reason), tickets);
}

void Coordinator::KillWorkerLocked(WorkerEntry* worker, const std::string& why,
                                   const std::string& cause, Tickets* tickets) {
  const std::string message =
      absl::StrCat("worker ", worker->info.worker_id(), " (", worker->info.name(), ") lost: ", why);
  std::set<std::string> job_ids;
  for (const std::string& task_id : workers_.MarkDead(worker, Now())) {
    if (const TaskEntry* task = workers_.FindTask(task_id); task != nullptr) {
      job_ids.insert(task->job_id);
    }
  }
  for (const std::string& job_id : job_ids) {
    JobRun* run = book_.Find(job_id);
    if (run == nullptr || run->terminal) continue;
    tickets->push_back(TransitionLocked(run, run->job.state(), "worker_lost", message));
    RecoverJobLocked(run, FailureKind::kWorkerDead, message, cause, 0, tickets);
  }
  KickSchedulerLocked();
}

// -------------------------------------------------------------------------------------------------
// JobService.

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitJob(const v1::SubmitJobRequest& request) {
  absl::StatusOr<AnalyzedSpec> spec = ValidateSubmitJobRequest(request, kinds_);
  if (!spec.ok()) return spec.status();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/true); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
  }
  // A retry of an accepted job is answered whatever the cluster looks like now.
  absl::StatusOr<StoredJob> existing = store_->GetJobByKey(request.idempotency_key());
  if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();

  v1::Job job;
  bool checked = false;  // Found feasible against ready workers (not merely accepted for later).
  {
    absl::MutexLock lock(&mu_);
    if (!existing.ok()) {
      const int64_t ready = workers_.ReadyCount();
      absl::Status feasible =
          dispatcher_.CheckFeasible(*spec->analysis, workers_.View(/*for_placement=*/false), ready);
      if (!feasible.ok()) return feasible;
      checked = ready > 0;
    }
    job.set_job_id(NewId("j-"));
  }
  const absl::Time now = Now();
  job.set_idempotency_key(request.idempotency_key());
  *job.mutable_spec() = request.spec();
  job.set_state(v1::JOB_STATE_QUEUED);
  *job.mutable_create_time() = ToTimestamp(now);
  job.mutable_progress()->set_steps_total(spec->analysis->steps_total);
  v1::JobEvent event;
  event.set_kind("submitted");
  event.set_message(absl::StrCat("queued: ", spec->analysis->summary));
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
  if (outcome->created) metrics_->JobSubmitted(spec->kind->name());
  const std::string& id = outcome->job.job_id();
  // Only the call that created the job adopts it. A retry that found the stored row may race with
  // that job ending (cancel, feasibility failure) and would bring back a stale QUEUED copy.
  if (outcome->created && book_.Find(id) == nullptr &&
      outcome->job.state() == v1::JOB_STATE_QUEUED) {
    AdoptLocked(StoredJob{outcome->job, outcome->submit_seq}, *spec, checked);
  }
  const JobRun* run = book_.Find(id);
  if (run != nullptr) {
    *response.mutable_job() = PublicLocked(*run);
  } else {
    *response.mutable_job() = outcome->job;
    StripTensors(response.mutable_job());
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const v1::GetJobRequest& request) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.max_events() < 0 || request.max_events() > api::kMaxEvents) {
    return absl::InvalidArgumentError(absl::StrCat("max_events: must be 0 (the default, ",
                                                   api::kDefaultMaxEvents, ") to ", api::kMaxEvents,
                                                   ", got ", request.max_events()));
  }
  v1::Job job;
  bool found = false;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (const JobRun* run = book_.Find(request.job_id()); run != nullptr) {
      job = PublicLocked(*run);
      found = true;
    }
  }
  if (!found) {
    absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
    if (!stored.ok()) return stored.status();
    job = std::move(stored->job);
    StripTensors(&job);
    if (IsTerminal(job.state()) && job.has_end_time() &&
        options_.retention != absl::InfiniteDuration()) {
      *job.mutable_expire_time() = ToTimestamp(FromTimestamp(job.end_time()) + options_.retention);
    }
  }
  if (request.include_events()) {
    const int limit = request.max_events() == 0 ? api::kDefaultMaxEvents : request.max_events();
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
  if (absl::Status s = ValidateListJobsRequest(request, kinds_); !s.ok()) return s;
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
    const JobRun* run = book_.Find(stored.job.job_id());
    v1::Job* out = response.add_jobs();
    *out = run != nullptr ? PublicLocked(*run) : std::move(stored.job);
    StripTensors(out);
    if (run == nullptr && IsTerminal(out->state()) && out->has_end_time() &&
        options_.retention != absl::InfiniteDuration()) {
      *out->mutable_expire_time() =
          ToTimestamp(FromTimestamp(out->end_time()) + options_.retention);
    }
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
  auto terminal_answer = [&](v1::Job job) -> absl::StatusOr<v1::Job> {
    StripTensors(&job);
    if (job.state() == v1::JOB_STATE_CANCELLED) return job;
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.job_id(), " already ", StateName(job.state()),
                     "; only queued, placed or running jobs can be cancelled"));
  };
  Tickets tickets;
  v1::Job answer;
  {
    absl::MutexLock lock(&mu_);
    JobRun* run = book_.Find(request.job_id());
    if (run == nullptr) {
      mu_.Unlock();
      absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
      mu_.Lock();
      if (!stored.ok()) return stored.status();
      if (IsTerminal(stored->job.state())) return terminal_answer(stored->job);
      run = book_.Find(request.job_id());
      if (run == nullptr) {
        // Stored but not yet in memory: its SubmitJob is between the store and the queue.
        absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(stored->job.spec(), kinds_);
        if (!spec.ok()) return spec.status();
        AdoptLocked(*stored, *spec, /*checked=*/false);
        run = book_.Find(request.job_id());
        if (run == nullptr) {
          return absl::UnavailableError(
              absl::StrCat("job ", request.job_id(), " is changing state; retry"));
        }
      }
    }
    // Ended in memory, its last write in flight: answer from what it has become.
    if (run->terminal) return terminal_answer(run->job);
    switch (run->job.state()) {
      case v1::JOB_STATE_QUEUED:
        dispatcher_.Remove(run->job.job_id());
        tickets.push_back(TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                           absl::StrCat("cancelled: ", reason)));
        break;
      case v1::JOB_STATE_PLACED:
      case v1::JOB_STATE_RUNNING: {
        if (run->cancel_requested) break;
        run->cancel_requested = true;
        run->cancel_reason = reason;
        // Tasks not yet handed to a worker end here; the others when their workers confirm.
        std::vector<std::string> keep;
        for (const std::string& task_id : run->task_ids) {
          TaskEntry* task = workers_.FindTask(task_id);
          if (task != nullptr && task->dispatched) {
            keep.push_back(task_id);
            if (WorkerEntry* worker = workers_.Find(task->worker_id); worker != nullptr) {
              v1::WorkerCommand command;
              command.mutable_cancel()->set_task_id(task_id);
              command.mutable_cancel()->set_reason(absl::StrCat("job cancelled: ", reason));
              workers_.Push(worker, std::move(command));
            }
          } else {
            workers_.EraseTask(task_id, /*cancel=*/false, reason);
          }
        }
        run->task_ids = keep;
        if (keep.empty()) {
          ReleaseTasksLocked(run, false, reason);
          tickets.push_back(TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                             absl::StrCat("cancelled: ", reason)));
        } else {
          v1::JobEvent event;
          event.set_kind("cancel_requested");
          event.set_message(absl::StrCat("cancel requested (", reason, "); waiting for ",
                                         keep.size(), keep.size() == 1 ? " rank" : " ranks",
                                         " to stop"));
          tickets.push_back(AppendLocked(run, std::move(event)));
        }
        break;
      }
      default:
        return absl::InternalError(absl::StrCat("job ", run->job.job_id(), " in unexpected state ",
                                                StateName(run->job.state())));
    }
    // Durable once the flush below succeeds; the public view would still show the state before.
    answer = run->job;
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
    // Each open watch holds a server thread for its life: their number is bounded.
    if (static_cast<int>(book_.watchers()) >= options_.max_watch_streams) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the coordinator serves at most ", options_.max_watch_streams,
                       " WatchJob streams at once (--max-watch-streams); retry later or poll "
                       "GetJob"));
    }
    book_.Subscribe(request.job_id(), &watcher);
  }
  struct Unsubscribe {
    Coordinator* self;
    const std::string& id;
    Watcher* watcher;
    ~Unsubscribe() {
      absl::MutexLock lock(&self->mu_);
      self->book_.Unsubscribe(id, watcher);
    }
  } unsubscribe{this, request.job_id(), &watcher};

  absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
  if (!stored.ok()) return stored.status();
  // The history a page at a time: a long job's history (a progress event a second for days) is
  // never in memory at once.
  int64_t last = request.after_seq();
  for (;;) {
    absl::StatusOr<std::vector<v1::JobEvent>> page =
        store_->Events(request.job_id(), last, kWatchHistoryPage);
    if (!page.ok()) return page.status();
    for (const v1::JobEvent& event : *page) {
      if (!emit(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (IsTerminal(event.state())) return absl::OkStatus();
    }
    if (static_cast<int>(page->size()) < kWatchHistoryPage) break;
    if (cancelled && cancelled()) return absl::CancelledError("the watcher cancelled");
  }
  if (IsTerminal(stored->job.state())) return absl::OkStatus();  // Its end is before after_seq.

  for (;;) {
    std::deque<v1::JobEvent> events;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        events = book_.TakeEvents(&watcher);
        if (!events.empty()) break;
        if (streams_closed_) return absl::UnavailableError(kShuttingDown);
        if (cancelled && cancelled()) return absl::CancelledError("the watcher cancelled");
        watcher.cv.WaitWithTimeout(&mu_, options_.stream_poll_interval);
      }
    }
    for (const v1::JobEvent& event : events) {
      if (event.seq() <= last) continue;
      if (!emit(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (IsTerminal(event.state())) return absl::OkStatus();
    }
  }
}

absl::Status Coordinator::ReadOutput(const v1::ReadOutputRequest& request,
                                     const TensorChunkSink& emit) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
  if (!stored.ok()) return stored.status();
  const v1::Job& job = stored->job;
  if (job.state() != v1::JOB_STATE_SUCCEEDED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.job_id(), " is ", StateName(job.state()),
                     "; only a succeeded job has an output to read"));
  }
  const v1::AttentionJobResult& result = job.result().attention();
  if (result.has_output()) {
    // Stored before outputs moved out of the job's record: the tensor is in the row itself.
    v1::TensorChunk head;
    head.mutable_header()->set_dtype(result.output().dtype());
    *head.mutable_header()->mutable_shape() = result.output().shape();
    head.mutable_header()->set_total_bytes(static_cast<int64_t>(result.output().data().size()));
    if (!emit(head)) return absl::CancelledError("the reader went away");
    const std::string& data = result.output().data();
    for (size_t offset = 0; offset < data.size(); offset += api::kMaxOutputChunkBytes) {
      v1::TensorChunk chunk;
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(data.substr(offset, api::kMaxOutputChunkBytes));
      if (!emit(chunk)) return absl::CancelledError("the reader went away");
    }
    return absl::OkStatus();
  }
  if (!result.has_output_info()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job.job_id(), " kept no output (it was submitted without return_output)"));
  }
  absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(job.spec(), kinds_);
  if (!spec.ok()) return spec.status();
  return outputs_->Read(job.job_id(), job.attempt(), spec->kind->Output(*spec->analysis),
                        api::kMaxOutputChunkBytes, emit);
}

absl::StatusOr<v1::DeleteJobResponse> Coordinator::DeleteJob(const v1::DeleteJobRequest& request) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
    const JobRun* run = book_.Find(request.job_id());
    if (run != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", request.job_id(), " is ", StateName(run->job.state()),
                       "; only finished jobs can be deleted (cancel it first)"));
    }
  }
  absl::StatusOr<v1::Job> deleted = store_->Delete(request.job_id());
  if (!deleted.ok()) return deleted.status();
  v1::DeleteJobResponse response;
  response.set_output_bytes_freed(outputs_->Discard(request.job_id(), -1));
  metrics_->JobDeleted(JobKind(deleted->spec()), deleted->state());
  return response;
}

// -------------------------------------------------------------------------------------------------
// WorkerRegistry.

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (absl::Status s = WorkerRegistry::ValidateRegistration(request); !s.ok()) return s;
  Tickets tickets;
  v1::RegisterWorkerResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
    const std::string id = NewId("w-");
    for (WorkerEntry* other : workers_.LiveNamed(request.name())) {
      KillWorkerLocked(other,
                       absl::StrCat("the worker registered again as ", id, " (it restarted)"),
                       "worker_reregistered", &tickets);
    }
    workers_.Add(request, id, Now());
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
  WorkerEntry* worker = workers_.Find(request.worker_id());
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
  const absl::Time now = Now();
  for (TaskEntry* task : workers_.Heartbeat(worker, request, now, options_.heartbeat_interval)) {
    const JobRun* run = book_.Find(task->job_id);
    if (run == nullptr || run->terminal) continue;
    workers_.Dispatch(task, AssignmentLocked(*run, *task), now);
  }
  response.set_drain(worker->state == scheduler::WorkerState::kDraining);
  if (!dispatcher_.empty()) KickSchedulerLocked();
  return response;
}

absl::Status Coordinator::StreamAssignments(const v1::StreamAssignmentsRequest& request,
                                            const WorkerCommandSink& send,
                                            const CancelledFn& cancelled) {
  const std::string& id = request.worker_id();
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  if (streams_closed_) return absl::UnavailableError(kShuttingDown);
  WorkerEntry* worker = workers_.Find(id);
  if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) {
    return absl::NotFoundError(absl::StrCat("unknown worker id \"", id, "\"; register again"));
  }
  const uint64_t generation = workers_.OpenStream(worker);
  KickSchedulerLocked();  // It may take work again.
  struct StreamCount {
    Coordinator* self;
    WorkerEntry* worker;
    ~StreamCount() ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { self->workers_.CloseStream(worker); }
  } count{this, worker};  // Entries are forgotten only when dead and stream-less.
  for (;;) {
    StreamStep step = workers_.NextStep(worker, generation, streams_closed_);
    if (step.kind == StreamStep::Kind::kEnd) return step.end;
    if (step.kind == StreamStep::Kind::kWait) {
      if (cancelled && cancelled()) {
        // The worker went away (its process died, or its connection): until it opens a stream
        // again it can receive nothing, so it gets no new ranks.
        workers_.MarkStreamLost(worker, generation);
        return absl::CancelledError("the worker went away");
      }
      worker->cv->WaitWithTimeout(&mu_, options_.stream_poll_interval);
      continue;
    }
    mu_.Unlock();
    const bool sent = send(step.command);
    mu_.Lock();
    drain_cv_.SignalAll();
    if (!sent) {
      // The next stream of this worker delivers it.
      workers_.Requeue(worker, std::move(step.command));
      workers_.MarkStreamLost(worker, generation);
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
  if (request.state() == v1::TASK_STATE_FAILED && request.ring_formation_seconds() <= 0 &&
      !request.refused()) {
    std::string address, ring_id;
    int size = 0;
    {
      absl::MutexLock lock(&mu_);
      const TaskEntry* task = workers_.FindTask(request.task_id());
      const Ring* ring = task != nullptr ? rings_.Find(task->job_id) : nullptr;
      const JobRun* run = task != nullptr ? book_.Find(task->job_id) : nullptr;
      if (ring != nullptr && run != nullptr && run->job.attempt() == task->attempt &&
          !ring->is_formed()) {
        address = ring->address;
        ring_id = ring->id;
        size = ring->size;
      }
    }
    if (!address.empty()) missing_ranks = RingRendezvous::ProbeMissingRanks(address, ring_id, size);
  }
  v1::ReportTaskResponse response;
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
    TaskEntry* task = workers_.FindTask(request.task_id());
    WorkerEntry* worker = workers_.Find(request.worker_id());
    // Stale: unknown task, one that moved to another registration, or an older attempt's (those are
    // forgotten when their attempt ends, so they are unknown here too).
    if (task == nullptr || task->worker_id != request.worker_id() || worker == nullptr ||
        worker->state == scheduler::WorkerState::kDead) {
      response.set_stop(true);
      return response;
    }
    JobRun* run = book_.Find(task->job_id);
    if (run == nullptr || run->terminal || run->job.attempt() != task->attempt) {
      response.set_stop(true);
      return response;
    }
    // Every report of a formed ring rank says so; the ring is formed when every rank has.
    if (request.ring_formation_seconds() > 0) {
      task->formation_seconds = request.ring_formation_seconds();
      rings_.MarkFormed(run->job.job_id(), task->rank, task->formation_seconds);
    }
    ReportContext c{&request,
                    task,
                    run,
                    worker,
                    absl::StrCat("rank ", task->rank, " on ", workers_.Describe(task->worker_id)),
                    std::move(missing_ranks),
                    &tickets};
    switch (request.state()) {
      case v1::TASK_STATE_STARTED:
        OnStartedLocked(c);
        break;
      case v1::TASK_STATE_PROGRESS:
        OnProgressLocked(c);
        break;
      case v1::TASK_STATE_SUCCEEDED:
        OnSucceededLocked(c);
        break;
      case v1::TASK_STATE_FAILED:
        OnFailedLocked(c);
        break;
      case v1::TASK_STATE_CANCELLED:
        OnCancelledLocked(c);
        break;
      default:
        break;
    }
  }
  if (absl::Status s = Flush(tickets); !s.ok()) return s;
  return response;
}

// -------------------------------------------------------------------------------------------------
// ReportTask's handlers, one per report state. Each runs with the task current (its attempt is
// the job's, on the registration that holds it).

void Coordinator::OnStartedLocked(ReportContext& c) {
  c.task->started = true;
  c.run->refusals = 0;
  if (c.run->job.state() != v1::JOB_STATE_PLACED) return;
  if (!c.run->job.has_start_time()) *c.run->job.mutable_start_time() = ToTimestamp(Now());
  c.tickets->push_back(
      TransitionLocked(c.run, v1::JOB_STATE_RUNNING, "started",
                       absl::StrCat(c.where, " started (attempt ", c.run->job.attempt(), ")")));
  // A cancel in progress is not a "stop": the worker got a CancelTask and must still send its
  // final CANCELLED report, which is what ends the job (stop would silence that report).
}

void Coordinator::OnProgressLocked(ReportContext& c) {
  OnStartedLocked(c);
  JobRun* run = c.run;
  c.task->steps_done = std::max(c.task->steps_done, c.report->progress().steps_done());
  int64_t done = c.task->steps_done;
  for (const std::string& other : run->task_ids) {
    if (const TaskEntry* task = workers_.FindTask(other); task != nullptr) {
      done = std::min(done, task->steps_done);
    }
  }
  v1::JobProgress* progress = run->job.mutable_progress();
  progress->set_steps_done(std::min(done, run->analysis->steps_total));
  progress->set_steps_total(run->analysis->steps_total);
  const absl::Time now = Now();
  if (now - run->last_progress_write < options_.progress_persist_interval) return;
  run->last_progress_write = now;
  v1::JobEvent event;
  event.set_kind("progress");
  event.set_message(
      absl::StrCat(progress->steps_done(), " of ", progress->steps_total(), " steps"));
  *event.mutable_progress() = *progress;
  c.tickets->push_back(AppendLocked(run, std::move(event)));
}

void Coordinator::OnSucceededLocked(ReportContext& c) {
  OnStartedLocked(c);
  JobRun* run = c.run;
  if (run->analysis->keeps_output && !c.task->output_uploaded) {
    // The worker uploads a shard before it reports success; without it the job has no output.
    OnFailedLocked(c);
    return;
  }
  if (run->results == nullptr) run->results = run->kind->NewAttempt(*run->analysis, run->device);
  run->results->AddRank(c.task->rank, c.task->worker_id, c.worker->info.name(), *c.report);
  const std::string task_id = c.task->task_id;
  DropTaskLocked(run, task_id);  // c.task is gone from here on.
  if (!run->task_ids.empty()) return;
  // Every rank has ended. With a cancel in flight some of them may have ended CANCELLED (a ring's
  // ranks race the cancel): a job succeeds only with every rank's result; otherwise the cancel
  // wins and the partial results are dropped.
  const int finished = run->results->ranks_done();
  if (finished < run->analysis->num_ranks) {
    ReleaseTasksLocked(run, /*cancel_tasks=*/false, "");
    c.tickets->push_back(
        TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                         absl::StrCat("cancelled: ", run->cancel_reason, " (", finished, " of ",
                                      run->analysis->num_ranks, " ranks had finished)")));
    return;
  }
  std::optional<v1::TensorHeader> output;
  if (run->analysis->keeps_output) output = run->kind->Output(*run->analysis).header;
  std::string message =
      run->results->Finish(output ? &*output : nullptr, run->job.mutable_result());
  run->results.reset();
  rings_.End(run->job.job_id(), "");
  if (run->cancel_requested) absl::StrAppend(&message, " (it finished before the cancel)");
  run->job.mutable_progress()->set_steps_done(run->analysis->steps_total);
  c.tickets->push_back(TransitionLocked(run, v1::JOB_STATE_SUCCEEDED, "succeeded", message));
}

std::string Coordinator::RingFailedLocked(ReportContext& c, const std::string& why) {
  JobRun* run = c.run;
  const Ring* ring = rings_.Find(run->job.job_id());
  const v1::TaskReport& report = *c.report;
  if (report.ring_formation_seconds() > 0 || ring->is_formed()) {
    c.tickets->push_back(TransitionLocked(
        run, run->job.state(), "ring_failed",
        absl::StrCat(why, "; the ring ", ring->id, ": ", DescribeRanksLocked(*run))));
    return why;
  }
  // The ring never formed: name the ranks the store never saw, and where they were.
  std::vector<std::string> absent;
  for (int r : c.missing_ranks.value_or(std::vector<int>())) {
    if (r >= run->job.worker_ids_size()) continue;
    const TaskEntry* peer = workers_.FindTask(TaskId(run->job.job_id(), run->job.attempt(), r));
    const v1::RankPhase phase = peer != nullptr ? peer->phase : v1::RANK_PHASE_UNSPECIFIED;
    const char* seen = "not yet seen by its worker";
    switch (phase) {
      case v1::RANK_PHASE_PREPARING:
        seen = "preparing (allocating and generating inputs)";
        break;
      case v1::RANK_PHASE_FORMING_RING:
        seen = "waiting for its peers";
        break;
      case v1::RANK_PHASE_RUNNING:
        seen = "running";
        break;
      case v1::RANK_PHASE_FINISHED:
        seen = "finished";
        break;
      default:
        break;
    }
    absent.push_back(absl::StrCat("rank ", r, " on ", workers_.Describe(run->job.worker_ids(r)),
                                  " (", seen, ")"));
  }
  // A timeout is the missing ranks' doing; another failure (a refused rank, a store that cannot be
  // reached) is the reporting rank's, and the others simply had not come yet.
  const bool timed_out =
      report.error_code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded);
  std::string failure = why;
  std::string message = absl::StrCat("ring ", ring->id, " did not form: ");
  if (!absent.empty()) {
    const std::string list = absl::StrJoin(absent, ", ");
    if (timed_out) {
      absl::StrAppend(&message, list, " never arrived within ",
                      Seconds(options_.ring_formation_timeout), "; ");
      failure = absl::StrCat("ring formation failed: ", list, " never arrived");
    } else {
      absl::StrAppend(&message, list, " had not arrived yet; ");
    }
  }
  absl::StrAppend(&message, c.where, " reported: ", report.error());
  c.tickets->push_back(TransitionLocked(run, run->job.state(), "ring_formation_failed", message));
  rings_.End(run->job.job_id(), timed_out ? "timed_out" : "failed");
  return failure;
}

void Coordinator::OnFailedLocked(ReportContext& c) {
  JobRun* run = c.run;
  const v1::TaskReport& report = *c.report;
  const std::string task_id = c.task->task_id;
  if (report.refused() && !run->cancel_requested) {
    // The worker did not start the rank (no free slot, draining, stopping): nothing ran, so the
    // job did not fail. It goes back in the queue without spending an attempt, and the worker gets
    // no new rank until its next heartbeat says what it runs.
    c.worker->refused_since_heartbeat = true;
    DropTaskLocked(run, task_id);
    RequeueRefusedLocked(run,
                         absl::StrCat(c.where, " refused the rank before starting it: ",
                                      report.error().empty() ? "no reason given" : report.error()),
                         c.tickets);
    return;
  }
  std::string why;
  absl::StatusCode code = static_cast<absl::StatusCode>(report.error_code());
  if (report.state() == v1::TASK_STATE_SUCCEEDED) {
    // A success without the output shard the job keeps (OnSucceededLocked).
    code = absl::StatusCode::kUnavailable;
    why = absl::StrCat(c.where, " reported success without uploading its output shard");
  } else {
    why = absl::StrCat(c.where,
                       " failed: ", report.error().empty() ? "no error given" : report.error(),
                       " (code ", absl::StatusCodeToString(code), ")");
  }
  if (rings_.Find(run->job.job_id()) != nullptr && !run->cancel_requested) {
    why = RingFailedLocked(c, why);
  }
  const int64_t free_bytes = c.worker->info.free_memory_bytes();
  std::optional<FailureKind> failure;
  switch (code) {
    case absl::StatusCode::kResourceExhausted:
      failure = FailureKind::kOom;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      failure = FailureKind::kCommTimeout;
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      failure = FailureKind::kPeerLost;
      break;
    default:
      break;  // Retrying cannot help (a bad spec, an engine bug): the job fails at once.
  }
  // The reporting rank has stopped already: no CancelTask for it, only for its peers.
  DropTaskLocked(run, task_id);
  if (run->cancel_requested || !failure.has_value()) {
    ReleaseTasksLocked(run, /*cancel_tasks=*/true, why);
    if (run->cancel_requested) {
      c.tickets->push_back(
          TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                           absl::StrCat("cancelled: ", run->cancel_reason, " (", why, ")")));
    } else {
      c.tickets->push_back(TransitionLocked(
          run, v1::JOB_STATE_FAILED, "failed",
          absl::StrCat(why, "; not retried: the error does not depend on the worker")));
    }
    return;
  }
  RecoverJobLocked(run, *failure, why, "task_failed", free_bytes, c.tickets);
}

void Coordinator::OnCancelledLocked(ReportContext& c) {
  JobRun* run = c.run;
  const std::string task_id = c.task->task_id;
  DropTaskLocked(run, task_id);
  if (!run->cancel_requested) {
    RecoverJobLocked(run, FailureKind::kPeerLost,
                     absl::StrCat(c.where, " was cancelled by its worker"), "task_failed", 0,
                     c.tickets);
    return;
  }
  if (!run->task_ids.empty()) return;
  ReleaseTasksLocked(run, false, "");
  c.tickets->push_back(TransitionLocked(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                        absl::StrCat("cancelled: ", run->cancel_reason)));
}

absl::StatusOr<v1::UploadOutputResponse> Coordinator::UploadOutput(
    const v1::UploadOutputRequest& first, const UploadSource& next) {
  v1::UploadOutputResponse response;
  if (!first.chunk().has_header()) {
    return absl::InvalidArgumentError(
        "chunk.header: required in the first message (the shard's dtype, shape and size)");
  }
  std::string job_id;
  int attempt = 0, rank = 0;
  v1::TensorHeader expected;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    const TaskEntry* task = workers_.FindTask(first.task_id());
    const JobRun* run = task != nullptr ? book_.Find(task->job_id) : nullptr;
    if (task == nullptr || task->worker_id != first.worker_id() || run == nullptr ||
        run->terminal || run->job.attempt() != task->attempt) {
      response.set_stop(true);
      return response;
    }
    if (!run->analysis->keeps_output) {
      return absl::FailedPreconditionError(
          absl::StrCat("task ", first.task_id(), ": job ", run->job.job_id(),
                       " keeps no output (it was submitted without return_output)"));
    }
    expected = run->kind->ShardHeader(*run->analysis, task->rank);
    job_id = task->job_id;
    attempt = task->attempt;
    rank = task->rank;
  }
  const v1::TensorHeader& got = first.chunk().header();
  if (got.dtype() != expected.dtype() ||
      std::vector<int64_t>(got.shape().begin(), got.shape().end()) !=
          std::vector<int64_t>(expected.shape().begin(), expected.shape().end()) ||
      got.total_bytes() != expected.total_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", first.task_id(), ": the shard's header (", got.ShortDebugString(),
                     ") is not rank ", rank, "'s (", expected.ShortDebugString(), ")"));
  }
  // The shard goes to disk as it arrives, without the lock: a large output is never in memory.
  absl::StatusOr<std::unique_ptr<ResultStore::ShardWriter>> writer =
      outputs_->BeginShard(job_id, attempt, rank, expected.total_bytes());
  if (!writer.ok()) return writer.status();
  v1::UploadOutputRequest message = first;
  for (bool more = true; more; more = next(&message)) {
    const v1::TensorChunk& chunk = message.chunk();
    if (static_cast<int64_t>(chunk.data().size()) > api::kMaxOutputChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("chunk at offset ", chunk.offset(), " has ",
                                                     chunk.data().size(), " bytes, more than ",
                                                     api::kMaxOutputChunkBytes));
    }
    if (chunk.data().empty()) continue;
    if (absl::Status s = (*writer)->Append(chunk.offset(), chunk.data()); !s.ok()) return s;
  }
  if (absl::Status s = (*writer)->Finish(); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  TaskEntry* task = workers_.FindTask(first.task_id());
  const JobRun* run = task != nullptr ? book_.Find(task->job_id) : nullptr;
  if (task == nullptr || run == nullptr || run->terminal || run->job.attempt() != attempt) {
    response.set_stop(true);  // Ended meanwhile; its shard goes with the attempt.
    return response;
  }
  task->output_uploaded = true;
  return response;
}

// -------------------------------------------------------------------------------------------------
// AdminService.

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkers(
    const v1::ListWorkersRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  return workers_.List(request.include_dead());
}

absl::StatusOr<v1::Worker> Coordinator::DrainWorker(const v1::DrainWorkerRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  WorkerEntry* worker = workers_.FindByIdOrName(request.worker_id());
  if (worker == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no worker with id or name \"", request.worker_id(), "\""));
  }
  return workers_.SetDraining(worker, true);
}

absl::StatusOr<v1::Worker> Coordinator::UndrainWorker(const v1::UndrainWorkerRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: required");
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  WorkerEntry* worker = workers_.FindByIdOrName(request.worker_id());
  if (worker == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no worker with id or name \"", request.worker_id(), "\""));
  }
  absl::StatusOr<v1::Worker> out = workers_.SetDraining(worker, false);
  if (out.ok()) KickSchedulerLocked();
  return out;
}

// -------------------------------------------------------------------------------------------------
// Threads.

void Coordinator::ReapStores() {
  std::vector<std::unique_ptr<comm::TcpStoreServer>> stores;
  {
    absl::MutexLock lock(&mu_);
    stores = rings_.TakeRetired();
  }
  stores.clear();  // Closes their connections and joins their threads.
}

void Coordinator::SchedulePass() {
  ReapStores();
  Tickets tickets;
  std::vector<std::pair<std::string, Ticket>> placed;  // Each job with its "placed" write.
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kServing || !store_error_.ok()) return;
    const absl::Time now = Now();
    for (const Dispatcher::Verdict& v :
         dispatcher_.Check(now, workers_.ReadySet(), book_.Runs(), workers_.View(false))) {
      tickets.push_back(TransitionLocked(v.run, v1::JOB_STATE_FAILED, "failed", v.reason));
    }
    absl::StatusOr<std::vector<scheduler::Placement>> placements =
        dispatcher_.Schedule(workers_.View(/*for_placement=*/true), now);
    if (!placements.ok()) {
      Log(absl::StrCat("internal error: scheduling pass failed: ", placements.status().message()));
      placements = std::vector<scheduler::Placement>();
    }
    for (const scheduler::Placement& placement : *placements) {
      JobRun* run = book_.Find(placement.job_id);
      if (run == nullptr || run->terminal || run->job.state() != v1::JOB_STATE_QUEUED) continue;
      if (run->job.attempt() == 0) run->job.set_attempt(1);
      run->placed_before = true;
      const DeviceOption& device = run->analysis->devices[run->device];
      if (run->analysis->num_ranks > 1) {
        absl::StatusOr<const Ring*> ring = rings_.Start(
            run->job.job_id(), run->job.attempt(), device.ring_backend, run->analysis->num_ranks);
        if (!ring.ok()) {
          // Back in the queue, in its place, for the next pass (once a second).
          Log(absl::StrCat("cannot start the rendezvous store of job ", run->job.job_id(), ": ",
                           ring.status().message(), "; it stays queued"));
          EnqueueLocked(run);
          continue;
        }
      }
      run->job.clear_worker_ids();
      run->task_ids.clear();
      run->results.reset();
      for (size_t rank = 0; rank < placement.worker_ids.size(); ++rank) {
        TaskEntry task;
        task.task_id = TaskId(run->job.job_id(), run->job.attempt(), static_cast<int>(rank));
        task.job_id = run->job.job_id();
        task.worker_id = placement.worker_ids[rank];
        task.attempt = run->job.attempt();
        task.rank = static_cast<int>(rank);
        task.memory_bytes = device.memory_per_rank_bytes;
        run->task_ids.push_back(task.task_id);
        run->job.add_worker_ids(task.worker_id);
        workers_.AddTask(std::move(task));
      }
      metrics_->ObserveQueueWait(run->kind->name(), absl::ToDoubleSeconds(now - run->queued_since));
      std::string where = DescribeRanksLocked(*run);
      if (const Ring* ring = rings_.Find(run->job.job_id()); ring != nullptr) {
        where = absl::StrCat(where, " (", ring->backend, " ring ", ring->id, ", rendezvous ",
                             ring->address, ")");
      }
      Ticket ticket =
          TransitionLocked(run, v1::JOB_STATE_PLACED, "placed",
                           absl::StrCat("attempt ", run->job.attempt(), " placed on ", where));
      tickets.push_back(ticket);
      placed.emplace_back(run->job.job_id(), std::move(ticket));
    }
  }
  // Workers hear of a placement only once it is durable: after a crash in between, the restarted
  // coordinator neither loses the job nor has a worker running a placement it does not know. One
  // job's failed write (logged by the book) holds back that job only, not the rest of the pass.
  Flush(tickets).IgnoreError();
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, ticket] : placed) {
    absl::Status done;
    PendingWrite pending;
    JobRun* run = book_.Find(job_id);
    // Cancelled, or its worker lost, meanwhile: those paths released the tasks.
    if (run == nullptr || run->terminal || run->job.state() != v1::JOB_STATE_PLACED) continue;
    if (run->durable.state() != v1::JOB_STATE_PLACED ||
        run->durable.attempt() != run->job.attempt()) {
      continue;  // Its "placed" write did not commit.
    }
    for (const std::string& task_id : run->task_ids) {
      TaskEntry* task = workers_.FindTask(task_id);
      if (task == nullptr || task->dispatched) continue;
      WorkerEntry* worker = workers_.Find(task->worker_id);
      if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) continue;
      workers_.Dispatch(task, AssignmentLocked(*run, *task), Now());
    }
  }
}

void Coordinator::SchedulerLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!schedule_kicked_ && !threads_stop_) {
        clock_->WaitUntil(&schedule_cv_, &mu_, Now() + absl::Seconds(1));
      }
      if (threads_stop_) return;
      schedule_kicked_ = false;
    }
    SchedulePass();
  }
}

void Coordinator::CheckStore() {
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kNew || phase_ == Phase::kClosed) return;
  }
  // Unhealthy: a probe each pass finds out as soon as the file takes writes again. Healthy but idle
  // for a probe interval: a probe finds out that it can no longer be written (a read-only remount)
  // before a real write fails.
  const absl::Time now = Now();
  const bool unhealthy = !store_->Health().ok();
  {
    absl::MutexLock lock(&mu_);
    if (!unhealthy && (absl::Now() - store_->Stats().last_commit < options_.store_probe_interval ||
                       now - last_store_probe_ < options_.store_probe_interval)) {
      return;
    }
    last_store_probe_ = now;
  }
  store_->Probe().IgnoreError();  // Its outcome is what Health() now says.
  const absl::Status health = store_->Health();
  bool recovered = false;
  {
    absl::MutexLock lock(&mu_);
    if (health.ok() && !store_error_.ok()) {
      Log(absl::StrCat("the job store takes writes again (it failed with: ", store_error_.message(),
                       "); resuming"));
      store_error_ = absl::OkStatus();
      recovered = true;
      KickSchedulerLocked();
    } else if (!health.ok() && store_error_.ok()) {
      store_error_ = health;
      Log(absl::StrCat("not ready: the job store cannot be written: ", health.message()));
    }
  }
  if (recovered) {
    // Writes decided while the store failed are committed now, in order, before anything new.
    RetryStalledWrites();
    AdoptQueuedJobsFromStore();
  }
}

void Coordinator::AdoptQueuedJobsFromStore() {
  // A submit whose commit failed for the client may still have reached the file (the client then
  // retries with its idempotency key and is told the job exists): a queued job in the store that
  // the book lacks is taken into the queue, so that no acknowledged job waits unseen.
  absl::StatusOr<std::vector<StoredJob>> active = store_->LoadActive();
  if (!active.ok()) return;
  absl::MutexLock lock(&mu_);
  for (const StoredJob& stored : *active) {
    if (stored.job.state() != v1::JOB_STATE_QUEUED || book_.Find(stored.job.job_id()) != nullptr) {
      continue;
    }
    absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(stored.job.spec(), kinds_);
    if (!spec.ok()) continue;
    Log(absl::StrCat("job ", stored.job.job_id(), " was stored while the store failed; queued"));
    AdoptLocked(stored, *spec, /*checked=*/false);
  }
}

void Coordinator::ExpireJobs() {
  if (options_.retention == absl::InfiniteDuration()) return;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kServing || !store_error_.ok()) return;
  }
  absl::StatusOr<std::vector<std::string>> expired =
      store_->ListExpired(Now() - options_.retention, kExpireBatch);
  if (!expired.ok()) return;
  for (const std::string& job_id : *expired) {
    absl::StatusOr<v1::Job> deleted = store_->Delete(job_id);
    if (!deleted.ok()) continue;
    outputs_->Discard(job_id, -1);
    metrics_->JobDeleted(JobKind(deleted->spec()), deleted->state());
  }
}

void Coordinator::MonitorPass() {
  ReapStores();
  CheckStore();
  RetryStalledWrites();
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kNew || phase_ == Phase::kClosed || !store_error_.ok()) return;
    const absl::Time now = Now();
    for (WorkerEntry* worker : workers_.Silent(now, options_.dead_after)) {
      KillWorkerLocked(worker,
                       absl::StrCat("no heartbeat for ", Seconds(now - worker->last_heartbeat),
                                    " (dead after ", Seconds(options_.dead_after), ")"),
                       "worker_lost", &tickets);
    }
    workers_.ForgetDead(now, options_.dead_worker_retention);
  }
  Flush(tickets).IgnoreError();  // A failed write shows in Health() until the store recovers.
  ExpireJobs();
}

void Coordinator::MonitorLoop() {
  const absl::Duration interval =
      std::clamp(options_.dead_after / 4, absl::Milliseconds(10), absl::Seconds(1));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!threads_stop_) clock_->WaitUntil(&monitor_cv_, &mu_, Now() + interval);
      if (threads_stop_) return;
    }
    MonitorPass();
  }
}

}  // namespace server
}  // namespace dattn
