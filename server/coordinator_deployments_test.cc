// Deployments in the coordinator, with workers played through the core API: a deployment is
// resolved at submit (its model config read from the checkpoint, bad checkpoints refused naming
// them), planned with its limits and memory, never taken for a stalled job however long it runs,
// not waited for by a coordinator's drain (requeued at once), and answers Generate only while it
// serves.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/testing/test_checkpoint.h"
#include "server/coordinator_test_util.h"

namespace dattn {
namespace server {
namespace {

using ctest::CoordinatorTest;
using ctest::FakeWorker;
using ctest::NewDataDir;
using ctest::ValidRequest;
using ::testing::HasSubstr;

// A checkpoint of a tiny model (the coordinator reads only its config).
std::string SaveTinyCheckpoint(const std::string& root) {
  model::LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.ffn_dim = 16;
  c.segment_lengths = {4, 8};
  c.dilation_rates = {1, 2};
  absl::StatusOr<std::string> dir = model::testing::SaveTestCheckpoint(root, c, 1, 2, 0.0f);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

v1::SubmitJobRequest DeployRequest(const std::string& key, const std::string& checkpoint) {
  v1::SubmitJobRequest request;
  request.set_idempotency_key(key);
  request.mutable_spec()->mutable_deployment()->set_checkpoint(checkpoint);
  return request;
}

TEST_F(CoordinatorTest, ADeploymentIsPlannedNeverStallsAndIsNotWaitedForByADrain) {
  FakeWorker* worker = AddWorker("cpu-0", int64_t{4} << 30);
  const std::string checkpoint = SaveTinyCheckpoint(NewDataDir());
  v1::SubmitJobRequest request = DeployRequest("deploy", checkpoint);
  // The shortest stall limit a job may ask for: a deployment, which has no steps, ignores it.
  request.mutable_spec()->mutable_recovery()->set_stall_seconds(1);
  const v1::Job submitted = Submit(request);
  EXPECT_THAT(submitted.spec().deployment().model_config_json(), HasSubstr("\"d_model\": 8"));
  std::optional<v1::WorkerCommand> assign = worker->Next();
  ASSERT_TRUE(assign.has_value());
  const v1::DeploymentRankPlan& plan = assign->assign().deployment_plan();
  EXPECT_EQ(plan.checkpoint(), checkpoint);
  EXPECT_EQ(plan.max_context(), 4096);
  EXPECT_EQ(plan.max_batch(), 8);
  EXPECT_EQ(plan.max_queued(), 256);
  EXPECT_GT(plan.memory_bytes(), 0);
  EXPECT_THAT(plan.memory_plan(), HasSubstr("8 caches of"));
  const std::string id = submitted.job_id();
  ASSERT_TRUE(worker->Report(assign->assign().task_id(), v1::TASK_STATE_STARTED).ok());
  ASSERT_TRUE(WaitState(id, v1::JOB_STATE_RUNNING));

  // Not serving: no Serve stream is open.
  v1::GenerateRequest generate;
  generate.set_deployment_id(id);
  generate.set_prompt_text("x");
  absl::Status s = coordinator_->Generate(
      generate, [](const v1::GenerateResponse&) { return true; }, [] { return false; },
      absl::InfiniteDuration());
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not serving yet"));

  // Seconds past that limit without a step (an attention job is stopped within a second or two:
  // coordinator_workers_test, AStalledJobIsRecovered...): no cancel comes, it stays RUNNING.
  std::optional<v1::WorkerCommand> none = worker->Next(absl::Seconds(3));
  EXPECT_FALSE(none.has_value()) << none->DebugString();
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  for (const std::string& kind : EventKinds(Get(id, true))) EXPECT_NE(kind, "stalled");

  // A drain does not wait for it: it is requeued at once, to be placed again after a restart.
  coordinator_->StopAccepting();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(coordinator_->Drain(absl::Seconds(20)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const v1::Job drained = Get(id);
  EXPECT_EQ(drained.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(drained.attempt(), 2);
}

TEST_F(CoordinatorTest, DeploymentSpecsAreCheckedAtSubmit) {
  const std::string checkpoint = SaveTinyCheckpoint(NewDataDir());
  struct Case {
    std::string name;
    v1::SubmitJobRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"missing", DeployRequest("a", checkpoint + "-missing"),
                   "no checkpoint at " + checkpoint + "-missing"});
  cases.push_back({"none", DeployRequest("b", ""), "spec.deployment.checkpoint: required"});
  v1::SubmitJobRequest both = DeployRequest("c", checkpoint);
  both.mutable_spec()->mutable_deployment()->set_training_job_id("j-0123");
  cases.push_back({"both", both, "give checkpoint or training_job_id, not both"});
  v1::SubmitJobRequest unknown = DeployRequest("d", "");
  unknown.mutable_spec()->mutable_deployment()->set_training_job_id("j-0000000000000123");
  cases.push_back({"unknown job", unknown, "no job \"j-0000000000000123\""});
  v1::SubmitJobRequest batch = DeployRequest("e", checkpoint);
  batch.mutable_spec()->mutable_deployment()->set_max_batch(1000);
  cases.push_back({"batch", batch, "spec.deployment.max_batch: must be 1 .. 256 (0: 8), got 1000"});
  v1::SubmitJobRequest context = DeployRequest("f", checkpoint);
  context.mutable_spec()->mutable_deployment()->set_max_context(-5);
  cases.push_back({"context", context, "spec.deployment.max_context: must be 1 .. 16777216"});
  for (const Case& c : cases) {
    absl::StatusOr<v1::SubmitJobResponse> r = coordinator_->SubmitJob(c.request);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.name;
  }
  // A job that is not a deployment is not served.
  const v1::Job attention = Submit(ValidRequest("attention"));
  v1::ScoreRequest score;
  score.set_deployment_id(attention.job_id());
  score.set_text("ab");
  absl::StatusOr<v1::ScoreResponse> scored = coordinator_->Score(score, [] { return false; });
  EXPECT_TRUE(absl::IsFailedPrecondition(scored.status())) << scored.status();
  EXPECT_THAT(std::string(scored.status().message()), HasSubstr("is not a deployment"));
}

}  // namespace
}  // namespace server
}  // namespace dattn
