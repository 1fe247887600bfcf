#include "scheduler/types.h"

#include "gtest/gtest.h"
#include "scheduler/test_util.h"

namespace dattn {
namespace scheduler {
namespace {

using testing::Gpu;
using testing::Job;
using testing::kGiB;

TEST(FormatBytesTest, BinaryUnitsWithTrimmedDecimals) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(kGiB * 16 / 5), "3.2 GiB");
  EXPECT_EQ(FormatBytes(kGiB * 13 / 4), "3.25 GiB");
  EXPECT_EQ(FormatBytes(80 * kGiB), "80 GiB");
  EXPECT_EQ(FormatBytes(1024 * kGiB * 5 / 4), "1.25 TiB");
  EXPECT_EQ(FormatBytes(-2048), "-2 KiB");
}

TEST(WorkerStateTest, NamesRoundTrip) {
  for (WorkerState s : {WorkerState::kReady, WorkerState::kDraining, WorkerState::kDead}) {
    absl::StatusOr<WorkerState> parsed = ParseWorkerState(WorkerStateName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  absl::StatusOr<WorkerState> bad = ParseWorkerState("sleepy");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("sleepy"), std::string::npos);
}

TEST(ValidateWorkerTest, NamesTheBadField) {
  EXPECT_TRUE(ValidateWorker(Gpu("g0", 8 * kGiB)).ok());

  WorkerInfo w = Gpu("g0", 8 * kGiB);
  w.free_memory_bytes = 9 * kGiB;
  absl::Status s = ValidateWorker(w);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("free_memory_bytes 9663676416"), std::string::npos) << s;

  w = Gpu("g0", 8 * kGiB);
  w.running_ranks = 2;
  s = ValidateWorker(w);
  EXPECT_NE(s.message().find("running_ranks 2"), std::string::npos) << s;

  w = Gpu("g0", 8 * kGiB);
  w.max_ranks = 0;
  s = ValidateWorker(w);
  EXPECT_NE(s.message().find("max_ranks 0"), std::string::npos) << s;

  w = Gpu("", 8 * kGiB);
  EXPECT_FALSE(ValidateWorker(w).ok());
}

TEST(ValidateWorkersTest, RejectsDuplicateIds) {
  absl::Status s = ValidateWorkers({Gpu("g0", kGiB), Gpu("g1", kGiB), Gpu("g0", kGiB)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'g0' appears twice"), std::string::npos) << s;
}

TEST(ValidateJobTest, NamesTheBadField) {
  EXPECT_TRUE(ValidateJob(Job("j", 2, kGiB)).ok());
  JobRequest j = Job("j", 0, kGiB);
  EXPECT_NE(ValidateJob(j).message().find("num_ranks 0"), std::string::npos);
  j = Job("j", 1, -5);
  EXPECT_NE(ValidateJob(j).message().find("memory_per_rank_bytes -5"), std::string::npos);
  j = Job("j", 1, 0);
  j.dtype = "";
  EXPECT_NE(ValidateJob(j).message().find("dtype is empty"), std::string::npos);
  EXPECT_FALSE(ValidateJob(Job("", 1, 0)).ok());
}

TEST(IsEligibleTest, NeedsReadySameKindAndDType) {
  JobRequest job = Job("j", 1, 0);
  WorkerInfo w = Gpu("g", kGiB);
  EXPECT_TRUE(IsEligible(w, job));
  job.dtype = "fp16";
  EXPECT_FALSE(IsEligible(w, job));
  job.dtype = "bf16";
  EXPECT_TRUE(IsEligible(w, job));
  job.needs_gpu = false;
  EXPECT_FALSE(IsEligible(w, job));
  job.needs_gpu = true;
  w.state = WorkerState::kDraining;
  EXPECT_FALSE(IsEligible(w, job));
}

TEST(IsEligibleTest, MultiRankJobsNeedWorkersThatJoinRings) {
  WorkerInfo w = Gpu("g", kGiB);
  w.joins_rings = false;
  EXPECT_TRUE(IsEligible(w, Job("single", 1, 0)));
  EXPECT_FALSE(IsEligible(w, Job("ring", 2, 0)));
  w.joins_rings = true;
  EXPECT_TRUE(IsEligible(w, Job("ring", 2, 0)));
}

TEST(DebugStringTest, MentionsTheNumbers) {
  WorkerInfo w = Gpu("g3", 80 * kGiB, 12 * kGiB);
  EXPECT_EQ(w.DebugString(), "g3 (GPU test GPU, ready, 0/1 ranks, 12 GiB of 80 GiB free)");
  JobRequest j = Job("job-7", 4, kGiB * 16 / 5, 12);
  j.dtype = "bf16";
  j.tenant = "a";
  EXPECT_EQ(j.DebugString(), "job-7 (tenant=a prio=0 seq=12, 4 ranks x 3.2 GiB, GPU, bf16)");
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn
