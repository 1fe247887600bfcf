// The coordinator's model registry: named, versioned copies of models that deployments serve by
// name (DeploymentSpec.model; docs/SERVING.md "The model registry").
//
// What a version is: a folder of the imported form (model/model_folder.h) that the registry wrote
// and never changes: config.json, the weights (one safetensors file, or an index and its files),
// SHA256SUMS (every one of those files' SHA-256, which ModelFolder::Open verifies on the workers)
// and REGISTRY.json (what the version is: tenant, name, version, source, description, parameters,
// weights, bytes, creation time). Importing a training checkpoint copies its config and weights
// only (not its optimizer state), so every version has the same form whatever it came from.
//
// On disk, under `root` (the coordinator's --model-dir, which workers must read at the same path):
//   <root>/<tenant>/<name>/<version>/    a version (1, 2, ...)
//   <root>/<tenant>/<name>/NEXT          the next version's number: a removed number is never
//                                        given again, so "kjv version 3" names one model for ever
//   <root>/.incoming/<random>/           a copy in progress
//   <root>/.trash/<random>/              a version being removed
// Why files and not the job store: a version is its folder. The copy is written in .incoming,
// fsynced, then renamed into place (one rename is the commit), so a version exists whole or not at
// all, and its description travels with its weights; a table beside it would be a second copy of
// the truth to keep in step across a crash. The registry reads the folders once at Open and keeps
// the index in memory.
//
// Crash safety: a crash during a copy leaves a folder in .incoming, and during a removal one in
// .trash; Open removes both. NEXT is written (temporary file, fsync, rename) before the version's
// rename, so a crash between the two skips a number, never reuses one.
//
// Thread-safety: thread-safe. Copies run outside the registry's lock (two imports of one name
// copy at once and get consecutive versions at commit); Delete holds it while it checks users.
#ifndef DATTN_SERVER_MODEL_REGISTRY_H_
#define DATTN_SERVER_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dattn/v1/job_service.pb.h"

namespace dattn {
namespace server {

inline constexpr char kRegistryFile[] = "REGISTRY.json";
inline constexpr int kMaxModelNameLength = 64;
inline constexpr int kMaxModelDescriptionBytes = 1024;

// INVALID_ARGUMENT ("name: ...") unless `name` is 1 to 64 characters of [A-Za-z0-9._-] beginning
// with a letter or a digit.
absl::Status CheckModelName(const std::string& name);

class ModelRegistry {
 public:
  // Creates `root` if missing (0755: workers read it), removes what a crash left in .incoming and
  // .trash, and reads every version's REGISTRY.json. A version folder whose REGISTRY.json is
  // missing or does not parse is left alone and listed in problems() (the coordinator logs them).
  // Errors: the file system's (naming the path).
  static absl::StatusOr<std::unique_ptr<ModelRegistry>> Open(const std::string& root);

  const std::string& root() const { return root_; }
  // What Open found wrong, one line each.
  const std::vector<std::string>& problems() const { return problems_; }

  // Copies the model in `source_dir` as the next version of (tenant, name). `source` says what the
  // folder is, for RegisteredModel.source ("folder /x", "training job J step 300"); `field` names
  // the request's field in errors ("path", "training_job_id"). The source is opened as a
  // deployment's (ModelFolder, a checkpoint's checksums verified), its config parsed and its
  // tensors checked against the config's layout; the copy's checksums are verified before the
  // commit. Errors: INVALID_ARGUMENT for a bad name, tenant or description, and for a source that
  // is not a model the coordinator can serve (`field`: why, naming the file); RESOURCE_EXHAUSTED
  // when the root's file system has less room than the files (naming both numbers), or fills
  // during the copy; the file system's errors.
  // `cancelled` (optional) is asked between pieces of 64 MiB of the copy: true ends the import
  // CANCELLED, leaving nothing.
  absl::StatusOr<v1::RegisteredModel> Import(const std::string& tenant, const std::string& name,
                                             const std::string& source_dir,
                                             const std::string& source, const std::string& field,
                                             const std::string& description,
                                             const std::function<bool()>& cancelled = nullptr);

  // Version `version` of (tenant, name), or the newest for 0. NOT_FOUND naming the name (and the
  // versions there are).
  absl::StatusOr<v1::RegisteredModel> Get(const std::string& tenant, const std::string& name,
                                          int64_t version) const;

  // The tenant's versions (of `name` only, unless empty), by name then version.
  std::vector<v1::RegisteredModel> List(const std::string& tenant, const std::string& name) const;

  // What serves a version: the ids of the deployments (not ended) that serve it. Called under the
  // registry's lock.
  using UsersFn =
      std::function<absl::StatusOr<std::vector<std::string>>(const v1::RegisteredModel&)>;

  // Removes version `version` of (tenant, name), or every version for 0. FAILED_PRECONDITION naming
  // the version and its deployments when `users` names any (nothing is removed then); NOT_FOUND as
  // Get's; `users`' errors; the file system's.
  absl::StatusOr<v1::DeleteModelResponse> Delete(const std::string& tenant, const std::string& name,
                                                 int64_t version, const UsersFn& users);

 private:
  explicit ModelRegistry(std::string root) : root_(std::move(root)) {}
  absl::Status Load();
  std::string NameDir(const std::string& tenant, const std::string& name) const;
  // The next version of (tenant, name): NEXT, or one more than the newest version.
  int64_t NextVersionLocked(const std::string& tenant, const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string root_;
  std::vector<std::string> problems_;
  mutable absl::Mutex mu_;
  // (tenant, name) -> version -> the version.
  std::map<std::pair<std::string, std::string>, std::map<int64_t, v1::RegisteredModel>> models_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_MODEL_REGISTRY_H_
