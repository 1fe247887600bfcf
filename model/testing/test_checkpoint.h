// A checkpoint for tests of what loads one (dattn-generate, a deployment's rank, the coordinator's
// deployments, the serving end-to-end test): a LongNet model with MAGNETO weights from `seed`,
// each moved by a fixed pattern of amplitude `amplitude` (so that biases and gains are not 0 and 1
// and every path of the model matters), saved under `root` as the checkpoint of `step` with zero
// optimizer moments. Returns the step folder; *weights (optional) gets the fp32 weights saved.
#ifndef DATTN_MODEL_TESTING_TEST_CHECKPOINT_H_
#define DATTN_MODEL_TESTING_TEST_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/longnet.h"
#include "model/optimizer.h"

namespace dattn {
namespace model {
namespace testing {

inline absl::StatusOr<std::string> SaveTestCheckpoint(const std::string& root,
                                                      const LongNetConfig& config, uint64_t seed,
                                                      int64_t step, float amplitude,
                                                      std::vector<float>* weights = nullptr) {
  absl::StatusOr<std::unique_ptr<LongNetLM<float>>> lm = LongNetLM<float>::CreateCpu(config, {}, 1);
  if (!lm.ok()) return lm.status();
  if (absl::Status s = (*lm)->InitParams(seed); !s.ok()) return s;
  std::vector<float> params(static_cast<size_t>((*lm)->layout().total()));
  if (absl::Status s = (*lm)->CopyParamsToHost(params.data()); !s.ok()) return s;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] += amplitude * (static_cast<float>((i * 2654435761u) % 101) / 101.0f - 0.5f);
  }
  AdamWState state;
  state.m.assign(params.size(), 0.0f);
  state.v.assign(params.size(), 0.0f);
  const ParamLayout layout = (*lm)->layout();
  CheckpointContents contents;
  contents.layout = &layout;
  contents.params = params;
  contents.optimizer = &state;
  contents.model_config_json = ConfigToJson(config);
  contents.trainer.step = step;
  absl::StatusOr<std::string> dir = SaveCheckpoint(root, contents);
  if (dir.ok() && weights != nullptr) *weights = std::move(params);
  return dir;
}

}  // namespace testing
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_TEST_CHECKPOINT_H_
