#include "worker/worker_metrics.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "metrics/buckets.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dattn {
namespace worker {
namespace {

constexpr const char* kPhases[] = {"preparing", "forming_ring", "running", "finished"};
constexpr const char* kOutcomes[] = {"succeeded", "failed", "cancelled", "refused"};
constexpr const char* kFormationOutcomes[] = {"formed", "timed_out", "failed"};
// Listed at zero from the start (others appear when they first happen): what ranks fail with
// (attention_task.h) and communicators break with (communicator.h).
constexpr absl::StatusCode kRankFailureCodes[] = {
    absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable,
    absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kInvalidArgument,
    absl::StatusCode::kInternal};
constexpr absl::StatusCode kCommunicatorCodes[] = {absl::StatusCode::kUnavailable,
                                                   absl::StatusCode::kDeadlineExceeded,
                                                   absl::StatusCode::kInternal};

}  // namespace

WorkerMetrics::WorkerMetrics(const WorkerMetricsOptions& options, const TaskDevice* device)
    : device_(device), registry_(std::make_shared<prometheus::Registry>()) {
  const bool gpu = device_->caps().device == Device::kCuda;
  prometheus::BuildGauge()
      .Name("dattn_worker_info")
      .Help(
          "Who this worker process is (unit: none; always 1): its name (the coordinator's `worker` "
          "label), kind (cpu or gpu), device name and CUDA ordinal, and version.")
      .Register(*registry_)
      .Add({{"worker", options.name},
            {"kind", gpu ? "gpu" : "cpu"},
            {"device", device_->device_name()},
            {"device_index", absl::StrCat(device_->device_index())},
            {"version", options.version}})
      .Set(1);
  ready_ = &prometheus::BuildGauge()
                .Name("dattn_worker_ready")
                .Help(
                    "1 while the worker is registered with the coordinator and accepting work "
                    "(the health port's \"dattn-worker\" service), else 0 (unit: boolean).")
                .Register(*registry_)
                .Add({});
  draining_ = &prometheus::BuildGauge()
                   .Name("dattn_worker_draining")
                   .Help(
                       "1 while the coordinator drains this worker (no new ranks; running ones "
                       "finish), else 0 (unit: boolean); read per scrape.")
                   .Register(*registry_)
                   .Add({});
  registrations_ = &prometheus::BuildCounter()
                        .Name("dattn_worker_registrations_total")
                        .Help(
                            "Successful RegisterWorker calls of this process (unit: "
                            "registrations): 1 after the first, +1 per re-registration "
                            "(coordinator restart, or declared dead).")
                        .Register(*registry_)
                        .Add({});
  prometheus::BuildGauge()
      .Name("dattn_worker_slots")
      .Help("Ranks this worker runs at once, --slots (unit: ranks).")
      .Register(*registry_)
      .Add({})
      .Set(options.slots);
  ranks_ = &prometheus::BuildGauge()
                .Name("dattn_worker_ranks")
                .Help(
                    "Ranks held by this worker now, by phase (unit: ranks): preparing (planning, "
                    "allocating, generating inputs), forming_ring (waiting for ring peers), "
                    "running (engine steps), finished (ended; final report not yet taken by the "
                    "coordinator); read per scrape.")
                .Register(*registry_);
  for (const char* phase : kPhases) ranks_->Add({{"phase", phase}});
  ranks_total_ = &prometheus::BuildCounter()
                      .Name("dattn_worker_ranks_total")
                      .Help(
                          "Ranks (tasks) that ended on this worker, by outcome (unit: ranks): "
                          "succeeded, failed, cancelled, or refused (not started: no free slot, "
                          "draining, stopping, device failed); counted when the outcome is known.")
                      .Register(*registry_);
  for (const char* outcome : kOutcomes) ranks_total_->Add({{"outcome", outcome}});
  rank_failures_ = &prometheus::BuildCounter()
                        .Name("dattn_worker_rank_failures_total")
                        .Help(
                            "Ranks that failed on this worker (refusals not counted), by status "
                            "code name (unit: ranks): RESOURCE_EXHAUSTED is out of memory, "
                            "UNAVAILABLE / DEADLINE_EXCEEDED a peer or the coordinator gone.")
                        .Register(*registry_);
  for (absl::StatusCode code : kRankFailureCodes) {
    rank_failures_->Add({{"code", absl::StatusCodeToString(code)}});
  }
  steps_ = &prometheus::BuildCounter()
                .Name("dattn_worker_steps_total")
                .Help(
                    "Engine steps (forward, or forward + backward) done by ranks on this worker "
                    "(unit: steps); counted when each rank ends, whatever its outcome.")
                .Register(*registry_)
                .Add({});
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("dattn_worker_step_seconds")
                       .Help(
                           "Step time of each rank that succeeded on this worker (unit: seconds; "
                           "the median of its steps), one observation per rank.")
                       .Register(*registry_)
                       .Add({}, metrics::StepSecondsBuckets());
  ring_formations_ = &prometheus::BuildCounter()
                          .Name("dattn_worker_ring_formations_total")
                          .Help(
                              "Ring ranks on this worker by how their ring's formation ended "
                              "(unit: ranks): formed (communicator up), timed_out (peers missing "
                              "past the formation timeout), failed (ended otherwise while "
                              "forming); ranks cancelled while forming are not counted.")
                          .Register(*registry_);
  ring_formation_seconds_ = &prometheus::BuildHistogram()
                                 .Name("dattn_worker_ring_formation_seconds")
                                 .Help(
                                     "Formation time of each ring rank formed on this worker "
                                     "(unit: seconds): arrival at the rendezvous store to a "
                                     "formed communicator.")
                                 .Register(*registry_);
  communicator_errors_ = &prometheus::BuildCounter()
                              .Name("dattn_worker_communicator_errors_total")
                              .Help(
                                  "Ring communicators (Gloo, NCCL) on this worker that failed, by "
                                  "backend and status code (unit: communicators; each counted "
                                  "once): creation failed, or broken by a peer gone "
                                  "(UNAVAILABLE), a timeout (DEADLINE_EXCEEDED) or a library "
                                  "error (INTERNAL); this worker's own aborts (cancels) are not "
                                  "counted.")
                              .Register(*registry_);
  for (const std::string& backend : device_->ring_backends()) {
    for (const char* outcome : kFormationOutcomes) {
      ring_formations_->Add({{"backend", backend}, {"outcome", outcome}});
    }
    ring_formation_seconds_->Add({{"backend", backend}}, metrics::RingFormationSecondsBuckets());
    for (absl::StatusCode code : kCommunicatorCodes) {
      communicator_errors_->Add({{"backend", backend}, {"code", absl::StatusCodeToString(code)}});
    }
  }
  oom_retries_ = &prometheus::BuildCounter()
                      .Name("dattn_worker_out_of_memory_retries_total")
                      .Help(
                          "Rank set-ups on this worker that ran out of memory and were retried "
                          "once after releasing the device's caches (unit: set-ups), by outcome: "
                          "recovered (the retry fit) or failed (the rank reported "
                          "RESOURCE_EXHAUSTED).")
                      .Register(*registry_);
  for (const char* outcome : {"recovered", "failed"}) oom_retries_->Add({{"outcome", outcome}});
  device_healthy_ = &prometheus::BuildGauge()
                         .Name("dattn_worker_device_healthy")
                         .Help(
                             "1 while the device check passes (a GPU: cudaMemGetInfo in the "
                             "worker's context; a sticky CUDA error fails it until restart), "
                             "else 0 (unit: boolean); read per scrape.")
                         .Register(*registry_)
                         .Add({});
  prometheus::BuildGauge()
      .Name("dattn_worker_device_memory_total_bytes")
      .Help("Memory of the worker's device (unit: bytes): the GPU's, or the host's MemTotal.")
      .Register(*registry_)
      .Add({})
      .Set(static_cast<double>(device_->total_memory_bytes()));
  memory_free_ = &prometheus::BuildGauge()
                      .Name("dattn_worker_device_memory_free_bytes")
                      .Help(
                          "Free memory of the worker's device (unit: bytes): cudaMemGetInfo on a "
                          "GPU, MemAvailable on the host; read per scrape.")
                      .Register(*registry_)
                      .Add({});
  memory_reserved_ = &prometheus::BuildGauge()
                          .Name("dattn_worker_device_memory_reserved_bytes")
                          .Help(
                              "Planned bytes of the ranks this worker holds (unit: bytes): their "
                              "tensors, engine workspace and ring buffers, reserved at admission "
                              "until each ends; read per scrape.")
                          .Register(*registry_)
                          .Add({});
  prometheus::BuildGauge()
      .Name("dattn_worker_memory_budget_bytes")
      .Help(
          "Memory this worker advertises and admits ranks against (unit: bytes): --memory-bytes, "
          "or the device's total when that is 0.")
      .Register(*registry_)
      .Add({})
      .Set(static_cast<double>(options.memory_budget_bytes > 0 ? options.memory_budget_bytes
                                                               : device_->total_memory_bytes()));
  Refresh(nullptr);  // The device's health and free memory from the first scrape on.
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::TaskEnded(const v1::TaskAssignment& assignment, const v1::TaskReport& report,
                              v1::RankPhase last_phase) {
  const char* outcome = nullptr;
  switch (report.state()) {
    case v1::TASK_STATE_SUCCEEDED:
      outcome = "succeeded";
      break;
    case v1::TASK_STATE_FAILED:
      outcome = report.refused() ? "refused" : "failed";
      break;
    case v1::TASK_STATE_CANCELLED:
      outcome = "cancelled";
      break;
    default:
      return;  // Not a final report.
  }
  ranks_total_->Add({{"outcome", outcome}}).Increment();
  if (report.refused()) return;
  const absl::StatusCode code = static_cast<absl::StatusCode>(report.error_code());
  if (report.state() == v1::TASK_STATE_FAILED) {
    rank_failures_->Add({{"code", absl::StatusCodeToString(code)}}).Increment();
  }
  steps_->Increment(static_cast<double>(report.progress().steps_done()));
  if (report.state() == v1::TASK_STATE_SUCCEEDED) {
    step_seconds_->Observe(report.rank_result().seconds_per_step());
  }
  if (assignment.ring().size() <= 1) return;
  const std::string& backend = assignment.ring().backend();
  if (report.ring_formation_seconds() > 0) {
    ring_formations_->Add({{"backend", backend}, {"outcome", "formed"}}).Increment();
    ring_formation_seconds_->Add({{"backend", backend}}, metrics::RingFormationSecondsBuckets())
        .Observe(report.ring_formation_seconds());
  } else if (report.state() == v1::TASK_STATE_FAILED && last_phase == v1::RANK_PHASE_FORMING_RING) {
    const char* how = code == absl::StatusCode::kDeadlineExceeded ? "timed_out" : "failed";
    ring_formations_->Add({{"backend", backend}, {"outcome", how}}).Increment();
  }
}

void WorkerMetrics::CommunicatorFailed(const std::string& backend, const absl::Status& status) {
  communicator_errors_
      ->Add({{"backend", backend}, {"code", absl::StatusCodeToString(status.code())}})
      .Increment();
}

void WorkerMetrics::OutOfMemoryRetried(bool recovered) {
  oom_retries_->Add({{"outcome", recovered ? "recovered" : "failed"}}).Increment();
}

void WorkerMetrics::Refresh(const Worker* worker) {
  absl::MutexLock lock(&mu_);
  device_healthy_->Set(device_->Health().ok() ? 1 : 0);
  absl::StatusOr<int64_t> free_bytes = device_->FreeMemoryBytes();
  if (free_bytes.ok()) memory_free_->Set(static_cast<double>(*free_bytes));
  if (worker == nullptr) {
    ready_->Set(0);
    return;
  }
  const Worker::Load load = worker->load();
  ranks_->Add({{"phase", "preparing"}}).Set(load.preparing);
  ranks_->Add({{"phase", "forming_ring"}}).Set(load.forming_ring);
  ranks_->Add({{"phase", "running"}}).Set(load.running);
  ranks_->Add({{"phase", "finished"}}).Set(load.finished);
  memory_reserved_->Set(static_cast<double>(load.reserved_bytes));
  ready_->Set(load.ready ? 1 : 0);
  draining_->Set(load.draining ? 1 : 0);
  if (load.registrations > registrations_seen_) {
    registrations_->Increment(static_cast<double>(load.registrations - registrations_seen_));
    registrations_seen_ = load.registrations;
  }
}

}  // namespace worker
}  // namespace dattn
