// WorkerMetrics (worker_metrics.h): each outcome a worker reports lands in the documented series,
// and the per-scrape gauges follow the device.
#include "worker/worker_metrics.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "worker/cpu_device.h"

namespace dattn {
namespace worker {
namespace {

using ::testing::HasSubstr;

// The host device, with a health and a free figure the test sets.
class FakeDevice final : public ForwardingDevice {
 public:
  FakeDevice() : ForwardingDevice(HostDevice()) {}
  absl::Status health = absl::OkStatus();
  int64_t free_bytes = 3 << 20;

  std::string device_name() const override { return "fake \"device\""; }
  int device_index() const override { return 0; }
  int64_t total_memory_bytes() const override { return 8 << 20; }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override { return free_bytes; }
  absl::Status Health() const override { return health; }
  std::vector<std::string> ring_backends() const override { return {"gloo"}; }

 private:
  static std::shared_ptr<TaskDevice> HostDevice() {
    absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice();
    EXPECT_TRUE(host.ok()) << host.status();
    return host.ok() ? std::shared_ptr<TaskDevice>(*std::move(host)) : nullptr;
  }
};

class WorkerMetricsTest : public ::testing::Test {
 protected:
  WorkerMetricsTest() : metrics_(Options(), &device_) {}

  static WorkerMetricsOptions Options() {
    WorkerMetricsOptions options;
    options.name = "w-1";
    options.version = "test";
    options.slots = 2;
    return options;
  }

  std::string Text() const {
    return prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  }
  // The value of one series ("name{labels}" exactly as exposed); NaN when it is absent.
  double Value(const std::string& series) const {
    for (absl::string_view line : absl::StrSplit(Text(), '\n')) {
      if (absl::StartsWith(line, series + " ")) {
        double v = 0;
        if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
      }
    }
    return std::nan("");
  }

  static v1::TaskAssignment Ring(int size) {
    v1::TaskAssignment a;
    a.set_task_id("j-1/1/0");
    if (size > 1) {
      a.mutable_ring()->set_size(size);
      a.mutable_ring()->set_backend("gloo");
    }
    return a;
  }
  static v1::TaskReport Report(v1::TaskState state, absl::StatusCode code = absl::StatusCode::kOk,
                               int64_t steps = 0) {
    v1::TaskReport r;
    r.set_state(state);
    r.set_error_code(static_cast<int>(code));
    r.mutable_progress()->set_steps_done(steps);
    return r;
  }

  FakeDevice device_;
  WorkerMetrics metrics_;
};

TEST_F(WorkerMetricsTest, AFreshWorkerListsEveryFamilyAtZero) {
  EXPECT_EQ(Value("dattn_worker_ready"), 0);
  EXPECT_EQ(Value("dattn_worker_slots"), 2);
  EXPECT_EQ(Value("dattn_worker_ranks{phase=\"running\"}"), 0);
  EXPECT_EQ(Value("dattn_worker_ranks_total{outcome=\"refused\"}"), 0);
  EXPECT_EQ(Value("dattn_worker_ring_formations_total{backend=\"gloo\",outcome=\"timed_out\"}"), 0);
  EXPECT_EQ(Value("dattn_worker_rank_failures_total{code=\"RESOURCE_EXHAUSTED\"}"), 0);
  EXPECT_EQ(
      Value("dattn_worker_communicator_errors_total{backend=\"gloo\",code=\"DEADLINE_EXCEEDED\"}"),
      0);
  EXPECT_EQ(Value("dattn_worker_device_healthy"), 1);
  EXPECT_EQ(Value("dattn_worker_device_memory_free_bytes"), 3 << 20);
  EXPECT_EQ(Value("dattn_worker_device_memory_total_bytes"), 8 << 20);
  EXPECT_EQ(Value("dattn_worker_memory_budget_bytes"), 8 << 20);
  // Label values are escaped as the text format requires.
  EXPECT_THAT(Text(), HasSubstr("device=\"fake \\\"device\\\"\""));
  EXPECT_THAT(Text(), HasSubstr("worker=\"w-1\""));
  for (const char* name :
       {"dattn_worker_info", "dattn_worker_draining", "dattn_worker_registrations_total",
        "dattn_worker_rank_failures_total", "dattn_worker_steps_total", "dattn_worker_step_seconds",
        "dattn_worker_ring_formation_seconds", "dattn_worker_communicator_errors_total",
        "dattn_worker_device_healthy", "dattn_worker_device_memory_free_bytes",
        "dattn_worker_device_memory_reserved_bytes"}) {
    EXPECT_THAT(Text(), HasSubstr(absl::StrCat("# TYPE ", name, " "))) << name;
  }
}

TEST_F(WorkerMetricsTest, OutcomesStepsAndFailuresByCode) {
  v1::TaskReport ok = Report(v1::TASK_STATE_SUCCEEDED, absl::StatusCode::kOk, 5);
  ok.mutable_rank_result()->set_seconds_per_step(0.02);
  metrics_.TaskEnded(Ring(1), ok, v1::RANK_PHASE_RUNNING);
  metrics_.TaskEnded(Ring(1),
                     Report(v1::TASK_STATE_FAILED, absl::StatusCode::kResourceExhausted, 0),
                     v1::RANK_PHASE_PREPARING);
  metrics_.TaskEnded(Ring(1), Report(v1::TASK_STATE_CANCELLED, absl::StatusCode::kOk, 2),
                     v1::RANK_PHASE_RUNNING);
  v1::TaskReport refused = Report(v1::TASK_STATE_FAILED, absl::StatusCode::kUnavailable);
  refused.set_refused(true);
  metrics_.TaskEnded(Ring(1), refused, v1::RANK_PHASE_UNSPECIFIED);
  // Not final: ignored.
  metrics_.TaskEnded(Ring(1), Report(v1::TASK_STATE_PROGRESS), v1::RANK_PHASE_RUNNING);

  EXPECT_EQ(Value("dattn_worker_ranks_total{outcome=\"succeeded\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_ranks_total{outcome=\"failed\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_ranks_total{outcome=\"cancelled\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_ranks_total{outcome=\"refused\"}"), 1);
  // A refusal is not a failure of the rank.
  EXPECT_EQ(Value("dattn_worker_rank_failures_total{code=\"RESOURCE_EXHAUSTED\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_rank_failures_total{code=\"UNAVAILABLE\"}"), 0);
  EXPECT_EQ(Value("dattn_worker_steps_total"), 7);
  EXPECT_EQ(Value("dattn_worker_step_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Value("dattn_worker_step_seconds_sum"), 0.02);
  EXPECT_EQ(Value("dattn_worker_step_seconds_bucket{le=\"0.03\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_step_seconds_bucket{le=\"0.01\"}"), 0);
}

TEST_F(WorkerMetricsTest, RingFormationsByHowTheyEnded) {
  v1::TaskReport formed = Report(v1::TASK_STATE_SUCCEEDED, absl::StatusCode::kOk, 1);
  formed.set_ring_formation_seconds(0.25);
  metrics_.TaskEnded(Ring(2), formed, v1::RANK_PHASE_RUNNING);
  // Formed, then failed with a peer gone: formed (the communicator's failure is counted by the
  // metered device, not here).
  v1::TaskReport formed_then_failed =
      Report(v1::TASK_STATE_FAILED, absl::StatusCode::kUnavailable, 1);
  formed_then_failed.set_ring_formation_seconds(0.5);
  metrics_.TaskEnded(Ring(2), formed_then_failed, v1::RANK_PHASE_RUNNING);
  metrics_.TaskEnded(Ring(2), Report(v1::TASK_STATE_FAILED, absl::StatusCode::kDeadlineExceeded),
                     v1::RANK_PHASE_FORMING_RING);
  metrics_.TaskEnded(Ring(2), Report(v1::TASK_STATE_FAILED, absl::StatusCode::kUnavailable),
                     v1::RANK_PHASE_FORMING_RING);
  // Not formation outcomes: cancelled while forming; failed before forming (out of memory).
  metrics_.TaskEnded(Ring(2), Report(v1::TASK_STATE_CANCELLED), v1::RANK_PHASE_FORMING_RING);
  metrics_.TaskEnded(Ring(2), Report(v1::TASK_STATE_FAILED, absl::StatusCode::kResourceExhausted),
                     v1::RANK_PHASE_PREPARING);

  EXPECT_EQ(Value("dattn_worker_ring_formations_total{backend=\"gloo\",outcome=\"formed\"}"), 2);
  EXPECT_EQ(Value("dattn_worker_ring_formations_total{backend=\"gloo\",outcome=\"timed_out\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_ring_formations_total{backend=\"gloo\",outcome=\"failed\"}"), 1);
  EXPECT_EQ(Value("dattn_worker_ring_formation_seconds_count{backend=\"gloo\"}"), 2);
  EXPECT_DOUBLE_EQ(Value("dattn_worker_ring_formation_seconds_sum{backend=\"gloo\"}"), 0.75);
}

TEST_F(WorkerMetricsTest, CommunicatorFailuresByBackendAndCode) {
  metrics_.CommunicatorFailed("nccl", absl::InternalError("unhandled cuda error"));
  metrics_.CommunicatorFailed("nccl", absl::InternalError("again"));
  metrics_.CommunicatorFailed("gloo", absl::UnavailableError("peer closed"));
  EXPECT_EQ(Value("dattn_worker_communicator_errors_total{backend=\"nccl\",code=\"INTERNAL\"}"), 2);
  EXPECT_EQ(Value("dattn_worker_communicator_errors_total{backend=\"gloo\",code=\"UNAVAILABLE\"}"),
            1);
}

TEST_F(WorkerMetricsTest, OutOfMemoryRetriesByOutcome) {
  EXPECT_EQ(Value("dattn_worker_out_of_memory_retries_total{outcome=\"recovered\"}"), 0);
  EXPECT_EQ(Value("dattn_worker_out_of_memory_retries_total{outcome=\"failed\"}"), 0);
  metrics_.OutOfMemoryRetried(true);
  metrics_.OutOfMemoryRetried(true);
  metrics_.OutOfMemoryRetried(false);
  EXPECT_EQ(Value("dattn_worker_out_of_memory_retries_total{outcome=\"recovered\"}"), 2);
  EXPECT_EQ(Value("dattn_worker_out_of_memory_retries_total{outcome=\"failed\"}"), 1);
}

TEST_F(WorkerMetricsTest, ScrapeTimeGaugesFollowTheDeviceAndReadiness) {
  metrics_.Refresh(nullptr);
  EXPECT_EQ(Value("dattn_worker_device_healthy"), 1);
  EXPECT_EQ(Value("dattn_worker_device_memory_free_bytes"), 3 << 20);
  device_.health = absl::InternalError("an illegal memory access was encountered");
  device_.free_bytes = 1 << 20;
  metrics_.Refresh(nullptr);
  EXPECT_EQ(Value("dattn_worker_device_healthy"), 0);
  EXPECT_EQ(Value("dattn_worker_device_memory_free_bytes"), 1 << 20);
  EXPECT_EQ(Value("dattn_worker_ready"), 0);  // No worker yet: not ready.
}

}  // namespace
}  // namespace worker
}  // namespace dattn
