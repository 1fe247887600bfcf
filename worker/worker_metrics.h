// The worker process's own Prometheus metrics, served on its --metrics-listen port by
// metrics::MetricsServer (metrics/metrics_server.h): what the worker and its device see, whether
// or not the coordinator is reachable. The coordinator's view of each worker (from heartbeats and
// reports: dattn_worker_memory_*_bytes{worker}, dattn_worker_rank_step_seconds{worker}, ...) is in
// server/metrics.h; no name here is one of those, so that a query never mixes the two.
//
// Names, labels and HELP texts (unit and counting rule) are an interface (deploy/'s dashboards and
// alert rules, docs/DEPLOY.md): change them only additively.
//
//   name                                          type       counting rule
//   dattn_worker_info{worker,kind,device,device_index,version}
//                                                 gauge      1; who this process is (kind: cpu|gpu)
//   dattn_worker_ready                            gauge      1 while registered and accepting work
//                                                            (the health port's "dattn-worker")
//   dattn_worker_draining                         gauge      1 while the coordinator drains it
//   dattn_worker_registrations_total              counter    successful RegisterWorker calls
//   dattn_worker_slots                            gauge      ranks it runs at once (--slots)
//   dattn_worker_ranks{phase}                     gauge      ranks held, by phase: preparing |
//                                                            forming_ring | running | finished
//                                                            (final report not yet delivered)
//   dattn_worker_ranks_total{outcome}             counter    ranks ended: succeeded | failed |
//                                                            cancelled | refused (never started)
//   dattn_worker_rank_failures_total{code}        counter    failed ranks by status code
//                                                            (RESOURCE_EXHAUSTED, UNAVAILABLE, ...)
//   dattn_worker_steps_total                      counter    engine steps done by ranks that ended
//   dattn_worker_step_seconds                     histogram  each succeeded rank's median step time
//   dattn_worker_ring_formations_total{backend,outcome}
//                                                 counter    ring ranks by how their formation
//                                                            ended: formed | timed_out | failed
//                                                            (cancelled ones not counted)
//   dattn_worker_ring_formation_seconds{backend}  histogram  each formed rank: arrival to
//                                                            communicator
//   dattn_worker_communicator_errors_total{backend,code}
//                                                 counter    communicators that failed (not by
//                                                            this worker's own abort;
//                                                            metered_device.h)
//   dattn_worker_out_of_memory_retries_total{outcome}
//                                                 counter    set-ups that ran out of memory and
//                                                            were retried once after releasing the
//                                                            device's caches (oom_retry.h):
//                                                            recovered | failed
//   dattn_worker_device_healthy                   gauge      1 while the device check passes
//                                                            (TaskDevice::Health), read per scrape
//   dattn_worker_device_memory_total_bytes        gauge      the device's memory (GPU, or host)
//   dattn_worker_device_memory_free_bytes         gauge      free now (cudaMemGetInfo /
//                                                            MemAvailable), read per scrape
//   dattn_worker_device_memory_reserved_bytes     gauge      planned bytes of the ranks held here
//   dattn_worker_memory_budget_bytes              gauge      bytes the worker advertises and
//                                                            budgets ranks against (--memory-bytes,
//                                                            else the device's total)
//
// Every family exists from the start, with the label values known in advance at zero (phases,
// outcomes, the device's ring backends, the codes ranks and communicators usually fail with), so a
// fresh worker's scrape lists every name (a dashboard or alert never names a missing metric) and
// rate() has a start; other codes appear when they first happen.
//
// Thread-safety: every method may be called from any thread (prometheus-cpp metrics are atomic).
#ifndef DATTN_WORKER_WORKER_METRICS_H_
#define DATTN_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dattn/v1/worker.pb.h"
#include "worker/task_device.h"
#include "worker/worker.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace dattn {
namespace worker {

struct WorkerMetricsOptions {
  std::string name;     // The worker's name (--name): the `worker` label of dattn_worker_info.
  std::string version;  // kWorkerVersion.
  int slots = 1;        // --slots.
  int64_t memory_budget_bytes = 0;  // --memory-bytes; 0: the device's total.
};

class WorkerMetrics {
 public:
  // `device` (not owned) is read at construction (name, kind, index, ring backends) and on every
  // Refresh; it must outlive this object.
  WorkerMetrics(const WorkerMetricsOptions& options, const TaskDevice* device);
  ~WorkerMetrics();
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // WorkerOptions::on_task_end: counts the rank's outcome, failure code, steps, step time and, for
  // a ring rank, how its formation ended (formed: ring_formation_seconds > 0; otherwise, a FAILED
  // rank whose last phase was FORMING_RING: timed_out for DEADLINE_EXCEEDED, else failed).
  void TaskEnded(const v1::TaskAssignment& assignment, const v1::TaskReport& report,
                 v1::RankPhase last_phase);
  // CommunicatorFailureCallback (metered_device.h).
  void CommunicatorFailed(const std::string& backend, const absl::Status& status);
  // A task's set-up ran out of memory and was retried (oom_retry.h).
  void OutOfMemoryRetried(bool recovered);
  // Reads what is read per scrape (MetricsServer's before_scrape): the worker's load, readiness,
  // drain state and registrations (one snapshot, Worker::load(), so that a scrape never shows the
  // worker ready before the registration that made it so), and the device's health and free memory.
  // `worker` may be null before it exists (not ready).
  void Refresh(const Worker* worker);

 private:
  const TaskDevice* const device_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* ready_;
  prometheus::Gauge* draining_;
  prometheus::Counter* registrations_;
  prometheus::Family<prometheus::Gauge>* ranks_;
  prometheus::Family<prometheus::Counter>* ranks_total_;
  prometheus::Family<prometheus::Counter>* rank_failures_;
  prometheus::Counter* steps_;
  prometheus::Histogram* step_seconds_;
  prometheus::Family<prometheus::Counter>* ring_formations_;
  prometheus::Family<prometheus::Histogram>* ring_formation_seconds_;
  prometheus::Family<prometheus::Counter>* communicator_errors_;
  prometheus::Family<prometheus::Counter>* oom_retries_;
  prometheus::Gauge* device_healthy_;
  prometheus::Gauge* memory_free_;
  prometheus::Gauge* memory_reserved_;

  absl::Mutex mu_;  // Serialises Refresh (the registrations counter is advanced by differences).
  int64_t registrations_seen_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace worker
}  // namespace dattn

#endif  // DATTN_WORKER_WORKER_METRICS_H_
