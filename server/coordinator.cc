#include "server/coordinator.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "api/engine_convert.h"
#include "api/limits.h"
#include "api/quote.h"
#include "api/tenant.h"
#include "api/training_job.h"
#include "engine/tensor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/file_io.h"
#include "model/longnet_params.h"
#include "model/model_folder.h"
#include "server/attention_kind.h"
#include "server/deployment_kind.h"
#include "server/job_state.h"
#include "server/log.h"
#include "server/proto_time.h"
#include "server/training_kind.h"

namespace dattn {
namespace server {
namespace {

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d));
}

bool IsActiveRun(v1::JobState state) {
  return state == v1::JOB_STATE_PLACED || state == v1::JOB_STATE_RUNNING;
}

const char* const kShuttingDown =
    "the coordinator is shutting down; retry (with the same idempotency_key) once it is back";

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options, Metrics* metrics)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      metrics_(metrics != nullptr ? metrics : (own_metrics_ = std::make_unique<Metrics>()).get()),
      rng_(std::random_device{}()),
      book_(metrics_),
      workers_(metrics_),
      rings_(RingOptions{options_.rendezvous_host, options_.rendezvous_advertise,
                         options_.ring_formation_timeout, options_.ring_comm_timeout,
                         options_.rendezvous_tls},
             metrics_),
      dispatcher_(DispatcherOptions{options_.starvation_bound, options_.feasibility_settle,
                                    options_.quotas.max_running_ranks},
                  metrics_),
      quotas_(options_.quotas),
      runner_(&mu_, &book_, &workers_, &rings_, &dispatcher_, metrics_, clock_, &drain_cv_,
              RunnerOptions{options_.max_attempts, options_.progress_persist_interval,
                            options_.ring_formation_timeout}),
      recorder_(&mu_, &book_, &kinds_, metrics_, clock_,
                RecorderOptions{options_.store_probe_interval, options_.retention}),
      reader_(&mu_, &book_, &dispatcher_, &kinds_,
              ReaderOptions{options_.retention, options_.max_watch_streams,
                            options_.stream_poll_interval}) {
  // The kinds of work this coordinator runs: adding a kind is one line here.
  kinds_.Add(std::make_unique<AttentionKind>(metrics_));
  kinds_.Add(std::make_unique<TrainingKind>(metrics_));
  kinds_.Add(std::make_unique<DeploymentKind>(metrics_));
  absl::MutexLock lock(&mu_);
  dispatcher_.Attach(&book_, &workers_, &rings_);
}

Coordinator::~Coordinator() { Close().IgnoreError(); }

// -------------------------------------------------------------------------------------------------
// Lifecycle.

absl::Status Coordinator::Start() {
  const CoordinatorOptions& o = options_;
  if (absl::Status s = ValidateCoordinatorOptions(o); !s.ok()) return s;
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
  recorder_.Attach(store_.get(), outputs_.get());
  reader_.Attach(store_.get(), outputs_.get());
  absl::StatusOr<std::unique_ptr<ModelRegistry>> registry =
      ModelRegistry::Open(o.model_dir.empty() ? o.data_dir + "/models" : o.model_dir);
  if (!registry.ok()) return registry.status();
  registry_ = *std::move(registry);
  for (const std::string& problem : registry_->problems()) Log(problem);

  for (const WorkKind* kind : kinds_.All()) {
    absl::StatusOr<std::map<v1::JobState, int64_t>> counts = store_->CountByState(kind->name());
    if (!counts.ok()) return counts.status();
    for (v1::JobState state :
         {v1::JOB_STATE_QUEUED, v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING,
          v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
      auto it = counts->find(state);
      metrics_->SetJobCount(kind->name(), state, it == counts->end() ? 0 : it->second);
    }
  }
  if (absl::Status s = Recover(); !s.ok()) return s;
  recorder_.CollectOutputs();

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
  RemoveStalePins(*active);
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
    // Analysed before the lock (kinds_ is fixed; a large ring takes milliseconds to plan).
    absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(stored.job.spec(), kinds_);
    absl::MutexLock lock(&mu_);
    if (!spec.ok()) {
      // Only a newer binary's stricter rules (or a kind it no longer runs) get here; the job
      // cannot run, so say why. It is recorded under its kind (the first one if none runs it) for
      // its metrics.
      AnalyzedSpec any;
      any.kind = kinds_.For(stored.job.spec()) != nullptr ? kinds_.For(stored.job.spec())
                                                          : kinds_.All().front();
      JobRun* run = book_.Add(stored, any.kind, nullptr);
      tickets.push_back(
          runner_.Transition(run, v1::JOB_STATE_FAILED, "failed",
                             absl::StrCat("the stored spec is not valid for this coordinator: ",
                                          spec.status().message())));
      continue;
    }
    JobRun* run = book_.Add(stored, spec->kind, spec->analysis);
    run->queued_since = Now();
    run->placed_before = placed_before;
    run->free_requeues = free_requeues;
    if (state == v1::JOB_STATE_QUEUED && spec->analysis->runs_once) {
      tickets.push_back(runner_.Transition(
          run, v1::JOB_STATE_FAILED, "failed",
          "the coordinator restarted before the job ran; an Attend job runs only while its call "
          "lasts (its inputs were in the caller's stream), the caller may call again"));
      continue;
    }
    if (state == v1::JOB_STATE_QUEUED) {
      runner_.Enqueue(run);
      continue;
    }
    const std::string where = absl::StrCat("attempt ", run->job.attempt(), " on ",
                                           absl::StrJoin(run->job.worker_ids(), ", "));
    if (cancel_requested) {
      tickets.push_back(runner_.Transition(
          run, v1::JOB_STATE_CANCELLED, "cancelled",
          absl::StrCat(
              "cancelled: the coordinator restarted while a requested cancel was pending (", where,
              ")")));
      continue;
    }
    runner_.NoteRecovery(run, "coordinator_restarted", "requeued");
    ++run->free_requeues;
    runner_.Requeue(run, "coordinator_restarted",
                    absl::StrCat("the coordinator restarted while the job was ", StateName(state),
                                 " (", where, "); requeued as attempt ", run->job.attempt() + 1),
                    &tickets);
  }
  return recorder_.Flush(tickets);
}

void Coordinator::RemoveStalePins(const std::vector<StoredJob>& active) {
  std::set<std::string> held;
  for (const StoredJob& stored : active) {
    const v1::JobSpec& spec = stored.job.spec();
    if (spec.has_deployment() && spec.deployment().checkpoint_pinned()) {
      held.insert(spec.deployment().checkpoint());
    }
  }
  ListFilter finished;
  finished.kind = "deployment";
  finished.states = {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED};
  std::string token;
  do {
    absl::StatusOr<ListPage> page = store_->List(finished, api::kMaxPageSize, token);
    if (!page.ok()) {
      Log(absl::StrCat("cannot look for checkpoint pins of ended deployments: ",
                       page.status().message()));
      return;
    }
    for (const StoredJob& stored : page->jobs) {
      const v1::DeploymentSpec& d = stored.job.spec().deployment();
      if (!d.checkpoint_pinned() || held.count(d.checkpoint()) > 0) continue;
      std::error_code ec;
      if (!std::filesystem::exists(d.checkpoint(), ec)) continue;
      if (absl::Status s = model::RemoveCheckpointPin(d.checkpoint()); !s.ok()) {
        Log(absl::StrCat("could not remove the checkpoint pin ", d.checkpoint(),
                         " of ended deployment ", stored.job.job_id(), ": ", s.message()));
        continue;
      }
      Log(absl::StrCat("removed the checkpoint pin ", d.checkpoint(), " of deployment ",
                       stored.job.job_id(), ", which ended before the coordinator stopped"));
    }
    token = page->next_page_token;
  } while (!token.empty());
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
  }
  return recorder_.Health();
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
    // Deployments never end by themselves: AnyActiveRun leaves them out, and they are requeued
    // with the rest below, to be placed again when the coordinator runs again.
    while (book_.AnyActiveRun() && !clock_->WaitUntil(&drain_cv_, &mu_, deadline)) {
    }
    for (JobRun* run : book_.Runs()) {
      if (run->terminal || !IsActiveRun(run->job.state())) continue;
      const std::string why = absl::StrCat("the coordinator shut down before the job finished (",
                                           "drain timeout ", Seconds(timeout), ")");
      runner_.Release(run, /*cancel_tasks=*/true, why);
      if (run->cancel_requested) {
        runner_.NoteRecovery(run, "drain_timeout", "cancelled");
        tickets.push_back(runner_.Transition(run, v1::JOB_STATE_CANCELLED, "cancelled",
                                             absl::StrCat("cancelled: ", run->cancel_reason)));
      } else {
        runner_.NoteRecovery(run, "drain_timeout", "requeued");
        ++run->free_requeues;
        runner_.Requeue(run, "coordinator_stopped",
                        absl::StrCat(why, "; requeued as attempt ", run->job.attempt() + 1),
                        &tickets);
      }
    }
  }
  absl::Status status = recorder_.Flush(tickets);
  // Give connected streams a moment to deliver the cancels just queued.
  absl::MutexLock lock(&mu_);
  const absl::Time cancel_deadline = Now() + absl::Seconds(1);
  while (workers_.AnyUndelivered() && !streams_closed_ &&
         !clock_->WaitUntil(&drain_cv_, &mu_, cancel_deadline)) {
  }
  return status;
}

void Coordinator::CloseStreams() {
  {
    absl::MutexLock lock(&mu_);
    streams_closed_ = true;
    workers_.WakeAll();
    reader_.Close();
  }
  router_.Shutdown();
}

absl::Status Coordinator::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return close_status_;
    phase_ = Phase::kClosed;
    closed_ = true;
    threads_stop_ = true;
    streams_closed_ = true;
    dispatcher_.kick_cv()->SignalAll();
    monitor_cv_.SignalAll();
    drain_cv_.SignalAll();
    workers_.WakeAll();
    reader_.Close();
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
  if (absl::Status error = recorder_.store_error(); !error.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the job store cannot be written now (nothing was changed; retry once it "
                     "recovers): ",
                     error.message()));
  }
  return absl::OkStatus();
}

std::string Coordinator::NewId(const char* prefix) {
  return absl::StrCat(prefix, absl::Hex(rng_(), absl::kZeroPad16));
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
  runner_.Enqueue(run);
}

// -------------------------------------------------------------------------------------------------
// JobService.

absl::StatusOr<v1::SubmitJobResponse> Coordinator::SubmitJob(const v1::SubmitJobRequest& request) {
  if (request.spec().has_attention() && request.spec().attention().streamed()) {
    return absl::InvalidArgumentError(
        "spec.attention.streamed: set only by the coordinator for JobService.Attend calls; "
        "attention on your own tensors is an Attend call");
  }
  if (request.spec().has_deployment()) {
    // A version being deployed is not removed meanwhile (DeleteModel takes this for writing).
    absl::ReaderMutexLock models(&model_use_mu_);
    v1::SubmitJobRequest resolved = request;
    std::string new_pin;
    if (absl::Status s =
            ResolveDeployment(request.idempotency_key(), resolved.mutable_spec(), &new_pin);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<v1::SubmitJobResponse> submitted = Submit(resolved, {}, nullptr);
    // A pin this call made belongs to the job it created, and to nothing else.
    if (!new_pin.empty() && (!submitted.ok() || !submitted->created())) {
      if (absl::Status s = model::RemoveCheckpointPin(new_pin); !s.ok()) {
        Log(absl::StrCat("could not remove the unused checkpoint pin ", new_pin, ": ",
                         s.message()));
      }
    }
    return submitted;
  }
  return Submit(request, {}, nullptr);
}

namespace {

// The complete checkpoint of `step` that the training job `job` saved (TrainingJobSpec.
// checkpoint_dir: <checkpoint_dir>/<job_id>/step-NNNNNNNN). INVALID_ARGUMENT naming `field` (the
// request's step field), the step and the steps there are.
absl::StatusOr<std::string> TrainingJobCheckpoint(const v1::Job& job, int64_t step,
                                                  const std::string& field) {
  if (!job.spec().has_training() || job.spec().training().checkpoint_dir().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": job ", job.job_id(),
                     job.spec().has_training()
                         ? " saves no checkpoints (its spec.training.checkpoint_dir is empty)"
                         : " is not a training job"));
  }
  const std::string root = api::TrainingCheckpointDir(job.spec().training(), job.job_id());
  absl::StatusOr<std::vector<model::CheckpointEntry>> entries = model::ListCheckpoints(root);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot list ", api::Quote(root), ": ", entries.status().message()));
  }
  std::vector<std::string> complete;
  std::string found;
  for (const model::CheckpointEntry& e : *entries) {
    if (!e.has_manifest) continue;
    if (e.step == step) found = e.path;
    complete.push_back(absl::StrCat(e.step));
  }
  if (found.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": job ", job.job_id(), " has no complete checkpoint of step ", step, " under ",
        api::Quote(root), " (",
        complete.empty() ? "none yet" : absl::StrCat("its steps: ", absl::StrJoin(complete, ", ")),
        ")"));
  }
  return found;
}

// The final checkpoint of the training job `job`, which must have SUCCEEDED with one; else
// INVALID_ARGUMENT naming `field` (the request's job field) and what the job is, and that a saved
// step can be given to `use` ("serve", "import") instead.
absl::StatusOr<std::string> FinalCheckpoint(const v1::Job& job, const std::string& field,
                                            const char* use) {
  if (!job.spec().has_training() || job.state() != v1::JOB_STATE_SUCCEEDED ||
      job.result().training().final_checkpoint().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": job ", job.job_id(),
                     " is not a training job that succeeded with a final checkpoint (it is ",
                     StateName(job.state()), job.spec().has_training() ? "" : ", and not training",
                     "); give training_job_step to ", use, " one of its saved steps"));
  }
  return job.result().training().final_checkpoint();
}

// Where a deployment of `key` pins step `step` of the training job `job`: <its checkpoint root>/
// pinned/step-<step>-<16 hex>, the hex from SHA-256 of the tenant and the idempotency key, so that
// a retry of the submit resolves to the same spec (and finds its pin); random without a key (a
// request the validation then refuses: the caller removes the pin).
std::string PinFolder(const v1::Job& job, int64_t step, const std::string& tenant,
                      const std::string& key) {
  std::string tag;
  if (!key.empty()) {
    absl::StatusOr<std::string> digest =
        model::Sha256Hex(absl::StrCat(api::TenantOrDefault(tenant), "\n", key));
    if (digest.ok()) tag = digest->substr(0, 16);
  }
  if (tag.empty()) {
    std::random_device random;
    tag = absl::StrCat(absl::Hex((uint64_t{random()} << 32) | random(), absl::kZeroPad16));
  }
  return absl::StrCat(api::TrainingCheckpointDir(job.spec().training(), job.job_id()),
                      "/pinned/step-", step, "-", tag);
}

}  // namespace

absl::StatusOr<v1::Job> Coordinator::TenantJob(const std::string& tenant, const std::string& job_id,
                                               const std::string& field) {
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  get.set_max_events(1);
  absl::StatusOr<v1::Job> job = GetJob(get);
  if (!job.ok() || api::TenantOrDefault(job->spec().tenant()) != api::TenantOrDefault(tenant)) {
    return absl::NotFoundError(
        absl::StrCat(field, ": no job ", api::Quote(job_id), " of this tenant"));
  }
  return job;
}

absl::Status Coordinator::ResolveDeployment(const std::string& idempotency_key, v1::JobSpec* spec,
                                            std::string* new_pin) {
  v1::DeploymentSpec* d = spec->mutable_deployment();
  d->clear_model_config_json();
  d->clear_checkpoint_pinned();
  if (d->training_job_step() != 0 && d->training_job_id().empty()) {
    return absl::InvalidArgumentError(
        "spec.deployment.training_job_step: only with training_job_id (a step of its checkpoints)");
  }
  if (d->training_job_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.deployment.training_job_step: must be >= 1 (0: the final checkpoint), "
                     "got ",
                     d->training_job_step()));
  }
  if (d->model_version() != 0 && d->model().empty()) {
    return absl::InvalidArgumentError(
        "spec.deployment.model_version: only with model (a version of a registered model)");
  }
  if (!d->model().empty()) {
    if (!d->checkpoint().empty() || !d->training_job_id().empty()) {
      return absl::InvalidArgumentError(
          "spec.deployment: give one of model, checkpoint and training_job_id");
    }
    if (d->model_version() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.deployment.model_version: must be >= 1 (0: the newest), got ", d->model_version()));
    }
    absl::StatusOr<v1::RegisteredModel> m =
        registry_->Get(spec->tenant(), d->model(), d->model_version());
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("spec.deployment.model: ", m.status().message()));
    }
    d->set_checkpoint(m->folder());
    d->set_model_version(m->version());
  }
  if (!d->training_job_id().empty()) {
    if (!d->checkpoint().empty()) {
      return absl::InvalidArgumentError(
          "spec.deployment: give checkpoint or training_job_id, not both");
    }
    absl::StatusOr<v1::Job> job =
        TenantJob(spec->tenant(), d->training_job_id(), "spec.deployment.training_job_id");
    if (!job.ok()) return job.status();
    if (d->training_job_step() > 0) {
      // A job that has not ended may still prune the step (keep_last): it is pinned. A retry
      // finds the pin its first call made, whatever became of the job and the step since.
      const std::string pin =
          PinFolder(*job, d->training_job_step(), spec->tenant(), idempotency_key);
      const bool pinned_before = !idempotency_key.empty() && std::filesystem::exists(absl::StrCat(
                                                                 pin, "/", model::kManifestFile));
      if (pinned_before) {
        d->set_checkpoint(pin);
        d->set_checkpoint_pinned(true);
      } else {
        absl::StatusOr<std::string> folder = TrainingJobCheckpoint(
            *job, d->training_job_step(), "spec.deployment.training_job_step");
        if (!folder.ok()) return folder.status();
        d->set_checkpoint(*folder);
        if (!IsTerminal(job->state())) {
          absl::Status s = model::PinCheckpoint(*folder, pin);
          if (absl::IsAlreadyExists(s)) {
            // A retry racing its first call, which made the pin (and owns it).
            d->set_checkpoint(pin);
            d->set_checkpoint_pinned(true);
          } else if (absl::IsNotFound(s) || absl::IsDataLoss(s)) {
            return absl::InvalidArgumentError(
                absl::StrCat("spec.deployment.training_job_step: step ", d->training_job_step(),
                             " of job ", job->job_id(), " was pruned while it was being pinned (",
                             s.message(), "); deploy a newer step"));
          } else if (!s.ok()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "spec.deployment.training_job_step: cannot pin step ", d->training_job_step(),
                " of job ", job->job_id(), ", which is still ", StateName(job->state()),
                " and may prune it (", s.message(),
                "): the coordinator needs write access to the job's checkpoint folder, on the "
                "file system of its steps"));
          } else {
            *new_pin = pin;
            d->set_checkpoint(pin);
            d->set_checkpoint_pinned(true);
          }
        }
      }
    } else {
      absl::StatusOr<std::string> final_checkpoint =
          FinalCheckpoint(*job, "spec.deployment.training_job_id", "serve");
      if (!final_checkpoint.ok()) return final_checkpoint.status();
      d->set_checkpoint(*final_checkpoint);
    }
  }
  if (d->checkpoint().empty()) {
    return absl::InvalidArgumentError(
        "spec.deployment.checkpoint: required (a checkpoint step folder or an imported model's "
        "folder), or training_job_id");
  }
  absl::StatusOr<model::ModelFolder> folder =
      model::ModelFolder::Open(d->checkpoint(), /*verify_checksums=*/false);
  if (!folder.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.deployment.checkpoint: ", api::Quote(d->checkpoint()), ": ",
        folder.status().message(),
        " (the coordinator reads the model's config from it at submit, the workers its weights)"));
  }
  // The tensors against the config's layout, from the headers (a model that cannot load is
  // refused now, not when a worker tries). A config that does not parse is the kind's to name.
  absl::StatusOr<model::LongNetConfig> config = model::ParseConfigJson(folder->model_config_json());
  if (config.ok()) {
    absl::StatusOr<model::ParamLayout> layout = model::BuildParamLayout(*config);
    if (layout.ok()) {
      if (absl::Status s = folder->CheckWeights(*layout); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.deployment.checkpoint: ", s.message()));  // It names the file.
      }
    }
  }
  d->set_model_config_json(folder->model_config_json());
  return absl::OkStatus();
}

// -------------------------------------------------------------------------------------------------
// The model registry.

absl::StatusOr<v1::RegisteredModel> Coordinator::ImportModel(
    const v1::ImportModelRequest& request, const std::function<bool()>& cancelled) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/true); !s.ok()) return s;
  }
  if (!request.path().empty() && !request.training_job_id().empty()) {
    return absl::InvalidArgumentError("give path or training_job_id, not both");
  }
  if (request.training_job_step() != 0 && request.training_job_id().empty()) {
    return absl::InvalidArgumentError(
        "training_job_step: only with training_job_id (a step of its checkpoints)");
  }
  if (request.training_job_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training_job_step: must be >= 1 (0: the final checkpoint), got ",
                     request.training_job_step()));
  }
  if (absl::Status s = CheckModelName(request.name()); !s.ok()) return s;
  if (!request.path().empty()) {
    return registry_->Import(request.tenant(), request.name(), request.path(),
                             absl::StrCat("folder ", request.path()), "path", request.description(),
                             cancelled);
  }
  if (request.training_job_id().empty()) {
    return absl::InvalidArgumentError(
        "path: required (a model folder the coordinator can read), or training_job_id");
  }
  absl::StatusOr<v1::Job> job =
      TenantJob(request.tenant(), request.training_job_id(), "training_job_id");
  if (!job.ok()) return job.status();
  const int64_t step = request.training_job_step();
  absl::StatusOr<std::string> found = step > 0
                                          ? TrainingJobCheckpoint(*job, step, "training_job_step")
                                          : FinalCheckpoint(*job, "training_job_id", "import");
  if (!found.ok()) return found.status();
  const std::string folder = *found;
  // A step the job prunes while it is copied fails the copy (NOT_FOUND, DATA_LOSS): said so.
  const std::string source = absl::StrCat(
      "training job ", job->job_id(), step > 0 ? absl::StrCat(" step ", step) : " final checkpoint",
      " (", folder, ")");
  absl::StatusOr<v1::RegisteredModel> imported =
      registry_->Import(request.tenant(), request.name(), folder, source, "training_job_id",
                        request.description(), cancelled);
  if (!imported.ok() &&
      (absl::IsNotFound(imported.status()) || absl::IsDataLoss(imported.status()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("training_job_id: ", source, " went away while it was copied (",
                     imported.status().message(), "); import a newer step"));
  }
  return imported;
}

absl::StatusOr<v1::ListModelsResponse> Coordinator::ListModels(
    const v1::ListModelsRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  v1::ListModelsResponse response;
  for (v1::RegisteredModel& m : registry_->List(request.tenant(), request.name())) {
    *response.add_models() = std::move(m);
  }
  return response;
}

absl::StatusOr<v1::DeleteModelResponse> Coordinator::DeleteModel(
    const v1::DeleteModelRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  if (request.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: must be >= 1 (0: every version), got ", request.version()));
  }
  // No deployment of the model is being submitted meanwhile (SubmitJob reads this lock).
  absl::WriterMutexLock models(&model_use_mu_);
  // The deployments that have not ended and serve the version's folder.
  ListFilter active;
  active.kind = "deployment";
  active.tenant = api::TenantOrDefault(request.tenant());
  active.states = {v1::JOB_STATE_QUEUED, v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING};
  std::map<std::string, std::vector<std::string>> users;  // folder -> job ids
  std::string token;
  do {
    absl::StatusOr<ListPage> page = store_->List(active, api::kMaxPageSize, token);
    if (!page.ok()) return page.status();
    for (const StoredJob& stored : page->jobs) {
      users[stored.job.spec().deployment().checkpoint()].push_back(stored.job.job_id());
    }
    token = page->next_page_token;
  } while (!token.empty());
  return registry_->Delete(
      request.tenant(), request.name(), request.version(),
      [&users](const v1::RegisteredModel& m) -> absl::StatusOr<std::vector<std::string>> {
        auto it = users.find(m.folder());
        return it == users.end() ? std::vector<std::string>{} : it->second;
      });
}

absl::StatusOr<v1::SubmitJobResponse> Coordinator::Submit(
    const v1::SubmitJobRequest& request, std::vector<v1::JobSpec> sizes,
    const std::function<void(const v1::Job&)>& on_adopt) {
  absl::StatusOr<AnalyzedSpec> spec = ValidateSubmitJobRequest(request, kinds_);
  if (!spec.ok()) return spec.status();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/true); !s.ok()) return s;
    if (absl::Status s = CheckWritableLocked(); !s.ok()) return s;
  }
  // A retry of an accepted job is answered whatever the cluster looks like now.
  absl::StatusOr<StoredJob> existing =
      store_->GetJobByKey(request.spec().tenant(), request.idempotency_key());
  if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();

  v1::Job job;
  *job.mutable_spec() = request.spec();
  std::string sized;     // How a spec sized to the cluster was sized (the "submitted" event).
  bool checked = false;  // Found feasible against ready workers (not merely accepted for later).
  {
    absl::MutexLock lock(&mu_);
    if (!existing.ok()) {
      const int64_t ready = workers_.ReadyCount();
      if (sizes.empty()) sizes = spec->kind->Sizes(request.spec(), *spec->analysis);
      const bool training = request.spec().has_training();
      if (!sizes.empty()) {
        // The first size (in the order given: the largest data-parallel degree of a training job,
        // the fewest ranks of an Attend call) whose gang the ready workers can hold (each size is
        // analysed: its memory plan depends on it).
        if (ready == 0) {
          return absl::FailedPreconditionError(
              training ? "spec.training.auto_data_parallel: no worker is ready to size the job "
                         "by; submit it again once workers have registered, or give "
                         "spec.training.data_parallel"
                       : "start.num_ranks = 0: no worker is ready to size the call by; call "
                         "again once workers have registered, or give start.num_ranks");
        }
        const std::vector<scheduler::WorkerInfo> view = workers_.View(/*for_placement=*/false);
        absl::Status last = absl::OkStatus();
        std::vector<std::string> tried;
        for (const v1::JobSpec& candidate : sizes) {
          absl::StatusOr<AnalyzedSpec> analyzed = AnalyzeJobSpec(candidate, kinds_);
          absl::Status fits = analyzed.ok()
                                  ? dispatcher_.CheckFeasible(*analyzed->analysis, view, ready)
                                  : analyzed.status();
          tried.push_back(
              absl::StrCat(training ? candidate.training().data_parallel() *
                                          std::max(1, candidate.training().sequence_parallel())
                                    : candidate.attention().num_ranks()));
          if (fits.ok()) {
            *spec = *std::move(analyzed);
            *job.mutable_spec() = candidate;
            sized =
                training
                    ? absl::StrCat("; auto_data_parallel: ", candidate.training().data_parallel(),
                                   ", the largest data-parallel degree (of ranks ",
                                   absl::StrJoin(tried, ", "), " tried, largest first) whose ",
                                   spec->analysis->num_ranks, " ranks the ", ready,
                                   " ready workers can hold")
                    : absl::StrCat("; ", spec->analysis->num_ranks, " ranks: the fewest (of ",
                                   absl::StrJoin(tried, ", "), " tried) whose ring the ", ready,
                                   " ready workers can hold");
            break;
          }
          last = fits;
        }
        if (sized.empty()) return last;
      }
      // Quotas count only what would create a job: a retry of an accepted one was answered above.
      const std::string tenant = api::TenantOrDefault(request.spec().tenant());
      // The count scans the book (O(active jobs) per new job), only when the quota is on.
      int64_t queued = 0;
      const bool deployment = job.spec().has_deployment();
      int64_t deployments = deployment ? 0 : -1;
      if (quotas_.options().max_queued_jobs > 0 ||
          (deployment && quotas_.options().max_deployments > 0)) {
        for (const JobRun* run : book_.Runs()) {
          if (run->terminal || api::TenantOrDefault(run->job.spec().tenant()) != tenant) continue;
          queued += run->job.state() == v1::JOB_STATE_QUEUED;
          if (deployment) deployments += run->job.spec().has_deployment();
        }
      }
      if (absl::Status s =
              quotas_.Admit(tenant, queued, spec->analysis->num_ranks, Now(), deployments);
          !s.ok()) {
        return s;
      }
      const std::vector<scheduler::WorkerInfo> view = workers_.View(/*for_placement=*/false);
      absl::Status feasible = dispatcher_.CheckFeasible(*spec->analysis, view, ready);
      if (absl::IsResourceExhausted(feasible) && ready > 0 && sized.empty()) {
        // Out of memory before placing: the first rung of the kind's ladder (as far as the job's
        // recovery policy allows) that the ready workers can hold runs instead.
        std::vector<std::string> tried;
        for (LadderRung& rung : spec->kind->Ladder(job.spec(), *spec->analysis)) {
          absl::StatusOr<AnalyzedSpec> analyzed = AnalyzeJobSpec(rung.spec, kinds_);
          if (!analyzed.ok()) continue;  // A rung the spec's other rules forbid.
          const int ranks = analyzed->analysis->num_ranks;
          if (quotas_.options().max_running_ranks > 0 &&
              ranks > quotas_.options().max_running_ranks) {
            continue;  // More ranks than the tenant may ever hold.
          }
          tried.push_back(rung.change);
          if (dispatcher_.CheckFeasible(*analyzed->analysis, view, ready).ok()) {
            sized = absl::StrCat("; out of memory as asked (", feasible.message(),
                                 "); the recovery ladder runs it with ", rung.change, " (tried ",
                                 absl::StrJoin(tried, "; "), ")");
            *spec = *std::move(analyzed);
            *job.mutable_spec() = std::move(rung.spec);
            feasible = absl::OkStatus();
            break;
          }
        }
        if (!feasible.ok() && !tried.empty()) {
          feasible = absl::ResourceExhaustedError(
              absl::StrCat(feasible.message(), "; no rung of the recovery ladder fits either (",
                           absl::StrJoin(tried, "; "), ")"));
        }
      }
      if (!feasible.ok()) return feasible;
      checked = ready > 0;
    }
    job.set_job_id(NewId("j-"));
  }
  const absl::Time now = Now();
  if (!sized.empty()) *job.mutable_requested_spec() = request.spec();
  job.set_fitted_cluster(checked);
  job.set_idempotency_key(request.idempotency_key());
  job.set_state(v1::JOB_STATE_QUEUED);
  *job.mutable_create_time() = ToTimestamp(now);
  job.mutable_progress()->set_steps_total(spec->analysis->steps_total);
  v1::JobEvent event;
  event.set_kind("submitted");
  event.set_message(absl::StrCat("queued: ", spec->analysis->summary, sized));
  *event.mutable_time() = ToTimestamp(now);

  const absl::Time start = absl::Now();
  absl::StatusOr<SubmitOutcome> outcome = store_->Submit(job, event);
  metrics_->ObserveStoreCommit(absl::ToDoubleSeconds(absl::Now() - start));
  absl::MutexLock lock(&mu_);
  if (!outcome.ok()) {
    recorder_.NoteWriteFailure(outcome.status());
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
    if (on_adopt) on_adopt(outcome->job);
    AdoptLocked(StoredJob{outcome->job, outcome->submit_seq}, *spec, checked);
  }
  const JobRun* run = book_.Find(id);
  if (run != nullptr) {
    *response.mutable_job() = reader_.Public(*run);
  } else {
    *response.mutable_job() = outcome->job;
    StripTensors(kinds_, response.mutable_job());
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const v1::GetJobRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  return reader_.GetJob(request);
}

absl::Status Coordinator::JobNotFound(const std::string& job_id) const {
  return reader_.Explain(absl::NotFoundError(absl::StrCat("job \"", job_id, "\" not found")));
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  return reader_.ListJobs(request);
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
    StripTensors(kinds_, &job);
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
      // The store is read, and an active job's spec analysed, without the lock.
      mu_.Unlock();
      absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
      absl::StatusOr<AnalyzedSpec> spec = absl::UnknownError("not analysed");
      if (stored.ok() && !IsTerminal(stored->job.state())) {
        spec = AnalyzeJobSpec(stored->job.spec(), kinds_);
      }
      mu_.Lock();
      if (!stored.ok()) return stored.status();
      if (IsTerminal(stored->job.state())) return terminal_answer(stored->job);
      run = book_.Find(request.job_id());
      if (run == nullptr) {
        // Stored but not yet in memory: its SubmitJob is between the store and the queue.
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
    // Durable once the flush below succeeds; the public view would still show the state before.
    answer = runner_.Cancel(run, reason, &tickets);
  }
  if (absl::Status s = recorder_.Flush(tickets); !s.ok()) return s;
  return answer;
}

absl::Status Coordinator::WatchJob(const v1::WatchJobRequest& request, const JobEventSink& emit,
                                   const CancelledFn& cancelled) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  return reader_.WatchJob(request, emit, cancelled);
}

absl::Status Coordinator::ReadOutput(const v1::ReadOutputRequest& request,
                                     const TensorChunkSink& emit) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
  }
  return reader_.ReadOutput(request, emit);
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

namespace {

// An Attend call's field names: its start message stands where a job's spec stood.
absl::Status AsStartField(const absl::Status& status) {
  if (status.ok() || !absl::IsInvalidArgument(status)) return status;
  return absl::Status(
      status.code(),
      absl::StrReplaceAll(status.message(), {{"spec.attention.attention.", "start.attention."},
                                             {"spec.attention.", "start."},
                                             {"spec.", "start."}}));
}

// The code a failed job's reason carries ("... (code RESOURCE_EXHAUSTED)"); UNAVAILABLE (call
// again) when it names none (a lost worker).
absl::StatusCode FailureCode(const std::string& reason) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StrContains(reason, absl::StrCat("(code ", absl::StatusCodeToString(code), ")"))) {
      return code;
    }
  }
  return absl::StatusCode::kUnavailable;
}

}  // namespace

const TaskEntry* Coordinator::HeldTaskLocked(const std::string& worker_id,
                                             const std::string& task_id, const JobRun** run) {
  const TaskEntry* task = workers_.FindTask(task_id);
  const JobRun* job = task != nullptr ? book_.Find(task->job_id) : nullptr;
  if (task == nullptr || task->worker_id != worker_id || job == nullptr || job->terminal ||
      job->job.attempt() != task->attempt) {
    return nullptr;
  }
  *run = job;
  return task;
}

absl::StatusOr<int64_t> Coordinator::ServingDeployment(const std::string& job_id) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    const JobRun* run = book_.Find(job_id);
    if (run != nullptr && run->analysis != nullptr) {
      const DeploymentAnalysis* d = AsDeployment(*run->analysis);
      if (d == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id, " is not a deployment (it is ", run->kind->name(), ")"));
      }
      if (run->job.state() != v1::JOB_STATE_RUNNING || !router_.Serving(job_id)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "deployment ", job_id, " is not serving yet (", StateName(run->job.state()),
            run->job.state() == v1::JOB_STATE_RUNNING ? ", loading its model" : "",
            "); watch it with dattn status"));
      }
      return d->config.vocab_size;
    }
  }
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  get.set_max_events(1);
  absl::StatusOr<v1::Job> job = GetJob(get);
  if (!job.ok()) return job.status();
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", job_id,
      job->spec().has_deployment() ? " is a deployment that ended (" : " is not a deployment (",
      StateName(job->state()), ")"));
}

namespace {

// Token ids from `tokens` or, for byte-level models, from `text`: never both.
absl::StatusOr<std::vector<int32_t>> TokensOrText(
    const google::protobuf::RepeatedField<int32_t>& tokens, const std::string& text, int64_t vocab,
    const std::string& field, const std::string& text_field) {
  if (!tokens.empty() && !text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " and ", text_field, ": give one of them"));
  }
  if (!text.empty()) {
    if (vocab != 256) {
      return absl::InvalidArgumentError(absl::StrCat(
          text_field, ": text is for byte-level models (vocabulary 256); this one has ", vocab,
          " tokens: give ", field));
    }
    return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  return std::vector<int32_t>(tokens.begin(), tokens.end());
}

}  // namespace

absl::Status Coordinator::Generate(const v1::GenerateRequest& request,
                                   const std::function<bool(const v1::GenerateResponse&)>& emit,
                                   const CancelledFn& cancelled, absl::Duration timeout) {
  if (request.deployment_id().empty()) {
    return absl::InvalidArgumentError("deployment_id: required");
  }
  absl::StatusOr<int64_t> vocab = ServingDeployment(request.deployment_id());
  if (!vocab.ok()) return vocab.status();
  if (request.priority() < api::kMinPriority || request.priority() > api::kMaxPriority) {
    return absl::InvalidArgumentError(absl::StrCat("priority: must be ", api::kMinPriority, " .. ",
                                                   api::kMaxPriority, ", got ",
                                                   request.priority()));
  }
  v1::ServeWork work;
  v1::GenerateRequest* g = work.mutable_generate();
  *g = request;
  absl::StatusOr<std::vector<int32_t>> prompt =
      TokensOrText(request.prompt(), request.prompt_text(), *vocab, "prompt", "prompt_text");
  if (!prompt.ok()) return prompt.status();
  g->clear_prompt_text();
  g->mutable_prompt()->Assign(prompt->begin(), prompt->end());
  for (int i = 0; i < request.stop_text_size(); ++i) {
    google::protobuf::RepeatedField<int32_t> none;
    absl::StatusOr<std::vector<int32_t>> stop = TokensOrText(
        none, request.stop_text(i), *vocab, "stop", absl::StrCat("stop_text[", i, "]"));
    if (!stop.ok()) return stop.status();
    if (stop->empty()) return absl::InvalidArgumentError(absl::StrCat("stop_text[", i, "]: empty"));
    g->add_stop()->mutable_tokens()->Assign(stop->begin(), stop->end());
  }
  g->clear_stop_text();
  if (timeout != absl::InfiniteDuration()) {
    work.set_timeout_seconds(std::max(1e-3, absl::ToDoubleSeconds(timeout)));
  }
  const absl::Time start = absl::Now();
  absl::Time first_token = absl::InfinitePast();
  absl::Status status = router_.Call(
      request.deployment_id(), std::move(work),
      [&](const v1::ServeUpdate& u) {
        v1::GenerateResponse response;
        if (u.has_token()) {
          if (first_token == absl::InfinitePast()) first_token = absl::Now();
          *response.mutable_token() = u.token();
        } else if (u.has_done()) {
          v1::GenerateDone* done = response.mutable_done();
          *done = u.done();
          const absl::Time end = absl::Now();
          done->set_first_token_seconds(first_token == absl::InfinitePast()
                                            ? 0.0
                                            : absl::ToDoubleSeconds(first_token - start));
          done->set_seconds(absl::ToDoubleSeconds(end - start));
          metrics_->ObserveGenerate(request.deployment_id(), *done,
                                    done->generated_tokens() >= 2
                                        ? absl::ToDoubleSeconds(end - first_token) /
                                              static_cast<double>(done->generated_tokens() - 1)
                                        : -1.0);
        } else {
          return true;
        }
        return emit(response);
      },
      cancelled,
      [&](int64_t id) {
        v1::GenerateResponse accepted;
        accepted.set_accepted(absl::StrCat(request.deployment_id(), "/", id));
        return emit(accepted);
      });
  metrics_->CountServing(request.deployment_id(), "generate", status.code());
  return status;
}

absl::StatusOr<v1::ScoreResponse> Coordinator::Score(const v1::ScoreRequest& request,
                                                     const CancelledFn& cancelled) {
  if (request.deployment_id().empty()) {
    return absl::InvalidArgumentError("deployment_id: required");
  }
  absl::StatusOr<int64_t> vocab = ServingDeployment(request.deployment_id());
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<std::vector<int32_t>> tokens =
      TokensOrText(request.tokens(), request.text(), *vocab, "tokens", "text");
  if (!tokens.ok()) return tokens.status();
  for (size_t i = 0; i < tokens->size(); ++i) {
    if ((*tokens)[i] < 0 || (*tokens)[i] >= *vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens[", i, "]: ", (*tokens)[i], " is outside the vocabulary [0, ", *vocab, ")"));
    }
  }
  v1::ServeWork work;
  work.mutable_score()->set_deployment_id(request.deployment_id());
  work.mutable_score()->mutable_tokens()->Assign(tokens->begin(), tokens->end());
  v1::ScoreResponse response;
  absl::Status s = router_.Call(
      request.deployment_id(), std::move(work),
      [&](const v1::ServeUpdate& u) {
        if (u.has_score()) response = u.score();
        return true;
      },
      cancelled);
  metrics_->CountServing(request.deployment_id(), "score", s.code());
  if (!s.ok()) return s;
  return response;
}

absl::Status Coordinator::Serve(const v1::ServeUpdate& first,
                                const std::function<bool(v1::ServeUpdate*)>& next,
                                const std::function<bool(const v1::ServeWork&)>& send,
                                const CancelledFn& cancelled,
                                const std::function<void()>& end_stream) {
  std::string job_id;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    const JobRun* run = nullptr;
    const TaskEntry* task = HeldTaskLocked(first.worker_id(), first.task_id(), &run);
    if (task == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "task ", first.task_id(), " is not a task worker ", first.worker_id(), " holds now"));
    }
    if (run->analysis == nullptr || AsDeployment(*run->analysis) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("task ", first.task_id(), ": job ",
                                                        run->job.job_id(), " is not a deployment"));
    }
    job_id = task->job_id;
  }
  return router_.Serve(job_id, next, send, cancelled, end_stream);
}

absl::Status Coordinator::ReadInput(const v1::ReadInputRequest& request,
                                    const AttendChunkSink& send, const CancelledFn& cancelled) {
  std::string job_id;
  int rank = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    const JobRun* run = nullptr;
    const TaskEntry* task = HeldTaskLocked(request.worker_id(), request.task_id(), &run);
    if (task == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "task ", request.task_id(), " is not a task worker ", request.worker_id(), " holds now"));
    }
    if (!run->analysis->runs_once) {
      return absl::FailedPreconditionError(
          absl::StrCat("task ", request.task_id(), ": job ", run->job.job_id(),
                       " is not streamed (its ranks make their inputs from its seed)"));
    }
    job_id = task->job_id;
    rank = task->rank;
  }
  std::shared_ptr<AttendSession> session = relay_.Find(job_id);
  if (session == nullptr) {
    return absl::CancelledError(
        absl::StrCat("job ", job_id, "'s Attend call ended; its ranks are being cancelled"));
  }
  return session->ReadInput(rank, send, cancelled);
}

std::optional<std::string> Coordinator::CancelRequested(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  const JobRun* run = book_.Find(job_id);
  if (run == nullptr || !run->cancel_requested) return std::nullopt;
  return run->cancel_reason;
}

std::optional<v1::Job> Coordinator::EndedJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::Job> job = reader_.GetJob(request);
  if (!job.ok() || !IsTerminal(job->state())) return std::nullopt;
  return *std::move(job);
}

absl::Status Coordinator::Attend(const v1::AttendRequest& first, const AttendSource& next,
                                 const AttendSink& emit, const CancelledFn& cancelled,
                                 const std::function<void()>& end_call) {
  if (first.message_case() != v1::AttendRequest::kStart) {
    return absl::InvalidArgumentError(
        "start: required in the first message of an Attend call (the chunks of q, k, v follow)");
  }
  const v1::AttendStart& start = first.start();
  if (start.num_ranks() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start.num_ranks: must be >= 0 (0: the fewest ranks that fit), got ", start.num_ranks()));
  }
  if (start.has_shared_memory() && !options_.attend_shared_memory) {
    return absl::FailedPreconditionError(
        absl::StrCat("start.shared_memory: this coordinator takes no shared memory (",
                     start.shared_memory().name().substr(0, 64),
                     "); start it with --attend-shared-memory, or stream the tensors"));
  }
  v1::SubmitJobRequest submit;
  v1::JobSpec& spec = *submit.mutable_spec();
  spec.set_name(start.name());
  spec.set_tenant(start.tenant());
  spec.set_priority(start.priority());
  v1::AttentionJobSpec& work = *spec.mutable_attention();
  *work.mutable_attention() = start.attention();
  *work.mutable_shape() = start.shape();
  work.set_dtype(start.dtype());
  work.set_num_ranks(std::max(1, start.num_ranks()));
  work.set_pass(start.backward() ? v1::PASS_FORWARD_BACKWARD : v1::PASS_FORWARD);
  work.set_iterations(1);
  work.set_device(start.device());
  work.set_streamed(true);
  if (start.has_shared_memory()) *work.mutable_shared_memory() = start.shared_memory();
  // num_ranks 0: every ring size P dividing N, fewest first; the first the ready workers hold.
  std::vector<v1::JobSpec> sizes;
  if (start.num_ranks() == 0) {
    const int64_t n = start.shape().seq_len();
    for (int p = 1; p <= api::kMaxRingRanks && p <= n; ++p) {
      if (n % p != 0) continue;
      sizes.push_back(spec);
      sizes.back().mutable_attention()->set_num_ranks(p);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    submit.set_idempotency_key(NewId("attend-"));
  }
  std::shared_ptr<AttendSession> session;
  absl::StatusOr<v1::SubmitJobResponse> submitted =
      Submit(submit, std::move(sizes), [&](const v1::Job& job) {
        const v1::AttentionJobSpec& a = job.spec().attention();
        AttendShape shape;
        shape.batch = a.shape().batch();
        shape.seq_len = a.shape().seq_len();
        shape.num_heads = a.shape().num_heads();
        shape.head_dim = a.shape().head_dim();
        absl::StatusOr<DType> dtype = api::ToEngineDType(a.dtype());
        shape.element_bytes = dtype.ok() ? static_cast<int64_t>(DTypeSize(*dtype)) : 1;
        shape.num_ranks = a.num_ranks();
        shape.backward = a.pass() == v1::PASS_FORWARD_BACKWARD;
        shape.shared_memory = a.has_shared_memory();
        session = std::make_shared<AttendSession>(shape);
        relay_.Add(job.job_id(), session);
      });
  if (!submitted.ok()) return AsStartField(submitted.status());
  const std::string job_id = submitted->job().job_id();
  if (session == nullptr) {
    // Only a key collision could find an existing job: the key is new for every call.
    return absl::InternalError(
        absl::StrCat("Attend: job ", job_id, " was not created by this call"));
  }
  metrics_->AttendStarted();
  auto is_cancelled = [&cancelled] { return cancelled && cancelled(); };
  absl::Status end;  // Why the call ends before its job: set by this thread only.
  v1::AttendResponse accepted;
  accepted.mutable_accepted()->set_job_id(job_id);
  accepted.mutable_accepted()->set_num_ranks(submitted->job().spec().attention().num_ranks());
  if (!emit(accepted)) end = absl::CancelledError("the client went away");

  // The inputs, on a thread of their own: each chunk goes on to its ranks as it comes.
  absl::Notification reader_done;
  std::atomic<int64_t> bytes_in{0};
  std::thread reader([&] {
    v1::AttendRequest message;
    absl::Status status;
    for (int64_t count = 2; status.ok() && !session->InputsComplete(); ++count) {
      if (!next(&message)) {
        status = session->FinishInputs();
        break;
      }
      if (message.message_case() != v1::AttendRequest::kChunk) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "message ", count, " of the call: after start, every message carries a chunk"));
        break;
      }
      bytes_in += static_cast<int64_t>(message.chunk().data().size());
      status = session->PushInput(message.chunk(), is_cancelled);
    }
    if (!status.ok()) {
      session->Close(status);
      // The rest of what the client sends is read and dropped, so that the call can end with
      // this status rather than be cancelled under a client still sending (see below).
      while (next(&message)) {
      }
    }
    reader_done.Notify();
  });

  // The outputs, in the caller's order, as the ranks send them; the job's state is checked
  // whenever nothing comes for a while.
  int64_t bytes_out = 0;
  std::optional<v1::Job> ended;
  while (end.ok()) {
    v1::AttendResponse response;
    absl::Status s = session->NextOutput(response.mutable_chunk(),
                                         absl::Now() + absl::Milliseconds(200), is_cancelled);
    if (s.ok()) {
      bytes_out += static_cast<int64_t>(response.chunk().data().size());
      if (!emit(response)) end = absl::CancelledError("the client went away");
      continue;
    }
    if (absl::IsNotFound(s)) break;  // Every output went out.
    if (absl::IsDeadlineExceeded(s)) {
      ended = EndedJob(job_id);
      if (ended.has_value()) break;  // Ended without its outputs: its state says why.
      if (std::optional<std::string> why = CancelRequested(job_id); why.has_value()) {
        // Cancelled by someone else (dattn cancel): its ranks may be waiting for the caller's
        // chunks; closing the session ends their reads, so they stop and the cancel completes.
        end = absl::CancelledError(absl::StrCat("job ", job_id, " was cancelled: ", *why));
      }
      continue;
    }
    end = is_cancelled() ? absl::CancelledError(
                               "the call was cancelled (the client went away or "
                               "its deadline passed)")
                         : s;
  }
  // Every output went out: the ranks' reports end the job (each rank reports after its uploads).
  while (end.ok() && !ended.has_value()) {
    if (is_cancelled()) {
      end = absl::CancelledError(
          "the call was cancelled (the client went away or its deadline "
          "passed)");
      break;
    }
    ended = EndedJob(job_id);
    if (!ended.has_value()) absl::SleepFor(absl::Milliseconds(10));
  }
  if (!end.ok()) {
    // The job stops at once: its ranks are cancelled and free their memory.
    v1::CancelJobRequest cancel;
    cancel.set_job_id(job_id);
    cancel.set_reason(std::string(end.message()).substr(0, api::kMaxCancelReasonLength));
    (void)CancelJob(cancel);
  }
  session->Close(end.ok() ? absl::CancelledError("the Attend call ended") : end);
  // A reader still waiting for the client must be woken before the call ends. A client that is
  // still sending gets a moment to finish (its chunks are dropped), so that it sees the call's
  // error; after that, or at once when the client is gone, the call is cancelled under it.
  if (!reader_done.HasBeenNotified() && !is_cancelled()) {
    reader_done.WaitForNotificationWithTimeout(absl::Seconds(2));
  }
  if (!reader_done.HasBeenNotified() && end_call) end_call();
  reader.join();
  relay_.Remove(job_id);

  absl::Status answer = end;
  if (answer.ok()) {
    const v1::Job& job = *ended;
    if (job.state() == v1::JOB_STATE_SUCCEEDED) {
      if (!session->OutputsDone()) {
        answer = absl::InternalError(
            absl::StrCat("job ", job_id, " succeeded but not every output came from its ranks"));
      } else {
        v1::AttendResponse done;
        *done.mutable_done() = job.result().attention();
        if (!emit(done)) answer = absl::CancelledError("the client went away");
      }
    } else if (job.state() == v1::JOB_STATE_CANCELLED) {
      answer = absl::CancelledError(absl::StrCat("job ", job_id, " ", job.state_reason()));
    } else {
      answer = absl::Status(FailureCode(job.state_reason()),
                            absl::StrCat("job ", job_id, " failed: ", job.state_reason()));
    }
  }
  const std::string tenant = api::TenantOrDefault(start.tenant());
  metrics_->AttendEnded(tenant, answer.code(), bytes_in, bytes_out);
  metrics_->NoteAttendBuffered(session->peak_buffered_bytes());
  if (ended.has_value() && ended->has_start_time()) {
    metrics_->ObserveAttend(tenant,
                            absl::ToDoubleSeconds(FromTimestamp(ended->start_time()) -
                                                  FromTimestamp(ended->create_time())),
                            ended->state() == v1::JOB_STATE_SUCCEEDED
                                ? ended->result().attention().seconds_per_step()
                                : 0.0);
  }
  return answer;
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
      runner_.KillWorker(other,
                         absl::StrCat("the worker registered again as ", id, " (it restarted)"),
                         "worker_reregistered", &tickets);
    }
    workers_.Add(request, id, Now());
    dispatcher_.Kick();
    response.set_worker_id(id);
    response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  }
  if (absl::Status s = recorder_.Flush(tickets); !s.ok()) return s;
  return response;
}

std::string Coordinator::WorkerName(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  const WorkerEntry* worker = workers_.Find(worker_id);
  return worker != nullptr ? worker->info.name() : "";
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
  // A leaving worker (SIGTERM with --drain-wait-s) drains itself: nothing new is placed on it.
  if (request.draining() && worker->state == scheduler::WorkerState::kReady) {
    workers_.SetDraining(worker, true).IgnoreError();  // Not dead: checked above.
    Log(absl::StrCat("worker ", workers_.Describe(worker->info.worker_id()),
                     " is leaving: drained at its own request"));
  }
  const absl::Time now = Now();
  for (TaskEntry* task : workers_.Heartbeat(worker, request, now, options_.heartbeat_interval)) {
    const JobRun* run = book_.Find(task->job_id);
    if (run == nullptr || run->terminal) continue;
    workers_.Dispatch(task, dispatcher_.Assignment(*run, *task), now);
  }
  response.set_drain(worker->state == scheduler::WorkerState::kDraining);
  if (!dispatcher_.empty()) dispatcher_.Kick();
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
  dispatcher_.Kick();  // It may take work again.
  // Destroyed before `lock`, so with mu_ held: asserted, since the analysis cannot tell that
  // count.self->mu_ is this->mu_ at the returns.
  struct StreamCount {
    Coordinator* self;
    WorkerEntry* worker;
    ~StreamCount() {
      self->mu_.AssertHeld();
      self->workers_.CloseStream(worker);
    }
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
  if (request.state() == v1::TASK_STATE_SUCCEEDED && !request.has_rank_result() &&
      !request.has_training_result()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank_result (attention) or training_result (training): required with state "
                     "SUCCEEDED (task ",
                     request.task_id(), ")"));
  }
  // A ring rank that failed before its ring formed: ask the ring's store which ranks never
  // arrived, before taking the lock for the report itself (the answer is only used if the task is
  // still current then).
  std::optional<std::vector<int>> missing_ranks;
  if (request.state() == v1::TASK_STATE_FAILED && request.ring_formation_seconds() <= 0 &&
      !request.refused()) {
    std::string address, secret, ring_id;
    comm::StoreTls tls;
    int size = 0;
    {
      absl::MutexLock lock(&mu_);
      const TaskEntry* task = workers_.FindTask(request.task_id());
      const Ring* ring = task != nullptr ? rings_.Find(task->job_id) : nullptr;
      const JobRun* run = task != nullptr ? book_.Find(task->job_id) : nullptr;
      if (ring != nullptr && run != nullptr && run->job.attempt() == task->attempt &&
          !ring->is_formed()) {
        address = ring->address;
        secret = ring->secret;
        tls = rings_.options().tls;
        ring_id = ring->id;
        size = ring->size;
      }
    }
    if (!address.empty())
      missing_ranks = RingRendezvous::ProbeMissingRanks(address, secret, tls, ring_id, size);
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
      // A task the coordinator gave up on has ended there: its slot is free.
      const bool final_report = request.state() == v1::TASK_STATE_SUCCEEDED ||
                                request.state() == v1::TASK_STATE_FAILED ||
                                request.state() == v1::TASK_STATE_CANCELLED;
      if (worker != nullptr && final_report) {
        workers_.StoppedTask(worker, request.task_id());
        dispatcher_.Kick();
      }
      response.set_stop(true);
      return response;
    }
    JobRun* run = book_.Find(task->job_id);
    if (run == nullptr || run->terminal || run->job.attempt() != task->attempt) {
      response.set_stop(true);
      return response;
    }
    runner_.TakeReport(JobRunner::Report{&request, task, run, worker, std::move(missing_ranks)},
                       &tickets);
  }
  if (absl::Status s = recorder_.Flush(tickets); !s.ok()) return s;
  return response;
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
  bool streamed = false;
  v1::TensorHeader expected;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPhaseLocked(/*submit=*/false); !s.ok()) return s;
    const JobRun* run = nullptr;
    const TaskEntry* task = HeldTaskLocked(first.worker_id(), first.task_id(), &run);
    if (task == nullptr) {
      response.set_stop(true);
      return response;
    }
    if (!run->analysis->keeps_output && !run->analysis->runs_once) {
      return absl::FailedPreconditionError(
          absl::StrCat("task ", first.task_id(), ": job ", run->job.job_id(),
                       " keeps no output (it was submitted without return_output)"));
    }
    expected = run->kind->ShardHeader(*run->analysis, task->rank);
    job_id = task->job_id;
    attempt = task->attempt;
    rank = task->rank;
    streamed = run->analysis->runs_once;
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
  if (streamed) {
    // An Attend job's output goes on to its call as it arrives (attend_relay.h).
    std::shared_ptr<AttendSession> session = relay_.Find(job_id);
    if (session == nullptr) {
      response.set_stop(true);  // The call ended: the job is being cancelled.
      return response;
    }
    const v1::AttendTensor tensor =
        first.tensor() == v1::ATTEND_TENSOR_UNSPECIFIED ? v1::ATTEND_TENSOR_OUT : first.tensor();
    v1::UploadOutputRequest message = first;
    for (bool more = true; more; more = next(&message)) {
      v1::TensorChunk* chunk = message.mutable_chunk();
      absl::Status s = session->PushOutput(rank, tensor, chunk->offset(),
                                           std::move(*chunk->mutable_data()), nullptr);
      if (!s.ok()) {
        if (absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) return s;
        response.set_stop(true);  // The call ended meanwhile.
        return response;
      }
    }
    return response;
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
  if (out.ok()) dispatcher_.Kick();
  return out;
}

// -------------------------------------------------------------------------------------------------
// Threads.

void Coordinator::ReapStores() {
  std::vector<std::unique_ptr<comm::TcpStoreServer>> stores;
  std::vector<std::string> pins;
  {
    absl::MutexLock lock(&mu_);
    stores = rings_.TakeRetired();
    pins = runner_.TakeRetiredPins();
  }
  stores.clear();  // Closes their connections and joins their threads.
  for (const std::string& pin : pins) {
    if (absl::Status s = model::RemoveCheckpointPin(pin); !s.ok()) {
      Log(absl::StrCat("could not remove the checkpoint pin ", pin,
                       " of an ended deployment: ", s.message()));
    }
  }
}

void Coordinator::SchedulePass() {
  ReapStores();
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != Phase::kServing || !recorder_.store_error().ok()) return;
    const absl::Time now = Now();
    for (const Dispatcher::Verdict& v :
         dispatcher_.Check(now, workers_.ReadySet(), book_.Runs(), workers_.View(false))) {
      tickets.push_back(runner_.Transition(v.run, v1::JOB_STATE_FAILED, "failed", v.reason));
    }
    if (dispatcher_.Settled(now)) runner_.ShrinkStranded(&tickets);
    dispatcher_.Place(now, &tickets);
  }
  // Workers hear of a placement only once it is durable: after a crash in between, the restarted
  // coordinator neither loses the job nor has a worker running a placement it does not know. One
  // job's failed write (logged by the book) holds back that job only, not the rest of the pass.
  recorder_.Flush(tickets).IgnoreError();
  absl::MutexLock lock(&mu_);
  dispatcher_.Dispatch(Now());
}

void Coordinator::SchedulerLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!dispatcher_.TakeKick() && !threads_stop_) {
        clock_->WaitUntil(dispatcher_.kick_cv(), &mu_, Now() + absl::Seconds(1));
        dispatcher_.TakeKick();
      }
      if (threads_stop_) return;
    }
    SchedulePass();
  }
}

void Coordinator::MonitorPass() {
  ReapStores();
  if (recorder_.CheckStore()) {
    // A submit whose commit failed for its client may still have reached the file (the client
    // then retries with its idempotency key and is told the job exists): such a job is queued, so
    // that no acknowledged job waits unseen.
    for (const StoredJob& stored : recorder_.QueuedNotInBook()) {
      absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(stored.job.spec(), kinds_);
      if (!spec.ok()) continue;
      absl::MutexLock lock(&mu_);
      Log(absl::StrCat("job ", stored.job.job_id(), " was stored while the store failed; queued"));
      AdoptLocked(stored, *spec, /*checked=*/false);
    }
  }
  recorder_.RetryStalled();
  Tickets tickets;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kNew || phase_ == Phase::kClosed || !recorder_.store_error().ok()) return;
    const absl::Time now = Now();
    for (WorkerEntry* worker : workers_.Silent(now, options_.dead_after)) {
      runner_.KillWorker(worker,
                         absl::StrCat("no heartbeat for ", Seconds(now - worker->last_heartbeat),
                                      " (dead after ", Seconds(options_.dead_after), ")"),
                         "worker_lost", &tickets);
    }
    runner_.RecoverStalled(&tickets);
    workers_.ForgetDead(now, options_.dead_worker_retention);
  }
  recorder_.Flush(tickets).IgnoreError();  // A failed write shows in Health() until it recovers.
  recorder_.Expire();
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
