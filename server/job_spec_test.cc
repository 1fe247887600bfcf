#include "server/job_spec.h"

#include <map>
#include <string>
#include <vector>

#include "engine/memory_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/rank_memory_plan.h"

namespace dattn {
namespace server {
namespace {

using ::testing::HasSubstr;

v1::SubmitJobRequest Request() {
  v1::SubmitJobRequest request;
  request.set_idempotency_key("k");
  v1::AttentionJobSpec* a = request.mutable_spec()->mutable_attention();
  a->mutable_attention()->add_segment_lengths(128);
  a->mutable_attention()->add_dilation_rates(1);
  a->mutable_attention()->add_segment_lengths(256);
  a->mutable_attention()->add_dilation_rates(2);
  a->mutable_attention()->set_mode(v1::ATTENTION_MODE_MIXTURE);
  a->mutable_attention()->set_head_offsets(v1::HEAD_OFFSETS_BLOCKED);
  a->mutable_attention()->set_scale(0.25);
  a->mutable_shape()->set_batch(2);
  a->mutable_shape()->set_seq_len(512);
  a->mutable_shape()->set_num_heads(4);
  a->mutable_shape()->set_head_dim(32);
  a->set_dtype(v1::DTYPE_FP64);
  a->set_num_ranks(1);
  a->set_pass(v1::PASS_FORWARD_BACKWARD);
  return request;
}

TEST(JobSpecTest, DerivesTheEngineViewOfAValidJob) {
  absl::StatusOr<AttentionJobInfo> info = ValidateSubmitJobRequest(Request());
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

// Up to api::kMaxPatterns patterns are accepted; one more is refused naming the field and count.
TEST(JobSpecTest, PatternsAreBounded) {
  v1::SubmitJobRequest request = Request();
  v1::AttentionSpec* a = request.mutable_spec()->mutable_attention()->mutable_attention();
  a->clear_segment_lengths();
  a->clear_dilation_rates();
  for (int i = 0; i < api::kMaxPatterns; ++i) {
    a->add_segment_lengths(128);
    a->add_dilation_rates(1 + i % 4);
  }
  absl::StatusOr<AttentionJobInfo> info = ValidateSubmitJobRequest(request);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->spec.num_patterns(), api::kMaxPatterns);
  a->add_segment_lengths(128);
  a->add_dilation_rates(1);
  info = ValidateSubmitJobRequest(request);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("spec.attention.attention.segment_lengths: at most 64 patterns (entries) "
                        "per job, got 65"));
  // The stored-spec path (a restart) applies the same bound.
  EXPECT_EQ(AnalyzeJobSpec(request.spec()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobSpecTest, TheStoredSpecAloneIsCheckedTheSameWay) {
  v1::JobSpec spec = Request().spec();
  EXPECT_TRUE(AnalyzeJobSpec(spec).ok());
  spec.mutable_attention()->mutable_shape()->set_num_heads(0);
  EXPECT_THAT(std::string(AnalyzeJobSpec(spec).status().message()),
              HasSubstr("spec.attention.shape.num_heads: must be >= 1, got 0"));
}

TEST(JobSpecTest, MessagesQuoteAndCutOddValues) {
  v1::SubmitJobRequest request = Request();
  request.mutable_spec()->set_tenant(std::string("a\nb"));
  EXPECT_THAT(std::string(ValidateSubmitJobRequest(request).status().message()),
              HasSubstr("\"a\\x0ab\""));
  request.mutable_spec()->set_tenant("");
  request.mutable_spec()->set_name(std::string(300, 'n'));
  const std::string message(ValidateSubmitJobRequest(request).status().message());
  EXPECT_THAT(message, HasSubstr("got 300"));
  EXPECT_THAT(message, HasSubstr("...\""));
  EXPECT_LT(message.size(), 150u);
}

TEST(JobSpecTest, CombinesRankResults) {
  AttentionJobInfo info;
  info.flops_per_step = 2e12;
  std::vector<v1::RankResult> ranks(2);
  ranks[0].set_rank(1);
  ranks[0].set_seconds_per_step(0.5);
  ranks[0].set_out_sum(1);
  ranks[0].set_out_sum_squares(2);
  ranks[0].set_grad_sum(3);
  ranks[0].set_grad_sum_squares(4);
  ranks[1].set_rank(0);
  ranks[1].set_seconds_per_step(0.25);
  ranks[1].set_out_sum(10);
  ranks[1].set_out_sum_squares(20);
  ranks[1].set_grad_sum(30);
  ranks[1].set_grad_sum_squares(40);
  v1::Tensor output;
  output.set_data("abcd");
  v1::AttentionJobResult result = CombineRankResults(info, ranks, output, /*return_output=*/true);
  ASSERT_EQ(result.ranks_size(), 2);
  EXPECT_EQ(result.ranks(0).rank(), 0);
  EXPECT_EQ(result.ranks(1).rank(), 1);
  EXPECT_DOUBLE_EQ(result.seconds_per_step(), 0.5);  // The slowest rank.
  EXPECT_DOUBLE_EQ(result.tflops(), 4.0);            // 2e12 FLOPs / 0.5 s.
  EXPECT_DOUBLE_EQ(result.out_sum(), 11);
  EXPECT_DOUBLE_EQ(result.out_sum_squares(), 22);
  EXPECT_DOUBLE_EQ(result.grad_sum(), 33);
  EXPECT_DOUBLE_EQ(result.grad_sum_squares(), 44);
  EXPECT_DOUBLE_EQ(result.flops_per_step(), 2e12);
  EXPECT_EQ(result.output().data(), "abcd");
  EXPECT_FALSE(CombineRankResults(info, ranks, output, /*return_output=*/false).has_output());
}

TEST(JobSpecTest, RingJobsPlanTheLargestRank) {
  v1::SubmitJobRequest request = Request();
  request.mutable_spec()->mutable_attention()->set_num_ranks(4);
  absl::StatusOr<AttentionJobInfo> info = ValidateSubmitJobRequest(request);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->num_ranks, 4);
  // The whole problem's FLOPs, whatever the ring.
  EXPECT_DOUBLE_EQ(info->flops_per_step,
                   3.5 * dilation::NominalForwardFlops(info->spec, 2, 512, 4, 32));
  ASSERT_EQ(info->variants.size(), 1u);
  worker::RankProblem problem;
  problem.spec = info->spec;
  problem.batch = 2;
  problem.seq_len = 512;
  problem.num_heads = 4;
  problem.head_dim = 32;
  problem.ranks = 4;
  problem.dtype = DType::kFloat64;
  problem.backward = true;
  absl::StatusOr<worker::RankMemoryPlan> largest =
      worker::PlanLargestRankMemory(problem, BackendKind::kCpu, kCpuPlanThreads);
  ASSERT_TRUE(largest.ok());
  EXPECT_EQ(info->variants[0].memory_per_rank_bytes, largest->total_bytes());
  EXPECT_GT(largest->ring_bytes, 0);  // w = 256 crosses the shard boundaries (L = 128).
  EXPECT_EQ(info->variants[0].ring_backend, "gloo");
  EXPECT_THAT(info->variants[0].memory_plan, HasSubstr("ring buffers"));
  EXPECT_THAT(info->variants[0].memory_plan, HasSubstr("of 4)"));
  // Every rank's plan is at most the reserved figure.
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<worker::RankMemoryPlan> plan =
        worker::PlanRankMemory(problem, r, BackendKind::kCpu, kCpuPlanThreads);
    ASSERT_TRUE(plan.ok());
    EXPECT_LE(plan->total_bytes(), info->variants[0].memory_per_rank_bytes);
  }
}

TEST(JobSpecTest, GpuJobsArePlannedByTheCudaPlanner) {
  v1::SubmitJobRequest request = Request();
  request.mutable_spec()->mutable_attention()->set_dtype(v1::DTYPE_BF16);
  request.mutable_spec()->mutable_attention()->set_device(v1::DEVICE_PREFERENCE_GPU);
  request.mutable_spec()->mutable_attention()->set_num_ranks(2);
  absl::StatusOr<AttentionJobInfo> info = ValidateSubmitJobRequest(request);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->variants.size(), 1u);
  EXPECT_TRUE(info->variants[0].gpu);
  EXPECT_EQ(info->variants[0].ring_backend, "nccl");
  EXPECT_GE(info->variants[0].memory_per_rank_bytes, 4 * 2 * 256 * 4 * 32 * 2);  // The shard.
}

// The job's output from its shards: rank r's rows of every batch item go to positions
// [r N/P, (r+1) N/P) of that item.
TEST(JobSpecTest, AssemblesTheOutputFromTheRanksShards) {
  AttentionJobInfo info;
  info.batch = 2;
  info.seq_len = 6;
  info.num_heads = 1;
  info.head_dim = 1;
  info.num_ranks = 3;
  info.dtype = DType::kFloat32;
  std::map<int, v1::Tensor> shards;
  for (int r = 0; r < 3; ++r) {
    v1::Tensor& t = shards[r];
    t.set_dtype(v1::DTYPE_FP32);
    for (int64_t d : {2, 2, 1, 1}) t.add_shape(d);
    // Element (b, i) of rank r's shard is the global position's value 10 b + 2 r + i.
    std::vector<float> values;
    for (int b = 0; b < 2; ++b) {
      for (int i = 0; i < 2; ++i) values.push_back(static_cast<float>(10 * b + 2 * r + i));
    }
    t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  }
  absl::StatusOr<v1::Tensor> out = AssembleOutput(info, shards);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->dtype(), v1::DTYPE_FP32);
  EXPECT_THAT(out->shape(), ::testing::ElementsAre(2, 6, 1, 1));
  ASSERT_EQ(out->data().size(), 12u * 4);
  const float* got = reinterpret_cast<const float*>(out->data().data());
  for (int b = 0; b < 2; ++b) {
    for (int p = 0; p < 6; ++p) EXPECT_EQ(got[b * 6 + p], 10 * b + p) << b << ", " << p;
  }

  std::map<int, v1::Tensor> missing = shards;
  missing.erase(1);
  EXPECT_THAT(std::string(AssembleOutput(info, missing).status().message()),
              HasSubstr("rank 1 returned no output shard"));
  std::map<int, v1::Tensor> wrong = shards;
  wrong[2].set_dtype(v1::DTYPE_FP64);
  EXPECT_THAT(std::string(AssembleOutput(info, wrong).status().message()),
              HasSubstr("rank 2 returned a fp64 shard of shape [2, 2, 1, 1]"));
  wrong = shards;
  wrong[0].mutable_data()->pop_back();
  EXPECT_THAT(std::string(AssembleOutput(info, wrong).status().message()),
              HasSubstr("rank 0 returned"));
}

}  // namespace
}  // namespace server
}  // namespace dattn
