// Randomized checks of Scheduler::Schedule against its documented policy: many seeded simulations
// of arrivals, completions, cancels and worker failures, each pass replayed by an independent
// oracle.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "scheduler/test_util.h"

namespace dattn {
namespace scheduler {
namespace {

using testing::CheckPlacements;
using testing::kGiB;
using testing::RanksThatFitNow;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

struct Shape {
  int ranks;
  int64_t mem;
  const char* dtype;
  bool gpu;
};
// Few shapes, so that jobs with identical needs meet often.
const Shape kShapes[] = {
    {1, 4 * kGiB, "fp32", true},  {2, 6 * kGiB, "fp32", true},  {4, 10 * kGiB, "bf16", true},
    {1, 20 * kGiB, "bf16", true}, {3, 2 * kGiB, "fp32", false}, {6, 1 * kGiB, "fp32", false},
    {2, 70 * kGiB, "fp32", true},  // Only fits the large GPUs.
};

bool SameShape(const JobRequest& a, const JobRequest& b) {
  return a.num_ranks == b.num_ranks && a.memory_per_rank_bytes == b.memory_per_rank_bytes &&
         a.dtype == b.dtype && a.needs_gpu == b.needs_gpu;
}

std::vector<WorkerInfo> RandomCluster(std::mt19937_64& rng) {
  std::vector<WorkerInfo> workers;
  const int n = 2 + static_cast<int>(rng() % 8);
  for (int i = 0; i < n; ++i) {
    WorkerInfo w;
    if (rng() % 3 != 0) {
      w = testing::Gpu(absl::StrCat("g", i), (rng() % 2 ? 80 : 24) * kGiB);
      if (rng() % 4 == 0) w.dtypes = {"fp32"};
    } else {
      w = testing::Cpu(absl::StrCat("c", i), 1 + static_cast<int>(rng() % 8),
                       (8 + static_cast<int64_t>(rng() % 24)) * kGiB);
    }
    workers.push_back(w);
  }
  return workers;
}

void Apply(std::vector<WorkerInfo>& workers, const JobRequest& job, const Placement& p, int sign) {
  for (const std::string& id : p.worker_ids) {
    for (WorkerInfo& w : workers) {
      if (w.id != id) continue;
      w.running_ranks += sign;
      w.free_memory_bytes -= sign * job.memory_per_rank_bytes;
    }
  }
}

// Replays one pass by the policy in scheduler.h and checks every decision Schedule made.
void CheckPass(const std::vector<WorkerInfo>& workers, const std::vector<JobRequest>& order,
               const std::vector<Placement>& placements, absl::Duration bound, absl::Time now,
               const std::vector<std::string>& reservations) {
  ASSERT_EQ(CheckPlacements(workers, order, placements), "");
  std::map<std::string, const Placement*> placed;
  for (const Placement& p : placements) placed[p.job_id] = &p;

  // Placements come in queue order.
  size_t next = 0;
  for (const JobRequest& job : order) {
    if (next < placements.size() && placements[next].job_id == job.job_id) ++next;
  }
  ASSERT_EQ(next, placements.size()) << "placements out of queue order";

  std::vector<WorkerInfo> idle = workers;
  for (WorkerInfo& w : idle) {
    w.running_ranks = 0;
    w.free_memory_bytes = w.total_memory_bytes;
  }
  std::vector<WorkerInfo> pool = workers;
  std::vector<bool> reserved(pool.size(), false);
  std::vector<std::string> expected_reservations;
  for (size_t i = 0; i < order.size(); ++i) {
    const JobRequest& job = order[i];
    const bool fits = RanksThatFitNow(job, pool) >= job.num_ranks;
    auto it = placed.find(job.job_id);
    if (it != placed.end()) {
      ASSERT_TRUE(fits) << job.DebugString() << " placed where it does not fit";
      Apply(pool, job, *it->second, +1);
      continue;
    }
    ASSERT_FALSE(fits) << job.DebugString() << " skipped although it fits";
    const bool starved = job.submit_time + bound < now;
    if (starved && RanksThatFitNow(job, idle) >= job.num_ranks) {
      bool any = false;
      for (size_t w = 0; w < pool.size(); ++w) {
        if (!IsEligible(pool[w], job) || reserved[w]) continue;
        reserved[w] = any = true;
        pool[w].running_ranks = pool[w].max_ranks;
      }
      if (any) expected_reservations.push_back(job.job_id);
    }
    // Jobs of identical needs earlier in the order are placed before this one can be.
    for (size_t j = i + 1; j < order.size(); ++j) {
      if (SameShape(job, order[j])) {
        ASSERT_EQ(placed.count(order[j].job_id), 0u)
            << order[j].DebugString() << " placed ahead of " << job.DebugString();
      }
    }
  }
  // A pass over a cluster with no free slot returns at once: it can place nothing, so it records no
  // reservation either (scheduler.h).
  bool any_free_slot = false;
  for (const WorkerInfo& w : workers) {
    any_free_slot |= w.state == WorkerState::kReady && w.free_ranks() > 0;
  }
  if (!any_free_slot) expected_reservations.clear();
  ASSERT_EQ(reservations, expected_reservations);
}

TEST(SchedulerRandomTest, SimulationsKeepThePolicy) {
  std::mt19937_64 rng(424242);
  const absl::Duration bounds[] = {absl::InfiniteDuration(), absl::ZeroDuration(),
                                   absl::Seconds(90), absl::Minutes(5)};
  int total_placed = 0, total_reserved = 0;
  for (int sim = 0; sim < 150; ++sim) {
    std::vector<WorkerInfo> workers = RandomCluster(rng);
    SchedulerOptions options;
    options.starvation_bound = bounds[rng() % 4];
    Scheduler scheduler(options);
    std::map<std::string, std::pair<JobRequest, Placement>> running;
    absl::Time now = kT0;
    int64_t seq = 0;
    for (int step = 0; step < 40; ++step) {
      now += absl::Seconds(static_cast<int64_t>(rng() % 60));
      // Arrivals.
      const int arrivals = static_cast<int>(rng() % 4);
      for (int a = 0; a < arrivals; ++a) {
        const Shape& shape = kShapes[rng() % (sizeof(kShapes) / sizeof(kShapes[0]))];
        JobRequest job;
        job.job_id = absl::StrCat("j", seq);
        job.tenant = absl::StrCat("t", rng() % 3);
        job.priority = static_cast<int>(rng() % 3);
        job.submit_seq = seq++;
        job.submit_time = now;
        job.num_ranks = shape.ranks;
        job.memory_per_rank_bytes = shape.mem;
        job.dtype = shape.dtype;
        job.needs_gpu = shape.gpu;
        ASSERT_TRUE(scheduler.Enqueue(job).ok());
      }
      // Completions.
      for (auto it = running.begin(); it != running.end();) {
        if (rng() % 3 == 0) {
          Apply(workers, it->second.first, it->second.second, -1);
          it = running.erase(it);
        } else {
          ++it;
        }
      }
      // A cancel.
      std::vector<JobRequest> queued = scheduler.queue().Ordered();
      if (!queued.empty() && rng() % 3 == 0) {
        ASSERT_TRUE(scheduler.Remove(queued[rng() % queued.size()].job_id).ok());
      }
      // Worker state changes: a death requeues its jobs (same seq and time: they keep their place).
      for (WorkerInfo& w : workers) {
        const int roll = static_cast<int>(rng() % 40);
        if (w.state == WorkerState::kDead) {
          if (roll < 10) w.state = WorkerState::kReady;
          continue;
        }
        if (roll == 0) w.state = WorkerState::kDraining;
        if (roll == 1) w.state = WorkerState::kReady;
        if (roll == 2) {
          w.state = WorkerState::kDead;
          for (auto it = running.begin(); it != running.end();) {
            const auto& ids = it->second.second.worker_ids;
            if (std::find(ids.begin(), ids.end(), w.id) == ids.end()) {
              ++it;
              continue;
            }
            Apply(workers, it->second.first, it->second.second, -1);
            ASSERT_TRUE(scheduler.Enqueue(it->second.first).ok());
            it = running.erase(it);
          }
        }
      }

      const std::vector<JobRequest> order = scheduler.queue().Ordered();
      absl::StatusOr<std::vector<Placement>> placements = scheduler.Schedule(workers, now);
      ASSERT_TRUE(placements.ok()) << placements.status();
      SCOPED_TRACE(absl::StrCat("sim ", sim, " step ", step));
      CheckPass(workers, order, *placements, options.starvation_bound, now,
                scheduler.last_reservations());
      if (HasFatalFailure()) return;

      // Placed jobs leave the queue; the others stay.
      ASSERT_EQ(scheduler.queue().size(), order.size() - placements->size());
      std::map<std::string, JobRequest> by_id;
      for (const JobRequest& j : order) by_id[j.job_id] = j;
      for (const Placement& p : *placements) {
        ASSERT_FALSE(scheduler.queue().Contains(p.job_id));
        Apply(workers, by_id[p.job_id], p, +1);
        running[p.job_id] = {by_id[p.job_id], p};
      }
      ASSERT_TRUE(ValidateWorkers(workers).ok()) << "over-committed: " << ValidateWorkers(workers);
      total_placed += static_cast<int>(placements->size());
      total_reserved += static_cast<int>(scheduler.last_reservations().size());
    }
  }
  // The simulations must exercise both paths, or the checks above prove little.
  EXPECT_GT(total_placed, 1000);
  EXPECT_GT(total_reserved, 20);
}

// Two tenants flood identical jobs; over successive passes on a cluster of varying size, neither
// gets more than one job ahead of the other while both wait.
TEST(SchedulerRandomTest, FloodingTenantsAreInterleaved) {
  std::mt19937_64 rng(99);
  for (int sim = 0; sim < 50; ++sim) {
    Scheduler scheduler;
    int64_t seq = 0;
    // Tenant A submits its whole flood first, then B.
    for (const char* tenant : {"A", "B"}) {
      const int n = 20 + static_cast<int>(rng() % 20);
      for (int i = 0; i < n; ++i) {
        JobRequest job = testing::Job(absl::StrCat(tenant, seq), 1, kGiB, seq);
        job.tenant = tenant;
        ++seq;
        ASSERT_TRUE(scheduler.Enqueue(job).ok());
      }
    }
    std::map<std::string, int> served;
    std::map<std::string, int64_t> last_seq = {{"A", -1}, {"B", -1}};
    while (!scheduler.queue().empty()) {
      std::vector<WorkerInfo> workers;
      const int n = 1 + static_cast<int>(rng() % 5);
      for (int i = 0; i < n; ++i) workers.push_back(testing::Gpu(absl::StrCat("g", i), 8 * kGiB));
      absl::StatusOr<std::vector<Placement>> placements = scheduler.Schedule(workers, kT0);
      ASSERT_TRUE(placements.ok());
      ASSERT_FALSE(placements->empty());
      for (const Placement& p : *placements) {
        const std::string tenant = p.job_id.substr(0, 1);
        const int64_t s = std::stoll(p.job_id.substr(1));
        ASSERT_GT(s, last_seq[tenant]) << "FIFO broken within tenant " << tenant;
        last_seq[tenant] = s;
        ++served[tenant];
      }
      bool a_waiting = false, b_waiting = false;
      for (const JobRequest& j : scheduler.queue().Ordered()) {
        (j.tenant == "A" ? a_waiting : b_waiting) = true;
      }
      if (a_waiting && b_waiting) {
        ASSERT_LE(std::abs(served["A"] - served["B"]), 1);
      }
    }
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn
