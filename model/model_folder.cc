#include "model/model_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/file_io.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace model {
namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxJsonFile = int64_t{64} << 20;
// The two names of a single weights file and of an index, in the order Describe prefers.
constexpr const char* kSingleNames[] = {kImportedWeightsFile, kWeightsFile};
constexpr const char* kIndexNames[] = {kImportedIndexFile, kWeightsIndexFile};

enum class Kind { kMissing, kFile, kDirectory, kOther };

Kind KindOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Kind::kMissing;
  if (S_ISREG(st.st_mode)) return Kind::kFile;
  if (S_ISDIR(st.st_mode)) return Kind::kDirectory;
  return Kind::kOther;
}

// A file name the index may use: one plain name inside the folder, of a safetensors file.
absl::Status CheckIndexedName(const std::string& index, const std::string& tensor,
                              const std::string& file) {
  if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
      file.find('\\') != std::string::npos || file.find('\0') != std::string::npos ||
      !absl::EndsWith(file, ".safetensors")) {
    return absl::InvalidArgumentError(
        absl::StrCat(index, ": tensor \"", tensor, "\" maps to ", Json(file).dump(),
                     ": the index may name only .safetensors files in its own folder (no path)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelFolder> ModelFolder::Open(const std::string& dir, bool verify_checksums) {
  switch (KindOf(dir)) {
    case Kind::kMissing:
      return absl::NotFoundError(absl::StrCat("model folder ", dir, " does not exist"));
    case Kind::kDirectory:
      break;
    default:
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " is not a folder (a model folder holds config.json and the weights)"));
  }
  ModelFolder folder;
  folder.dir_ = dir;
  if (KindOf(JoinPath(dir, kManifestFile)) != Kind::kMissing) {
    absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(dir, verify_checksums);
    if (!checkpoint.ok()) return checkpoint.status();
    folder.form_ = Form::kCheckpoint;
    folder.config_ = checkpoint->model_config_json();
    folder.step_ = checkpoint->step();
    folder.weights_ = checkpoint->weights_files();
    folder.checkpoint_ = std::make_shared<const Checkpoint>(*std::move(checkpoint));
    return folder;
  }
  if (KindOf(JoinPath(dir, kConfigFile)) == Kind::kMissing) {
    absl::StatusOr<std::vector<CheckpointEntry>> steps = ListCheckpoints(dir);
    if (steps.ok() && !steps->empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " holds checkpoint step folders (", steps->back().path,
                       " is the newest), not a model: give one of them"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " is neither a checkpoint (no ", kManifestFile,
                     ") nor an imported model (no ", kConfigFile,
                     "): an imported model is config.json with model.safetensors, "
                     "weights.safetensors or a safetensors index"));
  }
  folder.form_ = Form::kImported;
  if (absl::Status s = folder.OpenImported(); !s.ok()) return s;
  if (verify_checksums && KindOf(JoinPath(dir, kChecksumsFile)) != Kind::kMissing) {
    if (absl::Status s = folder.VerifyChecksums(); !s.ok()) return s;
  }
  return folder;
}

absl::Status ModelFolder::OpenImported() {
  absl::StatusOr<std::string> config = ReadSmallFile(JoinPath(dir_, kConfigFile), kMaxJsonFile);
  if (!config.ok()) return absl::DataLossError(config.status().message());
  config_ = *std::move(config);

  std::vector<std::string> present;
  for (const char* name : kSingleNames) {
    if (KindOf(JoinPath(dir_, name)) != Kind::kMissing) present.push_back(name);
  }
  for (const char* name : kIndexNames) {
    if (KindOf(JoinPath(dir_, name)) != Kind::kMissing) present.push_back(name);
  }
  if (present.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir_, ": no weights: an imported model holds ", kImportedWeightsFile, ", ",
                     kWeightsFile, ", ", kImportedIndexFile, " or ", kWeightsIndexFile));
  }
  if (present.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir_, ": both ", present[0], " and ", present[1],
                     ": which weights to serve is ambiguous; keep one"));
  }
  weights_source_ = present[0];
  const std::string source_path = JoinPath(dir_, weights_source_);
  if (!absl::EndsWith(weights_source_, ".json")) {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(source_path);
    if (!file.ok()) return absl::DataLossError(file.status().message());
    for (const SafeTensorInfo& t : file->tensors()) holder_.emplace(t.name, 0);
    weights_.push_back(*std::move(file));
    return absl::OkStatus();
  }

  // An index: {"weight_map": {tensor: file}}.
  absl::StatusOr<std::string> text = ReadSmallFile(source_path, kMaxJsonFile);
  if (!text.ok()) return absl::DataLossError(text.status().message());
  Json index;
  bool too_deep = false;
  try {
    index =
        Json::parse(text->begin(), text->end(), [&too_deep](int depth, Json::parse_event_t, Json&) {
          if (depth > 16) too_deep = true;
          return true;
        });
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(source_path, ": not valid JSON (", e.what(), ")"));
  }
  if (too_deep) return absl::DataLossError(absl::StrCat(source_path, ": nested too deep"));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(
        absl::StrCat(source_path, ": no \"weight_map\" object (tensor name -> file name)"));
  }
  const Json& weight_map = index["weight_map"];
  if (weight_map.empty()) {
    return absl::DataLossError(absl::StrCat(source_path, ": \"weight_map\" is empty"));
  }
  std::map<std::string, std::string> file_of;  // Tensor -> file, from the index.
  std::set<std::string> files;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::DataLossError(absl::StrCat(source_path, ": tensor \"", it.key(), "\" maps to ",
                                              it.value().dump(), ", not a file name"));
    }
    const std::string file = it.value().get<std::string>();
    if (absl::Status s = CheckIndexedName(source_path, it.key(), file); !s.ok()) return s;
    file_of.emplace(it.key(), file);
    files.insert(file);
    if (static_cast<int>(files.size()) > kMaxImportedWeightsFiles) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_path, ": names more than ", kMaxImportedWeightsFiles, " files"));
    }
  }
  for (const std::string& name : files) {
    const std::string path = JoinPath(dir_, name);
    if (KindOf(path) == Kind::kMissing) {
      return absl::DataLossError(
          absl::StrCat(source_path, " names ", name, ", which is missing from ", dir_));
    }
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) return absl::DataLossError(file.status().message());
    const int position = static_cast<int>(weights_.size());
    for (const SafeTensorInfo& t : file->tensors()) {
      auto listed = file_of.find(t.name);
      if (listed == file_of.end()) {
        return absl::DataLossError(
            absl::StrCat(path, ": tensor \"", t.name, "\" is not in ", source_path));
      }
      if (listed->second != name) {
        return absl::DataLossError(absl::StrCat(path, ": holds tensor \"", t.name, "\", which ",
                                                source_path, " maps to ", listed->second));
      }
      holder_.emplace(t.name, position);
    }
    weights_.push_back(*std::move(file));
  }
  for (const auto& [tensor, file] : file_of) {
    if (!holder_.count(tensor)) {
      return absl::DataLossError(absl::StrCat(source_path, " maps tensor \"", tensor, "\" to ",
                                              file, ", which does not hold it"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelFolder::VerifyChecksums() {
  const std::string path = JoinPath(dir_, kChecksumsFile);
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxJsonFile);
  if (!text.ok()) return absl::DataLossError(text.status().message());
  std::map<std::string, std::string> digest_of;  // File name -> hex digest.
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    ++line_number;
    if (line.empty()) continue;
    // "<64 hex>  <name>" or "<64 hex> *<name>" (sha256sum's binary-mode marker).
    const bool hex =
        line.size() > 66 && std::all_of(line.begin(), line.begin() + 64, [](char c) {
          return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        });
    if (!hex || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
      return absl::DataLossError(
          absl::StrCat(path, ": line ", line_number, " is not \"<64 hex digits>  <file name>\""));
    }
    const std::string name(line.substr(66));
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return absl::DataLossError(absl::StrCat(path, ": line ", line_number, " names ",
                                              Json(name).dump(), ", not a file of its folder"));
    }
    if (!digest_of.emplace(name, absl::AsciiStrToLower(line.substr(0, 64))).second) {
      return absl::DataLossError(absl::StrCat(path, ": ", name, " is listed twice"));
    }
  }
  for (const std::string& name : ModelFiles()) {
    if (!digest_of.count(name)) {
      return absl::DataLossError(absl::StrCat(path, " does not list ", name,
                                              ", a file of the model: a model with checksums is "
                                              "checked whole"));
    }
  }
  for (const auto& [name, digest] : digest_of) {
    const std::string file = JoinPath(dir_, name);
    absl::StatusOr<std::string> actual = Sha256FileHex(file);
    if (!actual.ok()) {
      return absl::DataLossError(absl::StrCat(
          path, " lists ", name, ", which cannot be read: ", actual.status().message()));
    }
    if (*actual != digest) {
      return absl::DataLossError(absl::StrCat(file, " has SHA-256 ", *actual, ", ", kChecksumsFile,
                                              " says ", digest, ": the file changed"));
    }
  }
  checksums_verified_ = true;
  return absl::OkStatus();
}

std::vector<std::string> ModelFolder::ModelFiles() const {
  std::vector<std::string> files = {kConfigFile};
  if (form_ == Form::kImported) {
    if (absl::EndsWith(weights_source_, ".json")) files.push_back(weights_source_);
  } else if (KindOf(JoinPath(dir_, kWeightsIndexFile)) != Kind::kMissing) {
    files.push_back(kWeightsIndexFile);
  }
  for (const SafetensorsFile& f : weights_) {
    const std::string& name = f.name();
    const size_t slash = name.find_last_of('/');
    files.push_back(slash == std::string::npos ? name : name.substr(slash + 1));
  }
  return files;
}

std::string ModelFolder::Describe() const {
  if (form_ == Form::kCheckpoint) return absl::StrCat("checkpoint of step ", step_);
  std::set<std::string> dtypes;
  for (const SafetensorsFile& f : weights_) {
    for (const SafeTensorInfo& t : f.tensors()) dtypes.insert(SafeDtypeName(t.dtype));
  }
  const std::string kinds = absl::StrJoin(dtypes, " and ");
  if (!absl::EndsWith(weights_source_, ".json")) {
    return absl::StrCat("imported model (", weights_source_, ", ", kinds, ")");
  }
  return absl::StrCat("imported model (", weights_.size(),
                      weights_.size() == 1 ? " file" : " files", " of ", weights_source_, ", ",
                      kinds, ")");
}

absl::Status ModelFolder::CheckWeights(const ParamLayout& layout) const {
  if (form_ == Form::kCheckpoint) return checkpoint_->CheckWeights(layout);
  const std::string where = JoinPath(dir_, weights_source_);
  std::set<std::string> names;
  for (const ParamEntry& e : layout.entries()) {
    names.insert(e.name);
    auto held = holder_.find(e.name);
    if (held == holder_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": no tensor \"", e.name, "\", which the model's layout has"));
    }
    const SafetensorsFile& file = weights_[static_cast<size_t>(held->second)];
    const SafeTensorInfo* info = *file.Find(e.name);
    if (info->shape != e.shape) {
      return absl::FailedPreconditionError(
          absl::StrCat(file.name(), ": tensor \"", e.name, "\" has shape ",
                       ShapeString(info->shape), ", the model's layout ", ShapeString(e.shape)));
    }
    if (!IsFloatDtype(info->dtype)) {
      return absl::FailedPreconditionError(
          absl::StrCat(file.name(), ": tensor \"", e.name, "\" is ", SafeDtypeName(info->dtype),
                       "; a model's weights are F32, BF16, F16 or F64"));
    }
  }
  for (const auto& [tensor, position] : holder_) {
    if (!names.count(tensor)) {
      return absl::FailedPreconditionError(
          absl::StrCat(weights_[static_cast<size_t>(position)].name(), ": tensor \"", tensor,
                       "\" is not in the model's layout"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelFolder::ReadWeights(const ParamLayout& layout, absl::Span<float> out) const {
  if (static_cast<int64_t>(out.size()) != layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReadWeights: ", out.size(), " elements given, the layout has ", layout.total()));
  }
  if (absl::Status s = CheckWeights(layout); !s.ok()) return s;
  if (form_ == Form::kCheckpoint) {
    if (absl::Status s = checkpoint_->ReadWeights(layout, 0, out); !s.ok()) return s;
  } else {
    for (const ParamEntry& e : layout.entries()) {
      const SafetensorsFile& file = weights_[static_cast<size_t>(holder_.at(e.name))];
      absl::Status s = file.ReadAsFloat32(
          e.name, e.shape,
          out.subspan(static_cast<size_t>(e.offset), static_cast<size_t>(e.numel)));
      if (!s.ok()) return s;
    }
  }
  for (const ParamEntry& e : layout.entries()) {
    for (int64_t i = 0; i < e.numel; ++i) {
      const float x = out[static_cast<size_t>(e.offset + i)];
      if (!std::isfinite(x)) {
        // A checkpoint's tensors are named by its folder; an import's by the file holding them.
        const std::string& where = form_ == Form::kCheckpoint
                                       ? dir_
                                       : weights_[static_cast<size_t>(holder_.at(e.name))].name();
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": tensor \"", e.name, "\" holds ", x, " at element ", i,
                         "; a served model's weights must be finite"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace model
}  // namespace dattn
