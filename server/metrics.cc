#include "server/metrics.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "metrics/buckets.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/job_state.h"

namespace dattn {
namespace server {
namespace {

constexpr v1::JobState kAllStates[] = {
    v1::JOB_STATE_QUEUED,    v1::JOB_STATE_PLACED, v1::JOB_STATE_RUNNING,
    v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED,
};

std::string Str(absl::string_view s) { return std::string(s); }

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  jobs_ = &prometheus::BuildGauge()
               .Name("dattn_jobs")
               .Help(
                   "Jobs in the store per kind and state (unit: jobs). Terminal jobs stay counted; "
                   "set from the store at start-up, then moved on every state change.")
               .Register(*registry_);
  submitted_ = &prometheus::BuildCounter()
                    .Name("dattn_jobs_submitted_total")
                    .Help(
                        "Jobs created by SubmitJob (unit: jobs). An idempotent retry that returns "
                        "an existing job does not count.")
                    .Register(*registry_);
  finished_ = &prometheus::BuildCounter()
                   .Name("dattn_jobs_finished_total")
                   .Help(
                       "Jobs that reached a terminal state (succeeded, failed, cancelled), "
                       "counted once per job (unit: jobs).")
                   .Register(*registry_);
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("dattn_queue_depth")
                      .Help("Jobs waiting in the scheduler queue for placement (unit: jobs).")
                      .Register(*registry_)
                      .Add({});
  job_duration_ =
      &prometheus::BuildHistogram()
           .Name("dattn_job_duration_seconds")
           .Help(
               "Run time of each ended job that ran: first RUNNING to its terminal state "
               "(unit: seconds; one observation per job).")
           .Register(*registry_);
  queue_wait_ = &prometheus::BuildHistogram()
                     .Name("dattn_job_queue_wait_seconds")
                     .Help(
                         "Time from entering QUEUED (submit or requeue) to PLACED (unit: seconds; "
                         "one observation per placement).")
                     .Register(*registry_);
  attention_tokens_ =
      &prometheus::BuildCounter()
           .Name("dattn_attention_tokens_total")
           .Help(
               "Sequence positions processed by succeeded attention jobs: batch * seq_len * "
               "iterations per job, counted when the job succeeds (unit: tokens).")
           .Register(*registry_)
           .Add({});
  attention_flops_ =
      &prometheus::BuildCounter()
           .Name("dattn_attention_flops_total")
           .Help(
               "Nominal floating-point operations of succeeded attention jobs: flops_per_step * "
               "iterations per job (forward x3.5 with backward), counted when the job succeeds "
               "(unit: FLOPs).")
           .Register(*registry_)
           .Add({});
  workers_ = &prometheus::BuildGauge()
                  .Name("dattn_workers")
                  .Help(
                      "Registered workers per state: ready, draining, dead, device_failed (live "
                      "but its device failed: it gets no new ranks) (unit: workers; dead ones stay "
                      "listed until forgotten).")
                  .Register(*registry_);
  rpcs_ = &prometheus::BuildCounter()
               .Name("dattn_rpc_total")
               .Help(
                   "Finished gRPC calls by full method name and status code (unit: calls; "
                   "streams count once, when they end).")
               .Register(*registry_);
  recoveries_ = &prometheus::BuildCounter()
                     .Name("dattn_recoveries_total")
                     .Help(
                         "Job recoveries by cause and outcome (unit: jobs recovered; one per job "
                         "per event; outcome requeued, resized (requeued as a rung of its "
                         "recovery ladder), failed or cancelled).")
                     .Register(*registry_);
  recovery_seconds_ = &prometheus::BuildHistogram()
                           .Name("dattn_recovery_seconds")
                           .Help(
                               "Time to recover, by cause: from the fault's recovery decision to "
                               "the job running again (unit: seconds; requeued jobs that ran "
                               "again only).")
                           .Register(*registry_);
  store_commit_ =
      &prometheus::BuildHistogram()
           .Name("dattn_store_commit_seconds")
           .Help(
               "Latency of each durable job-store write as seen by the coordinator "
               "(unit: seconds; one observation per submit or update).")
           .Register(*registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                            0.025, 0.05, 0.1, 0.25, 0.5, 1});

  attend_active_ = &prometheus::BuildGauge()
                        .Name("dattn_attend_calls_active")
                        .Help(
                            "JobService.Attend calls in progress (unit: calls; from the "
                            "acceptance of the call's job to the end of the call).")
                        .Register(*registry_)
                        .Add({});
  attend_buffered_max_ = &prometheus::BuildGauge()
                              .Name("dattn_attend_buffered_bytes_max")
                              .Help(
                                  "The most bytes one Attend call has had waiting in the relay "
                                  "between its client and its ranks, since start (unit: bytes; "
                                  "bounded by the relay's 16 MiB a direction plus a chunk a "
                                  "rank).")
                              .Register(*registry_)
                              .Add({});
  attend_calls_ = &prometheus::BuildCounter()
                       .Name("dattn_attend_calls_total")
                       .Help(
                           "Ended JobService.Attend calls whose job was accepted, by tenant and "
                           "status code (unit: calls; refusals before the job existed are in "
                           "dattn_rpc_total).")
                       .Register(*registry_);
  attend_bytes_ = &prometheus::BuildCounter()
                       .Name("dattn_attend_bytes_total")
                       .Help(
                           "Tensor bytes of JobService.Attend calls: direction=in from the "
                           "client (q, k, v, dout), out to it (out, dq, dk, dv) (unit: bytes; "
                           "counted when the call ends).")
                       .Register(*registry_);

  attend_queue_seconds_ = &prometheus::BuildHistogram()
                               .Name("dattn_attend_queue_seconds")
                               .Help(
                                   "Queue time of each Attend call's job: accepted to first "
                                   "RUNNING (unit: seconds; calls whose job never ran are not "
                                   "observed).")
                               .Register(*registry_);
  attend_engine_seconds_ = &prometheus::BuildHistogram()
                                .Name("dattn_attend_engine_seconds")
                                .Help(
                                    "Engine time of each succeeded Attend call: the slowest "
                                    "rank's forward (and backward) step (unit: seconds).")
                                .Register(*registry_);

  inference_requests_ =
      &prometheus::BuildCounter()
           .Name("dattn_inference_requests_total")
           .Help(
               "ModelInfer calls of the Open Inference Protocol, by model, tenant and status "
               "code (unit: calls).")
           .Register(*registry_);
  inference_bytes_ = &prometheus::BuildCounter()
                          .Name("dattn_inference_bytes_total")
                          .Help(
                              "Tensor bytes of ModelInfer calls: direction=in (inputs), out "
                              "(outputs returned) (unit: bytes).")
                          .Register(*registry_);
  inference_seconds_ = &prometheus::BuildHistogram()
                            .Name("dattn_inference_request_seconds")
                            .Help(
                                "Each ModelInfer call, from its arrival to its answer (unit: "
                                "seconds).")
                            .Register(*registry_);

  serving_requests_ = &prometheus::BuildCounter()
                           .Name("dattn_serving_requests_total")
                           .Help(
                               "Generate and Score calls on deployments, by deployment (its job "
                               "id), call and status code (unit: calls).")
                           .Register(*registry_);
  generated_tokens_ = &prometheus::BuildCounter()
                           .Name("dattn_generated_tokens_total")
                           .Help("Tokens Generate calls returned, by deployment (unit: tokens).")
                           .Register(*registry_);
  first_token_seconds_ = &prometheus::BuildHistogram()
                              .Name("dattn_generate_first_token_seconds")
                              .Help(
                                  "Time to first token of each Generate call: accepted to its "
                                  "first token, by deployment (unit: seconds).")
                              .Register(*registry_);
  output_token_seconds_ = &prometheus::BuildHistogram()
                               .Name("dattn_generate_output_token_seconds")
                               .Help(
                                   "Time per output token of each Generate call after its first "
                                   "(calls of two tokens or more), by deployment (unit: seconds).")
                               .Register(*registry_);
  serving_queue_seconds_ = &prometheus::BuildHistogram()
                                .Name("dattn_generate_queue_seconds")
                                .Help(
                                    "Time each Generate call waited in its deployment's queue for "
                                    "a free sequence (unit: seconds).")
                                .Register(*registry_);
  prefill_tokens_per_second_ = &prometheus::BuildHistogram()
                                    .Name("dattn_generate_prefill_tokens_per_second")
                                    .Help(
                                        "Prompt tokens over the prompt's forward pass of each "
                                        "Generate call, by deployment (unit: tokens/s).")
                                    .Register(*registry_);
  deployment_sequences_ = &prometheus::BuildGauge()
                               .Name("dattn_deployment_sequences")
                               .Help(
                                   "A deployment's requests: state=running (being decoded) or "
                                   "queued, as its rank last reported (unit: requests).")
                               .Register(*registry_);
  deployment_cache_bytes_ = &prometheus::BuildGauge()
                                 .Name("dattn_deployment_cache_bytes")
                                 .Help(
                                     "Cache memory of a deployment's running sequences (unit: "
                                     "bytes).")
                                 .Register(*registry_);

  job_tflops_ = &prometheus::BuildHistogram()
                     .Name("dattn_attention_job_tflops")
                     .Help(
                         "Effective rate of each succeeded attention job: nominal FLOPs of one "
                         "step over the slowest rank's median step time (unit: TFLOP/s, 1e12 "
                         "FLOP/s; one observation per job).")
                     .Register(*registry_);
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("dattn_attention_step_seconds")
                       .Help(
                           "Step time of each succeeded attention job: the slowest rank's median "
                           "(unit: seconds; one observation per job).")
                       .Register(*registry_);
  rank_step_seconds_ = &prometheus::BuildHistogram()
                            .Name("dattn_worker_rank_step_seconds")
                            .Help(
                                "Median step time of each succeeded rank, by worker name (unit: "
                                "seconds; one observation per rank).")
                            .Register(*registry_);
  worker_flops_ = &prometheus::BuildCounter()
                       .Name("dattn_worker_attention_flops_total")
                       .Help(
                           "Nominal FLOPs of the succeeded ranks each worker ran: the job's "
                           "FLOPs per step / ranks x steps, counted when the rank succeeds "
                           "(unit: FLOPs; rate() is the worker's FLOP/s).")
                       .Register(*registry_);
  worker_tflops_ = &prometheus::BuildGauge()
                        .Name("dattn_worker_attention_tflops")
                        .Help(
                            "Effective rate of the last rank that succeeded on each worker "
                            "(unit: TFLOP/s; set when a rank succeeds).")
                        .Register(*registry_);
  worker_memory_total_ = &prometheus::BuildGauge()
                              .Name("dattn_worker_memory_total_bytes")
                              .Help(
                                  "Memory each worker offers: device memory of a GPU worker, host "
                                  "memory (or its --memory-bytes) of a CPU worker (unit: bytes).")
                              .Register(*registry_);
  worker_memory_free_ = &prometheus::BuildGauge()
                             .Name("dattn_worker_memory_free_bytes")
                             .Help(
                                 "Free memory of each worker's device as its last heartbeat said "
                                 "(cudaMemGetInfo, MemAvailable or its budget left; unit: "
                                 "bytes).")
                             .Register(*registry_);
  worker_memory_used_ = &prometheus::BuildGauge()
                             .Name("dattn_worker_memory_used_bytes")
                             .Help(
                                 "Memory in use on each worker's device, by anything: total - free "
                                 "(unit: bytes).")
                             .Register(*registry_);
  worker_memory_reserved_ =
      &prometheus::BuildGauge()
           .Name("dattn_worker_memory_reserved_bytes")
           .Help(
               "Planned memory of the ranks the coordinator has placed on each worker and not "
               "yet released (unit: bytes).")
           .Register(*registry_);
  ring_formations_ = &prometheus::BuildCounter()
                          .Name("dattn_ring_formations_total")
                          .Help(
                              "Ring attempts by how their formation ended: formed (every rank "
                              "reported its communicator), timed_out (a rank's formation "
                              "timed out), failed (the attempt ended otherwise before forming); "
                              "cancelled attempts are not counted (unit: rings).")
                          .Register(*registry_);
  ring_formation_seconds_ = &prometheus::BuildHistogram()
                                 .Name("dattn_ring_formation_seconds")
                                 .Help(
                                     "Formation time of each formed ring: the longest of its "
                                     "ranks' arrival-to-communicator times (unit: seconds; one "
                                     "observation per formed ring).")
                                 .Register(*registry_);

  training_loss_ = &prometheus::BuildGauge()
                        .Name("dattn_training_loss")
                        .Help(
                            "Training loss of the last step a running training job reported "
                            "(unit: nats per token; NaN when not finite). One series per running "
                            "job, removed when it ends.")
                        .Register(*registry_);
  training_validation_loss_ =
      &prometheus::BuildGauge()
           .Name("dattn_training_validation_loss")
           .Help(
               "Validation loss of a running training job's last evaluation (unit: nats per "
               "token). One series per running job that evaluated, removed when it ends.")
           .Register(*registry_);
  training_tokens_per_second_ =
      &prometheus::BuildGauge()
           .Name("dattn_training_tokens_per_second")
           .Help(
               "Training tokens of a running job's last reported step over its time, all ranks "
               "together (unit: tokens per second).")
           .Register(*registry_);
  training_mfu_ = &prometheus::BuildGauge()
                       .Name("dattn_training_mfu")
                       .Help(
                           "Model FLOPs of a running training job's last reported step over its "
                           "time and its ranks' nominal peak (unit: ratio 0..1; 0 where no peak "
                           "is known: CPU workers).")
                       .Register(*registry_);
  training_steps_ = &prometheus::BuildCounter()
                         .Name("dattn_training_steps_total")
                         .Help(
                             "Training steps done by every training job, as their progress "
                             "reports say (unit: steps; steps redone after a resume count again).")
                         .Register(*registry_)
                         .Add({});
  training_tokens_ = &prometheus::BuildCounter()
                          .Name("dattn_training_tokens_total")
                          .Help(
                              "Training tokens consumed by every training job (unit: tokens; "
                              "batch_size * seq_len per step).")
                          .Register(*registry_)
                          .Add({});
  training_step_seconds_ =
      &prometheus::BuildHistogram()
           .Name("dattn_training_step_seconds")
           .Help(
               "Time of a training step as each progress report gives it: the last step before "
               "the report (unit: seconds).")
           .Register(*registry_);
  training_checkpoint_seconds_ =
      &prometheus::BuildHistogram()
           .Name("dattn_training_checkpoint_seconds")
           .Help(
               "Time to write one checkpoint of a training job, every rank's shard and the "
               "manifest (unit: seconds; one observation per checkpoint).")
           .Register(*registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100,
                                                            300});
  training_checkpoint_bytes_ =
      &prometheus::BuildHistogram()
           .Name("dattn_training_checkpoint_bytes")
           .Help("Size of one checkpoint of a training job, every file (unit: bytes).")
           .Register(*registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{1 << 20, 16 << 20, 256 << 20, 1 << 30,
                                                            4.0 * (1 << 30), 16.0 * (1 << 30),
                                                            64.0 * (1 << 30)});

  // Label sets known now, at zero, so that every name is scrapeable from the start.
  for (const char* kind : {"attention", "training"}) {
    for (v1::JobState state : kAllStates) {
      JobGauge(kind, state);
      if (IsTerminal(state)) finished_->Add({{"kind", kind}, {"state", Str(StateName(state))}});
    }
    submitted_->Add({{"kind", kind}});
    ObserveJobDuration(kind, -1);  // Creates the series; negative values are not recorded.
    ObserveQueueWait(kind, -1);
  }
  for (const char* state : {"ready", "draining", "dead"}) workers_->Add({{"state", state}});
  for (const char* kind : {"worker_lost", "coordinator_restarted", "worker_reregistered",
                           "task_failed", "drain_timeout"}) {
    recoveries_->Add({{"kind", kind}, {"outcome", "requeued"}});
  }
  for (const char* device : {"cpu", "gpu"}) {
    ObserveAttentionJob(device, -1, -1);
    training_step_seconds_->Add({{"device", device}}, metrics::StepSecondsBuckets());
  }
  for (const char* backend : {"gloo", "nccl"}) {
    for (const char* outcome : {"formed", "timed_out", "failed"}) {
      ring_formations_->Add({{"backend", backend}, {"outcome", outcome}});
    }
    CountRingFormation(backend, "", -1);
  }
}

Metrics::~Metrics() = default;

std::string Metrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

prometheus::Gauge& Metrics::JobGauge(absl::string_view kind, v1::JobState state) {
  return jobs_->Add({{"kind", Str(kind)}, {"state", Str(StateName(state))}});
}

void Metrics::SetJobCount(absl::string_view kind, v1::JobState state, int64_t count) {
  JobGauge(kind, state).Set(static_cast<double>(count));
}

void Metrics::JobSubmitted(absl::string_view kind) {
  submitted_->Add({{"kind", Str(kind)}}).Increment();
  JobGauge(kind, v1::JOB_STATE_QUEUED).Increment();
}

void Metrics::JobTransition(absl::string_view kind, v1::JobState from, v1::JobState to) {
  if (from == to) return;
  JobGauge(kind, from).Decrement();
  JobGauge(kind, to).Increment();
  if (IsTerminal(to))
    finished_->Add({{"kind", Str(kind)}, {"state", Str(StateName(to))}}).Increment();
}

void Metrics::JobDeleted(absl::string_view kind, v1::JobState state) {
  JobGauge(kind, state).Decrement();
}

namespace {

// Run times span milliseconds (tiny CPU jobs) to many hours (training).
const prometheus::Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& WaitBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600};
  return *buckets;
}

}  // namespace

void Metrics::ObserveJobDuration(absl::string_view kind, double seconds) {
  prometheus::Histogram& h = job_duration_->Add({{"kind", Str(kind)}}, DurationBuckets());
  if (seconds >= 0) h.Observe(seconds);
}

void Metrics::ObserveQueueWait(absl::string_view kind, double seconds) {
  prometheus::Histogram& h = queue_wait_->Add({{"kind", Str(kind)}}, WaitBuckets());
  if (seconds >= 0) h.Observe(seconds);
}

void Metrics::AddAttentionWork(double tokens, double flops) {
  if (tokens > 0) attention_tokens_->Increment(tokens);
  if (flops > 0) attention_flops_->Increment(flops);
}

void Metrics::SetQueueDepth(int64_t depth) { queue_depth_->Set(static_cast<double>(depth)); }

void Metrics::SetWorkers(int64_t ready, int64_t draining, int64_t dead, int64_t device_failed) {
  workers_->Add({{"state", "ready"}}).Set(static_cast<double>(ready));
  workers_->Add({{"state", "draining"}}).Set(static_cast<double>(draining));
  workers_->Add({{"state", "dead"}}).Set(static_cast<double>(dead));
  workers_->Add({{"state", "device_failed"}}).Set(static_cast<double>(device_failed));
}

void Metrics::CountRpc(absl::string_view method, absl::string_view code) {
  rpcs_->Add({{"method", Str(method)}, {"code", Str(code)}}).Increment();
}

void Metrics::DeclareRpc(absl::string_view method) {
  rpcs_->Add({{"method", Str(method)}, {"code", "OK"}});
}

void Metrics::CountRecovery(absl::string_view kind, absl::string_view outcome) {
  recoveries_->Add({{"kind", Str(kind)}, {"outcome", Str(outcome)}}).Increment();
}

void Metrics::ObserveRecovery(absl::string_view kind, double seconds) {
  static const auto* buckets =
      new prometheus::Histogram::BucketBoundaries{0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000, 3000};
  recovery_seconds_->Add({{"kind", Str(kind)}}, *buckets).Observe(seconds);
}

void Metrics::AttendStarted() { attend_active_->Increment(); }

void Metrics::NoteAttendBuffered(int64_t bytes) {
  absl::MutexLock lock(&tenants_mu_);  // Read-compare-set of one gauge.
  if (static_cast<double>(bytes) > attend_buffered_max_->Value()) {
    attend_buffered_max_->Set(static_cast<double>(bytes));
  }
}

std::string Metrics::TenantLabel(absl::string_view tenant) {
  absl::MutexLock lock(&tenants_mu_);
  if (tenants_.contains(tenant)) return std::string(tenant);
  if (static_cast<int>(tenants_.size()) >= kMaxTenantLabels) return "other";
  tenants_.insert(std::string(tenant));
  return std::string(tenant);
}

void Metrics::AttendEnded(absl::string_view tenant, absl::StatusCode code, int64_t bytes_in,
                          int64_t bytes_out) {
  attend_active_->Decrement();
  const std::string label = TenantLabel(tenant);
  attend_calls_->Add({{"tenant", label}, {"code", absl::StatusCodeToString(code)}}).Increment();
  attend_bytes_->Add({{"tenant", label}, {"direction", "in"}})
      .Increment(static_cast<double>(bytes_in));
  attend_bytes_->Add({{"tenant", label}, {"direction", "out"}})
      .Increment(static_cast<double>(bytes_out));
}

void Metrics::CountInference(absl::string_view model, absl::string_view tenant,
                             absl::StatusCode code, int64_t bytes_in, int64_t bytes_out,
                             double seconds) {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300};
  const std::string label = TenantLabel(tenant);
  const std::string m(model);
  inference_requests_
      ->Add({{"model", m}, {"tenant", label}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
  inference_bytes_->Add({{"model", m}, {"tenant", label}, {"direction", "in"}})
      .Increment(static_cast<double>(bytes_in));
  inference_bytes_->Add({{"model", m}, {"tenant", label}, {"direction", "out"}})
      .Increment(static_cast<double>(bytes_out));
  if (seconds >= 0) inference_seconds_->Add({{"model", m}}, *buckets).Observe(seconds);
}

void Metrics::ObserveAttend(absl::string_view tenant, double queue_seconds, double engine_seconds) {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000};
  const std::string label = TenantLabel(tenant);
  if (queue_seconds >= 0) {
    attend_queue_seconds_->Add({{"tenant", label}}, *buckets).Observe(queue_seconds);
  }
  if (engine_seconds > 0) {
    attend_engine_seconds_->Add({{"tenant", label}}, *buckets).Observe(engine_seconds);
  }
}

void Metrics::ObserveStoreCommit(double seconds) {
  if (seconds >= 0) store_commit_->Observe(seconds);
}

namespace {

// Effective rates from a laptop CPU core (~0.01 TFLOP/s) to a GPU ring (~1000s).
const prometheus::Histogram::BucketBoundaries& TflopsBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000, 3000};
  return *buckets;
}

// Removes the series of `family` labelled worker=`worker`, if it exists (Add finds it).
template <typename T, typename... Args>
void RemoveSeries(prometheus::Family<T>* family, const std::string& worker, Args&&... args) {
  const std::map<std::string, std::string> labels = {{"worker", worker}};
  if (!family->Has(labels)) return;
  family->Remove(&family->Add(labels, std::forward<Args>(args)...));
}

}  // namespace

void Metrics::ObserveAttentionJob(absl::string_view device, double tflops,
                                  double seconds_per_step) {
  prometheus::Histogram& rate = job_tflops_->Add({{"device", Str(device)}}, TflopsBuckets());
  prometheus::Histogram& step =
      step_seconds_->Add({{"device", Str(device)}}, metrics::StepSecondsBuckets());
  if (tflops >= 0) rate.Observe(tflops);
  if (seconds_per_step >= 0) step.Observe(seconds_per_step);
}

void Metrics::ObserveRank(absl::string_view worker, double seconds_per_step, double flops,
                          double tflops) {
  const std::map<std::string, std::string> labels = {{"worker", Str(worker)}};
  if (seconds_per_step >= 0)
    rank_step_seconds_->Add(labels, metrics::StepSecondsBuckets()).Observe(seconds_per_step);
  if (flops > 0) worker_flops_->Add(labels).Increment(flops);
  if (tflops >= 0) worker_tflops_->Add(labels).Set(tflops);
}

void Metrics::SetWorkerMemory(absl::string_view worker, int64_t total, int64_t free,
                              int64_t reserved) {
  const std::map<std::string, std::string> labels = {{"worker", Str(worker)}};
  worker_memory_total_->Add(labels).Set(static_cast<double>(total));
  worker_memory_free_->Add(labels).Set(static_cast<double>(free));
  worker_memory_used_->Add(labels).Set(static_cast<double>(std::max<int64_t>(0, total - free)));
  worker_memory_reserved_->Add(labels).Set(static_cast<double>(reserved));
}

void Metrics::RemoveWorker(absl::string_view worker) {
  const std::string name(worker);
  RemoveSeries(rank_step_seconds_, name, metrics::StepSecondsBuckets());
  RemoveSeries(worker_flops_, name);
  RemoveSeries(worker_tflops_, name);
  RemoveSeries(worker_memory_total_, name);
  RemoveSeries(worker_memory_free_, name);
  RemoveSeries(worker_memory_used_, name);
  RemoveSeries(worker_memory_reserved_, name);
}

void Metrics::CountRingFormation(absl::string_view backend, absl::string_view outcome,
                                 double seconds) {
  prometheus::Histogram& h = ring_formation_seconds_->Add({{"backend", Str(backend)}},
                                                          metrics::RingFormationSecondsBuckets());
  if (outcome.empty()) return;
  ring_formations_->Add({{"backend", Str(backend)}, {"outcome", Str(outcome)}}).Increment();
  if (outcome == "formed" && seconds >= 0) h.Observe(seconds);
}

void Metrics::ObserveTrainingProgress(absl::string_view job_id, absl::string_view device,
                                      double loss, double tokens_per_second, double mfu,
                                      double step_seconds, int64_t steps, int64_t tokens) {
  const std::map<std::string, std::string> labels = {{"job_id", Str(job_id)}};
  training_loss_->Add(labels).Set(loss);
  training_tokens_per_second_->Add(labels).Set(tokens_per_second);
  training_mfu_->Add(labels).Set(mfu);
  if (steps > 0) training_steps_->Increment(static_cast<double>(steps));
  if (tokens > 0) training_tokens_->Increment(static_cast<double>(tokens));
  prometheus::Histogram& h =
      training_step_seconds_->Add({{"device", Str(device)}}, metrics::StepSecondsBuckets());
  if (step_seconds > 0) h.Observe(step_seconds);
}

void Metrics::SetTrainingValidationLoss(absl::string_view job_id, double loss) {
  training_validation_loss_->Add({{"job_id", Str(job_id)}}).Set(loss);
}

void Metrics::ObserveTrainingCheckpoint(double seconds, int64_t bytes) {
  if (seconds >= 0) training_checkpoint_seconds_->Observe(seconds);
  if (bytes >= 0) training_checkpoint_bytes_->Observe(static_cast<double>(bytes));
}

void Metrics::CountServing(absl::string_view deployment, absl::string_view call,
                           absl::StatusCode code) {
  serving_requests_
      ->Add({{"deployment", Str(deployment)},
             {"call", Str(call)},
             {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

void Metrics::ObserveGenerate(absl::string_view deployment, const v1::GenerateDone& done,
                              double seconds_per_token) {
  static const auto* seconds = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
  static const auto* rates =
      new prometheus::Histogram::BucketBoundaries{10, 100, 1e3, 1e4, 1e5, 1e6, 1e7};
  const std::map<std::string, std::string> labels = {{"deployment", Str(deployment)}};
  generated_tokens_->Add(labels).Increment(static_cast<double>(done.generated_tokens()));
  if (done.generated_tokens() > 0) {
    first_token_seconds_->Add(labels, *seconds).Observe(done.first_token_seconds());
  }
  if (seconds_per_token >= 0) {
    output_token_seconds_->Add(labels, *seconds).Observe(seconds_per_token);
  }
  serving_queue_seconds_->Add(labels, *seconds).Observe(done.queue_seconds());
  if (done.prefill_seconds() > 0) {
    prefill_tokens_per_second_->Add(labels, *rates)
        .Observe(static_cast<double>(done.prompt_tokens()) / done.prefill_seconds());
  }
}

void Metrics::SetDeployment(absl::string_view deployment, const v1::DeploymentStatus& status) {
  const std::string d(deployment);
  deployment_sequences_->Add({{"deployment", d}, {"state", "running"}})
      .Set(static_cast<double>(status.running()));
  deployment_sequences_->Add({{"deployment", d}, {"state", "queued"}})
      .Set(static_cast<double>(status.queued()));
  deployment_cache_bytes_->Add({{"deployment", d}})
      .Set(static_cast<double>(status.running() * status.cache_bytes_per_sequence()));
}

void Metrics::RemoveDeployment(absl::string_view deployment) {
  const std::string d(deployment);
  for (const char* state : {"running", "queued"}) {
    const std::map<std::string, std::string> labels = {{"deployment", d}, {"state", state}};
    if (deployment_sequences_->Has(labels)) {
      deployment_sequences_->Remove(&deployment_sequences_->Add(labels));
    }
  }
  const std::map<std::string, std::string> labels = {{"deployment", d}};
  if (deployment_cache_bytes_->Has(labels)) {
    deployment_cache_bytes_->Remove(&deployment_cache_bytes_->Add(labels));
  }
}

void Metrics::RemoveTrainingJob(absl::string_view job_id) {
  const std::map<std::string, std::string> labels = {{"job_id", Str(job_id)}};
  for (prometheus::Family<prometheus::Gauge>* family :
       {training_loss_, training_validation_loss_, training_tokens_per_second_, training_mfu_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
}

}  // namespace server
}  // namespace dattn
