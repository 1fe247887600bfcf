#include "model/model_folder.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "model/safetensors.h"

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kConfig[] = R"({"vocab_size": 11, "d_model": 4})";

ParamLayout Layout() {
  ParamLayout layout;
  EXPECT_TRUE(layout.Add("embed.weight", {11, 4}).ok());
  EXPECT_TRUE(layout.Add("blocks.0.ffn.w1", {4, 6}).ok());
  EXPECT_TRUE(layout.Add("final_norm.weight", {4}).ok());
  return layout;
}

class ModelFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/model_folder_test_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    layout_ = Layout();
    params_.resize(static_cast<size_t>(layout_.total()));
    Rng rng(7);
    for (float& x : params_) x = static_cast<float>(rng.Uniform() * 4 - 2);
  }
  void TearDown() override { fs::remove_all(root_); }

  // One tensor per entry, `dtype` F32 (the values), BF16 (rounded), F16 (the values' F16
  // patterns, from bf16-rounded values that F16 holds exactly) or F64; `skip`/`extra` change
  // the set. The expected fp32 values go to `expected`.
  std::vector<TensorToWrite> Tensors(SafeDtype dtype, std::vector<float>* expected,
                                     std::vector<std::string>* storage) {
    expected->assign(params_.begin(), params_.end());
    std::vector<TensorToWrite> tensors;
    storage->clear();
    storage->reserve(layout_.entries().size());
    for (const ParamEntry& e : layout_.entries()) {
      std::string bytes;
      for (int64_t i = 0; i < e.numel; ++i) {
        float& x = (*expected)[static_cast<size_t>(e.offset + i)];
        if (dtype == SafeDtype::kF32) {
          bytes.append(reinterpret_cast<const char*>(&x), 4);
        } else if (dtype == SafeDtype::kF64) {
          const double d = static_cast<double>(x) + 1e-12;  // Rounds back to x.
          bytes.append(reinterpret_cast<const char*>(&d), 8);
        } else if (dtype == SafeDtype::kBF16) {
          const uint16_t b = FloatToBf16(x);
          x = Bf16ToFloat(b);
          bytes.append(reinterpret_cast<const char*>(&b), 2);
        } else {  // F16: sign, 5-bit exponent (bias 15), 10-bit mantissa, of |x| in [2^-14, 2^4).
          const uint16_t sign = x < 0 ? 0x8000 : 0;
          float a = std::fabs(x);
          a = std::min(std::max(a, std::ldexp(1.0f, -14)), 15.0f);
          int exponent;
          const float m = std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1).
          const uint16_t mant =
              static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024)) & 0x3ff;  // Round, keep 10.
          const uint16_t h = sign | static_cast<uint16_t>((exponent - 1 + 15) << 10) | mant;
          x = HalfToFloat(h);
          bytes.append(reinterpret_cast<const char*>(&h), 2);
        }
      }
      storage->push_back(std::move(bytes));
      TensorToWrite t;
      t.name = e.name;
      t.dtype = dtype;
      t.shape = e.shape;
      t.bytes = storage->back();
      tensors.push_back(t);
    }
    return tensors;
  }

  void WriteConfig(const std::string& dir, const std::string& text = kConfig) {
    fs::create_directories(dir);
    ASSERT_TRUE(WriteWholeFile(JoinPath(dir, kConfigFile), text, false).ok());
  }
  void WriteFile(const std::string& path, const std::vector<TensorToWrite>& tensors) {
    ASSERT_TRUE(WriteSafetensors(path, tensors).ok()) << path;
  }
  // A valid import of one file of `dtype`.
  std::string Import(SafeDtype dtype, std::vector<float>* expected,
                     const std::string& name = kImportedWeightsFile) {
    const std::string dir = JoinPath(root_, absl::StrCat("import-", SafeDtypeName(dtype)));
    WriteConfig(dir);
    std::vector<std::string> storage;
    WriteFile(JoinPath(dir, name), Tensors(dtype, expected, &storage));
    return dir;
  }

  absl::StatusOr<std::vector<float>> Read(const std::string& dir) {
    absl::StatusOr<ModelFolder> folder = ModelFolder::Open(dir);
    if (!folder.ok()) return folder.status();
    std::vector<float> out(static_cast<size_t>(layout_.total()));
    absl::Status s = folder->ReadWeights(layout_, absl::MakeSpan(out));
    if (!s.ok()) return s;
    return out;
  }

  std::string root_;
  ParamLayout layout_;
  std::vector<float> params_;
};

TEST_F(ModelFolderTest, ReadsAnImportedFileOfEachDtypeExactly) {
  for (SafeDtype dtype : {SafeDtype::kF32, SafeDtype::kBF16, SafeDtype::kF16, SafeDtype::kF64}) {
    SCOPED_TRACE(SafeDtypeName(dtype));
    std::vector<float> expected;
    const std::string dir = Import(dtype, &expected);
    absl::StatusOr<ModelFolder> folder = ModelFolder::Open(dir);
    ASSERT_TRUE(folder.ok()) << folder.status();
    EXPECT_EQ(folder->form(), ModelFolder::Form::kImported);
    EXPECT_EQ(folder->model_config_json(), kConfig);
    EXPECT_EQ(folder->step(), 0);
    EXPECT_EQ(folder->Describe(),
              absl::StrCat("imported model (model.safetensors, ", SafeDtypeName(dtype), ")"));
    absl::StatusOr<std::vector<float>> got = Read(dir);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ((*got)[i], expected[i]) << i;
    if (dtype != SafeDtype::kF32 && dtype != SafeDtype::kF64) {
      EXPECT_NE(*got, params_);  // Rounded: the test would not tell the conversions apart else.
    }
  }
}

TEST_F(ModelFolderTest, ReadsWeightsSafetensorsAsWritten) {
  std::vector<float> expected;
  const std::string dir = Import(SafeDtype::kF32, &expected, kWeightsFile);
  absl::StatusOr<std::vector<float>> got = Read(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, params_);
}

TEST_F(ModelFolderTest, ReadsAShardedImportThroughItsIndex) {
  const std::string dir = JoinPath(root_, "sharded");
  WriteConfig(dir);
  std::vector<float> expected;
  std::vector<std::string> storage;
  std::vector<TensorToWrite> all = Tensors(SafeDtype::kBF16, &expected, &storage);
  // Entry 0 and 2 in one file, entry 1 in another, F32 there (dtypes may differ by tensor).
  std::vector<float> f32;
  std::vector<std::string> storage32;
  std::vector<TensorToWrite> all32 = Tensors(SafeDtype::kF32, &f32, &storage32);
  for (int64_t i = 0; i < layout_.entries()[1].numel; ++i) {
    expected[static_cast<size_t>(layout_.entries()[1].offset + i)] =
        f32[static_cast<size_t>(layout_.entries()[1].offset + i)];
  }
  WriteFile(JoinPath(dir, "model-00001-of-00002.safetensors"), {all[0], all[2]});
  WriteFile(JoinPath(dir, "model-00002-of-00002.safetensors"), {all32[1]});
  ASSERT_TRUE(WriteWholeFile(JoinPath(dir, kImportedIndexFile),
                             R"({"metadata": {"total_size": 1},
                                 "weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                                   "blocks.0.ffn.w1": "model-00002-of-00002.safetensors",
                                   "final_norm.weight": "model-00001-of-00002.safetensors"}})",
                             false)
                  .ok());
  absl::StatusOr<ModelFolder> folder = ModelFolder::Open(dir);
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(folder->Describe(),
            "imported model (2 files of model.safetensors.index.json, BF16 and F32)");
  absl::StatusOr<std::vector<float>> got = Read(dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, expected);
}

TEST_F(ModelFolderTest, ReadsACheckpoint) {
  AdamWState optimizer;
  optimizer.m.assign(params_.size(), 0.5f);
  optimizer.v.assign(params_.size(), 0.25f);
  CheckpointContents c;
  c.layout = &layout_;
  c.params = params_;
  c.optimizer = &optimizer;
  c.model_config_json = kConfig;
  c.trainer.step = 12;
  absl::StatusOr<std::string> dir = SaveCheckpoint(JoinPath(root_, "ckpt"), c);
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<ModelFolder> folder = ModelFolder::Open(*dir);
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(folder->form(), ModelFolder::Form::kCheckpoint);
  EXPECT_EQ(folder->step(), 12);
  EXPECT_EQ(folder->Describe(), "checkpoint of step 12");
  EXPECT_EQ(folder->model_config_json(), kConfig);
  absl::StatusOr<std::vector<float>> got = Read(*dir);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, params_);

  // The checkpoints' root is not a model, and says which folder to give.
  absl::StatusOr<ModelFolder> root = ModelFolder::Open(JoinPath(root_, "ckpt"));
  EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(root.status().message(), HasSubstr("step-00000012"));

  // A damaged checkpoint stays a damaged checkpoint: never read as an import (its config.json
  // and weights.safetensors would make one).
  ASSERT_TRUE(WriteWholeFile(JoinPath(*dir, kManifestFile), "{", false).ok());
  absl::StatusOr<ModelFolder> damaged = ModelFolder::Open(*dir);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
}

TEST_F(ModelFolderTest, RefusesFoldersOfNeitherForm) {
  absl::StatusOr<ModelFolder> missing = ModelFolder::Open(JoinPath(root_, "nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope"));

  const std::string empty = JoinPath(root_, "empty");
  fs::create_directories(empty);
  absl::StatusOr<ModelFolder> neither = ModelFolder::Open(empty);
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(neither.status().message(), HasSubstr("no config.json"));

  WriteConfig(empty);
  absl::StatusOr<ModelFolder> no_weights = ModelFolder::Open(empty);
  EXPECT_EQ(no_weights.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_weights.status().message(), HasSubstr("no weights"));

  std::vector<float> expected;
  const std::string dir = Import(SafeDtype::kF32, &expected);
  fs::copy_file(JoinPath(dir, kImportedWeightsFile), JoinPath(dir, kWeightsFile));
  absl::StatusOr<ModelFolder> both = ModelFolder::Open(dir);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(both.status().message(), HasSubstr("ambiguous"));

  const std::string file = JoinPath(root_, "a-file");
  ASSERT_TRUE(WriteWholeFile(file, "x", false).ok());
  EXPECT_EQ(ModelFolder::Open(file).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ModelFolderTest, RefusesTensorsThatDoNotFitTheLayout) {
  std::vector<float> expected;
  std::vector<std::string> storage;
  std::vector<TensorToWrite> good = Tensors(SafeDtype::kF32, &expected, &storage);
  struct Case {
    std::string name;
    std::vector<TensorToWrite> tensors;
    std::string says;
  };
  std::vector<Case> cases;
  cases.push_back({"missing", {good[0], good[2]}, "no tensor \"blocks.0.ffn.w1\""});
  TensorToWrite extra = good[2];
  extra.name = "unused.bias";
  cases.push_back({"extra", {good[0], good[1], good[2], extra}, "\"unused.bias\" is not in"});
  TensorToWrite reshaped = good[1];
  reshaped.shape = {6, 4};
  cases.push_back(
      {"shape", {good[0], reshaped, good[2]}, "has shape [6, 4], the model's layout [4, 6]"});
  TensorToWrite ints = good[2];
  ints.dtype = SafeDtype::kI32;
  cases.push_back({"dtype", {good[0], good[1], ints}, "is I32; a model's weights are F32, BF16"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = JoinPath(root_, c.name);
    WriteConfig(dir);
    WriteFile(JoinPath(dir, kImportedWeightsFile), c.tensors);
    absl::StatusOr<ModelFolder> folder = ModelFolder::Open(dir);
    ASSERT_TRUE(folder.ok()) << folder.status();  // Structure is fine; the layout decides.
    absl::Status s = folder->CheckWeights(layout_);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
    std::vector<float> out(static_cast<size_t>(layout_.total()));
    EXPECT_EQ(folder->ReadWeights(layout_, absl::MakeSpan(out)).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST_F(ModelFolderTest, RefusesWeightsThatAreNotFinite) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    params_[static_cast<size_t>(layout_.entries()[1].offset + 5)] = bad;
    std::vector<float> expected;
    const std::string dir = Import(SafeDtype::kF32, &expected);
    absl::StatusOr<std::vector<float>> got = Read(dir);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr("\"blocks.0.ffn.w1\" holds"));
    EXPECT_THAT(got.status().message(),
                HasSubstr("at element 5; a served model's weights must be"));
  }
}

TEST_F(ModelFolderTest, RefusesIndexesThatDoNotMatchTheirFiles) {
  std::vector<float> expected;
  std::vector<std::string> storage;
  std::vector<TensorToWrite> t = Tensors(SafeDtype::kF32, &expected, &storage);
  struct Case {
    std::string name;
    std::string index;
    absl::StatusCode code;
    std::string says;
  };
  const std::string both_in_a =
      R"("embed.weight": "a.safetensors", "blocks.0.ffn.w1": "a.safetensors", )";
  const std::vector<Case> cases = {
      {"not-json", "{", absl::StatusCode::kDataLoss, "not valid JSON"},
      {"no-map", R"({"metadata": {}})", absl::StatusCode::kDataLoss, "no \"weight_map\""},
      {"empty-map", R"({"weight_map": {}})", absl::StatusCode::kDataLoss, "is empty"},
      {"not-a-name", "{\"weight_map\": {" + both_in_a + R"("final_norm.weight": 3}})",
       absl::StatusCode::kDataLoss, "maps to 3, not a file name"},
      {"escapes", "{\"weight_map\": {" + both_in_a + R"("final_norm.weight": "../b.safetensors"}})",
       absl::StatusCode::kInvalidArgument, "only .safetensors files in its own folder"},
      {"not-safetensors", "{\"weight_map\": {" + both_in_a + R"("final_norm.weight": "b.bin"}})",
       absl::StatusCode::kInvalidArgument, "\"b.bin\""},
      {"missing-file",
       "{\"weight_map\": {" + both_in_a + R"("final_norm.weight": "c.safetensors"}})",
       absl::StatusCode::kDataLoss, "names c.safetensors, which is missing"},
      {"unlisted", R"({"weight_map": {"embed.weight": "a.safetensors",
                       "final_norm.weight": "b.safetensors"}})",
       absl::StatusCode::kDataLoss, "\"blocks.0.ffn.w1\" is not in"},
      {"misplaced", R"({"weight_map": {"embed.weight": "a.safetensors",
                         "blocks.0.ffn.w1": "b.safetensors", "final_norm.weight": "b.safetensors"}})",
       absl::StatusCode::kDataLoss, "holds tensor \"blocks.0.ffn.w1\", which"},
      {"elsewhere", "{\"weight_map\": {" + both_in_a + R"("final_norm.weight": "a.safetensors"}})",
       absl::StatusCode::kDataLoss,
       "maps tensor \"final_norm.weight\" to a.safetensors, which does"},
      {"phantom",
       "{\"weight_map\": {" + both_in_a +
           R"("final_norm.weight": "b.safetensors", "ghost": "b.safetensors"}})",
       absl::StatusCode::kDataLoss, "maps tensor \"ghost\" to b.safetensors, which does not hold"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = JoinPath(root_, c.name);
    WriteConfig(dir);
    WriteFile(JoinPath(dir, "a.safetensors"), {t[0], t[1]});
    WriteFile(JoinPath(dir, "b.safetensors"), {t[2]});
    ASSERT_TRUE(WriteWholeFile(JoinPath(dir, kImportedIndexFile), c.index, false).ok());
    absl::StatusOr<ModelFolder> folder = ModelFolder::Open(dir);
    EXPECT_EQ(folder.status().code(), c.code) << folder.status();
    EXPECT_THAT(folder.status().message(), HasSubstr(c.says));
  }
  // A damaged weights file is DATA_LOSS naming it.
  const std::string dir = JoinPath(root_, "damaged");
  WriteConfig(dir);
  ASSERT_TRUE(WriteWholeFile(JoinPath(dir, kImportedWeightsFile), "xyz", false).ok());
  absl::StatusOr<ModelFolder> damaged = ModelFolder::Open(dir);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_THAT(damaged.status().message(), HasSubstr(kImportedWeightsFile));
}

}  // namespace
}  // namespace model
}  // namespace dattn
