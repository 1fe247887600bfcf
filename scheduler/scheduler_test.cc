#include "scheduler/scheduler.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/test_util.h"

namespace dattn {
namespace scheduler {
namespace {

using testing::CheckPlacements;
using testing::Cpu;
using testing::Gpu;
using testing::kGiB;
using Ids = std::vector<std::string>;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

JobRequest J(const std::string& id, int ranks, int64_t mem, int64_t seq, int priority = 0,
             const std::string& tenant = "t") {
  JobRequest j = testing::Job(id, ranks, mem, seq);
  j.priority = priority;
  j.tenant = tenant;
  j.submit_time = kT0 + absl::Seconds(seq);
  return j;
}

std::vector<WorkerInfo> Gpus(int n, int64_t mem) {
  std::vector<WorkerInfo> w;
  for (int i = 0; i < n; ++i) w.push_back(Gpu(absl::StrCat("g", i), mem));
  return w;
}

Ids PlacedIds(const std::vector<Placement>& placements) {
  Ids ids;
  for (const Placement& p : placements) ids.push_back(p.job_id);
  return ids;
}

std::vector<Placement> SchedulePass(Scheduler& s, const std::vector<WorkerInfo>& workers,
                                    absl::Time now) {
  absl::StatusOr<std::vector<Placement>> placed = s.Schedule(workers, now);
  EXPECT_TRUE(placed.ok()) << placed.status();
  return placed.ok() ? *placed : std::vector<Placement>();
}

TEST(SchedulerTest, PlacesWhatFitsWithoutOverCommitting) {
  Scheduler s;
  std::vector<JobRequest> jobs = {J("a", 1, 6 * kGiB, 1), J("b", 1, 6 * kGiB, 2),
                                  J("c", 1, 6 * kGiB, 3)};
  for (const JobRequest& j : jobs) ASSERT_TRUE(s.Enqueue(j).ok());
  std::vector<WorkerInfo> workers = Gpus(2, 8 * kGiB);
  std::vector<Placement> placed = SchedulePass(s, workers, kT0);
  EXPECT_EQ(PlacedIds(placed), Ids({"a", "b"}));
  EXPECT_EQ(CheckPlacements(workers, jobs, placed), "");
  EXPECT_EQ(s.queue().size(), 1u);
  EXPECT_TRUE(s.queue().Contains("c"));
  EXPECT_FALSE(s.queue().Contains("a"));
}

TEST(SchedulerTest, SubtractsRanksAndMemoryOfMultiRankJobsWithinAPass) {
  Scheduler s;
  JobRequest a = J("a", 3, 4 * kGiB, 1), b = J("b", 2, 4 * kGiB, 2), c = J("c", 1, 4 * kGiB, 3);
  for (JobRequest* j : {&a, &b, &c}) {
    j->needs_gpu = false;
    ASSERT_TRUE(s.Enqueue(*j).ok());
  }
  std::vector<WorkerInfo> workers = {Cpu("c0", 4, 16 * kGiB)};
  std::vector<Placement> placed = SchedulePass(s, workers, kT0);
  EXPECT_EQ(PlacedIds(placed), Ids({"a", "c"}));
  EXPECT_EQ(CheckPlacements(workers, {a, b, c}, placed), "");
}

TEST(SchedulerTest, HigherPriorityWinsWhenBothFit) {
  Scheduler s;
  ASSERT_TRUE(s.Enqueue(J("low", 1, kGiB, 1, 0)).ok());
  ASSERT_TRUE(s.Enqueue(J("high", 1, kGiB, 2, 5)).ok());
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(1, 8 * kGiB), kT0)), Ids({"high"}));
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(1, 8 * kGiB), kT0)), Ids({"low"}));
}

TEST(SchedulerTest, FifoWithinTenantAndPriority) {
  Scheduler s;
  ASSERT_TRUE(s.Enqueue(J("second", 1, kGiB, 2)).ok());
  ASSERT_TRUE(s.Enqueue(J("first", 1, kGiB, 1)).ok());
  ASSERT_TRUE(s.Enqueue(J("third", 1, kGiB, 3)).ok());
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(1, 8 * kGiB), kT0)), Ids({"first"}));
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(1, 8 * kGiB), kT0)), Ids({"second"}));
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(1, 8 * kGiB), kT0)), Ids({"third"}));
}

TEST(SchedulerTest, BackfillsPastAJobThatDoesNotFit) {
  Scheduler s;
  ASSERT_TRUE(s.Enqueue(J("big", 4, kGiB, 1, 5)).ok());
  ASSERT_TRUE(s.Enqueue(J("small", 1, kGiB, 2, 0)).ok());
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(2, 8 * kGiB), kT0 + absl::Seconds(5))), Ids({"small"}));
  EXPECT_TRUE(s.queue().Contains("big"));
  EXPECT_TRUE(s.last_reservations().empty());
}

TEST(SchedulerTest, StarvedJobReservesItsWorkers) {
  SchedulerOptions options;
  options.starvation_bound = absl::Minutes(5);
  JobRequest cpu_job = J("cpu", 1, kGiB, 3, 0);
  cpu_job.needs_gpu = false;
  std::vector<WorkerInfo> workers = Gpus(2, 8 * kGiB);
  workers[0].running_ranks = 1;  // Busy: big does not fit now.
  workers[0].free_memory_bytes = 0;
  workers.push_back(Cpu("c0", 4, 16 * kGiB));

  // Before the bound: backfill.
  Scheduler s(options);
  for (const JobRequest& j : {J("big", 2, 4 * kGiB, 1, 5), J("small", 1, kGiB, 2, 0), cpu_job}) {
    ASSERT_TRUE(s.Enqueue(j).ok());
  }
  EXPECT_EQ(PlacedIds(SchedulePass(s, workers, kT0 + absl::Minutes(4))), Ids({"small", "cpu"}));

  // Past the bound: the GPUs are held for big; the CPU job still runs on the CPU host.
  Scheduler s2(options);
  for (const JobRequest& j : {J("big", 2, 4 * kGiB, 1, 5), J("small", 1, kGiB, 2, 0), cpu_job}) {
    ASSERT_TRUE(s2.Enqueue(j).ok());
  }
  EXPECT_EQ(PlacedIds(SchedulePass(s2, workers, kT0 + absl::Minutes(6))), Ids({"cpu"}));
  EXPECT_EQ(s2.last_reservations(), Ids({"big"}));
  EXPECT_TRUE(s2.queue().Contains("small"));
  // Once the busy GPU frees up, big goes first.
  std::vector<Placement> placed = SchedulePass(s2, Gpus(2, 8 * kGiB), kT0 + absl::Minutes(7));
  EXPECT_EQ(PlacedIds(placed), Ids({"big"}));
  // small has now waited past the bound too, and claims the GPUs as big releases them.
  EXPECT_EQ(s2.last_reservations(), Ids({"small"}));
}

TEST(SchedulerTest, StarvedJobDoesNotBlockJobsAheadOfIt) {
  SchedulerOptions options;
  options.starvation_bound = absl::Seconds(1);
  Scheduler s(options);
  ASSERT_TRUE(s.Enqueue(J("urgent", 1, kGiB, 5, 9)).ok());
  ASSERT_TRUE(s.Enqueue(J("big", 3, kGiB, 1, 5)).ok());
  ASSERT_TRUE(s.Enqueue(J("small", 1, kGiB, 2, 0)).ok());
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(3, 8 * kGiB), kT0 + absl::Hours(1))), Ids({"urgent"}));
  EXPECT_EQ(s.last_reservations(), Ids({"big"}));
}

TEST(SchedulerTest, StarvedJobThatCanNeverFitReservesNothing) {
  SchedulerOptions options;
  options.starvation_bound = absl::Seconds(1);
  Scheduler s(options);
  ASSERT_TRUE(s.Enqueue(J("huge", 1, 100 * kGiB, 1, 5)).ok());
  ASSERT_TRUE(s.Enqueue(J("small", 1, kGiB, 2, 0)).ok());
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(2, 8 * kGiB), kT0 + absl::Hours(1))), Ids({"small"}));
  EXPECT_TRUE(s.last_reservations().empty());
}

TEST(SchedulerTest, InfiniteBoundNeverReserves) {
  SchedulerOptions options;
  options.starvation_bound = absl::InfiniteDuration();
  Scheduler s(options);
  ASSERT_TRUE(s.Enqueue(J("big", 3, kGiB, 1, 5)).ok());
  ASSERT_TRUE(s.Enqueue(J("small", 1, kGiB, 2, 0)).ok());
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(2, 8 * kGiB), kT0 + absl::Hours(1000))), Ids({"small"}));
}

TEST(SchedulerTest, TwoFloodingTenantsShareTheCluster) {
  Scheduler s;
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(s.Enqueue(J(absl::StrCat("a", i), 1, kGiB, i, 0, "A")).ok());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(s.Enqueue(J(absl::StrCat("b", i), 1, kGiB, 10 + i, 0, "B")).ok());
  }
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(3, 8 * kGiB), kT0)), Ids({"a0", "b0", "a1"}));
  // A was served last in the previous pass, so B leads this one.
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(3, 8 * kGiB), kT0)), Ids({"b1", "a2", "b2"}));
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(2, 8 * kGiB), kT0)), Ids({"a3", "b3"}));
}

TEST(SchedulerTest, TenantQuotaOnRunningRanksHoldsBackOnlyThatTenant) {
  SchedulerOptions options;
  options.tenant_max_running_ranks = 3;
  options.starvation_bound = absl::ZeroDuration();  // Every waiting job is starved.
  Scheduler s(options);
  // A holds 1 rank already: a0 (2 ranks) fits its quota, a1 (1 rank) would make 4. B is free.
  ASSERT_TRUE(s.Enqueue(J("a0", 2, kGiB, 1, 0, "A")).ok());
  ASSERT_TRUE(s.Enqueue(J("a1", 1, kGiB, 2, 0, "A")).ok());
  ASSERT_TRUE(s.Enqueue(J("b0", 2, kGiB, 3, 0, "B")).ok());
  ASSERT_TRUE(s.Enqueue(J("b1", 1, kGiB, 4, 0, "B")).ok());
  const TenantRanks running = {{"A", 1}};
  absl::StatusOr<std::vector<Placement>> placed = s.Schedule(Gpus(8, 8 * kGiB), kT0, running);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(PlacedIds(*placed), Ids({"a0", "b0", "b1"}));
  ASSERT_EQ(s.last_quota_waits().size(), 1u);
  EXPECT_EQ(s.last_quota_waits()[0].job_id, "a1");
  EXPECT_EQ(s.last_quota_waits()[0].tenant, "A");
  EXPECT_EQ(s.last_quota_waits()[0].tenant_ranks, 3);
  EXPECT_EQ(s.last_quota_waits()[0].num_ranks, 1);
  // A job held back by its quota reserves nothing, starved or not.
  EXPECT_TRUE(s.last_reservations().empty());

  // Once A's ranks end, a1 starts; without `running` nothing is held.
  placed = s.Schedule(Gpus(8, 8 * kGiB), kT0, {{"A", 2}});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(PlacedIds(*placed), Ids({"a1"}));
  EXPECT_TRUE(s.last_quota_waits().empty());
}

TEST(SchedulerTest, NoTenantQuotaByDefault) {
  Scheduler s;
  ASSERT_TRUE(s.Enqueue(J("a0", 4, kGiB, 1, 0, "A")).ok());
  absl::StatusOr<std::vector<Placement>> placed = s.Schedule(Gpus(4, 8 * kGiB), kT0, {{"A", 100}});
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(PlacedIds(*placed), Ids({"a0"}));
  EXPECT_TRUE(s.last_quota_waits().empty());
}

TEST(SchedulerTest, RemovedJobIsNotPlaced) {
  Scheduler s;
  ASSERT_TRUE(s.Enqueue(J("a", 1, kGiB, 1)).ok());
  ASSERT_TRUE(s.Enqueue(J("b", 1, kGiB, 2)).ok());
  ASSERT_TRUE(s.Remove("a").ok());
  EXPECT_EQ(s.Remove("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.Enqueue(J("b", 1, kGiB, 3)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(PlacedIds(SchedulePass(s, Gpus(2, 8 * kGiB), kT0)), Ids({"b"}));
  EXPECT_TRUE(s.queue().empty());
}

TEST(SchedulerTest, InvalidWorkersAreAnErrorAndLeaveTheQueueAlone) {
  Scheduler s;
  ASSERT_TRUE(s.Enqueue(J("a", 1, kGiB, 1)).ok());
  std::vector<WorkerInfo> workers = {Gpu("g0", 8 * kGiB), Gpu("g0", 8 * kGiB)};
  absl::StatusOr<std::vector<Placement>> placed = s.Schedule(workers, kT0);
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s.queue().Contains("a"));
}

TEST(SchedulerTest, SameInputsGiveTheSamePlacements) {
  std::vector<WorkerInfo> workers = Gpus(5, 8 * kGiB);
  workers[2].free_memory_bytes = 3 * kGiB;
  workers.push_back(Cpu("c0", 8, 64 * kGiB));
  auto fill = [](Scheduler& s) {
    for (int i = 0; i < 10; ++i) {
      JobRequest j = J(absl::StrCat("j", i), 1 + i % 3, kGiB * (1 + i % 4), i, i % 2,
                       absl::StrCat("t", i % 3));
      j.needs_gpu = i % 4 != 0;
      ASSERT_TRUE(s.Enqueue(j).ok());
    }
  };
  Scheduler s1, s2;
  fill(s1);
  fill(s2);
  std::vector<Placement> p1 = SchedulePass(s1, workers, kT0), p2 = SchedulePass(s2, workers, kT0);
  ASSERT_EQ(p1.size(), p2.size());
  ASSERT_FALSE(p1.empty());
  for (size_t i = 0; i < p1.size(); ++i) {
    EXPECT_EQ(p1[i].job_id, p2[i].job_id);
    EXPECT_EQ(p1[i].worker_ids, p2[i].worker_ids);
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn
