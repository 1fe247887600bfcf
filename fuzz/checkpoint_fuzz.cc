// Fuzzes the checkpoint reader (model/checkpoint.h): Checkpoint::Open on a folder whose five files
// come from the input, then Restore into a layout made from the weights it holds. The input is the
// files' contents in the order MANIFEST.json, config.json, trainer_state.json, weights.safetensors,
// optimizer.safetensors, separated by the line "@@@@" ("\n@@@@\n"); a file the input does not reach
// is absent. The input is also parsed alone as trainer_state.json (TrainerStateFromJson).
//
// A manifest carries its own SHA-256 and every file's size: no mutation forges those, so when the
// manifest is a JSON object whose "files" list names files, the harness writes the right sizes and
// the manifest's checksum into it before writing it (their mismatches are model/checkpoint_test's),
// and opens without verifying the files' SHA-256. The folder is a fresh one per process, under
// $TMPDIR (/tmp by default), removed at exit.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz/scratch_folder.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "nlohmann/json.hpp"

namespace {

using Json = nlohmann::json;
namespace model = dattn::model;

constexpr const char* kFiles[] = {model::kManifestFile, model::kConfigFile,
                                  model::kTrainerStateFile, model::kWeightsFile,
                                  model::kOptimizerFile};
constexpr int64_t kMaxRestoreElements = int64_t{1} << 20;

using ::dattn::fuzz::Check;
using ::dattn::fuzz::WriteScratchFile;

// The manifest with the sizes of the files present and its own checksum made right, when it is an
// object listing files; else as given.
// A manifest nested deeper than the reader accepts (64) is written as given: dump() recurses.
std::string FixManifest(absl::string_view text, const std::vector<std::string>& parts) {
  bool too_deep = false;
  auto depth_check = [&too_deep](int depth, Json::parse_event_t, Json&) {
    if (depth > 64) too_deep = true;
    return true;
  };
  Json manifest = Json::parse(text.begin(), text.end(), depth_check, /*allow_exceptions=*/false);
  if (too_deep || !manifest.is_object()) return std::string(text);
  auto files = manifest.find("files");
  if (files != manifest.end() && files->is_array()) {
    for (Json& entry : *files) {
      if (!entry.is_object()) continue;
      auto name = entry.find("name");
      if (name == entry.end() || !name->is_string()) continue;
      for (size_t i = 1; i < parts.size(); ++i) {
        if (*name == kFiles[i]) entry["bytes"] = static_cast<int64_t>(parts[i].size());
      }
    }
  }
  manifest.erase("manifest_sha256");
  absl::StatusOr<std::string> digest = model::Sha256Hex(manifest.dump());
  Check(digest.ok());
  manifest["manifest_sha256"] = *digest;
  return manifest.dump(2);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  (void)model::TrainerStateFromJson(input, "fuzz/trainer_state.json");

  std::vector<std::string> parts = absl::StrSplit(input, "\n@@@@\n");
  if (parts.size() > 5) parts.resize(5);
  const std::string& dir = ::dattn::fuzz::ScratchFolder("checkpoint-fuzz");
  for (size_t i = 0; i < 5; ++i) {
    const std::string path = model::JoinPath(dir, kFiles[i]);
    if (i >= parts.size()) {
      unlink(path.c_str());
      continue;
    }
    const std::string content = i == 0 ? FixManifest(parts[0], parts) : parts[i];
    WriteScratchFile(path, content);
  }
  absl::StatusOr<model::Checkpoint> ck = model::Checkpoint::Open(dir, /*verify_checksums=*/false);
  if (!ck.ok()) return 0;

  model::ParamLayout layout;
  for (const model::SafeTensorInfo& t : ck->weights_file().tensors()) {
    if (!layout.Add(t.name, t.shape).ok()) return 0;
  }
  if (layout.total() > kMaxRestoreElements) return 0;
  std::vector<float> params(static_cast<size_t>(layout.total()));
  model::AdamWState state;
  if (ck->Restore(layout, absl::MakeSpan(params), &state).ok()) {
    Check(state.step == ck->optimizer_step());
    Check(static_cast<int64_t>(state.m.size()) == layout.total());
  }
  return 0;
}
