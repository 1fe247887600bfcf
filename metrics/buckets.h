// Histogram bucket boundaries shared by the coordinator's metrics (server/metrics.h) and each
// worker's (worker/worker_metrics.h): a histogram of the same quantity has the same buckets in
// every process, so that a dashboard can put the coordinator's and a worker's quantiles side by
// side. Returned references live for the process (never destroyed); thread-safe.
#ifndef DATTN_METRICS_BUCKETS_H_
#define DATTN_METRICS_BUCKETS_H_

#include "prometheus/histogram.h"

namespace dattn {
namespace metrics {

// Engine step times (seconds), from a GPU's fraction of a millisecond to a CPU's minutes.
inline const prometheus::Histogram::BucketBoundaries& StepSecondsBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300};
  return *buckets;
}

// Ring formation times (seconds): arrival at the rendezvous to a working communicator.
inline const prometheus::Histogram::BucketBoundaries& RingFormationSecondsBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
  return *buckets;
}

}  // namespace metrics
}  // namespace dattn

#endif  // DATTN_METRICS_BUCKETS_H_
