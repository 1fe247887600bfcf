#include "scheduler/recovery.h"

#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/test_util.h"

namespace dattn {
namespace scheduler {
namespace {

using testing::Gpu;
using testing::kGiB;

std::vector<WorkerInfo> Gpus(const std::string& prefix, int n, int64_t free_bytes) {
  std::vector<WorkerInfo> w;
  for (int i = 0; i < n; ++i) w.push_back(Gpu(absl::StrCat(prefix, i), 80 * kGiB, free_bytes));
  return w;
}

// A job of N = 65536 on 8 GPUs whose working set (48 GiB) splits evenly over its ranks.
RecoveryInput Base() {
  RecoveryInput in;
  in.failure = FailureKind::kPeerLost;
  in.num_ranks = 8;
  in.surviving_ranks = 6;
  in.seq_len = 65536;
  in.micro_batch_size = 1;
  in.dtype = "fp32";
  in.needs_gpu = true;
  in.attempts = 0;
  in.max_attempts = 3;
  in.survivors = Gpus("s", 6, 16 * kGiB);
  in.memory_per_rank = [](int ranks) -> std::optional<int64_t> { return 48 * kGiB / ranks; };
  return in;
}

struct Case {
  std::string name;
  std::function<void(RecoveryInput&)> setup;
  RecoveryKind kind;
  int num_ranks;
  std::vector<std::string> reason_has;
};

TEST(DecideRecoveryTest, Table) {
  const std::vector<Case> cases = {
      {"attempts exhausted",
       [](RecoveryInput& in) { in.attempts = 3; },
       RecoveryKind::kFail,
       8,
       {"peer_lost: recovery attempts exhausted (3 of 3)"}},
      {"no attempts allowed",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.max_attempts = 0;
         in.micro_batch_size = 4;
       },
       RecoveryKind::kFail,
       8,
       {"oom: recovery attempts exhausted (0 of 0)"}},
      // oom
      {"oom splits the micro-batch first",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.micro_batch_size = 8;
       },
       RecoveryKind::kSplitBatch,
       8,
       {"micro-batch 8 -> 4"}},
      {"oom odd micro-batch rounds up",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.micro_batch_size = 3;
       },
       RecoveryKind::kSplitBatch,
       8,
       {"micro-batch 3 -> 2"}},
      {"oom lowers precision next",
       [](RecoveryInput& in) { in.failure = FailureKind::kOom; },
       RecoveryKind::kLowerPrecision,
       8,
       {"lowering precision fp32 -> bf16"}},
      {"oom adds ranks when already bf16",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.num_ranks = 4;
         in.surviving_ranks = 4;
         in.dtype = "bf16";
         in.cluster = Gpus("c", 8, 7 * kGiB);
       },
       RecoveryKind::kMoreRanks,
       8,
       {"over 8 ranks (divides N=65536), 6 GiB per rank"}},
      {"oom adds ranks when a worker lacks bf16",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.num_ranks = 4;
         in.surviving_ranks = 4;
         in.survivors[2].dtypes = {"fp32"};
         in.cluster = Gpus("c", 16, 7 * kGiB);
       },
       RecoveryKind::kMoreRanks,
       8,
       {"8 ranks"}},
      {"oom skips ring sizes that do not divide N",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.num_ranks = 4;
         in.surviving_ranks = 4;
         in.allow_precision_fallback = false;
         in.cluster =
             Gpus("c", 8, 10 * kGiB);  // 5 ranks x 9.6 GiB would fit, but 5 does not divide N.
       },
       RecoveryKind::kMoreRanks,
       8,
       {"over 8 ranks"}},
      {"oom fails with planner estimate and measured free",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.num_ranks = 4;
         in.surviving_ranks = 4;
         in.dtype = "bf16";
         in.cluster = Gpus("c", 8, 5 * kGiB);
         in.oom_free_memory_bytes = 21 * kGiB / 2;
       },
       RecoveryKind::kFail,
       4,
       {"planner estimate 12 GiB per rank, measured free 10.5 GiB", "micro-batch already 1",
        "dtype already bf16",
        "no larger ring fits the cluster (tried 8 ranks x 6 GiB; free on the cluster: 5 GiB, 5 "
        "GiB"}},
      {"oom with fallbacks disallowed fails",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.allow_precision_fallback = false;
         in.allow_more_ranks = false;
         in.cluster = Gpus("c", 16, 80 * kGiB);
       },
       RecoveryKind::kFail,
       8,
       {"precision fallback not allowed", "more ranks not allowed"}},
      {"oom with no bigger ring dividing N",
       [](RecoveryInput& in) {
         in.failure = FailureKind::kOom;
         in.num_ranks = 8;
         in.seq_len = 8;
         in.dtype = "bf16";
         in.cluster = Gpus("c", 12, 80 * kGiB);
       },
       RecoveryKind::kFail,
       8,
       {"no ring of more ranks dividing N=8 within the cluster's 12 free slots"}},
      // peer loss
      {"shrinks to the largest divisor of N that fits",
       [](RecoveryInput&) {},
       RecoveryKind::kShrinkRing,
       4,
       {"peer_lost with 6 of 8 ranks surviving", "8 -> 4 ranks", "<= 6", "12 GiB per rank"}},
      {"shrinks to a non-power-of-two divisor",
       [](RecoveryInput& in) { in.seq_len = 12 * 1024; },
       RecoveryKind::kShrinkRing,
       6,
       {"8 -> 6 ranks"}},
      {"shrink bounded by surviving ranks",
       [](RecoveryInput& in) {
         in.surviving_ranks = 3;
         in.survivors = Gpus("s", 6, 80 * kGiB);
       },
       RecoveryKind::kShrinkRing,
       2,
       {"8 -> 2 ranks"}},
      {"worker death follows the same chain",
       [](RecoveryInput& in) { in.failure = FailureKind::kWorkerDead; },
       RecoveryKind::kShrinkRing,
       4,
       {"worker_dead with 6 of 8"}},
      {"comm timeout follows the same chain",
       [](RecoveryInput& in) { in.failure = FailureKind::kCommTimeout; },
       RecoveryKind::kShrinkRing,
       4,
       {"comm_timeout"}},
      {"planner veto skips a ring size",
       [](RecoveryInput& in) {
         in.memory_per_rank = [](int ranks) -> std::optional<int64_t> {
           if (ranks == 4) return std::nullopt;
           return 48 * kGiB / ranks;
         };
         in.survivors = Gpus("s", 6, 30 * kGiB);
       },
       RecoveryKind::kShrinkRing,
       2,
       {"8 -> 2 ranks"}},
      {"single device when no smaller ring fits",
       [](RecoveryInput& in) {
         in.survivors = Gpus("s", 5, 10 * kGiB);
         in.survivors.push_back(Gpu("s-big", 80 * kGiB, 60 * kGiB));
       },
       RecoveryKind::kSingleDevice,
       1,
       {"one device on s-big, 48 GiB needed", "no smaller ring fits the survivors"}},
      {"single device when shrinking is off",
       [](RecoveryInput& in) {
         in.allow_shrink = false;
         in.survivors = Gpus("s", 6, 60 * kGiB);
       },
       RecoveryKind::kSingleDevice,
       1,
       {"shrinking not allowed"}},
      {"requeue when nothing fits the survivors",
       [](RecoveryInput& in) {
         in.survivors = Gpus("s", 6, 10 * kGiB);
         in.attempts = 1;
       },
       RecoveryKind::kRequeue,
       8,
       {"requeueing to restart from the last checkpoint (attempt 2 of 3)",
        "tried 4 ranks x 12 GiB, 2 ranks x 24 GiB",
        "one device does not fit (1 rank x 48 GiB; free on the survivors: 10 GiB, 10 GiB, 10 GiB, "
        "10 GiB and 2 more)"}},
      {"requeue when shrink and single device are off",
       [](RecoveryInput& in) {
         in.allow_shrink = false;
         in.allow_single_device = false;
       },
       RecoveryKind::kRequeue,
       8,
       {"shrinking not allowed", "single-device fallback not allowed"}},
      {"requeue a lost single-rank job",
       [](RecoveryInput& in) {
         in.num_ranks = 1;
         in.surviving_ranks = 0;
         in.survivors.clear();
       },
       RecoveryKind::kRequeue,
       1,
       {"already on a single device"}},
      {"requeue when no ring size divides N",
       [](RecoveryInput& in) {
         in.seq_len = 7;
         in.allow_single_device = false;
       },
       RecoveryKind::kRequeue,
       8,
       {"no ring size in [2, 6] divides N=7"}},
      {"survivors of the wrong dtype cannot host",
       [](RecoveryInput& in) { in.dtype = "fp16"; },
       RecoveryKind::kRequeue,
       8,
       {"no smaller ring fits"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RecoveryInput in = Base();
    c.setup(in);
    absl::StatusOr<RecoveryAction> action = DecideRecovery(in);
    ASSERT_TRUE(action.ok()) << action.status();
    EXPECT_EQ(RecoveryKindName(action->kind), std::string(RecoveryKindName(c.kind)))
        << action->reason;
    EXPECT_EQ(action->num_ranks, c.num_ranks) << action->reason;
    for (const std::string& part : c.reason_has) {
      EXPECT_NE(action->reason.find(part), std::string::npos)
          << "reason: " << action->reason << "\nmissing: " << part;
    }
    const bool placed = c.kind == RecoveryKind::kMoreRanks || c.kind == RecoveryKind::kShrinkRing ||
                        c.kind == RecoveryKind::kSingleDevice;
    if (placed) {
      EXPECT_EQ(static_cast<int>(action->worker_ids.size()), action->num_ranks);
      EXPECT_EQ(in.seq_len % action->num_ranks, 0);
      EXPECT_EQ(action->memory_per_rank_bytes, *in.memory_per_rank(action->num_ranks));
    } else {
      EXPECT_TRUE(action->worker_ids.empty());
    }
  }
}

TEST(DecideRecoveryTest, ActionsCarryTheNextAttemptsShape) {
  RecoveryInput in = Base();
  in.failure = FailureKind::kOom;
  in.micro_batch_size = 8;
  absl::StatusOr<RecoveryAction> split = DecideRecovery(in);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->micro_batch_size, 4);
  EXPECT_EQ(split->dtype, "fp32");

  in.micro_batch_size = 1;
  absl::StatusOr<RecoveryAction> lower = DecideRecovery(in);
  ASSERT_TRUE(lower.ok());
  EXPECT_EQ(lower->dtype, "bf16");
  EXPECT_EQ(lower->micro_batch_size, 1);
}

TEST(DecideRecoveryTest, ShrinkPlacesOnlyOnSurvivorsWithinTheirCapacity) {
  RecoveryInput in = Base();
  in.survivors = Gpus("s", 6, 16 * kGiB);
  in.survivors[0].free_memory_bytes = 4 * kGiB;  // Too small for 12 GiB.
  absl::StatusOr<RecoveryAction> action = DecideRecovery(in);
  ASSERT_TRUE(action.ok());
  ASSERT_EQ(action->kind, RecoveryKind::kShrinkRing);
  ASSERT_EQ(action->worker_ids.size(), 4u);
  std::set<std::string> distinct(action->worker_ids.begin(), action->worker_ids.end());
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_EQ(distinct.count("s0"), 0u);
}

TEST(DecideRecoveryTest, InvalidInputIsAnError) {
  const std::vector<std::pair<std::function<void(RecoveryInput&)>, std::string>> bad = {
      {[](RecoveryInput& in) { in.num_ranks = 0; }, "num_ranks 0"},
      {[](RecoveryInput& in) { in.surviving_ranks = 9; }, "surviving_ranks 9"},
      {[](RecoveryInput& in) { in.surviving_ranks = -1; }, "surviving_ranks -1"},
      {[](RecoveryInput& in) { in.seq_len = 0; }, "seq_len 0"},
      {[](RecoveryInput& in) { in.micro_batch_size = 0; }, "micro_batch_size 0"},
      {[](RecoveryInput& in) { in.dtype.clear(); }, "dtype is empty"},
      {[](RecoveryInput& in) { in.attempts = -1; }, "attempts -1"},
      {[](RecoveryInput& in) { in.memory_per_rank = nullptr; }, "memory_per_rank is not set"},
      {[](RecoveryInput& in) { in.survivors.push_back(in.survivors[0]); }, "survivors: worker id"},
      {[](RecoveryInput& in) { in.cluster = {Gpu("", kGiB)}; }, "cluster: worker id is empty"},
  };
  for (const auto& [setup, message] : bad) {
    RecoveryInput in = Base();
    setup(in);
    absl::StatusOr<RecoveryAction> action = DecideRecovery(in);
    EXPECT_EQ(action.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(action.status().message().find(message), std::string::npos) << action.status();
  }
}

TEST(RecoveryNamesTest, FailureKindsRoundTrip) {
  for (FailureKind k : {FailureKind::kOom, FailureKind::kPeerLost, FailureKind::kWorkerDead,
                        FailureKind::kCommTimeout}) {
    absl::StatusOr<FailureKind> parsed = ParseFailureKind(FailureKindName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(ParseFailureKind("meteor").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(RecoveryKindName(RecoveryKind::kShrinkRing)), "shrink_ring");
  EXPECT_EQ(std::string(RecoveryKindName(RecoveryKind::kRequeue)), "requeue");
}

}  // namespace
}  // namespace scheduler
}  // namespace dattn
