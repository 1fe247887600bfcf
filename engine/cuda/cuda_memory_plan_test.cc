// The CUDA memory plan: tensor bytes by role, the workspace the call plan needs, and the issue's
// memory target (forward workspace <= 5% of one input tensor) on the benchmark shapes.
#include "engine/cuda/cuda_memory_plan.h"

#include <algorithm>
#include <cstdint>

#include "engine/cuda/block_calls.h"
#include "gtest/gtest.h"

namespace dattn {
namespace cuda {
namespace {

AttentionSpec BenchSpec(AttentionMode mode) {
  AttentionSpec spec;
  spec.segment_lengths = {2048, 4096, 8192, 16384};
  spec.dilation_rates = {1, 2, 4, 8};
  spec.mode = mode;
  return spec;
}

TEST(CudaMemoryPlanTest, TensorBytesByRole) {
  const AttentionSpec spec = BenchSpec(AttentionMode::kGrouped);
  const int64_t b = 2, n = 1 << 14, h = 8, d = 64;
  const int64_t tensor = b * n * h * d * 2;
  absl::StatusOr<CudaMemoryPlan> fwd = PlanCudaMemory(spec, b, n, h, d, DType::kBFloat16, false);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  EXPECT_EQ(fwd->inputs_bytes, 3 * tensor);
  EXPECT_EQ(fwd->outputs_bytes, tensor);
  EXPECT_EQ(fwd->lse_bytes, b * h * n * 4);
  absl::StatusOr<CudaMemoryPlan> bwd = PlanCudaMemory(spec, b, n, h, d, DType::kBFloat16, true);
  ASSERT_TRUE(bwd.ok()) << bwd.status();
  EXPECT_EQ(bwd->inputs_bytes, 4 * tensor);
  EXPECT_EQ(bwd->outputs_bytes, 4 * tensor);
  EXPECT_GE(bwd->workspace_bytes, fwd->workspace_bytes);
}

TEST(CudaMemoryPlanTest, WorkspaceIsTheCallPlans) {
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    const AttentionSpec spec = BenchSpec(mode);
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (bool backward : {false, true}) {
        PlanInputs in;
        in.dtype = dtype;
        in.use_cudnn = dtype != DType::kFloat32;
        in.backward = false;
        in.overlap_calls = true;  // the backend's default
        int64_t want_cudnn = PlanBlockCalls(spec, {1, 1 << 16, 16, 64}, in).workspace_bytes;
        in.hopper = in.use_cudnn;  // our Hopper kernels take bf16 and fp16 at D = 64
        int64_t want = PlanBlockCalls(spec, {1, 1 << 16, 16, 64}, in).workspace_bytes;
        if (backward) {
          in.backward = true;
          want = std::max(want, PlanBlockCalls(spec, {1, 1 << 16, 16, 64}, in).workspace_bytes);
          in.hopper = false;
          want_cudnn =
              std::max(want_cudnn, PlanBlockCalls(spec, {1, 1 << 16, 16, 64}, in).workspace_bytes);
        }
        absl::StatusOr<CudaMemoryPlan> plan =
            PlanCudaMemory(spec, 1, 1 << 16, 16, 64, dtype, backward);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->workspace_bytes, want);
        plan = PlanCudaMemory(spec, 1, 1 << 16, 16, 64, dtype, backward, 0,
                              /*hopper_kernels=*/false);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->workspace_bytes, want_cudnn);
      }
    }
  }
}

// The target on its benchmark shapes: forward memory beyond inputs, outputs and lse is at
// most 5% of one input tensor (N = 2^20, bf16, H = 16, D = 64 and H = 8, D = 128; both modes).
TEST(CudaMemoryPlanTest, ForwardWorkspaceWithinFivePercentOfAnInput) {
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (auto [h, d] : {std::pair<int64_t, int64_t>{16, 64}, {8, 128}}) {
      const int64_t n = int64_t{1} << 20;
      absl::StatusOr<CudaMemoryPlan> plan =
          PlanCudaMemory(BenchSpec(mode), 1, n, h, d, DType::kBFloat16, false);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t tensor = n * h * d * 2;
      EXPECT_LE(plan->workspace_bytes, tensor / 20)
          << AttentionModeName(mode) << " H=" << h << " D=" << d;
    }
  }
}

// The same target for the backward (N = 2^16, the forward + backward shape): our Hopper
// kernels need two floats per row of a call, and a mixture merge adds in place; cuDNN's backward
// (its fp32 dQ accumulator, tiles for the merges) needs far more by default.
TEST(CudaMemoryPlanTest, HopperBackwardWorkspaceWithinFivePercentOfAnInput) {
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (auto [h, d] : {std::pair<int64_t, int64_t>{16, 64}, {8, 128}}) {
      const int64_t n = int64_t{1} << 16;
      const int64_t tensor = n * h * d * 2;
      PlanInputs in;
      in.backward = true;
      in.hopper = true;
      in.overlap_calls = true;  // two scratch slots in grouped mode
      const int64_t hopper = PlanBlockCalls(BenchSpec(mode), {1, n, h, d}, in).workspace_bytes;
      EXPECT_LE(hopper, tensor / 20) << AttentionModeName(mode) << " H=" << h << " D=" << d;
      in.hopper = false;
      const int64_t cudnn = PlanBlockCalls(BenchSpec(mode), {1, n, h, d}, in).workspace_bytes;
      EXPECT_GT(cudnn, tensor / 2) << AttentionModeName(mode) << " H=" << h << " D=" << d;
    }
  }
}

TEST(CudaMemoryPlanTest, RejectsWhatTheBackendCannotRun) {
  const AttentionSpec spec = BenchSpec(AttentionMode::kGrouped);
  EXPECT_EQ(PlanCudaMemory(spec, 1, 1024, 4, 64, DType::kFloat64, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanCudaMemory(spec, 0, 1024, 4, 64, DType::kBFloat16, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanCudaMemory(spec, int64_t{1} << 40, int64_t{1} << 40, 4, 64, DType::kBFloat16, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// What a fuzzer found: a segment length that does not divide N unfolds the batch into a call per
// batch item and head group; a huge batch asked for gigabytes of calls. The plan refuses it, at
// once and naming the count, and still plans the same problem with a modest batch.
TEST(CudaMemoryPlanTest, RefusesProblemsOfTooManyBlockCalls) {
  AttentionSpec spec;
  spec.segment_lengths = {72, 211, 72, 129};
  spec.dilation_rates = {65, 91, 1, 91};
  spec.mode = AttentionMode::kMixture;
  spec.head_offsets = HeadOffsets::kBlocked;
  absl::StatusOr<CudaMemoryPlan> huge =
      PlanCudaMemory(spec, 4207741, 1216, 39, 71, DType::kFloat16, false);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("block calls"), std::string::npos) << huge.status();
  EXPECT_NE(huge.status().message().find("B=4207741"), std::string::npos) << huge.status();
  EXPECT_TRUE(PlanCudaMemory(spec, 4, 1216, 39, 71, DType::kFloat16, true).ok());
}

// What the fuzzer found next: few block calls, but tiny segments over N = 6e11 positions (a shard
// of 2.5e12 on 4 ranks), each call cut into chunks of 2^31 elements: 1.7 GB of planned calls. The
// plan counts them first and refuses, naming the count; a sequence that fits is still planned.
TEST(CudaMemoryPlanTest, RefusesPassesOfTooManyPlannedCalls) {
  AttentionSpec spec;
  spec.segment_lengths = {47, 211, 72, 129};
  spec.dilation_rates = {65, 91, 1, 91};
  spec.mode = AttentionMode::kMixture;
  spec.head_offsets = HeadOffsets::kBlocked;
  const int64_t n = 616575695648;
  ASSERT_LE(CountBlockCalls(spec, {3, n, 39, 71}, /*fold_batches=*/true), kMaxBlockCalls)
      << "the block-call bound alone would let it through";
  absl::StatusOr<CudaMemoryPlan> huge = PlanCudaMemory(spec, 3, n, 39, 71, DType::kFloat16, false);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("kernel calls per forward pass"), std::string::npos)
      << huge.status();
  EXPECT_NE(huge.status().message().find("N=616575695648"), std::string::npos) << huge.status();
  EXPECT_TRUE(PlanCudaMemory(spec, 3, 1 << 20, 39, 71, DType::kFloat16, true).ok());
}

}  // namespace
}  // namespace cuda
}  // namespace dattn
