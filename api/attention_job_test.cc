#include "api/attention_job.h"
#include "api/limits.h"

#include <string>

#include "engine/memory_plan.h"
#include "engine/rank_memory_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace api {
namespace {

using ::testing::HasSubstr;

v1::AttentionJobSpec Spec() {
  v1::AttentionJobSpec a;
  a.mutable_attention()->add_segment_lengths(128);
  a.mutable_attention()->add_dilation_rates(1);
  a.mutable_attention()->add_segment_lengths(256);
  a.mutable_attention()->add_dilation_rates(2);
  a.mutable_attention()->set_mode(v1::ATTENTION_MODE_MIXTURE);
  a.mutable_attention()->set_head_offsets(v1::HEAD_OFFSETS_BLOCKED);
  a.mutable_attention()->set_scale(0.25);
  a.mutable_shape()->set_batch(2);
  a.mutable_shape()->set_seq_len(512);
  a.mutable_shape()->set_num_heads(4);
  a.mutable_shape()->set_head_dim(32);
  a.set_dtype(v1::DTYPE_FP64);
  a.set_num_ranks(1);
  a.set_pass(v1::PASS_FORWARD_BACKWARD);
  return a;
}

TEST(AttentionJobTest, DerivesTheEngineViewOfAValidJob) {
  absl::StatusOr<AttentionJobInfo> info = AnalyzeAttentionJob(Spec(), "spec.attention");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->spec.mode, AttentionMode::kMixture);
  EXPECT_EQ(info->spec.head_offsets, HeadOffsets::kBlocked);
  ASSERT_TRUE(info->spec.scale.has_value());
  EXPECT_EQ(*info->spec.scale, 0.25);
  EXPECT_EQ(info->dtype, DType::kFloat64);
  EXPECT_TRUE(info->backward);
  EXPECT_EQ(info->iterations, 1);  // Unset means 1.
  EXPECT_EQ(info->output_bytes, 2 * 512 * 4 * 32 * 8);
  EXPECT_DOUBLE_EQ(info->tokens, 2.0 * 512);
  EXPECT_DOUBLE_EQ(info->flops_per_step,
                   3.5 * dilation::NominalForwardFlops(info->spec, 2, 512, 4, 32));
  // DEVICE_PREFERENCE_ANY with fp64: only CPU workers run it, with the planner's bytes per rank.
  ASSERT_EQ(info->variants.size(), 1u);
  EXPECT_FALSE(info->variants[0].gpu);
  PlanOptions options;
  options.dtype = DType::kFloat64;
  options.backward = true;
  options.num_threads = kCpuPlanThreads;
  absl::StatusOr<MemoryPlan> plan = PlanAttentionMemory(info->spec, {2, 512, 4, 32}, options);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(info->variants[0].memory_per_rank_bytes, plan->total_bytes());
  EXPECT_EQ(info->variants[0].memory_plan, plan->DebugString());
}

TEST(AttentionJobTest, RingJobsPlanTheLargestRankAndEachRankGetsItsPlan) {
  v1::AttentionJobSpec spec = Spec();
  spec.set_num_ranks(4);
  spec.set_iterations(7);
  absl::StatusOr<AttentionJobInfo> info = AnalyzeAttentionJob(spec, "spec.attention");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->num_ranks, 4);
  // The whole problem's FLOPs, whatever the ring.
  EXPECT_DOUBLE_EQ(info->flops_per_step,
                   3.5 * dilation::NominalForwardFlops(info->spec, 2, 512, 4, 32));
  ASSERT_EQ(info->variants.size(), 1u);
  RankProblem problem;
  problem.spec = info->spec;
  problem.batch = 2;
  problem.seq_len = 512;
  problem.num_heads = 4;
  problem.head_dim = 32;
  problem.ranks = 4;
  problem.dtype = DType::kFloat64;
  problem.backward = true;
  absl::StatusOr<RankMemoryPlan> largest =
      PlanLargestRankMemory(problem, BackendKind::kCpu, kCpuPlanThreads);
  ASSERT_TRUE(largest.ok());
  EXPECT_EQ(info->variants[0].memory_per_rank_bytes, largest->total_bytes());
  EXPECT_GT(largest->ring_bytes, 0);  // w = 256 crosses the shard boundaries (L = 128).
  EXPECT_EQ(info->variants[0].ring_backend, "gloo");
  EXPECT_THAT(info->variants[0].memory_plan, HasSubstr("ring buffers"));
  EXPECT_THAT(info->variants[0].memory_plan, HasSubstr("of 4)"));
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<RankMemoryPlan> plan =
        PlanRankMemory(problem, r, BackendKind::kCpu, kCpuPlanThreads);
    ASSERT_TRUE(plan.ok());
    EXPECT_LE(plan->total_bytes(), info->variants[0].memory_per_rank_bytes);
    const v1::AttentionRankPlan rank = PlanAttentionRank(*info, info->variants[0], r);
    EXPECT_EQ(rank.num_ranks(), 4);
    EXPECT_EQ(rank.position_begin(), 128 * r);
    EXPECT_EQ(rank.position_end(), 128 * (r + 1));
    EXPECT_EQ(rank.iterations(), 7);
    EXPECT_TRUE(rank.backward());
    EXPECT_EQ(rank.memory_bytes(), info->variants[0].memory_per_rank_bytes);
    EXPECT_DOUBLE_EQ(rank.flops_per_step(), info->flops_per_step / 4);
  }
}

TEST(AttentionJobTest, GpuJobsArePlannedByTheCudaPlanner) {
  v1::AttentionJobSpec spec = Spec();
  spec.set_dtype(v1::DTYPE_BF16);
  spec.set_device(v1::DEVICE_PREFERENCE_GPU);
  spec.set_num_ranks(2);
  absl::StatusOr<AttentionJobInfo> info = AnalyzeAttentionJob(spec, "spec.attention");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->variants.size(), 1u);
  EXPECT_TRUE(info->variants[0].gpu);
  EXPECT_EQ(info->variants[0].ring_backend, "nccl");
  EXPECT_GE(info->variants[0].memory_per_rank_bytes, 4 * 2 * 256 * 4 * 32 * 2);  // The shard.
}

// A job of millions of patterns is refused before anything is converted.
TEST(AttentionJobTest, PatternsAreBounded) {
  v1::AttentionJobSpec spec = Spec();
  spec.mutable_attention()->clear_segment_lengths();
  spec.mutable_attention()->clear_dilation_rates();
  for (int i = 0; i < kMaxPatterns; ++i) {
    spec.mutable_attention()->add_segment_lengths(64);
    spec.mutable_attention()->add_dilation_rates(1);
  }
  spec.mutable_shape()->set_num_heads(kMaxPatterns);
  EXPECT_TRUE(AnalyzeAttentionJob(spec, "spec.attention").ok());
  spec.mutable_attention()->add_segment_lengths(64);
  spec.mutable_attention()->add_dilation_rates(1);
  absl::Status s = AnalyzeAttentionJob(spec, "spec.attention").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.attention.attention.segment_lengths: at most 64 patterns (entries) "
                        "per job, got 65"));
}

// Ring planning grew as P^2 H on adversarial shapes (a fuzzer's 20 s input: P = 64, N = 64,
// H = 2048): the ring size and P^2 H are bounded, each refusal naming the field and the values.
TEST(AttentionJobTest, RingSizesAreBounded) {
  v1::AttentionJobSpec spec = Spec();
  spec.mutable_shape()->set_seq_len(1024);
  spec.mutable_shape()->set_num_heads(64);
  spec.set_num_ranks(256);  // 256^2 x 64 = 2^22: the largest plan taken.
  absl::StatusOr<AttentionJobInfo> largest = AnalyzeAttentionJob(spec, "spec.attention");
  EXPECT_TRUE(largest.ok()) << largest.status();
  spec.mutable_shape()->set_num_heads(65);
  absl::Status s = AnalyzeAttentionJob(spec, "spec.attention").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.attention.num_ranks: 256 ranks with 65 heads: num_ranks^2 x "
                        "num_heads is over 4194304"));
  spec.mutable_shape()->set_seq_len(512 * 2);
  spec.mutable_shape()->set_num_heads(1);
  spec.set_num_ranks(512);
  s = AnalyzeAttentionJob(spec, "spec.attention").status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("spec.attention.num_ranks: at most 256 ranks per ring, got 512"));
  // The fuzzer's input, refused at once.
  spec = Spec();
  spec.mutable_attention()->set_mode(v1::ATTENTION_MODE_GROUPED);
  spec.mutable_attention()->set_segment_lengths(0, 4480);
  spec.mutable_attention()->set_segment_lengths(1, 4096);
  spec.mutable_shape()->set_batch(1);
  spec.mutable_shape()->set_seq_len(64);
  spec.mutable_shape()->set_num_heads(2048);
  spec.mutable_shape()->set_head_dim(256);
  spec.set_dtype(v1::DTYPE_BF16);
  spec.set_num_ranks(64);
  EXPECT_EQ(AnalyzeAttentionJob(spec, "spec.attention").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AttentionJobTest, ErrorsNameTheFieldAndValue) {
  v1::AttentionJobSpec spec = Spec();
  spec.mutable_shape()->set_num_heads(0);
  EXPECT_THAT(std::string(AnalyzeAttentionJob(spec, "spec.attention").status().message()),
              HasSubstr("spec.attention.shape.num_heads: must be >= 1, got 0"));
  spec = Spec();
  spec.set_return_output(true);
  spec.mutable_shape()->set_seq_len(int64_t{1} << 30);
  spec.mutable_attention()->set_segment_lengths(0, 256);
  EXPECT_THAT(std::string(AnalyzeAttentionJob(spec, "spec.attention").status().message()),
              HasSubstr("spec.attention.return_output: the output is"));
}

TEST(AttentionJobTest, SharedMemoryIsForStreamedJobsAndChecked) {
  v1::AttentionJobSpec a = Spec();
  const uint64_t bytes = 2 * 512 * 4 * 32 * 8;
  v1::SharedMemoryRegion* r = a.mutable_shared_memory();
  r->set_name("/dattn-call");
  const v1::AttendTensor order[] = {
      v1::ATTEND_TENSOR_Q,   v1::ATTEND_TENSOR_K,  v1::ATTEND_TENSOR_V,  v1::ATTEND_TENSOR_DOUT,
      v1::ATTEND_TENSOR_OUT, v1::ATTEND_TENSOR_DQ, v1::ATTEND_TENSOR_DK, v1::ATTEND_TENSOR_DV};
  for (int i = 0; i < 8; ++i) {
    r->add_tensors()->set_tensor(order[i]);
    r->mutable_tensors(i)->set_offset(i * bytes);
  }
  r->set_byte_size(8 * bytes);
  absl::StatusOr<AttentionJobInfo> info = AnalyzeAttentionJob(a, "spec.attention");
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(),
              HasSubstr("spec.attention.shared_memory: only the job of a JobService.Attend"));
  a.set_streamed(true);
  info = AnalyzeAttentionJob(a, "spec.attention");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->shared_memory);
  // The region is checked against the job's own tensor size.
  a.mutable_shared_memory()->set_byte_size(8 * bytes - 1);
  info = AnalyzeAttentionJob(a, "spec.attention");
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(),
              HasSubstr("spec.attention.shared_memory.tensors[7].offset: dv at offset"));
}

}  // namespace
}  // namespace api
}  // namespace dattn
