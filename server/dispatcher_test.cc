// The dispatcher alone: feasibility against the workers shown, device kinds, the settle rule for
// unchecked jobs, and placements.
#include "server/dispatcher.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_kind.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

scheduler::WorkerInfo Cpu(const std::string& id, int64_t memory) {
  scheduler::WorkerInfo w;
  w.id = id;
  w.total_memory_bytes = memory;
  w.free_memory_bytes = memory;
  w.is_gpu = false;
  w.dtypes = {"fp32", "fp64"};
  return w;
}

class DispatcherTest : public ::testing::Test {
 protected:
  // A job of `ranks` ranks needing `memory` per rank, on GPU then CPU (DEVICE_PREFERENCE_ANY).
  JobRun* Add(const std::string& id, int64_t memory, int ranks = 1) {
    auto analysis = std::make_shared<JobAnalysis>();
    analysis->num_ranks = ranks;
    analysis->dtype = "fp32";
    for (bool gpu : {true, false}) {
      DeviceOption d;
      d.gpu = gpu;
      d.memory_per_rank_bytes = memory;
      d.memory_plan = "plan " + std::to_string(memory);
      analysis->devices.push_back(d);
    }
    StoredJob stored;
    stored.job.set_job_id(id);
    stored.job.set_state(v1::JOB_STATE_QUEUED);
    stored.submit_seq = ++seq_;
    return book_.Add(stored, &kind_, analysis);
  }
  Metrics metrics_;
  AttentionKind kind_{&metrics_};
  JobBook book_{&metrics_};
  Dispatcher dispatcher_{DispatcherOptions{absl::Minutes(10), absl::Seconds(5)}, &metrics_};
  int64_t seq_ = 0;
  const absl::Time t0_ = absl::FromUnixSeconds(1000);
};

TEST_F(DispatcherTest, FeasibilityNamesEveryDeviceKindsNumbers) {
  JobRun* run = Add("j-1", 2000);
  EXPECT_TRUE(dispatcher_.CheckFeasible(*run->analysis, {}, 0).ok());  // No worker yet: wait.
  absl::Status s = dispatcher_.CheckFeasible(*run->analysis, {Cpu("c0", 1000)}, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("none of the 1 ready worker is a GPU worker"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(memory plan per rank: plan 2000)"));
  EXPECT_TRUE(dispatcher_.CheckFeasible(*run->analysis, {Cpu("c0", 4000)}, 1).ok());
}

// A job with several device kinds is queued for the first kind the workers could fit, and placed.
TEST_F(DispatcherTest, AnyDeviceGoesToTheKindThatFits) {
  JobRun* run = Add("j-1", 500);
  const std::vector<scheduler::WorkerInfo> workers = {Cpu("c0", 1000)};
  dispatcher_.Enqueue(run, workers, 1);
  EXPECT_EQ(run->device, 1u);  // CPU.
  EXPECT_EQ(dispatcher_.Position("j-1"), std::optional<size_t>(1));
  absl::StatusOr<std::vector<scheduler::Placement>> placed = dispatcher_.Schedule(workers, t0_);
  ASSERT_TRUE(placed.ok());
  ASSERT_EQ(placed->size(), 1u);
  EXPECT_EQ((*placed)[0].worker_ids, std::vector<std::string>({"c0"}));
  EXPECT_TRUE(dispatcher_.empty());
}

// Unchecked jobs are looked at only once the ready set has been stable for the settle time; one
// that can never run is reported, one placed before is left to wait.
TEST_F(DispatcherTest, UncheckedJobsWaitForTheReadySetToSettle) {
  JobRun* big = Add("j-big", 5000);
  JobRun* small = Add("j-small", 500);
  JobRun* placed_before = Add("j-before", 5000);
  placed_before->placed_before = true;
  for (JobRun* run : {big, small, placed_before}) dispatcher_.Enqueue(run, {}, 0);
  const std::vector<scheduler::WorkerInfo> workers = {Cpu("c0", 1000)};
  const std::vector<JobRun*> runs = {big, small, placed_before};
  EXPECT_TRUE(dispatcher_.Check(t0_, "c0", runs, workers).empty());
  EXPECT_TRUE(dispatcher_.Check(t0_ + absl::Seconds(4), "c0", runs, workers).empty());
  std::vector<Dispatcher::Verdict> verdicts =
      dispatcher_.Check(t0_ + absl::Seconds(5), "c0", runs, workers);
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].run, big);
  EXPECT_THAT(verdicts[0].reason, HasSubstr("can never run on the ready workers"));
  EXPECT_TRUE(small->checked);
  EXPECT_EQ(small->device, 1u);
  EXPECT_FALSE(placed_before->checked);
  // A new ready set starts the wait again.
  EXPECT_TRUE(dispatcher_.Check(t0_ + absl::Seconds(6), "c0,c1", {placed_before}, workers).empty());
}

}  // namespace
}  // namespace server
}  // namespace dattn
