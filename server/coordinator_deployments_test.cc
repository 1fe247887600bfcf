// Deployments in the coordinator, with workers played through the core API: a deployment is
// resolved at submit (its model config read from the checkpoint or imported model, bad folders
// refused naming them), planned with its limits and memory, never taken for a stalled job however
// long it runs, not waited for by a coordinator's drain (requeued at once), and answers Generate
// only while it serves.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/cuda/serving_plan.h"
#include "model/file_io.h"
#include "model/safetensors.h"
#include "model/testing/test_checkpoint.h"
#include "server/coordinator_test_util.h"
#include "server/job_store.h"

namespace dattn {
namespace server {
namespace {

using ctest::CoordinatorTest;
using ctest::FakeWorker;
using ctest::NewDataDir;
using ctest::ValidRequest;
using ::testing::HasSubstr;

using model::testing::TinyTestConfig;

// A checkpoint of a tiny model (the coordinator reads its config and the weights' headers).
std::string SaveTinyCheckpoint(const std::string& root, int64_t step = 2) {
  absl::StatusOr<std::string> dir =
      model::testing::SaveTestCheckpoint(root, TinyTestConfig(), 1, step, 0.0f);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

// A training job of TinyConfig's model on CPU workers, saving its checkpoints under
// `checkpoint_dir` (the tests write its steps there themselves).
v1::SubmitJobRequest TinyTrainingRequest(const std::string& key,
                                         const std::string& checkpoint_dir) {
  v1::SubmitJobRequest train;
  train.set_idempotency_key(key);
  v1::TrainingJobSpec* training = train.mutable_spec()->mutable_training();
  training->set_config_json(R"({
    "model": {"vocab_size": 256, "d_model": 8, "num_layers": 1, "num_heads": 2, "ffn_dim": 16,
              "attention": {"segment_lengths": [4, 8], "dilation_rates": [1, 2]}},
    "data": {"paths": ["/data/corpus.txt"]},
    "seq_len": 16, "batch_size": 2, "steps": 100})");
  training->set_device(v1::DEVICE_PREFERENCE_CPU);
  training->set_checkpoint_dir(checkpoint_dir);
  return train;
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

// A deployment on a ring of 2 workers: placed as a gang with a rendezvous (each rank's assignment
// carries the ring and the plan's ranks), each rank reserving its share: half of each cache and of
// the prefill, the weights whole, plus the ring's buffers.
TEST_F(CoordinatorTest, ADeploymentOnARingIsPlacedAsAGangWithItsShareOnEachRank) {
  FakeWorker* a = AddWorker("cpu-a", int64_t{4} << 30);
  FakeWorker* b = AddWorker("cpu-b", int64_t{4} << 30);
  const std::string checkpoint = SaveTinyCheckpoint(NewDataDir());
  v1::SubmitJobRequest request = DeployRequest("ring", checkpoint);
  request.mutable_spec()->mutable_deployment()->set_ranks(2);
  const v1::Job ring = Submit(request);
  // Each worker gets a rank.
  std::vector<v1::TaskAssignment> ranks;
  for (FakeWorker* w : {a, b}) {
    std::optional<v1::WorkerCommand> c = w->Next();
    if (c.has_value() && c->has_assign()) ranks.push_back(c->assign());
  }
  ASSERT_EQ(ranks.size(), 2u) << Get(ring.job_id(), true).DebugString();
  for (const v1::TaskAssignment& t : ranks) {
    EXPECT_EQ(t.deployment_plan().ranks(), 2);
    EXPECT_EQ(t.ring().size(), 2);
    EXPECT_EQ(t.ring().rank(), t.rank());
    EXPECT_EQ(t.ring().backend(), "gloo");
    EXPECT_FALSE(t.ring().store_address().empty());
    // The weights are whole on each rank; the caches and the prefill are halved.
    EXPECT_THAT(t.deployment_plan().memory_plan(), HasSubstr("prefill of 2048 tokens"));
    EXPECT_THAT(t.deployment_plan().memory_plan(), HasSubstr("ring buffers"));
    EXPECT_THAT(t.deployment_plan().memory_plan(), HasSubstr("8 caches of 128 B (1/2 of 256 B)"));
  }
  EXPECT_NE(ranks[0].rank(), ranks[1].rank());
  const v1::Job got = Get(ring.job_id(), true);
  bool said = false;
  for (const v1::JobEvent& e : got.events()) {
    said = said || absl::StrContains(e.message(), "on a ring of 2 workers");
  }
  EXPECT_TRUE(said) << got.DebugString();
}

// A deployment on a ring of 2 whose worker is lost for good serves again on one rank of the worker
// left (shrink_ring and single_device are on for deployments by default).
TEST_F(CoordinatorTest, ADeploymentRingThatLostAWorkerServesAgainOnTheWorkerLeft) {
  options_.feasibility_settle = absl::Milliseconds(50);
  Restart();
  FakeWorker* a = AddWorker("cpu-a", int64_t{4} << 30);
  FakeWorker* b = AddWorker("cpu-b", int64_t{4} << 30);
  v1::SubmitJobRequest request = DeployRequest("ring", SaveTinyCheckpoint(NewDataDir()));
  request.mutable_spec()->mutable_deployment()->set_ranks(2);
  const std::string id = Submit(request).job_id();
  std::optional<v1::WorkerCommand> first = a->Next();
  ASSERT_TRUE(first.has_value() && first->has_assign());
  ASSERT_TRUE(b->Next().has_value());
  b->StopHeartbeats();
  std::optional<v1::WorkerCommand> cancel = a->Next();
  ASSERT_TRUE(cancel.has_value() && cancel->has_cancel()) << Get(id, true).DebugString();
  ASSERT_TRUE(a->Fail(cancel->cancel().task_id(), absl::StatusCode::kAborted, "aborted").ok());
  // The next assignment (a cancel of the old rank may be sent again first, as the worker's
  // heartbeat listed it until the report).
  std::optional<v1::WorkerCommand> again;
  for (int i = 0; i < 5 && !(again.has_value() && again->has_assign()); ++i) {
    again = a->Next(absl::Seconds(10));
  }
  ASSERT_TRUE(again.has_value() && again->has_assign()) << Get(id, true).DebugString();
  EXPECT_EQ(again->assign().deployment_plan().ranks(), 1);
  EXPECT_EQ(again->assign().attempt(), 2);
  const v1::Job job = Get(id, true);
  EXPECT_EQ(job.spec().deployment().ranks(), 1);
  EXPECT_EQ(job.requested_spec().deployment().ranks(), 2);
  bool said = false;
  for (const v1::JobEvent& e : job.events()) {
    said = said || (e.kind() == "shrunk" && absl::StrContains(e.message(), "on 1 rank ("));
  }
  EXPECT_TRUE(said) << job.DebugString();
}

// A deployment that ended while the coordinator stopped before its next scheduling pass (the pass
// removes an ended deployment's pin) leaves its pinned step on disk: the next coordinator removes
// it at startup, and keeps the pin of a deployment still active.
TEST_F(CoordinatorTest, PinsOfDeploymentsThatEndedBeforeAStopAreRemovedAtStartup) {
  const std::string root = NewDataDir();
  const std::string step = SaveTinyCheckpoint(root);
  const std::string stale = root + "/pinned/step-2-00000000000000aa";
  const std::string kept = root + "/pinned/step-2-00000000000000bb";
  ASSERT_TRUE(model::PinCheckpoint(step, stale).ok());
  ASSERT_TRUE(model::PinCheckpoint(step, kept).ok());
  // A resolved deployment spec (the model's config read at submit), to store two of, each on a pin
  // as a submit of a training job's step makes them.
  const v1::Job resolved = Submit(DeployRequest("model", step));
  ASSERT_TRUE(coordinator_->Close().ok());
  coordinator_.reset();
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store =
        JobStore::Open(options_.data_dir + "/jobs.db", JobStoreOptions{});
    ASSERT_TRUE(store.ok()) << store.status();
    int n = 0;
    for (const std::string& pin : {stale, kept}) {
      v1::Job job = resolved;
      job.set_job_id(absl::StrCat("j-00000000000000p", ++n));
      job.set_idempotency_key(absl::StrCat("default/pinned-", n));
      job.mutable_spec()->mutable_deployment()->set_checkpoint(pin);
      job.mutable_spec()->mutable_deployment()->set_checkpoint_pinned(true);
      v1::JobEvent submitted;
      submitted.set_kind("submitted");
      ASSERT_TRUE((*store)->Submit(job, submitted).ok());
      if (pin == stale) {
        job.set_state(v1::JOB_STATE_CANCELLED);
        v1::JobEvent cancelled;
        cancelled.set_kind("cancelled");
        ASSERT_TRUE((*store)->Update(job, cancelled).ok());
      }
    }
    ASSERT_TRUE((*store)->Close().ok());
  }
  Open();
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(kept + "/" + model::kManifestFile));
  EXPECT_TRUE(std::filesystem::exists(step + "/" + model::kManifestFile)) << "the step itself";
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
                   "model folder " + checkpoint + "-missing does not exist"});
  cases.push_back({"root", DeployRequest("g", std::filesystem::path(checkpoint).parent_path()),
                   "holds checkpoint step folders (" + checkpoint + " is the newest)"});
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
  v1::SubmitJobRequest ranks = DeployRequest("h", checkpoint);
  ranks.mutable_spec()->mutable_deployment()->set_ranks(65);
  cases.push_back({"ranks", ranks, "spec.deployment.ranks: must be 1 .. 64 (0: 1), got 65"});
  v1::SubmitJobRequest uneven = DeployRequest("i", checkpoint);
  uneven.mutable_spec()->mutable_deployment()->set_ranks(3);
  cases.push_back({"uneven", uneven,
                   "spec.deployment.ranks: 3 ranks must divide max_context 4096 (a prompt is "
                   "split evenly over the ring)"});
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

// Where a deployment runs: GPU workers in bf16 when the spec allows (device any or gpu) and the
// model runs there, reserving what model/cuda/serving_plan.h plans (one GPU, or each GPU of an
// NCCL ring its largest rank's share); CPU workers in fp32 otherwise. A GPU spec the GPU cannot
// serve (a head_dim the CUDA model refuses) is refused at submit naming the field.
TEST_F(CoordinatorTest, ADeploymentRunsOnAGpuWorkerInBf16WhenItsSpecAndModelAllow) {
  model::LongNetConfig gpu_config = TinyTestConfig();
  gpu_config.d_model = 16;  // head_dim 8: the CUDA model's smallest
  absl::StatusOr<std::string> gpu_checkpoint =
      model::testing::SaveTestCheckpoint(NewDataDir(), gpu_config, 1, 2, 0.0f);
  ASSERT_TRUE(gpu_checkpoint.ok()) << gpu_checkpoint.status();
  FakeWorker* gpu = AddWorker("gpu-0", int64_t{8} << 30, 1, true, true, /*gpu=*/true);
  const v1::Job any = Submit(DeployRequest("any", *gpu_checkpoint));
  std::optional<v1::WorkerCommand> assign = gpu->Next();
  ASSERT_TRUE(assign.has_value());
  EXPECT_EQ(assign->assign().job_id(), any.job_id());
  const v1::DeploymentRankPlan& plan = assign->assign().deployment_plan();
  absl::StatusOr<model::cuda::ServingMemoryPlan> planned =
      model::cuda::PlanCudaServingMemory(gpu_config, 4096, 8);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_EQ(plan.memory_bytes(), planned->total_bytes);
  EXPECT_THAT(plan.memory_plan(), HasSubstr("GPU, bf16: model "));
  EXPECT_THAT(plan.memory_plan(), HasSubstr("(8 caches of "));

  // device cpu: a CPU worker takes it (with none ready it would be refused at submit: it could
  // never run).
  FakeWorker* cpu = AddWorker("cpu-0", int64_t{8} << 30);
  v1::SubmitJobRequest cpu_only = DeployRequest("cpu", *gpu_checkpoint);
  cpu_only.mutable_spec()->mutable_deployment()->set_device(v1::DEVICE_PREFERENCE_CPU);
  const v1::Job on_cpu = Submit(cpu_only);
  std::optional<v1::WorkerCommand> cpu_assign = cpu->Next();
  ASSERT_TRUE(cpu_assign.has_value());
  EXPECT_EQ(cpu_assign->assign().job_id(), on_cpu.job_id());
  EXPECT_THAT(cpu_assign->assign().deployment_plan().memory_plan(), HasSubstr("CPU, fp32: "));

  // A ring of 2 GPUs: two GPU workers, each rank an NCCL ring's, reserving rank 0's share.
  FakeWorker* gpu_a = AddWorker("gpu-a", int64_t{8} << 30, 1, true, true, /*gpu=*/true);
  FakeWorker* gpu_b = AddWorker("gpu-b", int64_t{8} << 30, 1, true, true, /*gpu=*/true);
  // Room for the ring's share, NCCL's allowance included (more than the default 1 GiB free).
  gpu_a->SetFreeMemory(int64_t{4} << 30);
  gpu_b->SetFreeMemory(int64_t{4} << 30);
  absl::SleepFor(absl::Milliseconds(100));  // a heartbeat of each says so
  v1::SubmitJobRequest ring = DeployRequest("ring", *gpu_checkpoint);
  ring.mutable_spec()->mutable_deployment()->set_device(v1::DEVICE_PREFERENCE_GPU);
  ring.mutable_spec()->mutable_deployment()->set_ranks(2);
  const v1::Job on_ring = Submit(ring);
  absl::StatusOr<model::cuda::ServingMemoryPlan> ring_plan =
      model::cuda::PlanCudaServingMemory(gpu_config, 4096, 8, 2);
  ASSERT_TRUE(ring_plan.ok()) << ring_plan.status();
  EXPECT_GT(ring_plan->ring_bytes, 0);
  std::vector<int> ring_ranks;
  for (FakeWorker* w : {gpu_a, gpu_b}) {
    std::optional<v1::WorkerCommand> c = w->Next();
    ASSERT_TRUE(c.has_value() && c->has_assign()) << Get(on_ring.job_id(), true).DebugString();
    EXPECT_EQ(c->assign().job_id(), on_ring.job_id());
    EXPECT_EQ(c->assign().ring().backend(), "nccl");
    EXPECT_EQ(c->assign().ring().size(), 2);
    EXPECT_EQ(c->assign().deployment_plan().memory_bytes(), ring_plan->total_bytes);
    EXPECT_THAT(c->assign().deployment_plan().memory_plan(), HasSubstr(" + ring "));
    EXPECT_THAT(c->assign().deployment_plan().memory_plan(),
                HasSubstr("1/2 of each sequence's) on each of 2 GPUs"));
    ring_ranks.push_back(c->assign().rank());
  }
  EXPECT_NE(ring_ranks[0], ring_ranks[1]);

  // Refused at submit: a model the CUDA model cannot run (head_dim 4).
  v1::SubmitJobRequest small = DeployRequest("small", SaveTinyCheckpoint(NewDataDir()));
  small.mutable_spec()->mutable_deployment()->set_device(v1::DEVICE_PREFERENCE_GPU);
  absl::StatusOr<v1::SubmitJobResponse> refused = coordinator_->SubmitJob(small);
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("spec.deployment.model_config_json: the model does not run on GPU "
                        "workers: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("d_model / num_heads"));
  // The same model with device any: CPU workers only (the GPU worker, busy anyway, is not what
  // it waits for: a free CPU worker takes it).
  const v1::Job small_any = Submit(DeployRequest("small-any", SaveTinyCheckpoint(NewDataDir())));
  FakeWorker* cpu2 = AddWorker("cpu-1", int64_t{8} << 30);
  std::optional<v1::WorkerCommand> second = cpu2->Next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->assign().job_id(), small_any.job_id());
}

// An imported model (config.json + safetensors, model/model_folder.h) is resolved like a
// checkpoint: its config read at submit; tensors that do not fit its config are refused then,
// naming the tensor, and so is a checkpoint whose weights do not fit its config.
TEST_F(CoordinatorTest, AnImportedModelIsCheckedAndResolvedAtSubmit) {
  const std::string root = NewDataDir();
  std::vector<float> weights;
  model::LongNetConfig c = TinyTestConfig();
  ASSERT_TRUE(model::testing::SaveTestCheckpoint(root + "/ckpt", c, 1, 2, 0.0f, &weights).ok());
  const std::string imported = root + "/imported";
  ASSERT_TRUE(model::testing::SaveTestImport(imported, c, weights, model::SafeDtype::kBF16).ok());
  const v1::Job job = Submit(DeployRequest("imported", imported));
  EXPECT_EQ(job.spec().deployment().checkpoint(), imported);
  EXPECT_EQ(job.spec().deployment().model_config_json(), model::ConfigToJson(c));
  EXPECT_FALSE(job.spec().deployment().checkpoint_pinned());

  // The same tensors under the config of a wider model: refused, naming the first misfit.
  model::LongNetConfig wide = c;
  wide.d_model = 16;
  ASSERT_TRUE(
      model::WriteWholeFile(imported + "/config.json", model::ConfigToJson(wide), false).ok());
  absl::StatusOr<v1::SubmitJobResponse> misfit =
      coordinator_->SubmitJob(DeployRequest("misfit", imported));
  ASSERT_TRUE(absl::IsInvalidArgument(misfit.status())) << misfit.status();
  EXPECT_THAT(
      std::string(misfit.status().message()),
      HasSubstr("spec.deployment.checkpoint: " + imported +
                "/model.safetensors: tensor \"token_embedding.weight\" has shape [256, 8], the "
                "model's layout [256, 16]"));
  // Neither form: a folder with only weights.
  std::filesystem::remove(imported + "/config.json");
  absl::StatusOr<v1::SubmitJobResponse> neither =
      coordinator_->SubmitJob(DeployRequest("neither", imported));
  ASSERT_TRUE(absl::IsInvalidArgument(neither.status())) << neither.status();
  EXPECT_THAT(std::string(neither.status().message()),
              HasSubstr("is neither a checkpoint (no MANIFEST.json) nor an imported model"));
}

// Any saved step of a training job, in whatever state the job is: training_job_step picks the
// complete checkpoint <checkpoint_dir>/<job_id>/step-NNNNNNNN; a step it has not saved (or saved
// only in part) is refused naming the steps it has. A step of a job that has not ended is pinned
// (its keep_last cannot take it from the deployment): a retry finds the same pin, even once the
// step itself was pruned; the pin goes when the deployment ends. A step of an ended job is not
// pinned.
TEST_F(CoordinatorTest, ADeploymentServesAnySavedStepOfATrainingJob) {
  const std::string root = NewDataDir() + "/checkpoints";
  // A trailing slash is the same folder.
  const v1::Job job = Submit(TinyTrainingRequest("train", root + "/"));
  const std::string folder = root + "/" + job.job_id();
  // Steps 2 and 4 saved whole; step 6 begun but without its manifest.
  SaveTinyCheckpoint(folder, 2);
  const std::string step4 = SaveTinyCheckpoint(folder, 4);
  const std::string step6 = SaveTinyCheckpoint(folder, 6);
  ASSERT_TRUE(std::filesystem::remove(step6 + "/MANIFEST.json"));

  auto deploy = [&](const std::string& key, const std::string& job_id, int64_t step) {
    v1::SubmitJobRequest r = DeployRequest(key, "");
    r.mutable_spec()->mutable_deployment()->set_training_job_id(job_id);
    r.mutable_spec()->mutable_deployment()->set_training_job_step(step);
    return coordinator_->SubmitJob(r);
  };
  auto pins = [&] {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(folder + "/pinned", ec)) {
      out.push_back(e.path().string());
    }
    return out;
  };
  absl::StatusOr<v1::SubmitJobResponse> served = deploy("d4", job.job_id(), 4);
  ASSERT_TRUE(served.ok()) << served.status();
  const v1::Job deployment = Get(served->job().job_id());
  const std::string pin = deployment.spec().deployment().checkpoint();
  EXPECT_THAT(pin, ::testing::StartsWith(folder + "/pinned/step-4-"));
  EXPECT_TRUE(deployment.spec().deployment().checkpoint_pinned());
  EXPECT_THAT(deployment.spec().deployment().model_config_json(), HasSubstr("\"d_model\": 8"));
  // The job saves step 8 and keeps only it: the pinned step 4 still opens, checksums and all.
  SaveTinyCheckpoint(folder, 8);
  ASSERT_TRUE(model::PruneCheckpoints(folder, 1).ok());
  ASSERT_FALSE(std::filesystem::exists(step4));
  EXPECT_TRUE(model::Checkpoint::Open(pin, /*verify_checksums=*/true).ok());
  absl::StatusOr<v1::SubmitJobResponse> retry = deploy("d4", job.job_id(), 4);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->created());
  EXPECT_EQ(retry->job().job_id(), deployment.job_id());
  EXPECT_EQ(pins(), std::vector<std::string>{pin});
  // Another key, another deployment with a pin of its own; a submit refused after pinning (here
  // for its missing key) leaves none.
  absl::StatusOr<v1::SubmitJobResponse> other = deploy("d8", job.job_id(), 8);
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string pin8 = Get(other->job().job_id()).spec().deployment().checkpoint();
  EXPECT_THAT(pin8, ::testing::StartsWith(folder + "/pinned/step-8-"));
  EXPECT_TRUE(absl::IsInvalidArgument(deploy("", job.job_id(), 8).status()));
  EXPECT_EQ(pins().size(), 2u);
  // Undeployed: its pin goes (at the coordinator's next scheduling pass).
  v1::CancelJobRequest undeploy;
  undeploy.set_job_id(deployment.job_id());
  ASSERT_TRUE(coordinator_->CancelJob(undeploy).ok());
  ASSERT_TRUE(WaitState(deployment.job_id(), v1::JOB_STATE_CANCELLED));
  for (int i = 0; i < 500 && std::filesystem::exists(pin); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(std::filesystem::exists(pin));
  EXPECT_EQ(pins(), std::vector<std::string>{pin8});
  const v1::Job attention = Submit(ValidRequest("attention"));
  struct Case {
    std::string job_id;
    int64_t step;
    std::string message;
  };
  const std::vector<Case> cases = {
      {job.job_id(), 6,
       absl::StrCat("job ", job.job_id(), " has no complete checkpoint of step 6 under \"")},
      {job.job_id(), 6, "(its steps: 8)"},  // 2, 4 and the incomplete 6 pruned
      {job.job_id(), 3, "no complete checkpoint of step 3"},
      {job.job_id(), -1, "training_job_step: must be >= 1 (0: the final checkpoint), got -1"},
      {"", 4, "training_job_step: only with training_job_id"},
      {job.job_id(), 0,
       "is not a training job that succeeded with a final checkpoint (it is queued); give "
       "training_job_step"},
      {attention.job_id(), 4, absl::StrCat("job ", attention.job_id(), " is not a training job")},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<v1::SubmitJobResponse> r =
        deploy(absl::StrCat("bad-", i), cases[i].job_id, cases[i].step);
    ASSERT_FALSE(r.ok()) << cases[i].message;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(cases[i].message));
  }
  EXPECT_EQ(pins().size(), 1u) << "refused submits leave no pin";

  // A deployment the quota refuses after its step was pinned leaves no pin either.
  options_.quotas.max_deployments = 1;  // d8 is queued
  Restart();
  absl::StatusOr<v1::SubmitJobResponse> over = deploy("d8-over", job.job_id(), 8);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_EQ(pins(), std::vector<std::string>{pin8});

  // An ended job prunes nothing more: its steps are served where they are.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.job_id());
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  ASSERT_TRUE(WaitState(job.job_id(), v1::JOB_STATE_CANCELLED));
  options_.quotas.max_deployments = 0;
  Restart();
  absl::StatusOr<v1::SubmitJobResponse> ended = deploy("d8-ended", job.job_id(), 8);
  ASSERT_TRUE(ended.ok()) << ended.status();
  const v1::DeploymentSpec d8 = Get(ended->job().job_id()).spec().deployment();
  EXPECT_EQ(d8.checkpoint(), folder + "/step-00000008");
  EXPECT_FALSE(d8.checkpoint_pinned());
}

// The model registry: an imported folder and a training job's saved step become versions 1 and 2
// of a name; a deployment names the model (the newest version, or one given), resolved at submit to
// the version's folder; a served version cannot be removed until its deployment ends, and then it
// can; bad names, versions and sources are refused naming the field; another tenant's models are
// not seen. The registry outlives a restart.
TEST_F(CoordinatorTest, ADeploymentServesARegisteredModelByName) {
  const std::string root = NewDataDir();
  std::vector<float> weights;
  ASSERT_TRUE(
      model::testing::SaveTestCheckpoint(root + "/ckpt", TinyTestConfig(), 1, 2, 0.0f, &weights)
          .ok());
  const std::string imported = root + "/imported";
  ASSERT_TRUE(
      model::testing::SaveTestImport(imported, TinyTestConfig(), weights, model::SafeDtype::kBF16)
          .ok());
  v1::ImportModelRequest import;
  import.set_name("tiny");
  import.set_path(imported);
  import.set_description("bf16 copy");
  absl::StatusOr<v1::RegisteredModel> first = coordinator_->ImportModel(import);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version(), 1);
  EXPECT_EQ(first->source(), "folder " + imported);
  EXPECT_EQ(first->folder(), options_.data_dir + "/models/default/tiny/1");

  // A training job's saved step.
  const v1::Job job = Submit(TinyTrainingRequest("train", root + "/checkpoints"));
  SaveTinyCheckpoint(root + "/checkpoints/" + job.job_id(), 4);
  v1::ImportModelRequest from_job;
  from_job.set_name("tiny");
  from_job.set_training_job_id(job.job_id());
  from_job.set_training_job_step(4);
  absl::StatusOr<v1::RegisteredModel> second = coordinator_->ImportModel(from_job);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version(), 2);
  EXPECT_THAT(second->source(), HasSubstr("training job " + job.job_id() + " step 4 ("));
  EXPECT_EQ(second->weights(), "weights.safetensors, F32");

  // Refusals, each naming the field.
  struct Case {
    v1::ImportModelRequest request;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases(6);
  cases[0].request.set_name("bad name");
  cases[0].request.set_path(imported);
  cases[0] = {cases[0].request, absl::StatusCode::kInvalidArgument, "name: \"bad name\""};
  cases[1].request.set_name("tiny");
  cases[1] = {cases[1].request, absl::StatusCode::kInvalidArgument, "path: required"};
  cases[2].request.set_name("tiny");
  cases[2].request.set_path(imported);
  cases[2].request.set_training_job_id(job.job_id());
  cases[2] = {cases[2].request, absl::StatusCode::kInvalidArgument,
              "give path or training_job_id, not both"};
  cases[3].request.set_name("tiny");
  cases[3].request.set_training_job_id(job.job_id());
  cases[3] = {cases[3].request, absl::StatusCode::kInvalidArgument,
              "is not a training job that succeeded with a final checkpoint (it is queued)"};
  cases[4].request.set_name("tiny");
  cases[4].request.set_training_job_id(job.job_id());
  cases[4].request.set_training_job_step(6);
  cases[4] = {cases[4].request, absl::StatusCode::kInvalidArgument,
              "training_job_step: job " + job.job_id() + " has no complete checkpoint of step 6"};
  cases[5].request.set_name("tiny");
  cases[5].request.set_training_job_id("J-nope");
  cases[5] = {cases[5].request, absl::StatusCode::kNotFound,
              "training_job_id: no job \"J-nope\" of this tenant"};
  for (const Case& c : cases) {
    absl::StatusOr<v1::RegisteredModel> r = coordinator_->ImportModel(c.request);
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }

  // Deploy by name: the newest version, or the one named.
  v1::SubmitJobRequest by_name;
  by_name.set_idempotency_key("by-name");
  by_name.mutable_spec()->mutable_deployment()->set_model("tiny");
  const v1::Job newest = Submit(by_name);
  EXPECT_EQ(newest.spec().deployment().model_version(), 2);
  EXPECT_EQ(newest.spec().deployment().checkpoint(), second->folder());
  EXPECT_EQ(newest.spec().deployment().model_config_json(), model::ConfigToJson(TinyTestConfig()));
  v1::SubmitJobRequest pinned = by_name;
  pinned.set_idempotency_key("v1");
  pinned.mutable_spec()->mutable_deployment()->set_model_version(1);
  const v1::Job old = Submit(pinned);
  EXPECT_EQ(old.spec().deployment().checkpoint(), first->folder());
  EXPECT_EQ(old.spec().deployment().model_version(), 1);
  struct Bad {
    std::string model;
    int64_t version;
    std::string checkpoint;
    absl::StatusCode code;
    std::string message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"tiny", 3, "", absl::StatusCode::kNotFound,
            "spec.deployment.model: model tiny has no version 3 (its versions: 1, 2)"},
           {"other", 0, "", absl::StatusCode::kNotFound,
            "spec.deployment.model: no model named \"other\" in the registry of tenant default"},
           {"tiny", -1, "", absl::StatusCode::kInvalidArgument,
            "spec.deployment.model_version: must be >= 1"},
           {"", 2, imported, absl::StatusCode::kInvalidArgument,
            "spec.deployment.model_version: only with model"},
           {"tiny", 0, imported, absl::StatusCode::kInvalidArgument,
            "give one of model, checkpoint and training_job_id"}}) {
    v1::SubmitJobRequest r;
    r.set_idempotency_key("bad-" + b.model + absl::StrCat(b.version));
    r.mutable_spec()->mutable_deployment()->set_model(b.model);
    r.mutable_spec()->mutable_deployment()->set_model_version(b.version);
    r.mutable_spec()->mutable_deployment()->set_checkpoint(b.checkpoint);
    absl::StatusOr<v1::SubmitJobResponse> refused = coordinator_->SubmitJob(r);
    EXPECT_EQ(refused.status().code(), b.code) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(b.message));
  }
  // Another tenant sees none of it.
  v1::ListModelsRequest other_tenant;
  other_tenant.set_tenant("acme");
  absl::StatusOr<v1::ListModelsResponse> none = coordinator_->ListModels(other_tenant);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->models_size(), 0);
  v1::SubmitJobRequest foreign = by_name;
  foreign.set_idempotency_key("foreign");
  foreign.mutable_spec()->set_tenant("acme");
  EXPECT_TRUE(absl::IsNotFound(coordinator_->SubmitJob(foreign).status()));

  // Served versions stay until their deployments end.
  v1::DeleteModelRequest remove;
  remove.set_name("tiny");
  absl::StatusOr<v1::DeleteModelResponse> busy = coordinator_->DeleteModel(remove);
  ASSERT_TRUE(absl::IsFailedPrecondition(busy.status())) << busy.status();
  EXPECT_THAT(std::string(busy.status().message()),
              HasSubstr("model tiny is served: version 1 by " + old.job_id() + "; version 2 by " +
                        newest.job_id()));
  ASSERT_TRUE(Cancel(old.job_id()).ok());
  ASSERT_TRUE(WaitState(old.job_id(), v1::JOB_STATE_CANCELLED));
  remove.set_version(1);
  absl::StatusOr<v1::DeleteModelResponse> removed = coordinator_->DeleteModel(remove);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(removed->versions(), ::testing::ElementsAre(1));
  EXPECT_FALSE(std::filesystem::exists(first->folder()));

  // A restart keeps version 2 and its number sequence.
  Restart();
  v1::ListModelsRequest list;
  absl::StatusOr<v1::ListModelsResponse> listed = coordinator_->ListModels(list);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->models_size(), 1);
  EXPECT_EQ(listed->models(0).version(), 2);
  EXPECT_EQ(listed->models(0).description(), "");
  import.set_description("");
  absl::StatusOr<v1::RegisteredModel> third = coordinator_->ImportModel(import);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->version(), 3);
}

// --tenant-max-deployments: a tenant's deployments queued or serving; a retry of an accepted one is
// answered whatever the quota says, another tenant has its own, an undeployed one makes room, and
// other jobs do not count.
TEST_F(CoordinatorTest, TheDeploymentsQuotaCountsATenantsActiveDeployments) {
  options_.quotas.max_deployments = 2;
  Restart();  // with the quota
  const std::string checkpoint = SaveTinyCheckpoint(NewDataDir());
  auto deploy = [&](const std::string& key, const std::string& tenant) {
    v1::SubmitJobRequest r = DeployRequest(key, checkpoint);
    r.mutable_spec()->set_tenant(tenant);
    return coordinator_->SubmitJob(r);
  };
  absl::StatusOr<v1::SubmitJobResponse> first = deploy("a1", "alice");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(deploy("a2", "alice").ok());
  absl::StatusOr<v1::SubmitJobResponse> third = deploy("a3", "alice");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("tenant \"alice\" has 2 deployments queued or serving, its quota "
                        "(--tenant-max-deployments 2): undeploy one first"));
  absl::StatusOr<v1::SubmitJobResponse> retry = deploy("a1", "alice");
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(retry->created());
  EXPECT_TRUE(deploy("b1", "bob").ok());
  v1::SubmitJobRequest attention = ValidRequest("attention");
  attention.mutable_spec()->set_tenant("alice");
  EXPECT_TRUE(coordinator_->SubmitJob(attention).ok()) << "not a deployment: not counted";
  v1::CancelJobRequest cancel;
  cancel.set_job_id(first->job().job_id());
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  ASSERT_TRUE(WaitState(first->job().job_id(), v1::JOB_STATE_CANCELLED));
  absl::StatusOr<v1::SubmitJobResponse> again = deploy("a4", "alice");
  EXPECT_TRUE(again.ok()) << again.status();
}

}  // namespace
}  // namespace server
}  // namespace dattn
