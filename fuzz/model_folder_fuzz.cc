// Fuzzes the reader of imported models (model/model_folder.h), which the coordinator runs at submit
// on a folder a user names: ModelFolder::Open on a folder whose files come from the input, then
// CheckWeights and ReadWeights against a layout made from the tensors it holds. The input is
// parts separated by the line "@@@@" ("\n@@@@\n"): an empty first part means one weights file,
// the second part, written as model.safetensors; otherwise the first part is
// model.safetensors.index.json and the next three are a.safetensors, b.safetensors and
// c.safetensors (a part the input does not reach is absent). config.json is always "{}" (the
// reader keeps it verbatim). The folder is a fresh one per process, under $TMPDIR (/tmp by
// default), removed at exit.
//
// Checked beyond "no crash, leak or sanitizer report": a folder that opens is an import; its
// layout (every tensor it holds, as held) passes CheckWeights unless a dtype is not one of the
// four readable ones (FAILED_PRECONDITION), and then ReadWeights is OK or refuses non-finite values
// (FAILED_PRECONDITION); the same layout less one tensor fails CheckWeights (an extra tensor).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz/scratch_folder.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/model_folder.h"
#include "model/param_layout.h"
#include "model/safetensors.h"

namespace {

namespace model = dattn::model;

constexpr const char* kShards[] = {"a.safetensors", "b.safetensors", "c.safetensors"};
constexpr int64_t kMaxReadElements = int64_t{1} << 20;

using ::dattn::fuzz::Check;
using ::dattn::fuzz::WriteScratchFile;

void Remove(const std::string& path) { unlink(path.c_str()); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> parts = absl::StrSplit(input, "\n@@@@\n");
  if (parts.size() > 4) parts.resize(4);
  const std::string& dir = ::dattn::fuzz::ScratchFolder("model-folder-fuzz");
  WriteScratchFile(model::JoinPath(dir, model::kConfigFile), "{}");
  const std::string single = model::JoinPath(dir, model::kImportedWeightsFile);
  const std::string index = model::JoinPath(dir, model::kImportedIndexFile);
  if (parts[0].empty()) {
    Remove(index);
    for (const char* shard : kShards) Remove(model::JoinPath(dir, shard));
    if (parts.size() > 1) {
      WriteScratchFile(single, parts[1]);
    } else {
      Remove(single);
    }
  } else {
    Remove(single);
    WriteScratchFile(index, parts[0]);
    for (size_t i = 0; i < 3; ++i) {
      const std::string path = model::JoinPath(dir, kShards[i]);
      if (i + 1 < parts.size()) {
        WriteScratchFile(path, parts[i + 1]);
      } else {
        Remove(path);
      }
    }
  }

  absl::StatusOr<model::ModelFolder> opened = model::ModelFolder::Open(dir);
  if (!opened.ok()) return 0;
  Check(opened->form() == model::ModelFolder::Form::kImported);
  Check(opened->step() == 0);
  Check(!opened->Describe().empty());

  model::ParamLayout layout;
  bool readable = true;
  for (const model::SafetensorsFile& f : opened->weights_files()) {
    for (const model::SafeTensorInfo& t : f.tensors()) {
      if (!layout.Add(t.name, t.shape).ok()) return 0;
      readable &= t.dtype == model::SafeDtype::kF32 || t.dtype == model::SafeDtype::kBF16 ||
                  t.dtype == model::SafeDtype::kF16 || t.dtype == model::SafeDtype::kF64;
    }
  }
  const absl::Status checked = opened->CheckWeights(layout);
  Check(checked.ok() == readable);
  if (!checked.ok()) Check(absl::IsFailedPrecondition(checked));
  if (checked.ok() && layout.total() <= kMaxReadElements) {
    std::vector<float> out(static_cast<size_t>(layout.total()));
    const absl::Status read = opened->ReadWeights(layout, absl::MakeSpan(out));
    Check(read.ok() || absl::IsFailedPrecondition(read));
  }
  if (!layout.entries().empty()) {
    model::ParamLayout fewer;
    for (size_t i = 1; i < layout.entries().size(); ++i) {
      Check(fewer.Add(layout.entries()[i].name, layout.entries()[i].shape).ok());
    }
    Check(absl::IsFailedPrecondition(opened->CheckWeights(fewer)));
  }
  return 0;
}
