// The trainer config: defaults, the JSON round trip, and every bad value refused by its field.
#include "model/trainer_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace {

TEST(TrainerConfigTest, DefaultsAreValidAndRoundTrip) {
  const TrainerConfig defaults;
  EXPECT_TRUE(ValidateTrainerConfig(defaults).ok());
  absl::StatusOr<TrainerConfig> empty = ParseTrainerConfigJson("{}");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, defaults);

  TrainerConfig c;
  c.model.d_model = 64;
  c.model.num_heads = 4;
  c.model.ffn_dim = 128;
  c.model.segment_lengths = {64, 128};
  c.model.dilation_rates = {1, 2};
  c.data.paths = {"a.tok", "b.tok"};
  c.data.format = "tokens";
  c.data.validation_fraction = 0.05;
  c.seq_len = 128;
  c.batch_size = 12;
  c.micro_batches = 3;
  c.steps = 77;
  c.seed = 0xfedcba9876543210ull;  // Above 2^63: kept exactly.
  c.checkpoint_activations = true;
  c.optimizer.lr = 1.5e-3;
  c.optimizer.min_lr = 0;
  c.optimizer.warmup_steps = 7;
  c.optimizer.decay_embeddings = true;
  c.optimizer.max_grad_norm = INFINITY;  // null in JSON.
  c.eval.every = 0;
  c.checkpoint.every = 10;
  c.checkpoint.keep_last = 1;
  c.log_every = 1;
  const std::string json = TrainerConfigToJson(c);
  EXPECT_NE(json.find("\"max_grad_norm\": null"), std::string::npos) << json;
  absl::StatusOr<TrainerConfig> back = ParseTrainerConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  EXPECT_EQ(*back, c);
  EXPECT_TRUE(std::isinf(back->optimizer.max_grad_norm));
  EXPECT_EQ(back->seed, 0xfedcba9876543210ull);
  EXPECT_EQ(back->schedule().total_steps, 77);
  EXPECT_EQ(back->schedule().warmup_steps, 7);
  EXPECT_FALSE(back->byte_level());

  // One path may be a string.
  absl::StatusOr<TrainerConfig> one = ParseTrainerConfigJson(R"({"data": {"paths": "kjv.txt"}})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->data.paths, std::vector<std::string>{"kjv.txt"});
}

struct BadCase {
  const char* json;
  const char* field;  // Expected in the message as trainer config field "<field>".
  const char* value;  // Expected in the message too.
};

TEST(TrainerConfigTest, EveryBadValueNamesItsField) {
  const std::vector<BadCase> cases = {
      {R"({"seq_len": 0})", "seq_len", "0"},
      {R"({"seq_len": "long"})", "seq_len", "\"long\""},
      {R"({"batch_size": -2})", "batch_size", "-2"},
      {R"({"micro_batches": 0})", "micro_batches", "0"},
      {R"({"batch_size": 8, "micro_batches": 3})", "micro_batches", "3"},
      {R"({"steps": 0})", "steps", "0"},
      {R"({"seed": -1})", "seed", "-1"},
      {R"({"device": "tpu"})", "device", "tpu"},
      {R"({"threads": -1})", "threads", "-1"},
      {R"({"threads": 100000})", "threads", "100000"},
      {R"({"checkpoint_activations": 1})", "checkpoint_activations", "1"},
      {R"({"log_every": 0})", "log_every", "0"},
      {R"({"data": {"format": "bytes"}})", "data.format", "bytes"},
      {R"({"data": {"paths": [3]}})", "data.paths[0]", "3"},
      {R"({"data": {"paths": [""]}})", "data.paths[0]", "\"\""},
      {R"({"data": {"paths": ["a", "b"]}})", "data.paths", "2 paths"},
      {R"({"data": {"validation_fraction": 1}})", "data.validation_fraction", "1"},
      {R"({"data": {"validation_fraction": -0.1}})", "data.validation_fraction", "-0.1"},
      {R"({"data": {"shuffle": true}})", "data.shuffle", "unknown field"},
      {R"({"optimizer": {"lr": 0}})", "optimizer.lr", "0"},
      {R"({"optimizer": {"lr": -1}})", "optimizer.lr", "-1"},
      {R"({"optimizer": {"min_lr": 1}})", "optimizer.min_lr", "1"},
      {R"({"optimizer": {"warmup_steps": -1}})", "optimizer.warmup_steps", "-1"},
      {R"({"steps": 10, "optimizer": {"warmup_steps": 11}})", "optimizer.warmup_steps", "11"},
      {R"({"optimizer": {"beta1": 1}})", "optimizer.beta1", "1"},
      {R"({"optimizer": {"beta2": -0.5}})", "optimizer.beta2", "-0.5"},
      {R"({"optimizer": {"epsilon": 0}})", "optimizer.epsilon", "0"},
      {R"({"optimizer": {"weight_decay": -0.1}})", "optimizer.weight_decay", "-0.1"},
      {R"({"optimizer": {"max_grad_norm": 0}})", "optimizer.max_grad_norm", "0"},
      {R"({"optimizer": {"max_grad_norm": "off"}})", "optimizer.max_grad_norm", "\"off\""},
      {R"({"optimizer": {"max_consecutive_skips": 0}})", "optimizer.max_consecutive_skips", "0"},
      {R"({"optimizer": {"decay_embeddings": "yes"}})", "optimizer.decay_embeddings", "yes"},
      {R"({"optimizer": {"momentum": 0.9}})", "optimizer.momentum", "unknown field"},
      {R"({"eval": {"every": -1}})", "eval.every", "-1"},
      {R"({"eval": {"batches": 0}})", "eval.batches", "0"},
      {R"({"retrieval": {"examples": -1}})", "retrieval.examples", "-1"},
      {R"({"retrieval": {"depth": 1.5}})", "retrieval.depth", "1.5"},
      {R"({"retrieval": {"seq_len": -5}})", "retrieval.seq_len", "-5"},
      {R"({"retrieval": {"key_length": 0}})", "retrieval.key_length", "0"},
      {R"({"retrieval": {"value_length": 65}})", "retrieval.value_length", "65"},
      {R"({"retrieval": {"distractors": -1}})", "retrieval.distractors", "-1"},
      {R"({"retrieval": {"train_fraction": 2}})", "retrieval.train_fraction", "2"},
      {R"({"data": {"format": "tokens"}, "retrieval": {"examples": 4}})", "retrieval.examples",
       "byte-level"},
      {R"({"data": {"validation_fraction": 0}, "retrieval": {"examples": 4}})",
       "retrieval.examples", "validation_fraction is 0"},
      {R"({"checkpoint": {"every": -3}})", "checkpoint.every", "-3"},
      {R"({"checkpoint": {"keep_last": 0}})", "checkpoint.keep_last", "0"},
      {R"({"checkpoint": "yes"})", "checkpoint", "must be a JSON object"},
      {R"({"learning_rate": 0.1})", "learning_rate", "unknown field"},
      {R"({"model": {"d_model": 0}})", "model.d_model", "0"},
      {R"({"model": {"num_heads": 5}})", "model.num_heads", "5"},
      {R"({"model": {"attention": {"segment_lengths": [0], "dilation_rates": [1]}}})",
       "model.attention.segment_lengths[0]", "0"},
      {R"({"model": {"width": 3}})", "model.width", "unknown field"},
      {R"({"model": 3})", "model", "must be a JSON object"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<TrainerConfig> parsed = ParseTrainerConfigJson(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    const std::string message(parsed.status().message());
    EXPECT_NE(message.find(std::string("trainer config field \"") + c.field), std::string::npos)
        << c.json << " -> " << message;
    EXPECT_NE(message.find(c.value), std::string::npos) << c.json << " -> " << message;
  }
  absl::StatusOr<TrainerConfig> junk = ParseTrainerConfigJson("{\"steps\": ");
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(junk.status().message().find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace model
}  // namespace dattn
