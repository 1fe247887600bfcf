#include "server/model_registry.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <system_error>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "api/tenant.h"
#include "model/config.h"
#include "model/file_io.h"
#include "model/longnet_params.h"
#include "model/model_folder.h"
#include "model/param_layout.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace server {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kIncoming[] = ".incoming";
constexpr char kTrash[] = ".trash";
constexpr char kNextFile[] = "NEXT";
// Room kept free beyond a copy's bytes (the file system's own needs, the small files).
constexpr int64_t kHeadroomBytes = int64_t{64} << 20;
constexpr int64_t kCopyPiece = int64_t{64} << 20;

std::string RandomName() {
  std::random_device random;
  return absl::StrCat(absl::Hex((uint64_t{random()} << 32) | random(), absl::kZeroPad16));
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return model::FileError("mkdir", path, errno);
  }
  return absl::OkStatus();
}

// Removes a tree; errors are the file system's, naming the path.
absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return model::FileError("remove", path, ec.value());
  return absl::OkStatus();
}

// Copies `from` to `to` (created, fsynced), returning the SHA-256 of the bytes copied.
absl::StatusOr<std::string> CopyFile(const std::string& from, const std::string& to,
                                     const std::function<bool()>& cancelled) {
  absl::StatusOr<model::MappedFile> in = model::MappedFile::Open(from);
  if (!in.ok()) return in.status();
  absl::StatusOr<model::OutputFile> out = model::OutputFile::Create(to);
  if (!out.ok()) return out.status();
  model::Sha256 sha;
  for (int64_t at = 0; at < in->size(); at += kCopyPiece) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("the import was cancelled while copying ", from));
    }
    const int64_t n = std::min(kCopyPiece, in->size() - at);
    sha.Update(in->data() + at, n);
    if (absl::Status s = out->Append(in->data() + at, n); !s.ok()) return s;
  }
  if (absl::Status s = out->Close(/*sync=*/true); !s.ok()) return s;
  absl::StatusOr<std::array<uint8_t, 32>> digest = sha.Finish();
  if (!digest.ok()) return digest.status();
  return model::HexDigest(*digest);
}

Json ToJson(const v1::RegisteredModel& m) {
  return Json{{"tenant", m.tenant()},
              {"name", m.name()},
              {"version", m.version()},
              {"source", m.source()},
              {"description", m.description()},
              {"parameters", m.parameters()},
              {"weights", m.weights()},
              {"bytes", m.bytes()},
              {"create_time_us", m.create_time_us()}};
}

absl::StatusOr<v1::RegisteredModel> FromJson(const std::string& path) {
  absl::StatusOr<std::string> text = model::ReadSmallFile(path, 1 << 20);
  if (!text.ok()) return text.status();
  v1::RegisteredModel m;
  try {
    const Json j = Json::parse(*text);
    m.set_tenant(j.at("tenant").get<std::string>());
    m.set_name(j.at("name").get<std::string>());
    m.set_version(j.at("version").get<int64_t>());
    m.set_source(j.at("source").get<std::string>());
    m.set_description(j.at("description").get<std::string>());
    m.set_parameters(j.at("parameters").get<int64_t>());
    m.set_weights(j.at("weights").get<std::string>());
    m.set_bytes(j.at("bytes").get<int64_t>());
    m.set_create_time_us(j.at("create_time_us").get<int64_t>());
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": ", e.what()));
  }
  return m;
}

absl::Status CheckTenant(const std::string& tenant) {
  if (!api::IsTenantName(tenant) || tenant[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant \"", tenant.substr(0, 64),
                     "\": a tenant that keeps models is a tenant name not beginning with '.'"));
  }
  return absl::OkStatus();
}

std::string Versions(const std::map<int64_t, v1::RegisteredModel>& versions) {
  std::vector<std::string> numbers;
  for (const auto& [v, m] : versions) numbers.push_back(absl::StrCat(v));
  return absl::StrJoin(numbers, ", ");
}

}  // namespace

absl::Status CheckModelName(const std::string& name) {
  const auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  const bool ok = !name.empty() && static_cast<int>(name.size()) <= kMaxModelNameLength &&
                  alnum(name[0]) && std::all_of(name.begin(), name.end(), [&](char c) {
                    return alnum(c) || c == '.' || c == '_' || c == '-';
                  });
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: ", Json(name.substr(0, 80)).dump(), " is not a model name (1 to ",
        kMaxModelNameLength, " characters of [A-Za-z0-9._-], beginning with a letter or a digit)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRegistry>> ModelRegistry::Open(const std::string& root) {
  if (root.empty()) return absl::InvalidArgumentError("model registry: no folder given");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return model::FileError("create the model folder", root, ec.value());
  std::unique_ptr<ModelRegistry> registry(new ModelRegistry(root));
  for (const char* leftover : {kIncoming, kTrash}) {
    const std::string dir = model::JoinPath(root, leftover);
    if (absl::Status s = RemoveTree(dir); !s.ok()) return s;
    if (absl::Status s = MakeDir(dir); !s.ok()) return s;
  }
  if (absl::Status s = registry->Load(); !s.ok()) return s;
  return registry;
}

std::string ModelRegistry::NameDir(const std::string& tenant, const std::string& name) const {
  return model::JoinPath(model::JoinPath(root_, tenant), name);
}

absl::Status ModelRegistry::Load() {
  absl::MutexLock lock(&mu_);
  std::error_code ec;
  for (const fs::directory_entry& t : fs::directory_iterator(root_, ec)) {
    const std::string tenant = t.path().filename().string();
    if (tenant.empty() || tenant[0] == '.' || !t.is_directory()) continue;
    for (const fs::directory_entry& n : fs::directory_iterator(t.path(), ec)) {
      const std::string name = n.path().filename().string();
      if (!n.is_directory() || !CheckModelName(name).ok()) continue;
      for (const fs::directory_entry& v : fs::directory_iterator(n.path(), ec)) {
        int64_t version = 0;
        if (!v.is_directory() || !absl::SimpleAtoi(v.path().filename().string(), &version) ||
            version < 1) {
          continue;
        }
        const std::string folder = v.path().string();
        absl::StatusOr<v1::RegisteredModel> m = FromJson(model::JoinPath(folder, kRegistryFile));
        if (!m.ok()) {
          problems_.push_back(
              absl::StrCat("model folder ", folder, " is skipped: ", m.status().message()));
          continue;
        }
        if (m->tenant() != tenant || m->name() != name || m->version() != version) {
          problems_.push_back(absl::StrCat("model folder ", folder, " is skipped: its ",
                                           kRegistryFile, " says ", m->tenant(), "/", m->name(),
                                           " version ", m->version()));
          continue;
        }
        absl::StatusOr<std::string> config =
            model::ReadSmallFile(model::JoinPath(folder, model::kConfigFile), 64 << 20);
        if (!config.ok()) {
          problems_.push_back(
              absl::StrCat("model folder ", folder, " is skipped: ", config.status().message()));
          continue;
        }
        m->set_model_config_json(*config);
        m->set_folder(folder);
        models_[{tenant, name}][version] = *std::move(m);
      }
    }
  }
  if (ec) return model::FileError("list", root_, ec.value());
  return absl::OkStatus();
}

int64_t ModelRegistry::NextVersionLocked(const std::string& tenant, const std::string& name) const {
  int64_t next = 1;
  auto it = models_.find({tenant, name});
  if (it != models_.end() && !it->second.empty()) next = it->second.rbegin()->first + 1;
  absl::StatusOr<std::string> text =
      model::ReadSmallFile(model::JoinPath(NameDir(tenant, name), kNextFile), 64);
  int64_t recorded = 0;
  if (text.ok() && absl::SimpleAtoi(*text, &recorded)) next = std::max(next, recorded);
  return next;
}

absl::StatusOr<v1::RegisteredModel> ModelRegistry::Import(
    const std::string& tenant_in, const std::string& name, const std::string& source_dir,
    const std::string& source, const std::string& field, const std::string& description,
    const std::function<bool()>& cancelled) {
  const std::string tenant = api::TenantOrDefault(tenant_in);
  if (absl::Status s = CheckTenant(tenant); !s.ok()) return s;
  if (absl::Status s = CheckModelName(name); !s.ok()) return s;
  if (static_cast<int>(description.size()) > kMaxModelDescriptionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("description: ", description.size(),
                                                   " bytes, more than the ",
                                                   kMaxModelDescriptionBytes, " allowed"));
  }
  // The source, as a deployment's submit would check it (and a checkpoint's checksums).
  absl::StatusOr<model::ModelFolder> folder =
      model::ModelFolder::Open(source_dir, /*verify_checksums=*/true);
  if (!folder.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", source, ": ", folder.status().message()));
  }
  absl::StatusOr<model::LongNetConfig> config = model::ParseConfigJson(folder->model_config_json());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", source, ": ", model::kConfigFile,
                                                   ": ", config.status().message()));
  }
  absl::StatusOr<model::ParamLayout> layout = model::BuildParamLayout(*config);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", source, ": ", layout.status().message()));
  }
  if (absl::Status s = folder->CheckWeights(*layout); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
  }
  const std::vector<std::string> files = folder->ModelFiles();
  int64_t bytes = 0;
  for (const std::string& f : files) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(model::JoinPath(source_dir, f), ec);
    if (ec) return model::FileError("stat", model::JoinPath(source_dir, f), ec.value());
    bytes += static_cast<int64_t>(size);
  }
  struct statvfs vfs;
  if (::statvfs(root_.c_str(), &vfs) != 0) return model::FileError("statvfs", root_, errno);
  const int64_t free_bytes =
      static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  if (free_bytes < bytes + kHeadroomBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model folder ", root_, " has ", free_bytes, " bytes free; the model's ", files.size(),
        " files take ", bytes, " (and ", kHeadroomBytes, " are kept free)"));
  }

  // The copy, outside the lock.
  const std::string incoming = model::JoinPath(model::JoinPath(root_, kIncoming), RandomName());
  if (absl::Status s = MakeDir(incoming); !s.ok()) return s;
  auto discard = absl::MakeCleanup([&incoming] { RemoveTree(incoming).IgnoreError(); });
  std::string sums;
  for (const std::string& f : files) {
    absl::StatusOr<std::string> digest =
        CopyFile(model::JoinPath(source_dir, f), model::JoinPath(incoming, f), cancelled);
    if (!digest.ok()) {
      if (absl::IsResourceExhausted(digest.status())) {
        return absl::ResourceExhaustedError(absl::StrCat("the model folder ", root_,
                                                         " filled while copying ", f, ": ",
                                                         digest.status().message()));
      }
      return digest.status();
    }
    absl::StrAppend(&sums, *digest, "  ", f, "\n");
  }
  if (absl::Status s =
          model::WriteWholeFile(model::JoinPath(incoming, model::kChecksumsFile), sums, true);
      !s.ok()) {
    return s;
  }
  // The copy as a worker will open it: checksums and tensors.
  absl::StatusOr<model::ModelFolder> copy =
      model::ModelFolder::Open(incoming, /*verify_checksums=*/true);
  if (!copy.ok()) return copy.status();
  if (absl::Status s = copy->CheckWeights(*layout); !s.ok()) return s;
  std::set<std::string> dtypes;
  for (const model::SafetensorsFile& f : copy->weights_files()) {
    for (const model::SafeTensorInfo& t : f.tensors()) dtypes.insert(model::SafeDtypeName(t.dtype));
  }

  v1::RegisteredModel m;
  m.set_tenant(tenant);
  m.set_name(name);
  m.set_source(source);
  m.set_description(description);
  m.set_parameters(layout->total());
  // files: config.json, then the index (then its files) or the one weights file.
  m.set_weights(absl::StrCat(
      files[1], files.size() > 2 ? absl::StrCat(" (", files.size() - 2, " files)") : "", ", ",
      absl::StrJoin(dtypes, " and ")));
  m.set_bytes(bytes);
  m.set_create_time_us(absl::ToUnixMicros(absl::Now()));
  m.set_model_config_json(folder->model_config_json());

  // The commit: a number, REGISTRY.json, NEXT, then one rename.
  absl::MutexLock lock(&mu_);
  const std::string name_dir = NameDir(tenant, name);
  if (absl::Status s = MakeDir(model::JoinPath(root_, tenant)); !s.ok()) return s;
  if (absl::Status s = MakeDir(name_dir); !s.ok()) return s;
  const int64_t version = NextVersionLocked(tenant, name);
  m.set_version(version);
  if (absl::Status s = model::WriteWholeFile(model::JoinPath(incoming, kRegistryFile),
                                             ToJson(m).dump(2) + "\n", true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = model::FsyncPath(incoming); !s.ok()) return s;
  const std::string next_tmp = model::JoinPath(name_dir, absl::StrCat(kNextFile, ".tmp"));
  if (absl::Status s = model::WriteWholeFile(next_tmp, absl::StrCat(version + 1, "\n"), true);
      !s.ok()) {
    return s;
  }
  const std::string next = model::JoinPath(name_dir, kNextFile);
  if (::rename(next_tmp.c_str(), next.c_str()) != 0) {
    return model::FileError("rename", next_tmp, errno);
  }
  const std::string final_dir = model::JoinPath(name_dir, absl::StrCat(version));
  if (::rename(incoming.c_str(), final_dir.c_str()) != 0) {
    return model::FileError("rename", incoming, errno);
  }
  std::move(discard).Cancel();
  if (absl::Status s = model::FsyncPath(name_dir); !s.ok()) return s;
  if (absl::Status s = model::FsyncPath(model::JoinPath(root_, kIncoming)); !s.ok()) return s;
  m.set_folder(final_dir);
  models_[{tenant, name}][version] = m;
  return m;
}

absl::StatusOr<v1::RegisteredModel> ModelRegistry::Get(const std::string& tenant_in,
                                                       const std::string& name,
                                                       int64_t version) const {
  const std::string tenant = api::TenantOrDefault(tenant_in);
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", version, " (>= 1; 0: the newest)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = models_.find({tenant, name});
  if (it == models_.end() || it->second.empty()) {
    return absl::NotFoundError(absl::StrCat("no model named \"", name.substr(0, 80),
                                            "\" in the registry of tenant ", tenant));
  }
  if (version == 0) return it->second.rbegin()->second;
  auto v = it->second.find(version);
  if (v == it->second.end()) {
    return absl::NotFoundError(absl::StrCat("model ", name, " has no version ", version,
                                            " (its versions: ", Versions(it->second), ")"));
  }
  return v->second;
}

std::vector<v1::RegisteredModel> ModelRegistry::List(const std::string& tenant_in,
                                                     const std::string& name) const {
  const std::string tenant = api::TenantOrDefault(tenant_in);
  std::vector<v1::RegisteredModel> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, versions] : models_) {
    if (key.first != tenant || (!name.empty() && key.second != name)) continue;
    for (const auto& [v, m] : versions) out.push_back(m);
  }
  return out;
}

absl::StatusOr<v1::DeleteModelResponse> ModelRegistry::Delete(const std::string& tenant_in,
                                                              const std::string& name,
                                                              int64_t version,
                                                              const UsersFn& users) {
  const std::string tenant = api::TenantOrDefault(tenant_in);
  std::vector<std::string> trash;
  v1::DeleteModelResponse response;
  {
    absl::MutexLock lock(&mu_);
    auto it = models_.find({tenant, name});
    if (it == models_.end() || it->second.empty()) {
      return absl::NotFoundError(absl::StrCat("no model named \"", name.substr(0, 80),
                                              "\" in the registry of tenant ", tenant));
    }
    std::vector<int64_t> doomed;
    if (version == 0) {
      for (const auto& [v, m] : it->second) doomed.push_back(v);
    } else if (it->second.count(version) == 0) {
      return absl::NotFoundError(absl::StrCat("model ", name, " has no version ", version,
                                              " (its versions: ", Versions(it->second), ")"));
    } else {
      doomed.push_back(version);
    }
    std::vector<std::string> busy;
    for (int64_t v : doomed) {
      absl::StatusOr<std::vector<std::string>> ids = users(it->second.at(v));
      if (!ids.ok()) return ids.status();
      if (!ids->empty()) {
        busy.push_back(absl::StrCat("version ", v, " by ", absl::StrJoin(*ids, ", ")));
      }
    }
    if (!busy.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("model ", name, " is served: ", absl::StrJoin(busy, "; "),
                       " (undeploy them first: `dattn cancel ID`)"));
    }
    const std::string name_dir = NameDir(tenant, name);
    for (int64_t v : doomed) {
      const v1::RegisteredModel& m = it->second.at(v);
      const std::string to = model::JoinPath(model::JoinPath(root_, kTrash), RandomName());
      if (::rename(m.folder().c_str(), to.c_str()) != 0) {
        return model::FileError("rename", m.folder(), errno);
      }
      trash.push_back(to);
      response.add_versions(v);
      response.set_bytes_freed(response.bytes_freed() + m.bytes());
      it->second.erase(v);
    }
    if (absl::Status s = model::FsyncPath(name_dir); !s.ok()) return s;
  }
  for (const std::string& dir : trash) {
    if (absl::Status s = RemoveTree(dir); !s.ok()) return s;
  }
  return response;
}

}  // namespace server
}  // namespace dattn
