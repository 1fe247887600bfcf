#include "api/training_job.h"

#include <string>

#include "gtest/gtest.h"
#include "model/trainer_config.h"

namespace dattn {
namespace api {
namespace {

// A small model whose CUDA form is valid too (d_model, ffn_dim and head_dim multiples of 8).
constexpr char kConfig[] = R"({
  "model": {"vocab_size": 256, "d_model": 64, "num_layers": 2, "num_heads": 4, "ffn_dim": 128,
            "attention": {"segment_lengths": [32, 64], "dilation_rates": [1, 2]}},
  "data": {"paths": ["/data/corpus.txt"]},
  "seq_len": 128, "batch_size": 8, "micro_batches": 2, "steps": 100,
  "checkpoint": {"every": 10, "keep_last": 2}
})";

v1::TrainingJobSpec Spec(const std::string& config = kConfig) {
  v1::TrainingJobSpec spec;
  spec.set_config_json(config);
  spec.set_device(v1::DEVICE_PREFERENCE_CPU);
  return spec;
}

// The analysis's error: code and message.
void ExpectError(const v1::TrainingJobSpec& spec, absl::StatusCode code,
                 const std::string& expected_in_message) {
  absl::StatusOr<TrainingJobInfo> info = AnalyzeTrainingJob(spec, "spec.training");
  ASSERT_FALSE(info.ok()) << "accepted: " << spec.DebugString();
  EXPECT_EQ(info.status().code(), code) << info.status();
  EXPECT_NE(info.status().message().find(expected_in_message), std::string::npos)
      << info.status().message() << "\nexpected to contain: " << expected_in_message;
}

TEST(TrainingJobTest, AValidSpecIsAnalysed) {
  v1::TrainingJobSpec spec = Spec();
  spec.set_data_parallel(2);
  spec.set_sequence_parallel(2);
  spec.set_checkpoint_dir("/shared/checkpoints/");
  absl::StatusOr<TrainingJobInfo> info = AnalyzeTrainingJob(spec, "spec.training");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->world, 4);
  EXPECT_EQ(info->micro_rows, 2);  // 8 / 2 micro-batches / 2 groups
  EXPECT_EQ(info->checkpoint_root, "/shared/checkpoints");
  EXPECT_GT(info->parameters, 0);
  EXPECT_GT(info->flops_per_step, 0);
  ASSERT_EQ(info->variants.size(), 1u);
  EXPECT_FALSE(info->variants[0].gpu);
  EXPECT_EQ(info->variants[0].ring_backend, "gloo");
  EXPECT_GT(info->variants[0].memory_per_rank_bytes, 4 * 4 * info->parameters / 2);

  const v1::TrainingRankPlan plan = PlanTrainingRank(*info, info->variants[0], 3, "j-0123");
  EXPECT_EQ(plan.rank(), 3);
  EXPECT_EQ(plan.data_parallel(), 2);
  EXPECT_EQ(plan.sequence_parallel(), 2);
  EXPECT_EQ(plan.checkpoint_dir(), "/shared/checkpoints/j-0123");
  EXPECT_EQ(plan.memory_bytes(), info->variants[0].memory_per_rank_bytes);
  EXPECT_DOUBLE_EQ(plan.flops_per_step(), info->flops_per_step / 4);
  absl::StatusOr<model::TrainerConfig> resolved =
      model::ParseTrainerConfigJson(plan.trainer_config_json());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->device, "cpu");
  EXPECT_EQ(resolved->steps, 100);
  EXPECT_EQ(SequenceGroupPrefix("j-0123/2", 1), "j-0123/2/sp/1");
}

TEST(TrainingJobTest, AnyDeviceOffersGpusFirstWhenTheModelRunsThere) {
  v1::TrainingJobSpec spec = Spec();
  spec.set_device(v1::DEVICE_PREFERENCE_ANY);
  spec.set_data_parallel(2);
  absl::StatusOr<TrainingJobInfo> info = AnalyzeTrainingJob(spec, "spec.training");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->variants.size(), 2u);
  EXPECT_TRUE(info->variants[0].gpu);
  EXPECT_EQ(info->variants[0].ring_backend, "nccl");
  EXPECT_FALSE(info->variants[1].gpu);
  const v1::TrainingRankPlan plan = PlanTrainingRank(*info, info->variants[0], 0, "j-1");
  EXPECT_TRUE(plan.checkpoint_dir().empty());
  // The coordinator's process registers no "cuda" training device: the plan is parsed on GPU
  // workers, which do. Here the text is enough.
  EXPECT_NE(plan.trainer_config_json().find("\"device\": \"cuda\""), std::string::npos)
      << plan.trainer_config_json();

  // A model the CUDA model cannot run (d_model not a multiple of 8) is offered to CPUs only; asked
  // for GPUs, it is refused naming the field.
  const std::string odd = R"({"model": {"d_model": 36, "num_heads": 2, "num_layers": 1,
      "ffn_dim": 64, "attention": {"segment_lengths": [16], "dilation_rates": [1]}},
      "data": {"paths": ["/d"]}, "seq_len": 32, "batch_size": 2})";
  spec = Spec(odd);
  spec.set_device(v1::DEVICE_PREFERENCE_ANY);
  info = AnalyzeTrainingJob(spec, "spec.training");
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->variants.size(), 1u);
  EXPECT_FALSE(info->variants[0].gpu);
  spec.set_device(v1::DEVICE_PREFERENCE_GPU);
  ExpectError(spec, absl::StatusCode::kInvalidArgument, "d_model");
}

TEST(TrainingJobTest, EveryBadFieldIsNamed) {
  struct Case {
    std::string what;
    v1::TrainingJobSpec spec;
    std::string message;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& what, v1::TrainingJobSpec spec, const std::string& message) {
    cases.push_back({what, std::move(spec), message});
  };
  add("empty config", Spec(""), "spec.training.config_json: required");
  add("not JSON", Spec("{nope"), "spec.training.config_json: not valid JSON");
  add("not an object", Spec("[1, 2]"), "spec.training.config_json: must be a JSON object");
  add("too large", Spec(std::string(kMaxTrainingConfigBytes + 1, ' ')),
      "spec.training.config_json: at most 16384 bytes");
  add("bad trainer field", Spec(R"({"optimizer": {"lr": -1}, "data": {"paths": ["/d"]}})"),
      "optimizer.lr");
  add("unknown trainer key", Spec(R"({"stepz": 3, "data": {"paths": ["/d"]}})"), "stepz");
  add("bad model field", Spec(R"({"model": {"d_model": 0}, "data": {"paths": ["/d"]}})"),
      "model.d_model");
  add("bad device", Spec(R"({"device": "tpu", "data": {"paths": ["/d"]}})"),
      "trainer config field \"device\"");
  {
    v1::TrainingJobSpec s = Spec();
    s.set_data_parallel(-1);
    add("negative data_parallel", s, "spec.training.data_parallel: must be in 1 .. 256");
  }
  {
    v1::TrainingJobSpec s = Spec();
    s.set_auto_data_parallel(true);
    s.set_data_parallel(2);
    add("auto_data_parallel with a data_parallel", s,
        "spec.training.data_parallel: must be 0 with auto_data_parallel (the coordinator picks "
        "D), got 2");
  }
  {
    v1::TrainingJobSpec s = Spec();
    s.set_sequence_parallel(257);
    add("huge sequence_parallel", s, "spec.training.sequence_parallel: must be in 1 .. 256");
  }
  {
    v1::TrainingJobSpec s = Spec();
    s.set_data_parallel(32);
    s.set_sequence_parallel(16);
    add("too many ranks", s, "more than 256");
  }
  {
    v1::TrainingJobSpec s = Spec();
    s.set_sequence_parallel(3);
    add("sequence_parallel not dividing seq_len", s,
        "spec.training.sequence_parallel: must divide the config's seq_len = 128, got 3");
  }
  {
    v1::TrainingJobSpec s = Spec();
    s.set_data_parallel(3);
    add("data_parallel not dividing the batch", s,
        "spec.training.data_parallel: must divide batch_size / micro_batches = 8 / 2 = 4, got 3");
  }
  {
    v1::TrainingJobSpec s = Spec(R"({"seq_len": 128, "batch_size": 4,
        "retrieval": {"examples": 4, "seq_len": 99}, "data": {"paths": ["/d"]}})");
    s.set_sequence_parallel(2);
    add("retrieval sequence not split by S", s,
        "spec.training.config_json: trainer config field \"retrieval.seq_len\": 99 is not a "
        "multiple of the sequence-parallel degree 2");
  }
  add("too many kept checkpoints",
      Spec(R"({"checkpoint": {"keep_last": 101}, "data": {"paths": ["/d"]}})"),
      "\"checkpoint.keep_last\": 101 must be at most 100");
  for (const std::string& bad :
       {std::string("relative/dir"), std::string("/a/../b"), std::string("/a/./b"),
        std::string("/a\nb"), "/" + std::string(kMaxTrainingPathLength, 'x')}) {
    v1::TrainingJobSpec s = Spec();
    s.set_checkpoint_dir(bad);
    add("checkpoint_dir " + bad.substr(0, 20), s, "spec.training.checkpoint_dir");
    s.clear_checkpoint_dir();
    s.set_init_from(bad);
    add("init_from " + bad.substr(0, 20), s, "spec.training.init_from");
  }
  {
    v1::TrainingJobSpec s = Spec(R"({"device": "cuda", "data": {"paths": ["/d"]}})");
    s.set_device(v1::DEVICE_PREFERENCE_CPU);
    add("device contradiction", s, "spec.training.device: DEVICE_PREFERENCE_CPU, but");
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ExpectError(c.spec, absl::StatusCode::kInvalidArgument, c.message);
  }
}

// A GPU rank plans its slice of the sequence with the ring's buffers and its 1/W optimizer shard:
// less than the whole sequence on one GPU, more than the slice alone.
TEST(TrainingJobTest, GpuRanksArePlannedForTheirShare) {
  // Long sequences: activations, not the fixed allowances (NCCL's 2.5 GiB included), make the plan.
  v1::TrainingJobSpec spec = Spec(R"({
    "model": {"vocab_size": 256, "d_model": 64, "num_layers": 2, "num_heads": 4, "ffn_dim": 128,
              "attention": {"segment_lengths": [32, 64], "dilation_rates": [1, 2]}},
    "data": {"paths": ["/data/corpus.txt"]}, "seq_len": 1048576, "batch_size": 2})");
  spec.set_device(v1::DEVICE_PREFERENCE_GPU);
  absl::StatusOr<TrainingJobInfo> one = AnalyzeTrainingJob(spec, "spec.training");
  spec.set_sequence_parallel(2);
  absl::StatusOr<TrainingJobInfo> two = AnalyzeTrainingJob(spec, "spec.training");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(two->variants[0].gpu);
  EXPECT_LT(two->variants[0].memory_per_rank_bytes, one->variants[0].memory_per_rank_bytes);
  EXPECT_NE(two->variants[0].memory_plan.find("ring"), std::string::npos)
      << two->variants[0].memory_plan;
  EXPECT_NE(two->variants[0].memory_plan.find("NCCL"), std::string::npos)
      << two->variants[0].memory_plan;
  EXPECT_EQ(one->variants[0].memory_plan.find("NCCL"), std::string::npos)
      << one->variants[0].memory_plan;
}

}  // namespace
}  // namespace api
}  // namespace dattn
