#include "scheduler/placement.h"

#include <functional>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/test_util.h"

namespace dattn {
namespace scheduler {
namespace {

using testing::CheckPlacements;
using testing::Cpu;
using testing::Gpu;
using testing::Job;
using testing::kGiB;
using Ids = std::vector<std::string>;

std::optional<Placement> Place(const JobRequest& job, const std::vector<WorkerInfo>& workers) {
  absl::StatusOr<std::optional<Placement>> placed = TryPlace(job, workers);
  EXPECT_TRUE(placed.ok()) << placed.status();
  return placed.ok() ? *placed : std::nullopt;
}

TEST(TryPlaceTest, GangIsAllOrNothing) {
  std::vector<WorkerInfo> workers = {Gpu("g0", 8 * kGiB), Gpu("g1", 8 * kGiB), Gpu("g2", 8 * kGiB)};
  EXPECT_EQ(Place(Job("j", 4, kGiB), workers), std::nullopt);
  std::optional<Placement> p = Place(Job("j", 3, kGiB), workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->job_id, "j");
  EXPECT_EQ(p->worker_ids, Ids({"g0", "g1", "g2"}));
}

TEST(TryPlaceTest, BestFitTakesTheTightestWorker) {
  std::vector<WorkerInfo> workers = {Gpu("big", 80 * kGiB, 40 * kGiB),
                                     Gpu("small", 80 * kGiB, 10 * kGiB),
                                     Gpu("mid", 80 * kGiB, 20 * kGiB)};
  std::optional<Placement> p = Place(Job("j", 1, 15 * kGiB), workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"mid"}));
  p = Place(Job("j", 2, 15 * kGiB), workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"mid", "big"}));
  p = Place(Job("j", 3, 5 * kGiB), workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"small", "mid", "big"}));
}

TEST(TryPlaceTest, TiesGoToTheSmallerId) {
  std::vector<WorkerInfo> workers = {Gpu("g2", 8 * kGiB), Gpu("g0", 8 * kGiB), Gpu("g1", 8 * kGiB)};
  std::optional<Placement> p = Place(Job("j", 2, kGiB), workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"g0", "g1"}));
}

TEST(TryPlaceTest, MultipleRanksPerWorkerNeedMultipleMemory) {
  // 4 slots but 10 GiB: three 4 GiB ranks need 12 GiB.
  std::vector<WorkerInfo> workers = {Cpu("c0", 4, 10 * kGiB)};
  JobRequest job = Job("j", 3, 4 * kGiB);
  job.needs_gpu = false;
  EXPECT_EQ(Place(job, workers), std::nullopt);
  job.num_ranks = 2;
  std::optional<Placement> p = Place(job, workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"c0", "c0"}));
}

TEST(TryPlaceTest, PacksRanksConsecutivelyOnTheTightestHost) {
  std::vector<WorkerInfo> workers = {Cpu("c-big", 4, 64 * kGiB), Cpu("c-small", 4, 8 * kGiB)};
  JobRequest job = Job("j", 6, 4 * kGiB);
  job.needs_gpu = false;
  std::optional<Placement> p = Place(job, workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"c-small", "c-small", "c-big", "c-big", "c-big", "c-big"}));
}

TEST(TryPlaceTest, RunningRanksTakeSlots) {
  WorkerInfo c = Cpu("c0", 4, 64 * kGiB);
  c.running_ranks = 3;
  JobRequest job = Job("j", 2, kGiB);
  job.needs_gpu = false;
  EXPECT_EQ(Place(job, {c}), std::nullopt);
  job.num_ranks = 1;
  EXPECT_TRUE(Place(job, {c}).has_value());
  WorkerInfo g = Gpu("g0", 80 * kGiB);
  g.running_ranks = 1;
  EXPECT_EQ(Place(Job("j", 1, 0), {g}), std::nullopt);
}

TEST(TryPlaceTest, SkipsIneligibleWorkers) {
  WorkerInfo draining = Gpu("a-draining", 80 * kGiB);
  draining.state = WorkerState::kDraining;
  WorkerInfo dead = Gpu("b-dead", 80 * kGiB);
  dead.state = WorkerState::kDead;
  WorkerInfo cpu = Cpu("c-cpu", 8, 80 * kGiB);
  WorkerInfo no_fp16 = Gpu("d-nofp16", 80 * kGiB);
  WorkerInfo fp16 = Gpu("e-fp16", 80 * kGiB);
  fp16.dtypes.push_back("fp16");
  JobRequest job = Job("j", 1, kGiB);
  job.dtype = "fp16";
  std::optional<Placement> p = Place(job, {draining, dead, cpu, no_fp16, fp16});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"e-fp16"}));
  job.num_ranks = 2;
  EXPECT_EQ(Place(job, {draining, dead, cpu, no_fp16, fp16}), std::nullopt);
}

TEST(TryPlaceTest, ZeroMemoryJobsNeedOnlySlots) {
  WorkerInfo g = Gpu("g0", 8 * kGiB, 0);
  std::optional<Placement> p = Place(Job("j", 1, 0), {g});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"g0"}));
}

TEST(TryPlaceTest, InvalidInputIsAnError) {
  EXPECT_EQ(TryPlace(Job("j", 0, 0), {Gpu("g", kGiB)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TryPlace(Job("j", 1, 0), {Gpu("g", kGiB), Gpu("g", kGiB)}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Independent oracle: does any assignment of rank counts to workers exist? Counts are tried one by
// one, checking slots and k * memory directly.
bool ExistsPlacement(const JobRequest& job, const std::vector<WorkerInfo>& workers, size_t i,
                     int remaining) {
  if (remaining == 0) return true;
  if (i == workers.size()) return false;
  const WorkerInfo& w = workers[i];
  bool ok_here = w.state == WorkerState::kReady && w.is_gpu == job.needs_gpu;
  bool dtype = false;
  for (const std::string& d : w.dtypes) dtype |= d == job.dtype;
  ok_here &= dtype;
  for (int k = 0; k <= remaining; ++k) {
    if (k > 0) {
      if (!ok_here || w.running_ranks + k > w.max_ranks ||
          k * job.memory_per_rank_bytes > w.free_memory_bytes) {
        break;
      }
    }
    if (ExistsPlacement(job, workers, i + 1, remaining - k)) return true;
  }
  return false;
}

TEST(TryPlaceRandomTest, PlacesExactlyWhenAPlacementExistsAndItFits) {
  std::mt19937_64 rng(7);
  const int64_t unit = kGiB / 4;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<WorkerInfo> workers;
    const int n = static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      const bool gpu = rng() % 3 != 0;
      const int64_t total = unit * static_cast<int64_t>(1 + rng() % 32);
      const int64_t free = total * static_cast<int64_t>(rng() % 5) / 4;
      WorkerInfo w = gpu ? Gpu(absl::StrCat("w", rng() % 100, "-", i), total, free)
                         : Cpu(absl::StrCat("w", rng() % 100, "-", i), 1 + rng() % 4, total, free);
      w.running_ranks = static_cast<int>(rng() % (w.max_ranks + 1));
      if (rng() % 6 == 0) w.state = rng() % 2 ? WorkerState::kDraining : WorkerState::kDead;
      if (rng() % 5 == 0) w.dtypes = {"fp16"};
      workers.push_back(w);
    }
    JobRequest job =
        Job("j", 1 + static_cast<int>(rng() % 6), unit * static_cast<int64_t>(rng() % 12));
    job.needs_gpu = rng() % 3 != 0;
    job.dtype = rng() % 5 == 0 ? "fp16" : "fp32";

    std::optional<Placement> p = Place(job, workers);
    ASSERT_EQ(p.has_value(), ExistsPlacement(job, workers, 0, job.num_ranks)) << "iter " << iter;
    if (!p.has_value()) continue;
    ASSERT_EQ(CheckPlacements(workers, {job}, {*p}), "") << "iter " << iter;
    // Ranks of one worker are consecutive.
    for (size_t r = 2; r < p->worker_ids.size(); ++r) {
      for (size_t s = 0; s + 1 < r; ++s) {
        if (p->worker_ids[s] == p->worker_ids[r]) {
          ASSERT_EQ(p->worker_ids[r - 1], p->worker_ids[r]) << "iter " << iter;
        }
      }
    }
    // A single rank goes to the worker with the least free memory among those that fit it.
    if (job.num_ranks == 1) {
      const WorkerInfo* chosen = nullptr;
      for (const WorkerInfo& w : workers) {
        if (w.id == p->worker_ids[0]) chosen = &w;
      }
      for (const WorkerInfo& w : workers) {
        if (ExistsPlacement(job, {w}, 0, 1)) {
          ASSERT_LE(chosen->free_memory_bytes, w.free_memory_bytes) << "iter " << iter;
        }
      }
    }
  }
}

TEST(CheckFeasibleTest, MemoryShortfallNamesTheNumbers) {
  JobRequest job = Job("j", 4, kGiB * 16 / 5);
  job.dtype = "bf16";
  std::vector<WorkerInfo> workers = {Gpu("g0", 8 * kGiB, 0), Gpu("g1", 4 * kGiB),
                                     Gpu("g2", 2 * kGiB), Gpu("g3", 2 * kGiB)};
  Feasibility f = CheckFeasible(job, workers);
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.max_ranks, 2);
  EXPECT_EQ(f.reason,
            "needs 4 ranks x 3.2 GiB (GPU, bf16); at most 2 ranks can ever fit: 2 of 4 ready GPU "
            "workers supporting bf16 have >= 3.2 GiB total memory (largest 8 GiB), room for 2 "
            "ranks in all");
}

TEST(CheckFeasibleTest, CountsTotalMemoryNotFreeMemory) {
  // Every worker is busy now, but the job could run once they are idle.
  std::vector<WorkerInfo> workers = {Gpu("g0", 8 * kGiB, 0), Gpu("g1", 8 * kGiB, 0)};
  workers[0].running_ranks = 1;
  Feasibility f = CheckFeasible(Job("j", 2, 6 * kGiB), workers);
  EXPECT_TRUE(f.feasible) << f.reason;
  EXPECT_EQ(f.max_ranks, 2);
  EXPECT_EQ(f.reason, "fits: up to 2 ranks on 2 ready GPU workers supporting fp32");
}

TEST(CheckFeasibleTest, SlotShortfallOnCpuHosts) {
  JobRequest job = Job("j", 16, kGiB);
  job.needs_gpu = false;
  Feasibility f = CheckFeasible(job, {Cpu("c0", 8, 64 * kGiB), Cpu("c1", 4, 64 * kGiB)});
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.max_ranks, 12);
  EXPECT_NE(f.reason.find("at most 12 ranks can ever fit"), std::string::npos) << f.reason;
  EXPECT_NE(f.reason.find("2 of 2 ready CPU workers supporting fp32"), std::string::npos)
      << f.reason;
  // Memory binds before slots: 8 slots but 10 GiB holds only three 3 GiB ranks.
  job.num_ranks = 4;
  job.memory_per_rank_bytes = 3 * kGiB;
  f = CheckFeasible(job, {Cpu("c0", 8, 10 * kGiB)});
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.max_ranks, 3);
  EXPECT_NE(f.reason.find("room for 3 ranks in all"), std::string::npos) << f.reason;
}

TEST(CheckFeasibleTest, NoReadyWorkers) {
  WorkerInfo draining = Gpu("g0", 80 * kGiB);
  draining.state = WorkerState::kDraining;
  WorkerInfo dead = Gpu("g1", 80 * kGiB);
  dead.state = WorkerState::kDead;
  Feasibility f = CheckFeasible(Job("j", 1, kGiB), {draining, dead});
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.reason, "needs 1 rank x 1 GiB (GPU, fp32); no ready workers (1 draining, 1 dead)");
  EXPECT_FALSE(CheckFeasible(Job("j", 1, kGiB), {}).feasible);
}

TEST(CheckFeasibleTest, WrongDeviceKind) {
  Feasibility f =
      CheckFeasible(Job("j", 1, kGiB), {Cpu("c0", 8, 64 * kGiB), Cpu("c1", 8, 64 * kGiB)});
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.reason,
            "needs 1 rank x 1 GiB (GPU, fp32); none of the 2 ready workers is a GPU worker");
}

TEST(CheckFeasibleTest, UnsupportedDTypeListsWhatIsSupported) {
  JobRequest job = Job("j", 1, kGiB);
  job.dtype = "fp16";
  Feasibility f = CheckFeasible(job, {Gpu("g0", 80 * kGiB), Gpu("g1", 80 * kGiB)});
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.reason,
            "needs 1 rank x 1 GiB (GPU, fp16); none of the 2 ready GPU workers supports fp16 "
            "(supported: bf16, fp32)");
}

// A worker that lists its head dimensions takes only jobs of those; one that lists none takes any.
TEST(CheckFeasibleTest, HeadDimsAreHonouredInFitAndPlacement) {
  std::vector<WorkerInfo> workers = {Gpu("g0", 80 * kGiB), Gpu("g1", 80 * kGiB)};
  workers[0].head_dims = {64, 128};
  workers[1].head_dims = {128};
  JobRequest job = Job("j", 1, kGiB);
  job.head_dim = 96;
  Feasibility f = CheckFeasible(job, workers);
  EXPECT_FALSE(f.feasible);
  EXPECT_EQ(f.reason,
            "needs 1 rank x 1 GiB (GPU, fp32); none of the 2 ready GPU workers supporting fp32 "
            "runs head_dim 96");
  EXPECT_EQ(Place(job, workers), std::nullopt);
  job.head_dim = 64;
  EXPECT_TRUE(CheckFeasible(job, workers).feasible);
  std::optional<Placement> p = Place(job, workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids, Ids({"g0"}));
  job.num_ranks = 2;
  EXPECT_FALSE(CheckFeasible(job, workers).feasible);  // Only g0 runs 64.
  workers[1].head_dims.clear();                        // Any.
  EXPECT_TRUE(CheckFeasible(job, workers).feasible);
  p = Place(job, workers);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->worker_ids.size(), 2u);
}

TEST(CheckFeasibleTest, RingsNeedWorkersThatJoinThem) {
  std::vector<WorkerInfo> workers = {Gpu("g0", 8 * kGiB), Gpu("g1", 8 * kGiB)};
  for (WorkerInfo& w : workers) w.joins_rings = false;
  EXPECT_TRUE(CheckFeasible(Job("single", 1, kGiB), workers).feasible);
  Feasibility f = CheckFeasible(Job("ring", 2, kGiB), workers);
  EXPECT_FALSE(f.feasible);
  EXPECT_NE(f.reason.find("none of the 2 ready GPU workers supporting fp32 join sequence-parallel "
                          "rings"),
            std::string::npos)
      << f.reason;
  EXPECT_EQ(Place(Job("ring", 2, kGiB), workers), std::nullopt);
  workers[0].joins_rings = true;
  f = CheckFeasible(Job("ring", 2, kGiB), workers);
  EXPECT_FALSE(f.feasible);
  EXPECT_NE(f.reason.find("at most 1 rank can ever fit"), std::string::npos) << f.reason;
  EXPECT_NE(f.reason.find("that join rings"), std::string::npos) << f.reason;
  workers[1].joins_rings = true;
  EXPECT_TRUE(CheckFeasible(Job("ring", 2, kGiB), workers).feasible);
}

TEST(CheckFeasibleTest, InvalidInputIsInfeasibleWithTheError) {
  Feasibility f = CheckFeasible(Job("j", 0, kGiB), {Gpu("g0", 80 * kGiB)});
  EXPECT_FALSE(f.feasible);
  EXPECT_NE(f.reason.find("num_ranks 0"), std::string::npos) << f.reason;
}

// Feasible exactly when the job places on the same workers made idle.
TEST(CheckFeasibleRandomTest, AgreesWithPlacementOnAnIdleCluster) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<WorkerInfo> workers, idle;
    const int n = static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      const int64_t total = kGiB * static_cast<int64_t>(1 + rng() % 16);
      WorkerInfo w = rng() % 2 ? Gpu(absl::StrCat("g", i), total, total / 2)
                               : Cpu(absl::StrCat("c", i), 1 + rng() % 4, total, 0);
      w.running_ranks = static_cast<int>(rng() % (w.max_ranks + 1));
      if (rng() % 5 == 0) w.state = WorkerState::kDraining;
      workers.push_back(w);
      w.running_ranks = 0;
      w.free_memory_bytes = w.total_memory_bytes;
      idle.push_back(w);
    }
    JobRequest job =
        Job("j", 1 + static_cast<int>(rng() % 8), kGiB * static_cast<int64_t>(rng() % 10));
    job.needs_gpu = rng() % 2;
    Feasibility f = CheckFeasible(job, workers);
    ASSERT_EQ(f.feasible, ExistsPlacement(job, idle, 0, job.num_ranks)) << f.reason;
    if (f.max_ranks > 0) {
      ASSERT_TRUE(ExistsPlacement(job, idle, 0, f.max_ranks)) << f.reason;
    }
    if (!f.feasible) {
      ASSERT_FALSE(ExistsPlacement(job, idle, 0, f.max_ranks + 1)) << f.reason;
      ASSERT_NE(f.reason.find(absl::StrCat("needs ", job.num_ranks, " rank")), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn
