// A checkpoint for tests of what loads one (dattn-generate, a deployment's rank, the coordinator's
// deployments, the serving end-to-end test): a LongNet model with MAGNETO weights from `seed`,
// each moved by a fixed pattern of amplitude `amplitude` (so that biases and gains are not 0 and 1
// and every path of the model matters), saved under `root` as the checkpoint of `step` with zero
// optimizer moments. Returns the step folder; *weights (optional) gets the fp32 weights saved.
// SaveTestImport writes the same weights as an imported model (model_folder.h): `dir`/config.json
// and `dir`/model.safetensors, each tensor as F32 or BF16; *served gets the values a reader sees.
#ifndef DATTN_MODEL_TESTING_TEST_CHECKPOINT_H_
#define DATTN_MODEL_TESTING_TEST_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/file_io.h"
#include "model/longnet.h"
#include "model/longnet_params.h"
#include "model/optimizer.h"
#include "model/safetensors.h"

namespace dattn {
namespace model {
namespace testing {

// The smallest model the coordinator's tests deploy: d_model 8 (head_dim 4: CPU workers only),
// one layer, two heads, segments of 4 and 8, a byte vocabulary.
inline LongNetConfig TinyTestConfig() {
  LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.ffn_dim = 16;
  c.segment_lengths = {4, 8};
  c.dilation_rates = {1, 2};
  return c;
}

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

inline absl::Status SaveTestImport(const std::string& dir, const LongNetConfig& config,
                                   const std::vector<float>& weights, SafeDtype dtype,
                                   std::vector<float>* served = nullptr) {
  if (dtype != SafeDtype::kF32 && dtype != SafeDtype::kBF16) {
    return absl::InvalidArgumentError("SaveTestImport writes F32 or BF16");
  }
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(config);
  if (!layout.ok()) return layout.status();
  if (static_cast<int64_t>(weights.size()) != layout->total()) {
    return absl::InvalidArgumentError("SaveTestImport: weights do not fit the config's layout");
  }
  std::vector<float> values = weights;
  std::vector<uint16_t> halves(weights.size());
  std::vector<TensorToWrite> tensors;
  for (const ParamEntry& e : layout->entries()) {
    TensorToWrite t;
    t.name = e.name;
    t.dtype = dtype;
    t.shape = e.shape;
    const size_t at = static_cast<size_t>(e.offset), n = static_cast<size_t>(e.numel);
    if (dtype == SafeDtype::kBF16) {
      for (size_t i = at; i < at + n; ++i) {
        halves[i] = FloatToBf16(weights[i]);
        values[i] = Bf16ToFloat(halves[i]);
      }
      t.bytes = absl::string_view(reinterpret_cast<const char*>(halves.data() + at), n * 2);
    } else {
      t.bytes = absl::string_view(reinterpret_cast<const char*>(weights.data() + at), n * 4);
    }
    tensors.push_back(std::move(t));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  if (absl::Status s = WriteSafetensors(dir + "/model.safetensors", tensors); !s.ok()) return s;
  if (absl::Status s = WriteWholeFile(dir + "/config.json", ConfigToJson(config), false); !s.ok()) {
    return s;
  }
  if (served != nullptr) *served = std::move(values);
  return absl::OkStatus();
}

}  // namespace testing
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_TESTING_TEST_CHECKPOINT_H_
