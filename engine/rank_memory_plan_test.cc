#include "engine/rank_memory_plan.h"

#include <algorithm>

#include "engine/cuda/cuda_memory_plan.h"
#include "engine/memory_plan.h"
#include "engine/ring/ring_geometry.h"
#include "engine/ring/ring_plan.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

RankProblem Problem(int ranks, bool backward) {
  RankProblem p;
  p.spec.segment_lengths = {16, 64};
  p.spec.dilation_rates = {1, 2};
  p.batch = 2;
  p.seq_len = 96;
  p.num_heads = 3;
  p.head_dim = 8;
  p.ranks = ranks;
  p.dtype = DType::kFloat64;
  p.backward = backward;
  return p;
}

// The exchange buffers of one rank, straight from the ring planner.
int64_t PlannedBuffers(const RankProblem& p, int rank) {
  ring::RingShape shape{p.batch, p.seq_len, p.num_heads, p.head_dim, p.ranks};
  ring::RingGeometry geo = *ring::RingGeometry::Create(p.spec, shape, rank, p.dtype);
  ring::PlanOptions options;
  options.cost = ring::CostModel::ForCpu();
  int64_t bytes = ring::PlanRing(geo, false, options).buffer_bytes;
  if (p.backward) bytes = std::max(bytes, ring::PlanRing(geo, true, options).buffer_bytes);
  return bytes;
}

TEST(RankMemoryPlanTest, OneRankIsTheEnginePlan) {
  const RankProblem p = Problem(1, true);
  absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, 0, BackendKind::kCpu, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  PlanOptions options;
  options.dtype = DType::kFloat64;
  options.backward = true;
  options.num_threads = 3;
  absl::StatusOr<MemoryPlan> engine = PlanAttentionMemory(p.spec, {2, 96, 3, 8}, options);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ(plan->shard.total_bytes(), engine->total_bytes());
  EXPECT_EQ(plan->shard.workspace_bytes, engine->workspace_bytes);
  EXPECT_EQ(plan->ring_bytes, 0);
  EXPECT_EQ(plan->total_bytes(), engine->total_bytes());
  EXPECT_EQ(plan->DebugString().find("ring"), std::string::npos) << plan->DebugString();
}

TEST(RankMemoryPlanTest, RingRanksHoldTheirShardKernelScratchAndBuffers) {
  for (bool backward : {false, true}) {
    const RankProblem p = Problem(4, backward);
    int64_t largest = 0;
    int largest_rank = -1;
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, r, BackendKind::kCpu, 2);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t tensor = 2 * 24 * 3 * 8 * 8;  // (B, N/P, H, D) fp64
      EXPECT_EQ(plan->shard.inputs_bytes, (backward ? 4 : 3) * tensor);
      EXPECT_EQ(plan->shard.outputs_bytes, (backward ? 4 : 1) * tensor);
      EXPECT_EQ(plan->shard.lse_bytes, 2 * 3 * 24 * 8);
      EXPECT_EQ(plan->shard.workspace_bytes, 2 * CpuRingKernelScratchBytes(DType::kFloat64, 8));
      const int64_t buffers = PlannedBuffers(p, r);
      EXPECT_GT(buffers, 0) << "every rank of this problem is in a spanning segment";
      EXPECT_EQ(plan->ring_bytes, buffers + 8 * 5) << "rank " << r;
      EXPECT_NE(plan->DebugString().find("ring buffers"), std::string::npos);
      if (plan->total_bytes() > largest) {
        largest = plan->total_bytes();
        largest_rank = r;
      }
    }
    absl::StatusOr<RankMemoryPlan> top = PlanLargestRankMemory(p, BackendKind::kCpu, 2);
    ASSERT_TRUE(top.ok()) << top.status();
    EXPECT_EQ(top->total_bytes(), largest);
    EXPECT_EQ(top->rank, largest_rank);
  }
}

// PlanLargestRankMemory computes the ring's groups once for all ranks; the answer must be the
// largest of the ranks planned one by one (each computing its own groups), for rings of several
// sizes, both modes, causal or not, on both planners' cost models.
TEST(RankMemoryPlanTest, TheLargestRankIsTheLargestOfEveryRankPlannedAlone) {
  for (int ranks : {2, 3, 5, 8}) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      for (bool causal : {false, true}) {
        for (BackendKind backend : {BackendKind::kCpu, BackendKind::kCuda}) {
          RankProblem p = Problem(ranks, /*backward=*/true);
          p.seq_len = 40 * ranks;
          p.spec.segment_lengths = {24, 56, 1000};
          p.spec.dilation_rates = {1, 2, 5};
          p.spec.mode = mode;
          p.spec.causal = causal;
          p.dtype = backend == BackendKind::kCuda ? DType::kBFloat16 : DType::kFloat64;
          int64_t largest = 0;
          for (int r = 0; r < ranks; ++r) {
            absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, r, backend, 1);
            ASSERT_TRUE(plan.ok()) << plan.status();
            largest = std::max(largest, plan->total_bytes());
          }
          absl::StatusOr<RankMemoryPlan> top = PlanLargestRankMemory(p, backend, 1);
          ASSERT_TRUE(top.ok()) << top.status();
          EXPECT_EQ(top->total_bytes(), largest)
              << "P=" << ranks << " " << AttentionModeName(mode) << (causal ? " causal" : "");
        }
      }
    }
  }
}

TEST(RankMemoryPlanTest, SegmentsInsideShardsNeedNoBuffers) {
  RankProblem p = Problem(4, true);
  p.spec.segment_lengths = {8, 24};  // Every segment ends on a shard boundary (L = 24).
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, r, BackendKind::kCpu, 1);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->ring_bytes, 8 * 5) << "only the agreement check's fingerprints";
  }
}

TEST(RankMemoryPlanTest, CpuRingKernelScratch) {
  // D = 64: 128-row tiles; 2 * 128^2 + 6 * 128 * 64 + 2 * 128 elements.
  EXPECT_EQ(CpuRingKernelScratchBytes(DType::kFloat64, 64), (32768 + 49152 + 256) * 8);
  EXPECT_EQ(CpuRingKernelScratchBytes(DType::kFloat32, 64), (32768 + 49152 + 256) * 4);
  // A huge D caps the tile rows at 2^20 / D.
  const int64_t d = int64_t{1} << 16, t = 16;
  EXPECT_EQ(CpuRingKernelScratchBytes(DType::kFloat32, d), (2 * t * t + 6 * t * d + 2 * t) * 4);
}

TEST(RankMemoryPlanTest, CudaRanksUseTheCudaPlanner) {
  RankProblem p = Problem(1, false);
  p.dtype = DType::kBFloat16;
  absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, 0, BackendKind::kCuda, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->shard.inputs_bytes, 3 * 2 * 96 * 3 * 8 * 2);
  p.dtype = DType::kFloat64;  // The CUDA backend does not run fp64.
  EXPECT_FALSE(PlanRankMemory(p, 0, BackendKind::kCuda, 0).ok());
}

// A single rank's backward runs on the CUDA backend's Hopper kernels (two floats per row); a ring
// rank's block kernels run theirs on cuDNN, whose fp32 dQ accumulator the plan must hold.
TEST(RankMemoryPlanTest, CudaBackwardWorkspaceFollowsWhatTheRankRuns) {
  for (int ranks : {1, 2}) {
    RankProblem p = Problem(ranks, true);
    p.dtype = DType::kBFloat16;
    p.head_dim = 64;
    absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, 0, BackendKind::kCuda, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<cuda::CudaMemoryPlan> want =
        cuda::PlanCudaMemory(p.spec, p.batch, p.seq_len / ranks, p.num_heads, p.head_dim, p.dtype,
                             true, 0, /*hopper_kernels=*/ranks == 1);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(plan->shard.workspace_bytes, want->workspace_bytes) << ranks << " ranks";
  }
  RankProblem p = Problem(2, true);
  p.dtype = DType::kBFloat16;
  p.head_dim = 64;
  absl::StatusOr<cuda::CudaMemoryPlan> hopper =
      cuda::PlanCudaMemory(p.spec, p.batch, p.seq_len / 2, p.num_heads, 64, p.dtype, true, 0, true);
  absl::StatusOr<RankMemoryPlan> ring = PlanRankMemory(p, 0, BackendKind::kCuda, 0);
  ASSERT_TRUE(hopper.ok() && ring.ok());
  EXPECT_GT(ring->shard.workspace_bytes, hopper->workspace_bytes);
}

TEST(RankMemoryPlanTest, Errors) {
  RankProblem p = Problem(5, false);
  absl::StatusOr<RankMemoryPlan> plan = PlanRankMemory(p, 0, BackendKind::kCpu, 1);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("5 ranks must divide the sequence length 96"),
            std::string::npos)
      << plan.status();
  p.ranks = 4;
  plan = PlanRankMemory(p, 4, BackendKind::kCpu, 1);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("rank 4 is outside [0, 4)"), std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace dattn
