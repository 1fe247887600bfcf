#include "server/model_registry.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/file_io.h"
#include "model/model_folder.h"
#include "model/param_layout.h"
#include "model/safetensors.h"
#include "model/testing/test_checkpoint.h"

namespace dattn {
namespace server {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using model::testing::TinyTestConfig;

class ModelRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/model_registry_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    absl::StatusOr<std::string> step = model::testing::SaveTestCheckpoint(
        dir_ + "/ckpt", TinyTestConfig(), 3, 300, 0.1f, &weights_);
    ASSERT_TRUE(step.ok()) << step.status();
    checkpoint_ = *step;
    imported_ = dir_ + "/imported";
    ASSERT_TRUE(model::testing::SaveTestImport(imported_, TinyTestConfig(), weights_,
                                               model::SafeDtype::kBF16)
                    .ok());
    root_ = dir_ + "/models";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<ModelRegistry> Open() {
    absl::StatusOr<std::unique_ptr<ModelRegistry>> r = ModelRegistry::Open(root_);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  static ModelRegistry::UsersFn NoUsers() {
    return [](const v1::RegisteredModel&) -> absl::StatusOr<std::vector<std::string>> {
      return std::vector<std::string>{};
    };
  }

  std::string dir_, root_, checkpoint_, imported_;
  std::vector<float> weights_;
};

// Both sources become versions 1 and 2 of one name, in the imported form with checksums; each
// version reads back the weights it was copied from (a checkpoint's exactly, without its optimizer
// state), and a second registry over the same folder sees the same versions.
TEST_F(ModelRegistryTest, ImportsCheckpointsAndImportsAsVersionsThatLoad) {
  std::unique_ptr<ModelRegistry> registry = Open();
  absl::StatusOr<v1::RegisteredModel> v1 =
      registry->Import("", "kjv", checkpoint_, "training job J step 300", "path", "first run");
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->tenant(), "default");
  EXPECT_EQ(v1->version(), 1);
  EXPECT_EQ(v1->folder(), root_ + "/default/kjv/1");
  EXPECT_EQ(v1->weights(), "weights.safetensors, F32");
  EXPECT_EQ(v1->parameters(), static_cast<int64_t>(weights_.size()));
  EXPECT_EQ(v1->model_config_json(), model::ConfigToJson(TinyTestConfig()));
  EXPECT_EQ(v1->description(), "first run");
  EXPECT_FALSE(fs::exists(v1->folder() + "/optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(v1->folder() + "/MANIFEST.json"));

  absl::StatusOr<v1::RegisteredModel> v2 =
      registry->Import("", "kjv", imported_, "folder " + imported_, "path", "");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->version(), 2);
  EXPECT_EQ(v2->weights(), "model.safetensors, BF16");

  absl::StatusOr<model::ParamLayout> layout = model::BuildParamLayout(TinyTestConfig());
  ASSERT_TRUE(layout.ok());
  for (const v1::RegisteredModel& m : {*v1, *v2}) {
    absl::StatusOr<model::ModelFolder> folder = model::ModelFolder::Open(m.folder());
    ASSERT_TRUE(folder.ok()) << folder.status();
    EXPECT_EQ(folder->form(), model::ModelFolder::Form::kImported);
    EXPECT_TRUE(folder->checksums_verified());
    std::vector<float> read(weights_.size());
    ASSERT_TRUE(folder->ReadWeights(*layout, absl::MakeSpan(read)).ok());
    if (m.version() == 1) {
      EXPECT_EQ(read, weights_);  // fp32 bit for bit
    }
  }
  // sha256sum's format: `sha256sum -c` reads it.
  absl::StatusOr<std::string> sums = model::ReadSmallFile(v1->folder() + "/SHA256SUMS", 1 << 20);
  ASSERT_TRUE(sums.ok());
  absl::StatusOr<std::string> config_sha = model::Sha256FileHex(v1->folder() + "/config.json");
  ASSERT_TRUE(config_sha.ok());
  EXPECT_THAT(*sums, HasSubstr(*config_sha + "  config.json\n"));

  absl::StatusOr<v1::RegisteredModel> newest = registry->Get("default", "kjv", 0);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->version(), 2);

  registry.reset();
  std::unique_ptr<ModelRegistry> again = Open();
  EXPECT_TRUE(again->problems().empty());
  std::vector<v1::RegisteredModel> listed = again->List("", "");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].version(), 1);
  EXPECT_EQ(listed[0].source(), "training job J step 300");
  EXPECT_EQ(listed[0].model_config_json(), model::ConfigToJson(TinyTestConfig()));
  EXPECT_EQ(listed[1].version(), 2);
  EXPECT_EQ(listed[1].bytes(), v2->bytes());
  EXPECT_EQ(listed[1].create_time_us(), v2->create_time_us());
}

// A version that changed on disk after its import is refused where a worker opens it, naming the
// file; so is a checksums file that leaves a model file out.
TEST_F(ModelRegistryTest, AChangedVersionIsRefusedAtLoad) {
  std::unique_ptr<ModelRegistry> registry = Open();
  absl::StatusOr<v1::RegisteredModel> m =
      registry->Import("", "kjv", imported_, "folder", "path", "");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string weights = m->folder() + "/model.safetensors";
  absl::StatusOr<std::string> bytes = model::ReadSmallFile(weights, 1 << 24);
  ASSERT_TRUE(bytes.ok());
  std::string changed = *bytes;
  changed[changed.size() - 1] ^= 1;  // the last weight's lowest bit
  fs::permissions(weights, fs::perms::owner_write, fs::perm_options::add);
  ASSERT_TRUE(model::WriteWholeFile(weights, changed, false).ok());
  absl::StatusOr<model::ModelFolder> opened = model::ModelFolder::Open(m->folder());
  ASSERT_TRUE(absl::IsDataLoss(opened.status())) << opened.status();
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr(weights + " has SHA-256 "));
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("the file changed"));
  // The coordinator's submit reads headers only (no checksums): it still opens.
  EXPECT_TRUE(model::ModelFolder::Open(m->folder(), /*verify_checksums=*/false).ok());

  ASSERT_TRUE(model::WriteWholeFile(m->folder() + "/SHA256SUMS",
                                    std::string(64, 'a') + "  config.json\n", false)
                  .ok());
  opened = model::ModelFolder::Open(m->folder());
  ASSERT_TRUE(absl::IsDataLoss(opened.status())) << opened.status();
  EXPECT_THAT(std::string(opened.status().message()),
              HasSubstr("does not list model.safetensors, a file of the model"));
  ASSERT_TRUE(model::WriteWholeFile(m->folder() + "/SHA256SUMS", "not a line\n", false).ok());
  opened = model::ModelFolder::Open(m->folder());
  ASSERT_TRUE(absl::IsDataLoss(opened.status())) << opened.status();
  EXPECT_THAT(std::string(opened.status().message()), HasSubstr("line 1 is not"));
}

// Bad names, tenants, descriptions and sources are INVALID_ARGUMENT naming the field; nothing is
// left behind by a refused import.
TEST_F(ModelRegistryTest, BadImportsAreRefusedNamingTheField) {
  std::unique_ptr<ModelRegistry> registry = Open();
  for (const std::string& name : std::vector<std::string>{"", "-x", ".hidden", "a/b", "..",
                                                          std::string(65, 'a'), "\xc3\xa9"}) {
    absl::StatusOr<v1::RegisteredModel> m = registry->Import("", name, imported_, "f", "path", "");
    ASSERT_TRUE(absl::IsInvalidArgument(m.status())) << name;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("name: ")) << name;
  }
  EXPECT_TRUE(registry->Import("", std::string(64, 'a'), imported_, "f", "path", "").ok());
  absl::StatusOr<v1::RegisteredModel> tenant =
      registry->Import("..", "kjv", imported_, "f", "path", "");
  ASSERT_TRUE(absl::IsInvalidArgument(tenant.status()));
  EXPECT_THAT(std::string(tenant.status().message()), HasSubstr("tenant \"..\""));
  absl::StatusOr<v1::RegisteredModel> described =
      registry->Import("", "kjv", imported_, "f", "path", std::string(1025, 'd'));
  ASSERT_TRUE(absl::IsInvalidArgument(described.status()));
  EXPECT_THAT(std::string(described.status().message()), HasSubstr("description: 1025 bytes"));

  absl::StatusOr<v1::RegisteredModel> missing =
      registry->Import("", "kjv", dir_ + "/nowhere", "folder " + dir_ + "/nowhere", "path", "");
  ASSERT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("path: folder " + dir_ + "/nowhere: model folder " + dir_ +
                        "/nowhere does not exist"));
  // Weights of another shape than config.json says.
  model::LongNetConfig wide = TinyTestConfig();
  wide.d_model = 16;
  ASSERT_TRUE(
      model::WriteWholeFile(imported_ + "/config.json", model::ConfigToJson(wide), false).ok());
  absl::StatusOr<v1::RegisteredModel> misfit =
      registry->Import("", "kjv", imported_, "f", "path", "");
  ASSERT_TRUE(absl::IsInvalidArgument(misfit.status()));
  EXPECT_THAT(std::string(misfit.status().message()),
              HasSubstr("path: " + imported_ + "/model.safetensors: tensor"));
  // A damaged checkpoint: its checksums are verified at import.
  absl::StatusOr<std::string> weights =
      model::ReadSmallFile(checkpoint_ + "/weights.safetensors", 1 << 24);
  ASSERT_TRUE(weights.ok());
  std::string damaged = *weights;
  damaged[damaged.size() - 1] ^= 1;
  fs::permissions(checkpoint_ + "/weights.safetensors", fs::perms::owner_write,
                  fs::perm_options::add);
  ASSERT_TRUE(model::WriteWholeFile(checkpoint_ + "/weights.safetensors", damaged, false).ok());
  absl::StatusOr<v1::RegisteredModel> bad_sum =
      registry->Import("", "kjv", checkpoint_, "training job J step 300", "training_job_id", "");
  ASSERT_TRUE(absl::IsInvalidArgument(bad_sum.status()));
  EXPECT_THAT(std::string(bad_sum.status().message()),
              HasSubstr("training_job_id: training job J step 300: "));

  // A caller that went away: the copy stops, CANCELLED.
  absl::StatusOr<v1::RegisteredModel> cancelled =
      registry->Import("", "kjv", dir_ + "/imported-2", "f", "path", "", [] { return true; });
  ASSERT_TRUE(model::testing::SaveTestImport(dir_ + "/imported-2", TinyTestConfig(), weights_,
                                             model::SafeDtype::kF32)
                  .ok());
  cancelled =
      registry->Import("", "kjv", dir_ + "/imported-2", "f", "path", "", [] { return true; });
  ASSERT_TRUE(absl::IsCancelled(cancelled.status())) << cancelled.status();

  EXPECT_EQ(registry->List("", "kjv").size(), 0u);
  EXPECT_TRUE(fs::is_empty(root_ + "/.incoming"));
}

// Deleting: one version or all; a served version is refused naming its deployments; a number once
// given is never given again, across a restart; unknown names and versions are NOT_FOUND naming
// what there is. Tenants do not see each other's models.
TEST_F(ModelRegistryTest, DeleteKeepsNumbersAndRefusesServedVersions) {
  std::unique_ptr<ModelRegistry> registry = Open();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(registry->Import("", "kjv", imported_, "f", "path", "").ok());
  }
  ASSERT_TRUE(registry->Import("acme", "kjv", imported_, "f", "path", "").ok());
  EXPECT_EQ(registry->List("acme", "").size(), 1u);
  EXPECT_EQ(registry->List("", "").size(), 3u);

  const ModelRegistry::UsersFn serving_2 =
      [](const v1::RegisteredModel& m) -> absl::StatusOr<std::vector<std::string>> {
    if (m.version() == 2) return std::vector<std::string>{"J-a", "J-b"};
    return std::vector<std::string>{};
  };
  absl::StatusOr<v1::DeleteModelResponse> busy = registry->Delete("", "kjv", 0, serving_2);
  ASSERT_TRUE(absl::IsFailedPrecondition(busy.status())) << busy.status();
  EXPECT_THAT(std::string(busy.status().message()),
              HasSubstr("model kjv is served: version 2 by J-a, J-b"));
  EXPECT_EQ(registry->List("", "kjv").size(), 3u);  // nothing removed

  absl::StatusOr<v1::DeleteModelResponse> three = registry->Delete("", "kjv", 3, serving_2);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_THAT(three->versions(), ElementsAre(3));
  EXPECT_GT(three->bytes_freed(), 0);
  EXPECT_FALSE(fs::exists(root_ + "/default/kjv/3"));
  absl::StatusOr<v1::DeleteModelResponse> again = registry->Delete("", "kjv", 3, NoUsers());
  ASSERT_TRUE(absl::IsNotFound(again.status()));
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr("model kjv has no version 3 (its versions: 1, 2)"));
  absl::StatusOr<v1::RegisteredModel> fourth =
      registry->Import("", "kjv", imported_, "f", "path", "");
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(fourth->version(), 4);

  absl::StatusOr<v1::DeleteModelResponse> all = registry->Delete("", "kjv", 0, NoUsers());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(all->versions(), ElementsAre(1, 2, 4));
  absl::StatusOr<v1::RegisteredModel> gone = registry->Get("", "kjv", 0);
  ASSERT_TRUE(absl::IsNotFound(gone.status()));
  EXPECT_THAT(std::string(gone.status().message()),
              HasSubstr("no model named \"kjv\" in the registry of tenant default"));
  EXPECT_EQ(registry->List("acme", "kjv").size(), 1u);  // the other tenant's is untouched

  registry.reset();
  std::unique_ptr<ModelRegistry> reopened = Open();
  absl::StatusOr<v1::RegisteredModel> fifth =
      reopened->Import("", "kjv", imported_, "f", "path", "");
  ASSERT_TRUE(fifth.ok());
  EXPECT_EQ(fifth->version(), 5);
}

// What a crash leaves (a copy in .incoming, a removal in .trash) is cleared at Open; a version
// folder whose REGISTRY.json is damaged is skipped and reported, not served.
TEST_F(ModelRegistryTest, OpenClearsWhatACrashLeft) {
  {
    std::unique_ptr<ModelRegistry> registry = Open();
    ASSERT_TRUE(registry->Import("", "kjv", imported_, "f", "path", "").ok());
    ASSERT_TRUE(registry->Import("", "other", imported_, "f", "path", "").ok());
  }
  fs::create_directories(root_ + "/.incoming/0123/");
  ASSERT_TRUE(model::WriteWholeFile(root_ + "/.incoming/0123/config.json", "{}", false).ok());
  fs::create_directories(root_ + "/.trash/4567/");
  ASSERT_TRUE(model::WriteWholeFile(root_ + "/default/other/1/REGISTRY.json", "{", false).ok());
  std::unique_ptr<ModelRegistry> registry = Open();
  EXPECT_TRUE(fs::is_empty(root_ + "/.incoming"));
  EXPECT_TRUE(fs::is_empty(root_ + "/.trash"));
  ASSERT_EQ(registry->problems().size(), 1u);
  EXPECT_THAT(registry->problems()[0], HasSubstr(root_ + "/default/other/1 is skipped"));
  std::vector<v1::RegisteredModel> listed = registry->List("", "");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name(), "kjv");
}

// Imports of one name at once each get their own version.
TEST_F(ModelRegistryTest, ConcurrentImportsGetDistinctVersions) {
  std::unique_ptr<ModelRegistry> registry = Open();
  std::vector<std::thread> threads;
  std::vector<int64_t> versions(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<v1::RegisteredModel> m =
          registry->Import("", "kjv", imported_, "f", "path", "");
      if (m.ok()) versions[static_cast<size_t>(i)] = m->version();
    });
  }
  for (std::thread& t : threads) t.join();
  std::sort(versions.begin(), versions.end());
  EXPECT_THAT(versions, ElementsAre(1, 2, 3, 4));
}

}  // namespace
}  // namespace server
}  // namespace dattn
