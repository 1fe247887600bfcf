// Request validation with the attention kind, and the attention kind's own parts (analysis into
// the common JobAnalysis, rank plans, combined results, output layout).
#include "server/requests.h"

#include <map>
#include <string>
#include <vector>

#include "api/limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/attention_kind.h"
#include "server/metrics.h"

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
  a->mutable_shape()->set_batch(2);
  a->mutable_shape()->set_seq_len(512);
  a->mutable_shape()->set_num_heads(4);
  a->mutable_shape()->set_head_dim(32);
  a->set_dtype(v1::DTYPE_FP32);
  a->set_num_ranks(2);
  a->set_iterations(3);
  a->set_return_output(true);
  return request;
}

class RequestsTest : public ::testing::Test {
 protected:
  RequestsTest() { kinds_.Add(std::make_unique<AttentionKind>(&metrics_)); }
  Metrics metrics_;
  WorkKinds kinds_;
};

TEST_F(RequestsTest, TheKindAnalysesTheSpecIntoWhatEveryRoleNeeds) {
  absl::StatusOr<AnalyzedSpec> spec = ValidateSubmitJobRequest(Request(), kinds_);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_STREQ(spec->kind->name(), "attention");
  const JobAnalysis& a = *spec->analysis;
  EXPECT_EQ(a.num_ranks, 2);
  EXPECT_EQ(a.steps_total, 3);
  EXPECT_EQ(a.dtype, "fp32");
  EXPECT_EQ(a.head_dim, 32);
  EXPECT_TRUE(a.keeps_output);
  ASSERT_EQ(a.devices.size(), 2u);  // DEVICE_PREFERENCE_ANY with fp32: GPU, then CPU.
  EXPECT_TRUE(a.devices[0].gpu);
  EXPECT_FALSE(a.devices[1].gpu);
  EXPECT_THAT(a.summary,
              HasSubstr("(B, N, H, D) = (2, 512, 4, 32) fp32, 2 ranks, 3 forward steps"));
  EXPECT_THAT(a.summary, HasSubstr("output of 512 KiB kept"));

  // Each rank's plan travels in its assignment.
  v1::TaskAssignment assignment;
  spec->kind->PlanRank(a, 1, 1, &assignment);
  ASSERT_TRUE(assignment.has_attention_plan());
  EXPECT_EQ(assignment.attention_plan().position_begin(), 256);
  EXPECT_EQ(assignment.attention_plan().memory_bytes(), a.devices[1].memory_per_rank_bytes);

  // The output is B blocks of each rank's N/P rows.
  const OutputLayout layout = spec->kind->Output(a);
  EXPECT_EQ(layout.ranks, 2);
  EXPECT_EQ(layout.blocks, 2);
  EXPECT_EQ(layout.rank_block_bytes, 256 * 4 * 32 * 4);
  EXPECT_EQ(layout.header.total_bytes(), 2 * 512 * 4 * 32 * 4);
  const v1::TensorHeader shard = spec->kind->ShardHeader(a, 1);
  EXPECT_THAT(shard.shape(), ::testing::ElementsAre(2, 256, 4, 32));
  EXPECT_EQ(shard.total_bytes(), layout.header.total_bytes() / 2);

  // An attention job's recovery is a rerun of the same job: nothing in place.
  scheduler::RecoveryInput input;
  spec->kind->DescribeRecovery(a, 1, &input);
  EXPECT_FALSE(input.allow_shrink || input.allow_single_device || input.allow_precision_fallback ||
               input.allow_more_ranks);
  EXPECT_EQ(input.memory_per_rank(2), a.devices[1].memory_per_rank_bytes);
  EXPECT_EQ(input.memory_per_rank(1), std::nullopt);
}

TEST_F(RequestsTest, TheStoredSpecAloneIsCheckedTheSameWay) {
  v1::JobSpec spec = Request().spec();
  EXPECT_TRUE(AnalyzeJobSpec(spec, kinds_).ok());
  spec.mutable_attention()->mutable_shape()->set_num_heads(0);
  EXPECT_THAT(std::string(AnalyzeJobSpec(spec, kinds_).status().message()),
              HasSubstr("spec.attention.shape.num_heads: must be >= 1, got 0"));
  spec.clear_attention();
  absl::Status none = AnalyzeJobSpec(spec, kinds_).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("spec: a job must say its work: one of attention (none is set)"));
}

// The stored-spec path (a restart) applies the same bounds as a submit.
TEST_F(RequestsTest, StoredSpecsAreBoundedToo) {
  v1::JobSpec spec = Request().spec();
  for (int i = 0; i < api::kMaxPatterns; ++i) {
    spec.mutable_attention()->mutable_attention()->add_segment_lengths(64);
    spec.mutable_attention()->mutable_attention()->add_dilation_rates(1);
  }
  EXPECT_EQ(AnalyzeJobSpec(spec, kinds_).status().code(), absl::StatusCode::kInvalidArgument);
  spec = Request().spec();
  spec.GetReflection()->MutableUnknownFields(&spec)->AddLengthDelimited(77,
                                                                        std::string(70000, 'x'));
  absl::Status s = AnalyzeJobSpec(spec, kinds_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("more than the 65536"));
}

TEST_F(RequestsTest, MessagesQuoteAndCutOddValues) {
  v1::SubmitJobRequest request = Request();
  request.mutable_spec()->set_tenant(std::string("a\nb"));
  EXPECT_THAT(std::string(ValidateSubmitJobRequest(request, kinds_).status().message()),
              HasSubstr("\"a\\x0ab\""));
  request.mutable_spec()->set_tenant("");
  request.mutable_spec()->set_name(std::string(300, 'n'));
  const std::string message(ValidateSubmitJobRequest(request, kinds_).status().message());
  EXPECT_THAT(message, HasSubstr("got 300"));
  EXPECT_THAT(message, HasSubstr("...\""));
  EXPECT_LT(message.size(), 150u);
}

TEST_F(RequestsTest, ListingsFilterOnlyByKnownKinds) {
  v1::ListJobsRequest list;
  list.set_kind("attention");
  EXPECT_TRUE(ValidateListJobsRequest(list, kinds_).ok());
  list.set_kind("training");
  absl::Status s = ValidateListJobsRequest(list, kinds_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("kind: must be one of attention or empty"));
}

TEST(AttentionKindTest, CombinesRankResults) {
  api::AttentionJobInfo info;
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
  v1::AttentionJobResult result = CombineRankResults(info, ranks);
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
}

}  // namespace
}  // namespace server
}  // namespace dattn
