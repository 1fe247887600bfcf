#include "server/job_runner.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "api/limits.h"
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

}  // namespace

// What one report's handlers share.
struct JobRunner::Context {
  const v1::TaskReport* report;
  TaskEntry* task;
  JobRun* run;
  WorkerEntry* worker;
  std::string where;  // "rank R on w-... (name)".
  const std::optional<std::vector<int>>& missing_ranks;
  Tickets* tickets;
};

void JobRunner::TakeReport(const Report& report, Tickets* tickets) {
  mu_->AssertHeld();
  TaskEntry* task = report.task;
  // Every report of a formed ring rank says so; the ring is formed when every rank has.
  if (report.report->ring_formation_seconds() > 0) {
    task->formation_seconds = report.report->ring_formation_seconds();
    rings_->MarkFormed(report.run->job.job_id(), task->rank, task->formation_seconds);
  }
  Context c{report.report,
            task,
            report.run,
            report.worker,
            absl::StrCat("rank ", task->rank, " on ", workers_->Describe(task->worker_id)),
            report.missing_ranks,
            tickets};
  // The kind's own figures (a training job's loss, evaluations, checkpoints), from any report.
  {
    JobRun* run = report.run;
    std::vector<v1::JobEvent> events;
    run->kind->TakeProgress(*run->analysis, run->device, task->rank, *report.report, &run->job,
                            &events);
    for (v1::JobEvent& event : events) tickets->push_back(Append(run, std::move(event)));
  }
  switch (report.report->state()) {
    case v1::TASK_STATE_STARTED:
      OnStarted(c);
      break;
    case v1::TASK_STATE_PROGRESS:
      OnProgress(c);
      break;
    case v1::TASK_STATE_SUCCEEDED:
      OnSucceeded(c);
      break;
    case v1::TASK_STATE_FAILED:
      OnFailed(c);
      break;
    case v1::TASK_STATE_CANCELLED:
      OnCancelled(c);
      break;
    default:
      break;
  }
}

v1::Job JobRunner::Cancel(JobRun* run, const std::string& reason, Tickets* tickets) {
  mu_->AssertHeld();
  switch (run->job.state()) {
    case v1::JOB_STATE_QUEUED:
      dispatcher_->Remove(run->job.job_id());
      tickets->push_back(Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
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
        TaskEntry* task = workers_->FindTask(task_id);
        if (task != nullptr && task->dispatched) {
          keep.push_back(task_id);
          if (WorkerEntry* worker = workers_->Find(task->worker_id); worker != nullptr) {
            v1::WorkerCommand command;
            command.mutable_cancel()->set_task_id(task_id);
            command.mutable_cancel()->set_reason(absl::StrCat("job cancelled: ", reason));
            workers_->Push(worker, std::move(command));
          }
        } else {
          workers_->EraseTask(task_id, /*cancel=*/false, reason);
        }
      }
      run->task_ids = keep;
      if (keep.empty()) {
        Release(run, false, reason);
        tickets->push_back(Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                      absl::StrCat("cancelled: ", reason)));
      } else {
        v1::JobEvent event;
        event.set_kind("cancel_requested");
        event.set_message(absl::StrCat("cancel requested (", reason, "); waiting for ", keep.size(),
                                       keep.size() == 1 ? " rank" : " ranks", " to stop"));
        tickets->push_back(Append(run, std::move(event)));
      }
      break;
    }
    default:
      break;  // Terminal jobs are answered by the caller.
  }
  v1::Job answer = run->job;
  answer.clear_events();
  answer.set_queue_position(0);
  return answer;
}

Ticket JobRunner::Transition(JobRun* run, v1::JobState state, const std::string& kind,
                             const std::string& message) {
  mu_->AssertHeld();
  const v1::JobState from = run->job.state();
  Ticket ticket = book_->Transition(run, state, kind, message, clock_->Now());
  if (ticket.queue == nullptr) return ticket;
  if (IsTerminal(state)) {
    rings_->End(run->job.job_id(), "");
    const v1::DeploymentSpec& d = run->job.spec().deployment();
    if (run->job.spec().has_deployment() && d.checkpoint_pinned()) {
      retired_pins_.push_back(d.checkpoint());
    }
    dispatcher_->Kick();  // The scheduling loop destroys the retired store and pin.
  }
  if (IsActiveRun(from) && !IsActiveRun(state)) {
    run->kind->AttemptEnded(run->job.job_id());
    activity_->SignalAll();
  }
  return ticket;
}

std::vector<std::string> JobRunner::TakeRetiredPins() {
  mu_->AssertHeld();
  std::vector<std::string> out;
  out.swap(retired_pins_);
  return out;
}

Ticket JobRunner::Append(JobRun* run, v1::JobEvent event) {
  mu_->AssertHeld();
  return book_->Append(run, std::move(event), clock_->Now());
}

void JobRunner::Enqueue(JobRun* run) {
  mu_->AssertHeld();
  dispatcher_->Enqueue(run, workers_->View(/*for_placement=*/false), workers_->ReadyCount());
  dispatcher_->Kick();
}

void JobRunner::DropTask(JobRun* run, const std::string& task_id) {
  run->task_ids.erase(std::remove(run->task_ids.begin(), run->task_ids.end(), task_id),
                      run->task_ids.end());
  workers_->EraseTask(task_id, /*cancel=*/false, "");
  dispatcher_->Kick();
}

void JobRunner::Release(JobRun* run, bool cancel_tasks, const std::string& reason, bool abort) {
  mu_->AssertHeld();
  for (const std::string& task_id : run->task_ids)
    workers_->EraseTask(task_id, cancel_tasks, reason, abort);
  run->task_ids.clear();
  run->results.reset();
  rings_->End(run->job.job_id(), "");
  dispatcher_->Kick();
}

void JobRunner::Requeue(JobRun* run, const std::string& kind, const std::string& message,
                        Tickets* tickets) {
  mu_->AssertHeld();
  if (run->analysis != nullptr && run->analysis->runs_once) {
    // Its inputs were in its caller's stream, consumed by this attempt: it cannot run again.
    Release(run, /*cancel_tasks=*/true, message, /*abort=*/true);
    tickets->push_back(Transition(
        run, v1::JOB_STATE_FAILED, "failed",
        absl::StrCat(message.empty() ? kind : message,
                     "; not requeued: an Attend job runs once (its inputs were in its caller's "
                     "stream), the caller may call again")));
    return;
  }
  run->job.set_attempt(run->job.attempt() + 1);
  run->job.mutable_progress()->set_steps_done(0);
  // Per-attempt figures start again; what the attempts share (a training job's checkpoints, its
  // last loss) stays until the next attempt reports.
  if (run->job.progress().has_training()) {
    run->job.mutable_progress()->mutable_training()->set_resumed_from_step(0);
  }
  tickets->push_back(Transition(run, v1::JOB_STATE_QUEUED, kind, message));
  run->queued_since = clock_->Now();
  Enqueue(run);
}

void JobRunner::RequeueRefused(JobRun* run, const std::string& why, Tickets* tickets) {
  // The attempt never ran whole: its other ranks stop at once.
  Release(run, /*cancel_tasks=*/true, why, /*abort=*/true);
  if (++run->refusals > kMaxRefusals) {
    NoteRecovery(run, "rank_refused", "failed");
    tickets->push_back(
        Transition(run, v1::JOB_STATE_FAILED, "failed",
                   absl::StrCat(why, "; the job's ranks were refused ", run->refusals,
                                " times in a row (at most ", kMaxRefusals, ")")));
    return;
  }
  ++run->free_requeues;
  NoteRecovery(run, "rank_refused", "requeued");
  Requeue(run, "refused",
          absl::StrCat(why, "; requeued as attempt ", run->job.attempt() + 1,
                       " (a refusal is not a failed attempt)"),
          tickets);
}

void JobRunner::Recover(JobRun* run, FailureKind failure, const std::string& why,
                        const std::string& cause, int64_t oom_free_bytes, Tickets* tickets) {
  mu_->AssertHeld();
  // A ring that had not formed yet failed to: counted as such unless the caller already did.
  rings_->End(run->job.job_id(), run->cancel_requested ? "" : "failed");
  // A rank failed or its worker was lost: the others cannot stop together, they stop at once.
  Release(run, /*cancel_tasks=*/true, why, /*abort=*/true);
  if (run->cancel_requested) {
    NoteRecovery(run, cause, "cancelled");
    tickets->push_back(
        Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
                   absl::StrCat("cancelled: ", run->cancel_reason, " (then ", why, ")")));
    return;
  }
  // Attempts that ended for reasons not the job's own (a coordinator restart or stop, a refusal, a
  // rank handed back) do not count.
  const int attempts = std::max(1, run->job.attempt() - run->free_requeues);
  if (failure == FailureKind::kOom && !run->analysis->runs_once &&
      attempts < options_.max_attempts) {
    if (std::optional<std::string> change = LadderStep(run); change.has_value()) {
      NoteRecovery(run, cause, "resized");
      Requeue(run, "requeued",
              absl::StrCat(why, "; out of memory while running: the recovery ladder runs it with ",
                           *change),
              tickets);
      return;
    }
  }
  scheduler::RecoveryInput input;
  run->kind->DescribeRecovery(*run->analysis, run->device, &input);
  input.failure = failure;
  input.attempts = attempts;
  input.max_attempts = options_.max_attempts;
  input.oom_free_memory_bytes = oom_free_bytes;
  absl::StatusOr<scheduler::RecoveryAction> action = scheduler::DecideRecovery(input);
  if (!action.ok()) {
    NoteRecovery(run, cause, "failed");
    tickets->push_back(
        Transition(run, v1::JOB_STATE_FAILED, "failed",
                   absl::StrCat(why, "; no recovery possible: ", action.status().message())));
    return;
  }
  if (action->kind == scheduler::RecoveryKind::kFail) {
    NoteRecovery(run, cause, "failed");
    tickets->push_back(
        Transition(run, v1::JOB_STATE_FAILED, "failed", absl::StrCat(why, "; ", action->reason)));
    return;
  }
  if (action->kind != scheduler::RecoveryKind::kRequeue) {
    // Only a kind that allows an in-place recovery (DescribeRecovery) can get one, and no kind
    // does yet: reaching this is a kind/runner mismatch. The job is rerun as it is rather than
    // lost.
    Log(absl::StrCat("internal error: job ", run->job.job_id(), ": recovery ",
                     scheduler::RecoveryKindName(action->kind),
                     " is not carried out by the job runner; requeued instead"));
  }
  std::string reason = action->reason;
  if (failure != FailureKind::kOom) {
    // scheduler::DecideRecovery's in-place shrink is not what runs (DescribeRecovery allows none):
    // a worker it ran on may be gone for good, and once the ready set settles ShrinkStranded
    // decides, with the workers then known.
    reason = absl::StrCat(
        scheduler::FailureKindName(failure), ": requeued as attempt ", run->job.attempt() + 1, " (",
        attempts, " of ", options_.max_attempts, " attempts used)",
        run->kind->Shrinks(run->job.spec(), *run->analysis).empty()
            ? "; it waits for workers that hold it as it ran (its recovery policy allows no "
              "fewer ranks)"
            : "; if the workers left cannot hold it as it ran once they settle, it continues on "
              "fewer ranks (spec.recovery.shrink_ring, spec.recovery.single_device)");
  }
  NoteRecovery(run, cause, "requeued");
  Requeue(run, "requeued", absl::StrCat(why, "; ", reason), tickets);
  run->shrink_pending = failure != FailureKind::kOom && !run->terminal;
}

void JobRunner::NoteRecovery(JobRun* run, const std::string& kind, const char* outcome) {
  mu_->AssertHeld();
  // A job that runs once cannot be requeued (Requeue fails it): that is its outcome.
  const bool again = std::string(outcome) == "requeued" || std::string(outcome) == "resized";
  const bool fails = again && run->analysis != nullptr && run->analysis->runs_once;
  metrics_->CountRecovery(kind, fails ? "failed" : outcome);
  if (again && !fails) {
    run->recovery_kind = kind;
    run->recovery_since = clock_->Now();
  }
}

std::optional<std::string> JobRunner::LadderStep(JobRun* run) {
  mu_->AssertHeld();
  const JobAnalysis& ran = *run->analysis;
  const DeviceOption& device = ran.devices[run->device];
  const std::vector<scheduler::WorkerInfo> view = workers_->View(/*for_placement=*/false);
  const int64_t ready = workers_->ReadyCount();
  const int quota = dispatcher_->tenant_max_running_ranks();
  for (LadderRung& rung : run->kind->Ladder(run->job.spec(), ran)) {
    absl::StatusOr<std::shared_ptr<const JobAnalysis>> analyzed =
        run->kind->Analyze(rung.spec, "spec");
    if (!analyzed.ok()) continue;  // A rung the spec's other rules forbid.
    const JobAnalysis& next = **analyzed;
    if (quota > 0 && next.num_ranks > quota) continue;
    auto same = std::find_if(next.devices.begin(), next.devices.end(),
                             [&](const DeviceOption& d) { return d.gpu == device.gpu; });
    if (same == next.devices.end() || same->memory_per_rank_bytes >= device.memory_per_rank_bytes) {
      continue;  // It would run out the same way.
    }
    if (!dispatcher_->CheckFeasible(next, view, ready).ok()) continue;
    const std::string change = absl::StrCat(
        rung.change, " (", scheduler::FormatBytes(same->memory_per_rank_bytes),
        " planned per rank, against ", scheduler::FormatBytes(device.memory_per_rank_bytes), ")");
    if (!run->job.has_requested_spec()) *run->job.mutable_requested_spec() = run->job.spec();
    *run->job.mutable_spec() = std::move(rung.spec);
    run->device = static_cast<size_t>(same - next.devices.begin());
    run->analysis = *std::move(analyzed);
    run->job.mutable_progress()->set_steps_total(run->analysis->steps_total);
    return change;
  }
  return std::nullopt;
}

void JobRunner::ShrinkStranded(Tickets* tickets) {
  mu_->AssertHeld();
  const int64_t ready = workers_->ReadyCount();
  if (ready == 0) return;
  const std::vector<scheduler::WorkerInfo> view = workers_->View(/*for_placement=*/false);
  const int quota = dispatcher_->tenant_max_running_ranks();
  for (JobRun* run : book_->Runs()) {
    if (!run->shrink_pending || run->terminal || run->cancel_requested ||
        run->job.state() != v1::JOB_STATE_QUEUED) {
      continue;
    }
    const absl::Status as_is = dispatcher_->CheckFeasible(*run->analysis, view, ready);
    if (as_is.ok()) continue;     // It fits the workers left: it waits for them as any job does.
    run->shrink_pending = false;  // Decided once per recovery.
    const std::string was =
        absl::StrCat("the ready workers cannot hold the job as it ran (", run->analysis->num_ranks,
                     run->analysis->num_ranks == 1 ? " rank" : " ranks", "): ", as_is.message());
    const std::vector<LadderRung> shrinks = run->kind->Shrinks(run->job.spec(), *run->analysis);
    bool shrunk = false;
    for (const LadderRung& rung : shrinks) {
      absl::StatusOr<std::shared_ptr<const JobAnalysis>> analyzed =
          run->kind->Analyze(rung.spec, "spec");
      if (!analyzed.ok()) continue;  // A size the spec's other rules forbid.
      if (quota > 0 && (*analyzed)->num_ranks > quota) continue;
      if (!dispatcher_->CheckFeasible(**analyzed, view, ready).ok()) continue;
      dispatcher_->Remove(run->job.job_id());
      if (!run->job.has_requested_spec()) *run->job.mutable_requested_spec() = run->job.spec();
      *run->job.mutable_spec() = rung.spec;
      run->analysis = *std::move(analyzed);
      run->device = 0;  // Enqueue picks the first device kind that fits.
      run->job.mutable_progress()->set_steps_total(run->analysis->steps_total);
      Enqueue(run);
      metrics_->CountRecovery(run->recovery_kind.empty() ? "ring_failed" : run->recovery_kind,
                              "shrunk");
      tickets->push_back(Transition(
          run, v1::JOB_STATE_QUEUED, "shrunk",
          absl::StrCat(
              was, "; it continues on ", rung.change, " (",
              scheduler::FormatBytes(run->analysis->devices[run->device].memory_per_rank_bytes),
              " planned per rank",
              run->job.spec().has_training() ? ", from its newest checkpoint)" : ")")));
      shrunk = true;
      break;
    }
    if (!shrunk) {
      tickets->push_back(
          Transition(run, v1::JOB_STATE_QUEUED, "waiting",
                     absl::StrCat(was,
                                  shrinks.empty()
                                      ? "; its recovery policy allows no fewer ranks "
                                        "(spec.recovery.shrink_ring, spec.recovery.single_device)"
                                      : "; no size of fewer ranks that its policy allows fits them",
                                  ": it waits for workers")));
    }
  }
}

void JobRunner::RecoverStalled(Tickets* tickets) {
  mu_->AssertHeld();
  const absl::Time now = clock_->Now();
  std::vector<std::pair<JobRun*, absl::Duration>> stalled;
  for (JobRun* run : book_->Runs()) {
    if (run->terminal || run->job.state() != v1::JOB_STATE_RUNNING ||
        run->last_step == absl::InfinitePast() || run->cancel_requested) {
      continue;
    }
    const absl::Duration limit = StallLimit(run->job.spec(), *run->analysis);
    if (now - run->last_step > limit) stalled.emplace_back(run, limit);
  }
  for (const auto& [run, limit] : stalled) {
    const std::string why = absl::StrCat(
        "stalled: no step finished for ", Seconds(now - run->last_step), " (",
        run->job.progress().steps_done(), " of ", run->job.progress().steps_total(),
        " done; the stall limit is ", Seconds(limit),
        run->job.spec().recovery().stall_seconds() > 0 ? ", spec.recovery.stall_seconds"
                                                       : ", the default",
        ")");
    run->last_step = absl::InfinitePast();
    tickets->push_back(Transition(run, run->job.state(), "stalled", why));
    Recover(run, FailureKind::kCommTimeout, why, "stalled", 0, tickets);
  }
}

void JobRunner::KillWorker(WorkerEntry* worker, const std::string& why, const std::string& cause,
                           Tickets* tickets) {
  mu_->AssertHeld();
  const std::string message =
      absl::StrCat("worker ", worker->info.worker_id(), " (", worker->info.name(), ") lost: ", why);
  std::set<std::string> job_ids;
  for (const std::string& task_id : workers_->MarkDead(worker, clock_->Now())) {
    if (const TaskEntry* task = workers_->FindTask(task_id); task != nullptr) {
      job_ids.insert(task->job_id);
    }
  }
  for (const std::string& job_id : job_ids) {
    JobRun* run = book_->Find(job_id);
    if (run == nullptr || run->terminal) continue;
    tickets->push_back(Transition(run, run->job.state(), "worker_lost", message));
    Recover(run, FailureKind::kWorkerDead, message, cause, 0, tickets);
  }
  dispatcher_->Kick();
}

void JobRunner::OnStarted(Context& c) {
  c.task->started = true;
  c.run->refusals = 0;
  if (c.run->job.state() != v1::JOB_STATE_PLACED) return;
  if (!c.run->job.has_start_time()) *c.run->job.mutable_start_time() = ToTimestamp(clock_->Now());
  c.run->last_step = clock_->Now();
  if (c.run->recovery_since != absl::InfinitePast()) {
    metrics_->ObserveRecovery(c.run->recovery_kind,
                              absl::ToDoubleSeconds(clock_->Now() - c.run->recovery_since));
    c.run->recovery_since = absl::InfinitePast();
  }
  c.tickets->push_back(
      Transition(c.run, v1::JOB_STATE_RUNNING, "started",
                 absl::StrCat(c.where, " started (attempt ", c.run->job.attempt(), ")")));
  // A cancel in progress is not a "stop": the worker got a CancelTask and must still send its
  // final CANCELLED report, which is what ends the job (stop would silence that report).
}

void JobRunner::OnProgress(Context& c) {
  OnStarted(c);
  JobRun* run = c.run;
  c.task->steps_done = std::max(c.task->steps_done, c.report->progress().steps_done());
  int64_t done = c.task->steps_done;
  for (const std::string& other : run->task_ids) {
    if (const TaskEntry* task = workers_->FindTask(other); task != nullptr) {
      done = std::min(done, task->steps_done);
    }
  }
  v1::JobProgress* progress = run->job.mutable_progress();
  const absl::Time now = clock_->Now();
  if (std::min(done, run->analysis->steps_total) > progress->steps_done()) run->last_step = now;
  progress->set_steps_done(std::min(done, run->analysis->steps_total));
  progress->set_steps_total(run->analysis->steps_total);
  if (now - run->last_progress_write < options_.progress_persist_interval) return;
  run->last_progress_write = now;
  v1::JobEvent event;
  event.set_kind("progress");
  event.set_message(run->kind->ProgressMessage(*progress));
  *event.mutable_progress() = *progress;
  c.tickets->push_back(Append(run, std::move(event)));
}

void JobRunner::OnSucceeded(Context& c) {
  OnStarted(c);
  JobRun* run = c.run;
  if (run->analysis->keeps_output && !c.task->output_uploaded) {
    // The worker uploads a shard before it reports success; without it the job has no output.
    OnFailed(c);
    return;
  }
  if (run->results == nullptr) run->results = run->kind->NewAttempt(*run->analysis, run->device);
  run->results->AddRank(c.task->rank, c.task->worker_id, c.worker->info.name(), *c.report);
  const std::string task_id = c.task->task_id;
  DropTask(run, task_id);  // c.task is gone from here on.
  if (!run->task_ids.empty()) return;
  // Every rank has ended. With a cancel in flight some of them may have ended CANCELLED (a ring's
  // ranks race the cancel): a job succeeds only with every rank's result; otherwise the cancel
  // wins and the partial results are dropped.
  const int finished = run->results->ranks_done();
  if (finished < run->analysis->num_ranks) {
    Release(run, /*cancel_tasks=*/false, "");
    c.tickets->push_back(
        Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
                   absl::StrCat("cancelled: ", run->cancel_reason, " (", finished, " of ",
                                run->analysis->num_ranks, " ranks had finished)")));
    return;
  }
  std::optional<v1::TensorHeader> output;
  if (run->analysis->keeps_output) output = run->kind->Output(*run->analysis).header;
  std::string message =
      run->results->Finish(output ? &*output : nullptr, run->job.mutable_result());
  run->results.reset();
  rings_->End(run->job.job_id(), "");
  if (run->cancel_requested) absl::StrAppend(&message, " (it finished before the cancel)");
  run->job.mutable_progress()->set_steps_done(run->analysis->steps_total);
  c.tickets->push_back(Transition(run, v1::JOB_STATE_SUCCEEDED, "succeeded", message));
}

std::string JobRunner::RingFailed(Context& c, const std::string& why) {
  JobRun* run = c.run;
  const Ring* ring = rings_->Find(run->job.job_id());
  const v1::TaskReport& report = *c.report;
  if (report.ring_formation_seconds() > 0 || ring->is_formed()) {
    c.tickets->push_back(Transition(
        run, run->job.state(), "ring_failed",
        absl::StrCat(why, "; the ring ", ring->id, ": ", workers_->DescribeRanks(run->job))));
    return why;
  }
  // The ring never formed: name the ranks the store never saw, and where they were.
  std::vector<std::string> absent;
  for (int r : c.missing_ranks.value_or(std::vector<int>())) {
    if (r >= run->job.worker_ids_size()) continue;
    const TaskEntry* peer = workers_->FindTask(TaskId(run->job.job_id(), run->job.attempt(), r));
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
    absent.push_back(absl::StrCat("rank ", r, " on ", workers_->Describe(run->job.worker_ids(r)),
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
  c.tickets->push_back(Transition(run, run->job.state(), "ring_formation_failed", message));
  rings_->End(run->job.job_id(), timed_out ? "timed_out" : "failed");
  return failure;
}

void JobRunner::OnFailed(Context& c) {
  JobRun* run = c.run;
  const v1::TaskReport& report = *c.report;
  const std::string task_id = c.task->task_id;
  if (report.refused() && !run->cancel_requested) {
    // The worker did not start the rank (no free slot, draining, stopping): nothing ran, so the
    // job did not fail. It goes back in the queue without spending an attempt, and the worker gets
    // no new rank until its next heartbeat says what it runs.
    c.worker->refused_since_heartbeat = true;
    DropTask(run, task_id);
    RequeueRefused(run,
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
  if (rings_->Find(run->job.job_id()) != nullptr && !run->cancel_requested) {
    why = RingFailed(c, why);
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
  DropTask(run, task_id);
  if (run->cancel_requested || !failure.has_value()) {
    Release(run, /*cancel_tasks=*/true, why, /*abort=*/true);
    if (run->cancel_requested) {
      c.tickets->push_back(
          Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
                     absl::StrCat("cancelled: ", run->cancel_reason, " (", why, ")")));
    } else {
      c.tickets->push_back(
          Transition(run, v1::JOB_STATE_FAILED, "failed",
                     absl::StrCat(why, "; not retried: the error does not depend on the worker")));
    }
    return;
  }
  Recover(run, *failure, why, "task_failed", free_bytes, c.tickets);
}

void JobRunner::OnCancelled(Context& c) {
  JobRun* run = c.run;
  const std::string task_id = c.task->task_id;
  DropTask(run, task_id);
  if (!run->cancel_requested) {
    if (c.report->handed_back()) {
      // The worker is stopping (SIGTERM, the end of its drain wait): not the job's failure.
      ++run->free_requeues;
      Recover(run, FailureKind::kPeerLost,
              absl::StrCat(c.where,
                           " handed its rank back unfinished: its worker is stopping (not counted "
                           "as a failed attempt)"),
              "worker_stopping", 0, c.tickets);
      return;
    }
    Recover(run, FailureKind::kPeerLost, absl::StrCat(c.where, " was cancelled by its worker"),
            "task_failed", 0, c.tickets);
    return;
  }
  if (!run->task_ids.empty()) return;
  Release(run, false, "");
  c.tickets->push_back(Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                  absl::StrCat("cancelled: ", run->cancel_reason)));
}

}  // namespace server
}  // namespace dattn
