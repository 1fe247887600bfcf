// The device registry of the trainer's seam (trainable_model.h): "cpu" always; a device a binary
// registers (as dattn-train-gpu registers "cuda") is accepted by the trainer config and made by
// NewTrainableModel; unknown devices and "cuda" where it is not registered are refused by name.
#include "model/trainable_model.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/trainer_config.h"

namespace dattn {
namespace model {
namespace {

LongNetConfig Tiny() {
  LongNetConfig c;
  c.vocab_size = 32;
  c.d_model = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  c.ffn_dim = 32;
  c.segment_lengths = {8, 16};
  c.dilation_rates = {1, 2};
  return c;
}

TEST(TrainableModelTest, CpuIsAlwaysThereAndUnknownDevicesAreNamed) {
  const std::vector<std::string> devices = TrainingDevices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0], "cpu");
  absl::StatusOr<std::unique_ptr<TrainableModel>> cpu = NewTrainableModel("cpu", Tiny(), {}, 1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->NominalPeakFlops(), 0);  // dattn-train measures the CPU instead.
  absl::StatusOr<std::unique_ptr<TrainableModel>> tpu = NewTrainableModel("tpu", Tiny(), {}, 1);
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tpu.status().message().find("\"tpu\" is not available in this build (cpu"),
            std::string::npos)
      << tpu.status();
  // This test links no CUDA model: "cuda" is refused, naming the binary that has it.
  absl::StatusOr<std::unique_ptr<TrainableModel>> cuda = NewTrainableModel("cuda", Tiny(), {}, 1);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cuda.status().message().find("dattn-train-gpu"), std::string::npos) << cuda.status();
  TrainerConfig config;
  config.device = "cuda";
  const absl::Status s = ValidateTrainerConfig(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("trainer config field \"device\": \"cuda\" is not available"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("dattn-train-gpu"), std::string::npos) << s;
}

TEST(TrainableModelTest, RegisteredDevicesAreMadeAndAccepted) {
  int made = 0;
  ASSERT_TRUE(RegisterTrainingDevice("fake", [&made](const LongNetConfig& config,
                                                     const ModelOptions& options, int threads) {
                ++made;
                return NewCpuTrainableModel(config, options, threads);
              }).ok());
  const std::vector<std::string> devices = TrainingDevices();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1], "fake");
  TrainerConfig config;
  config.device = "fake";
  EXPECT_TRUE(ValidateTrainerConfig(config).ok());
  absl::StatusOr<std::unique_ptr<TrainableModel>> m = NewTrainableModel("fake", Tiny(), {}, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(made, 1);
  EXPECT_EQ((*m)->config(), Tiny());
  // Refused: a second registration of a name, "cpu", an empty name, no factory.
  auto factory = [](const LongNetConfig& c, const ModelOptions& o, int t) {
    return NewCpuTrainableModel(c, o, t);
  };
  for (const std::string name : {"fake", "cpu", ""}) {
    const absl::Status s = RegisterTrainingDevice(name, factory);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("\"" + name + "\""), std::string::npos) << s;
  }
  EXPECT_EQ(RegisterTrainingDevice("other", nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainingDevices().size(), 2u);
}

}  // namespace
}  // namespace model
}  // namespace dattn
