// The coordinator's Prometheus metrics (served by metrics::MetricsServer, metrics/metrics_server.h;
// the workers' own are in worker/worker_metrics.h).
//
// Every metric is named dattn_*; the names and labels are an interface (the Grafana dashboards and
// alert rules in deploy/ are written against them, docs/DEPLOY.md), so change them only
// additively. Each
// definition in metrics.cc states its unit and counting rule in its help text; the summary:
//
//   name                                   type       counting rule
//   dattn_jobs{kind,state}                 gauge      jobs in the store per state (terminal too)
//   dattn_jobs_submitted_total{kind}       counter    jobs created (idempotent retries are not)
//   dattn_jobs_finished_total{kind,state}  counter    jobs reaching a terminal state
//   dattn_queue_depth                      gauge      jobs waiting for placement
//   dattn_job_duration_seconds{kind}       histogram  first RUNNING to terminal, per ended job
//   dattn_job_queue_wait_seconds{kind}     histogram  QUEUED (submit/requeue) to PLACED
//   dattn_attention_tokens_total           counter    B*N*iterations of succeeded attention jobs
//   dattn_attention_flops_total            counter    their nominal FLOPs (per step x iterations)
//   dattn_workers{state}                   gauge      workers per state (ready|draining|dead|
//                                                     device_failed: live, its device failed)
//   dattn_rpc_total{method,code}           counter    finished calls by method and status code
//   dattn_recoveries_total{kind,outcome}   counter    job recoveries by cause (worker_lost, ...)
//                                                     and outcome (requeued|resized|failed|
//                                                     cancelled; shrunk: a requeued job moved to
//                                                     fewer ranks, counted besides its requeue)
//   dattn_recovery_seconds{kind}           histogram  a recovery's decision to the job running
//                                                     again
//   dattn_store_commit_seconds             histogram  latency of each durable store write
//   dattn_attention_job_tflops{device}     histogram  effective TFLOP/s of each succeeded job
//   dattn_attention_step_seconds{device}   histogram  each succeeded job's step time (slowest rank)
//   dattn_worker_rank_step_seconds{worker} histogram  each succeeded rank's median step time
//   dattn_worker_attention_flops_total{worker} counter nominal FLOPs of succeeded ranks there
//   dattn_worker_attention_tflops{worker}  gauge      effective TFLOP/s of the last rank that
//                                                     succeeded there
//   dattn_worker_memory_total_bytes{worker} gauge     device (GPU) or host (CPU) memory it offers
//   dattn_worker_memory_free_bytes{worker} gauge      free, as its last heartbeat said
//   dattn_worker_memory_used_bytes{worker} gauge      total - free: in use on the device, by
//                                                     anything
//   dattn_worker_memory_reserved_bytes{worker} gauge  planned bytes of the ranks placed there
//   dattn_ring_formations_total{backend,outcome} counter ring attempts by how their formation
//                                                     ended: formed | timed_out | failed
//   dattn_ring_formation_seconds{backend}  histogram  formation time of each formed ring (its
//                                                     slowest rank: arrival to communicator)
//   dattn_training_loss{job_id}            gauge      last reported training loss of each running
//                                                     training job (NaN when not finite)
//   dattn_training_validation_loss{job_id} gauge      its last validation loss
//   dattn_training_tokens_per_second{job_id} gauge    its last step's tokens/s (all ranks)
//   dattn_training_mfu{job_id}             gauge      its last step's model FLOPs utilisation
//   dattn_training_steps_total             counter    training steps done (all jobs)
//   dattn_training_tokens_total            counter    training tokens consumed (all jobs)
//   dattn_training_step_seconds{device}    histogram  each reported step's time
//   dattn_training_checkpoint_seconds      histogram  time to write each checkpoint
//   dattn_training_checkpoint_bytes        histogram  size of each checkpoint
//   dattn_attend_calls_active              gauge      JobService.Attend calls in progress
//   dattn_attend_calls_total{tenant,code}  counter    ended Attend calls by tenant and status code
//   dattn_attend_bytes_total{tenant,direction} counter tensor bytes of Attend calls: in (q, k, v,
//                                                     dout from the client), out (to it)
//   dattn_attend_buffered_bytes_max        gauge      the most bytes one Attend call ever had
//                                                     waiting in the relay (attend_relay.h)
//   dattn_attend_queue_seconds{tenant}    histogram  each Attend job's submit to first RUNNING
//   dattn_attend_engine_seconds{tenant}   histogram  each succeeded Attend call's engine time (the
//                                                     slowest rank's step)
//   dattn_inference_requests_total{model,tenant,code} counter ModelInfer calls (Open Inference
//                                                     Protocol) by model, tenant and code
//   dattn_inference_bytes_total{model,tenant,direction} counter their tensor bytes, in and out
//   dattn_inference_request_seconds{model} histogram   each ModelInfer call, whole
// `tenant` labels take the first kMaxTenantLabels tenants seen; later
// ones are counted as "other" (a tenant is a string the caller chooses with --insecure).
//
// Per-job training series (job_id) exist while the job runs and are removed when it ends.
//
// Per-worker series are labelled with the worker's name (stable across its restarts) and removed
// when the coordinator forgets the worker.
//
// Thread-safety: every method may be called from any thread (prometheus-cpp metrics are atomic).
#ifndef DATTN_SERVER_METRICS_H_
#define DATTN_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "dattn/v1/job.pb.h"
#include "dattn/v1/job_service.pb.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace dattn {
namespace server {

class Metrics {
 public:
  // Creates every family, and the label sets known in advance at zero, so that a scrape of a fresh
  // coordinator already lists every name.
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The registry to expose; shared with MetricsServer, which holds a weak reference.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // The Prometheus text exposition of every metric (what /metrics serves).
  std::string Serialize() const;

  // dattn_jobs{kind,state} := count, for the start-up load from the store.
  void SetJobCount(absl::string_view kind, v1::JobState state, int64_t count);
  // A job was created: submitted_total += 1 and jobs{queued} += 1.
  void JobSubmitted(absl::string_view kind);
  // A job moved between states: jobs{from} -= 1, jobs{to} += 1; finished_total{to} += 1 when `to`
  // is terminal. No-op when from == to.
  void JobTransition(absl::string_view kind, v1::JobState from, v1::JobState to);
  // A finished job in `state` was deleted (DeleteJob, retention): jobs{state} -= 1.
  void JobDeleted(absl::string_view kind, v1::JobState state);

  void ObserveJobDuration(absl::string_view kind, double seconds);
  void ObserveQueueWait(absl::string_view kind, double seconds);
  void AddAttentionWork(double tokens, double flops);
  void SetQueueDepth(int64_t depth);
  // `device_failed`: live workers whose device failed (not counted as ready or draining).
  void SetWorkers(int64_t ready, int64_t draining, int64_t dead, int64_t device_failed);
  // `method` is the full gRPC method name ("/dattn.v1.JobService/SubmitJob"); `code` a status code
  // name as absl::StatusCodeToString gives it ("OK", "INVALID_ARGUMENT", ...).
  void CountRpc(absl::string_view method, absl::string_view code);
  // Creates dattn_rpc_total{method, code="OK"} at zero, so that a method is listed (and rate() has
  // a start) before its first call. The gRPC server declares every method it serves.
  void DeclareRpc(absl::string_view method);
  // `kind` is the cause: "worker_lost", "coordinator_restarted", "worker_reregistered",
  // "task_failed", "drain_timeout", "rank_refused", "stalled", "worker_stopping"; `outcome`
  // "requeued", "resized" (requeued as a rung of its recovery ladder), "failed" or "cancelled".
  void CountRecovery(absl::string_view kind, absl::string_view outcome);
  // A recovered job running again `seconds` after the recovery of cause `kind` decided.
  void ObserveRecovery(absl::string_view kind, double seconds);
  void ObserveStoreCommit(double seconds);

  // A succeeded attention job: its effective TFLOP/s and step time; `device` is "cpu" or "gpu".
  void ObserveAttentionJob(absl::string_view device, double tflops, double seconds_per_step);
  // A succeeded rank on worker `worker`: its median step time, the nominal FLOPs it did (all
  // steps) and its effective TFLOP/s.
  void ObserveRank(absl::string_view worker, double seconds_per_step, double flops, double tflops);
  // The worker's memory gauges (used = total - free) and what the coordinator reserved there.
  void SetWorkerMemory(absl::string_view worker, int64_t total, int64_t free, int64_t reserved);
  // Drops every series of the worker.
  void RemoveWorker(absl::string_view worker);
  // A ring attempt's formation ended: `outcome` is "formed", "timed_out" or "failed"; `seconds`
  // is observed for "formed" only.
  void CountRingFormation(absl::string_view backend, absl::string_view outcome, double seconds);

  // A training job's new figures: its last step's loss (any value: NaN and infinities are kept,
  // for the "loss not finite" alert), tokens/s and MFU; `steps` and `tokens` more steps and
  // tokens done since its last report (counted once: the caller passes differences); `step_seconds`
  // observed when > 0. `device` is "cpu" or "gpu".
  void ObserveTrainingProgress(absl::string_view job_id, absl::string_view device, double loss,
                               double tokens_per_second, double mfu, double step_seconds,
                               int64_t steps, int64_t tokens);
  void SetTrainingValidationLoss(absl::string_view job_id, double loss);
  void ObserveTrainingCheckpoint(double seconds, int64_t bytes);
  // Drops the job's per-job training series (it ended, or is no longer running here).
  void RemoveTrainingJob(absl::string_view job_id);

  // Most distinct tenant label values; later tenants are "other".
  static constexpr int kMaxTenantLabels = 64;
  // An Attend call began (after its job was accepted) / ended with `code` after `bytes_in` bytes
  // from the client and `bytes_out` to it. Calls refused before their job existed are counted by
  // dattn_rpc_total only.
  void AttendStarted();
  void AttendEnded(absl::string_view tenant, absl::StatusCode code, int64_t bytes_in,
                   int64_t bytes_out);
  // An Attend call had at most `bytes` waiting in its relay: the gauge keeps the largest.
  void NoteAttendBuffered(int64_t bytes);
  // A ModelInfer call of `model` ended with `code` after `seconds`, with `bytes_in` bytes of
  // inputs and `bytes_out` of outputs.
  void CountInference(absl::string_view model, absl::string_view tenant, absl::StatusCode code,
                      int64_t bytes_in, int64_t bytes_out, double seconds);
  // An Attend job's queue time (observed when >= 0) and, when it succeeded, its engine time.
  void ObserveAttend(absl::string_view tenant, double queue_seconds, double engine_seconds);

  // Deployments (docs/SERVING.md), labelled by the deployment's job id. A Generate or Score call
  // (`call`) on `deployment` ended with `code`.
  void CountServing(absl::string_view deployment, absl::string_view call, absl::StatusCode code);
  // A Generate call that finished: its `done` (time to first token, queue and prefill time,
  // tokens) and its time per output token after the first (< 0: fewer than two tokens).
  void ObserveGenerate(absl::string_view deployment, const v1::GenerateDone& done,
                       double seconds_per_token);
  // A deployment's rank reported its status: running and queued sequences, cache bytes in use.
  void SetDeployment(absl::string_view deployment, const v1::DeploymentStatus& status);
  // Its attempt ended: its gauges go.
  void RemoveDeployment(absl::string_view deployment);

 private:
  prometheus::Gauge& JobGauge(absl::string_view kind, v1::JobState state);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Family<prometheus::Counter>* submitted_;
  prometheus::Family<prometheus::Counter>* finished_;
  prometheus::Gauge* queue_depth_;
  prometheus::Family<prometheus::Histogram>* job_duration_;
  prometheus::Family<prometheus::Histogram>* queue_wait_;
  prometheus::Counter* attention_tokens_;
  prometheus::Counter* attention_flops_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Family<prometheus::Counter>* rpcs_;
  prometheus::Family<prometheus::Counter>* recoveries_;
  prometheus::Family<prometheus::Histogram>* recovery_seconds_;
  prometheus::Histogram* store_commit_;
  prometheus::Family<prometheus::Histogram>* job_tflops_;
  prometheus::Family<prometheus::Histogram>* step_seconds_;
  prometheus::Family<prometheus::Histogram>* rank_step_seconds_;
  prometheus::Family<prometheus::Counter>* worker_flops_;
  prometheus::Family<prometheus::Gauge>* worker_tflops_;
  prometheus::Family<prometheus::Gauge>* worker_memory_total_;
  prometheus::Family<prometheus::Gauge>* worker_memory_free_;
  prometheus::Family<prometheus::Gauge>* worker_memory_used_;
  prometheus::Family<prometheus::Gauge>* worker_memory_reserved_;
  prometheus::Family<prometheus::Counter>* ring_formations_;
  prometheus::Family<prometheus::Histogram>* ring_formation_seconds_;
  prometheus::Family<prometheus::Gauge>* training_loss_;
  prometheus::Family<prometheus::Gauge>* training_validation_loss_;
  prometheus::Family<prometheus::Gauge>* training_tokens_per_second_;
  prometheus::Family<prometheus::Gauge>* training_mfu_;
  prometheus::Counter* training_steps_;
  prometheus::Counter* training_tokens_;
  prometheus::Family<prometheus::Histogram>* training_step_seconds_;
  prometheus::Histogram* training_checkpoint_seconds_;
  prometheus::Histogram* training_checkpoint_bytes_;
  prometheus::Gauge* attend_active_;
  prometheus::Gauge* attend_buffered_max_;
  prometheus::Family<prometheus::Counter>* serving_requests_;
  prometheus::Family<prometheus::Counter>* generated_tokens_;
  prometheus::Family<prometheus::Histogram>* first_token_seconds_;
  prometheus::Family<prometheus::Histogram>* output_token_seconds_;
  prometheus::Family<prometheus::Histogram>* serving_queue_seconds_;
  prometheus::Family<prometheus::Histogram>* prefill_tokens_per_second_;
  prometheus::Family<prometheus::Gauge>* deployment_sequences_;
  prometheus::Family<prometheus::Gauge>* deployment_cache_bytes_;
  prometheus::Family<prometheus::Counter>* attend_calls_;
  prometheus::Family<prometheus::Counter>* attend_bytes_;
  prometheus::Family<prometheus::Histogram>* attend_queue_seconds_;
  prometheus::Family<prometheus::Counter>* inference_requests_;
  prometheus::Family<prometheus::Counter>* inference_bytes_;
  prometheus::Family<prometheus::Histogram>* inference_seconds_;
  prometheus::Family<prometheus::Histogram>* attend_engine_seconds_;
  absl::Mutex tenants_mu_;
  absl::flat_hash_set<std::string> tenants_ ABSL_GUARDED_BY(tenants_mu_);
  // `tenant`, or "other" once kMaxTenantLabels others have been seen.
  std::string TenantLabel(absl::string_view tenant);
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_METRICS_H_
