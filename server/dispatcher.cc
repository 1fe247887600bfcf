#include "server/dispatcher.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/tenant.h"
#include "server/log.h"
#include "server/proto_time.h"

namespace dattn {
namespace server {
namespace {

std::string TaskId(const std::string& job_id, int attempt, int rank) {
  return absl::StrCat(job_id, "/", attempt, "/", rank);
}

}  // namespace

Dispatcher::Dispatcher(DispatcherOptions options, Metrics* metrics)
    : options_(options),
      metrics_(metrics),
      scheduler_(scheduler::SchedulerOptions{options.starvation_bound,
                                             options.tenant_max_running_ranks}) {}

scheduler::JobRequest Dispatcher::Request(const JobRun& run, const JobAnalysis& analysis,
                                          size_t device) const {
  scheduler::JobRequest request;
  request.job_id = run.job.job_id();
  request.tenant = api::TenantOrDefault(run.job.spec().tenant());
  request.priority = run.job.spec().priority();
  request.submit_seq = run.submit_seq;
  request.submit_time = FromTimestamp(run.job.create_time());
  request.num_ranks = analysis.num_ranks;
  request.memory_per_rank_bytes = analysis.devices[device].memory_per_rank_bytes;
  request.dtype = analysis.dtype;
  request.needs_gpu = analysis.devices[device].gpu;
  request.head_dim = analysis.head_dim;
  return request;
}

absl::Status Dispatcher::CheckFeasible(const JobAnalysis& analysis,
                                       const std::vector<scheduler::WorkerInfo>& workers,
                                       int64_t ready_workers) const {
  // Workers may register later: with none ready, everything waits in the queue.
  if (ready_workers == 0) return absl::OkStatus();
  JobRun probe;
  probe.job.set_job_id("submitted-job");
  probe.submit_seq = 1;
  std::vector<std::string> reasons;
  for (size_t i = 0; i < analysis.devices.size(); ++i) {
    const scheduler::Feasibility f = scheduler::CheckFeasible(Request(probe, analysis, i), workers);
    if (f.feasible) return absl::OkStatus();
    reasons.push_back(
        absl::StrCat(f.reason, " (memory plan per rank: ", analysis.devices[i].memory_plan, ")"));
  }
  return absl::ResourceExhaustedError(absl::StrCat("the job can never run on the ready workers: ",
                                                   absl::StrJoin(reasons, "; or ")));
}

void Dispatcher::Enqueue(JobRun* run, const std::vector<scheduler::WorkerInfo>& workers,
                         int64_t ready_workers) {
  const JobAnalysis& analysis = *run->analysis;
  if (analysis.devices.size() > 1 && ready_workers > 0) {
    for (size_t i = 0; i < analysis.devices.size(); ++i) {
      if (scheduler::CheckFeasible(Request(*run, analysis, i), workers).feasible) {
        run->device = i;
        break;
      }
    }
  }
  absl::Status s = scheduler_.Enqueue(Request(*run, analysis, run->device));
  if (!s.ok() && !absl::IsAlreadyExists(s)) {
    Log(absl::StrCat("internal error: cannot queue job ", run->job.job_id(), ": ", s.message()));
  }
  UpdateDepth();
}

void Dispatcher::Remove(const std::string& job_id) {
  scheduler_.Remove(job_id).IgnoreError();
  UpdateDepth();
}

std::optional<size_t> Dispatcher::Position(const std::string& job_id) const {
  std::optional<size_t> position = scheduler_.queue().Position(job_id);
  if (position.has_value()) ++*position;
  return position;
}

bool Dispatcher::Settled(absl::Time now) const {
  return !ready_set_.empty() && now - ready_set_since_ >= options_.feasibility_settle;
}

std::vector<Dispatcher::Verdict> Dispatcher::Check(
    absl::Time now, const std::string& ready_set, const std::vector<JobRun*>& runs,
    const std::vector<scheduler::WorkerInfo>& workers) {
  if (ready_set != ready_set_) {
    ready_set_ = ready_set;
    ready_set_since_ = now;
  }
  std::vector<Verdict> verdicts;
  if (ready_set.empty() || now - ready_set_since_ < options_.feasibility_settle) return verdicts;
  for (JobRun* run : runs) {
    if (run->checked || run->terminal || run->job.state() != v1::JOB_STATE_QUEUED) continue;
    const JobAnalysis& analysis = *run->analysis;
    std::vector<std::string> reasons;
    std::optional<size_t> fits;
    for (size_t i = 0; i < analysis.devices.size() && !fits.has_value(); ++i) {
      const scheduler::Feasibility f =
          scheduler::CheckFeasible(Request(*run, analysis, i), workers);
      if (f.feasible) {
        fits = i;
      } else {
        reasons.push_back(absl::StrCat(
            f.reason, " (memory plan per rank: ", analysis.devices[i].memory_plan, ")"));
      }
    }
    if (!fits.has_value() && (run->placed_before || run->job.fitted_cluster())) {
      // It ran on this cluster before, or fitted it: the workers it needs may not have
      // re-registered yet (after a restart they come back as their cancelled tasks stop, or a
      // worker that died restarts). It waits, unchecked.
      continue;
    }
    scheduler_.Remove(run->job.job_id()).IgnoreError();
    if (!fits.has_value()) {
      verdicts.push_back(
          {run, absl::StrCat("the job can never run on the ready workers (it was queued before "
                             "they were checked): ",
                             absl::StrJoin(reasons, "; or "))});
      continue;
    }
    // Queued again for the device kind that fits, in its old place (same submit_seq).
    run->checked = true;
    run->job.set_fitted_cluster(true);  // Stored with the job's next write.
    run->device = *fits;
    absl::Status s = scheduler_.Enqueue(Request(*run, analysis, run->device));
    if (!s.ok()) {
      Log(absl::StrCat("internal error: cannot queue job ", run->job.job_id(), ": ", s.message()));
    }
  }
  UpdateDepth();
  return verdicts;
}

absl::StatusOr<std::vector<scheduler::Placement>> Dispatcher::Schedule(
    const std::vector<scheduler::WorkerInfo>& workers, absl::Time now,
    const scheduler::TenantRanks& running) {
  if (scheduler_.queue().empty()) {
    quota_waits_.clear();
    return std::vector<scheduler::Placement>();
  }
  absl::StatusOr<std::vector<scheduler::Placement>> placements =
      scheduler_.Schedule(workers, now, running);
  quota_waits_.clear();
  for (const scheduler::QuotaWait& wait : scheduler_.last_quota_waits()) {
    if (!scheduler_.queue().Contains(wait.job_id)) continue;  // Cancelled since.
    quota_waits_[wait.job_id] =
        absl::StrCat("waiting: tenant \"", wait.tenant, "\" holds ", wait.tenant_ranks,
                     " ranks of its quota of ", options_.tenant_max_running_ranks,
                     " (--tenant-max-running-ranks), the job asks for ", wait.num_ranks);
  }
  UpdateDepth();
  return placements;
}

std::string Dispatcher::QuotaWait(const std::string& job_id) const {
  auto it = quota_waits_.find(job_id);
  return it == quota_waits_.end() ? "" : it->second;
}

void Dispatcher::Place(absl::Time now, Tickets* tickets) {
  absl::StatusOr<std::vector<scheduler::Placement>> placements = Schedule(
      workers_->View(/*for_placement=*/true), now,
      options_.tenant_max_running_ranks > 0 ? workers_->RanksByTenant() : scheduler::TenantRanks());
  if (!placements.ok()) {
    Log(absl::StrCat("internal error: scheduling pass failed: ", placements.status().message()));
    return;
  }
  for (const scheduler::Placement& placement : *placements) {
    JobRun* run = book_->Find(placement.job_id);
    if (run == nullptr || run->terminal || run->job.state() != v1::JOB_STATE_QUEUED) continue;
    if (run->job.attempt() == 0) run->job.set_attempt(1);
    run->placed_before = true;
    run->shrink_pending = false;  // Placed as it is: no shrink to decide.
    const DeviceOption& device = run->analysis->devices[run->device];
    if (run->analysis->num_ranks > 1) {
      absl::StatusOr<const Ring*> ring = rings_->Start(
          run->job.job_id(), run->job.attempt(), device.ring_backend, run->analysis->num_ranks);
      if (!ring.ok()) {
        // Back in the queue, in its place (same submit_seq), for the next pass.
        Log(absl::StrCat("cannot start the rendezvous store of job ", run->job.job_id(), ": ",
                         ring.status().message(), "; it stays queued"));
        absl::Status s = scheduler_.Enqueue(Request(*run, *run->analysis, run->device));
        if (!s.ok()) Log(absl::StrCat("internal error: cannot queue job ", run->job.job_id()));
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
      task.tenant = api::TenantOrDefault(run->job.spec().tenant());
      task.worker_id = placement.worker_ids[rank];
      task.attempt = run->job.attempt();
      task.rank = static_cast<int>(rank);
      task.memory_bytes = device.memory_per_rank_bytes;
      run->task_ids.push_back(task.task_id);
      run->job.add_worker_ids(task.worker_id);
      workers_->AddTask(std::move(task));
    }
    metrics_->ObserveQueueWait(run->kind->name(), absl::ToDoubleSeconds(now - run->queued_since));
    std::string where = workers_->DescribeRanks(run->job);
    if (const Ring* ring = rings_->Find(run->job.job_id()); ring != nullptr) {
      absl::StrAppend(&where, " (", ring->backend, " ring ", ring->id, ", rendezvous ",
                      ring->address, ")");
    }
    Ticket ticket =
        book_->Transition(run, v1::JOB_STATE_PLACED, "placed",
                          absl::StrCat("attempt ", run->job.attempt(), " placed on ", where), now);
    tickets->push_back(std::move(ticket));
  }
}

void Dispatcher::Dispatch(absl::Time now) {
  for (const JobRun* run : book_->Runs()) {
    // Cancelled, or its worker lost, meanwhile: those paths released the tasks.
    if (run->terminal || run->job.state() != v1::JOB_STATE_PLACED) continue;
    // Until its "placed" write commits the ranks wait (a restarted coordinator must not find a
    // worker running a placement it never recorded); a write that stalled is dispatched by the
    // pass after it commits.
    if (run->durable.state() != v1::JOB_STATE_PLACED ||
        run->durable.attempt() != run->job.attempt()) {
      continue;
    }
    for (const std::string& task_id : run->task_ids) {
      TaskEntry* task = workers_->FindTask(task_id);
      if (task == nullptr || task->dispatched) continue;
      WorkerEntry* worker = workers_->Find(task->worker_id);
      if (worker == nullptr || worker->state == scheduler::WorkerState::kDead) continue;
      workers_->Dispatch(task, Assignment(*run, *task), now);
    }
  }
}

v1::WorkerCommand Dispatcher::Assignment(const JobRun& run, const TaskEntry& task) const {
  v1::WorkerCommand command;
  v1::TaskAssignment* assign = command.mutable_assign();
  assign->set_task_id(task.task_id);
  assign->set_job_id(task.job_id);
  assign->set_attempt(task.attempt);
  assign->set_rank(task.rank);
  *assign->mutable_spec() = run.job.spec();
  run.kind->PlanRank(*run.analysis, run.device, task.rank, assign);
  if (run.analysis->num_ranks > 1 && rings_->Find(run.job.job_id()) != nullptr) {
    *assign->mutable_ring() = rings_->Info(run.job.job_id(), task.rank);
  }
  return command;
}

void Dispatcher::UpdateDepth() const {
  metrics_->SetQueueDepth(static_cast<int64_t>(scheduler_.queue().size()));
}

}  // namespace server
}  // namespace dattn
