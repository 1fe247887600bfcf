#include "server/metrics.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
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
                      "Registered workers per state: ready, draining, dead (unit: workers; dead "
                      "ones stay listed until forgotten).")
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
                         "Job recoveries by cause (unit: jobs recovered; one per job per event, "
                         "whether it was requeued or failed).")
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

  // Label sets known now, at zero, so that every name is scrapeable from the start.
  for (v1::JobState state : kAllStates) {
    JobGauge("attention", state);
    if (IsTerminal(state))
      finished_->Add({{"kind", "attention"}, {"state", Str(StateName(state))}});
  }
  submitted_->Add({{"kind", "attention"}});
  for (const char* state : {"ready", "draining", "dead"}) workers_->Add({{"state", state}});
  for (const char* kind : {"worker_lost", "coordinator_restarted", "worker_reregistered",
                           "task_failed", "drain_timeout"}) {
    recoveries_->Add({{"kind", kind}});
  }
  ObserveJobDuration("attention", -1);  // Creates the series; negative values are not recorded.
  ObserveQueueWait("attention", -1);
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

void Metrics::SetWorkers(int64_t ready, int64_t draining, int64_t dead) {
  workers_->Add({{"state", "ready"}}).Set(static_cast<double>(ready));
  workers_->Add({{"state", "draining"}}).Set(static_cast<double>(draining));
  workers_->Add({{"state", "dead"}}).Set(static_cast<double>(dead));
}

void Metrics::CountRpc(absl::string_view method, absl::string_view code) {
  rpcs_->Add({{"method", Str(method)}, {"code", Str(code)}}).Increment();
}

void Metrics::DeclareRpc(absl::string_view method) {
  rpcs_->Add({{"method", Str(method)}, {"code", "OK"}});
}

void Metrics::CountRecovery(absl::string_view kind) {
  recoveries_->Add({{"kind", Str(kind)}}).Increment();
}

void Metrics::ObserveStoreCommit(double seconds) {
  if (seconds >= 0) store_commit_->Observe(seconds);
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string address)
    : exposer_(std::move(exposer)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address must be HOST:PORT, got \"", address, "\""));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  // civetweb reports a failed bind by throwing; nothing may cross this boundary as an exception.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry);
  std::string bound = address;
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (!ports.empty()) bound = absl::StrCat(address.substr(0, colon), ":", ports.front());
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), std::move(bound)));
}

}  // namespace server
}  // namespace dattn
