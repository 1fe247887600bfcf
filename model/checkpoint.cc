#include "model/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/file_io.h"
#include "model/rng.h"
#include "nlohmann/json.hpp"

namespace dattn {
namespace model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kManifestFormat[] = "dattn-checkpoint";
constexpr int64_t kManifestVersion = 1;
constexpr int64_t kShardedManifestVersion = 2;
// Version 2's ranks (file names have 5 digits).
constexpr int64_t kMaxShards = 99999;
constexpr char kTrainerFormat[] = "dattn-trainer-state";
constexpr int64_t kTrainerVersion = 1;
constexpr int64_t kMaxJsonFile = int64_t{64} << 20;
constexpr const char* kDataFiles[] = {kWeightsFile, kOptimizerFile, kConfigFile, kTrainerStateFile};

// ---- JSON field access with errors that name the file and the field ----

class Fields {
 public:
  Fields(const Json& object, std::string file, std::string prefix = "")
      : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {}

  absl::StatusOr<const Json*> Get(const char* key) const {
    if (!object_.is_object()) return Bad(key, "is not an object");
    auto it = object_.find(key);
    if (it == object_.end()) return Bad(key, "is missing");
    return &*it;
  }
  absl::StatusOr<int64_t> Int(const char* key) const {
    absl::StatusOr<const Json*> v = Get(key);
    if (!v.ok()) return v.status();
    if (!(*v)->is_number_integer()) return Bad(key, "is not an integer");
    return (*v)->get<int64_t>();
  }
  absl::StatusOr<double> Double(const char* key) const {
    absl::StatusOr<const Json*> v = Get(key);
    if (!v.ok()) return v.status();
    if (!(*v)->is_number()) return Bad(key, "is not a number");
    return (*v)->get<double>();
  }
  absl::StatusOr<bool> Bool(const char* key) const {
    absl::StatusOr<const Json*> v = Get(key);
    if (!v.ok()) return v.status();
    if (!(*v)->is_boolean()) return Bad(key, "is not true or false");
    return (*v)->get<bool>();
  }
  absl::StatusOr<std::string> String(const char* key) const {
    absl::StatusOr<const Json*> v = Get(key);
    if (!v.ok()) return v.status();
    if (!(*v)->is_string()) return Bad(key, "is not a string");
    return (*v)->get<std::string>();
  }
  absl::StatusOr<uint64_t> Hex(const char* key) const {
    absl::StatusOr<std::string> s = String(key);
    if (!s.ok()) return s.status();
    absl::StatusOr<uint64_t> v = HexToU64(*s);
    if (!v.ok()) return Bad(key, v.status().message());
    return v;
  }
  Fields Sub(const Json& object, const char* key) const {
    return Fields(object, file_, absl::StrCat(prefix_, key, "."));
  }
  absl::Status Bad(const char* key, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(file_, ": field \"", prefix_, key, "\" ", what));
  }

 private:
  const Json& object_;
  std::string file_;
  std::string prefix_;
};

#define DATTN_ASSIGN(lhs, expr)                           \
  do {                                                    \
    auto dattn_value_ = (expr);                           \
    if (!dattn_value_.ok()) return dattn_value_.status(); \
    lhs = *dattn_value_;                                  \
  } while (0)

// Our JSON files are a few levels deep (the trainer state's "extra" is the trainer's, and shallow).
// nlohmann parses without recursion, but dump() (the manifest's digest, "extra") recurses: deeper
// documents are refused.
constexpr int kMaxJsonDepth = 64;

absl::StatusOr<Json> ParseJson(absl::string_view text, const std::string& file) {
  bool too_deep = false;
  auto depth_check = [&too_deep](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return true;
  };
  Json parsed;
  try {
    parsed = Json::parse(text.begin(), text.end(), depth_check);
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(file, ": not valid JSON (", e.what(), ")"));
  }
  if (too_deep) {
    return absl::DataLossError(
        absl::StrCat(file, ": JSON nested more than ", kMaxJsonDepth, " levels deep"));
  }
  return parsed;
}

Json CursorToJson(const SamplerCursor& c) {
  return Json{
      {"seed", U64ToHex(c.seed)},   {"shuffle", c.shuffle},         {"seq_len", c.seq_len},
      {"batch_size", c.batch_size}, {"range_begin", c.range_begin}, {"range_end", c.range_end},
      {"epoch", c.epoch},           {"position", c.position},       {"batches", c.batches}};
}

absl::StatusOr<SamplerCursor> CursorFromJson(const Fields& f) {
  SamplerCursor c;
  DATTN_ASSIGN(c.seed, f.Hex("seed"));
  DATTN_ASSIGN(c.shuffle, f.Bool("shuffle"));
  DATTN_ASSIGN(c.seq_len, f.Int("seq_len"));
  DATTN_ASSIGN(c.batch_size, f.Int("batch_size"));
  DATTN_ASSIGN(c.range_begin, f.Int("range_begin"));
  DATTN_ASSIGN(c.range_end, f.Int("range_end"));
  DATTN_ASSIGN(c.epoch, f.Int("epoch"));
  DATTN_ASSIGN(c.position, f.Int("position"));
  DATTN_ASSIGN(c.batches, f.Int("batches"));
  return c;
}

// The compact, key-sorted text the manifest's checksum covers.
absl::StatusOr<std::string> ManifestDigest(Json manifest) {
  manifest.erase("manifest_sha256");
  return Sha256Hex(manifest.dump());
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) return FileError("remove", path, ec.value());
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Checks the tensors of `file` against `layout` with names prefix + entry name: every entry
// present, same shape, F32, and no others beyond `allowed_extra`.
absl::Status CheckAgainstLayout(const SafetensorsFile& file, const ParamLayout& layout,
                                const std::vector<std::string>& prefixes,
                                const std::set<std::string>& allowed_extra) {
  std::set<std::string> expected;
  for (const std::string& prefix : prefixes) {
    for (const ParamEntry& e : layout.entries()) {
      const std::string name = prefix + e.name;
      expected.insert(name);
      absl::StatusOr<const SafeTensorInfo*> info = file.Find(name);
      if (!info.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(file.name(), ": no tensor \"", name, "\", which the model's layout has"));
      }
      if ((*info)->shape != e.shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            file.name(), ": tensor \"", name, "\" has shape ", ShapeString((*info)->shape),
            ", the model's layout ", ShapeString(e.shape)));
      }
      if ((*info)->dtype != SafeDtype::kF32) {
        return absl::FailedPreconditionError(absl::StrCat(file.name(), ": tensor \"", name,
                                                          "\" is ", SafeDtypeName((*info)->dtype),
                                                          ", expected F32"));
      }
    }
  }
  for (const SafeTensorInfo& t : file.tensors()) {
    if (!expected.count(t.name) && !allowed_extra.count(t.name)) {
      return absl::FailedPreconditionError(
          absl::StrCat(file.name(), ": tensor \"", t.name, "\" is not in the model's layout"));
    }
  }
  return absl::OkStatus();
}

// Copies elements [begin, begin + out.size()) of the flat buffer from per-entry tensors.
void CopyRange(const SafetensorsFile& file, const ParamLayout& layout, const std::string& prefix,
               int64_t begin, absl::Span<float> out) {
  const int64_t end = begin + static_cast<int64_t>(out.size());
  for (const ParamEntry& e : layout.entries()) {
    const int64_t lo = std::max(begin, e.offset);
    const int64_t hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    const SafeTensorInfo* info = *file.Find(prefix + e.name);
    const char* src = file.Data(*info).data() + (lo - e.offset) * 4;
    std::memcpy(out.data() + (lo - begin), src, static_cast<size_t>(hi - lo) * 4);
  }
}

absl::Status CheckRange(const ParamLayout& layout, int64_t begin, int64_t size) {
  if (begin < 0 || size < 0 || begin > layout.total() || size > layout.total() - begin) {
    return absl::InvalidArgumentError(absl::StrCat("elements [", begin, ", ", begin + size,
                                                   ") are not inside the layout's [0, ",
                                                   layout.total(), ")"));
  }
  return absl::OkStatus();
}

// The manifest entry of a file written under `dir`.
absl::StatusOr<CheckpointFile> DescribeFile(const std::string& dir, const std::string& name) {
  const std::string path = JoinPath(dir, name);
  absl::StatusOr<std::string> digest = Sha256FileHex(path);
  if (!digest.ok()) return digest.status();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return FileError("stat", path, errno);
  return CheckpointFile{name, static_cast<int64_t>(st.st_size), *digest};
}

// Writes MANIFEST.json (with its own checksum) into `dir`, then fsyncs `dir`, renames it to
// `final_dir` and fsyncs `root`.
absl::Status WriteManifestAndCommit(const std::string& root, const std::string& dir,
                                    const std::string& final_dir, Json manifest) {
  absl::StatusOr<std::string> self = ManifestDigest(manifest);
  if (!self.ok()) return self.status();
  manifest["manifest_sha256"] = *self;
  if (absl::Status s = WriteWholeFile(JoinPath(dir, kManifestFile), manifest.dump(2) + "\n", true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = FsyncPath(dir); !s.ok()) return s;
  if (::rename(dir.c_str(), final_dir.c_str()) != 0) {
    return FileError(absl::StrCat("rename ", dir, " to"), final_dir, errno);
  }
  return FsyncPath(root);
}

// Checks a listed file of the manifest: present, of the listed size, and (verify) of the listed
// SHA-256. DATA_LOSS naming the file otherwise.
absl::Status VerifyListedFile(const std::string& dir, const std::string& manifest_path,
                              const Json& files, const std::string& file, bool verify) {
  const Json* entry = nullptr;
  for (const Json& f : files) {
    if (f.is_object() && f.contains("name") && f["name"] == file) entry = &f;
  }
  if (entry == nullptr) {
    return absl::DataLossError(absl::StrCat(manifest_path, " does not list ", file));
  }
  Fields ff(*entry, manifest_path, absl::StrCat("files[", file, "]."));
  int64_t bytes;
  DATTN_ASSIGN(bytes, ff.Int("bytes"));
  std::string sha;
  DATTN_ASSIGN(sha, ff.String("sha256"));
  const std::string path = JoinPath(dir, file);
  struct stat fst;
  if (::stat(path.c_str(), &fst) != 0) {
    if (errno == ENOENT) return absl::DataLossError(absl::StrCat(path, " is missing"));
    return absl::DataLossError(FileError("stat", path, errno).message());
  }
  if (static_cast<int64_t>(fst.st_size) != bytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", static_cast<int64_t>(fst.st_size),
                                            " bytes, the manifest says ", bytes,
                                            fst.st_size < bytes ? " (truncated)" : " (grown)"));
  }
  if (verify) {
    absl::StatusOr<std::string> digest = Sha256FileHex(path);
    if (!digest.ok()) return digest.status();
    if (*digest != sha) {
      return absl::DataLossError(absl::StrCat(
          path, ": SHA-256 is ", *digest, ", the manifest says ", sha, " (the file is corrupt)"));
    }
  }
  return absl::OkStatus();
}

// An int64 from a safetensors metadata value; DATA_LOSS naming the file and key otherwise.
absl::StatusOr<int64_t> MetadataInt(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  int64_t value;
  if (it == file.metadata().end() || !absl::SimpleAtoi(it->second, &value)) {
    return absl::DataLossError(
        absl::StrCat(file.name(), ": metadata \"", key, "\" is missing or not an integer"));
  }
  return value;
}

absl::Status CheckCommonContents(const std::string& model_config_json, const TrainerState& t,
                                 const char* who) {
  if (t.step < 0) return absl::InvalidArgumentError(absl::StrCat(who, ": step ", t.step));
  if (absl::StatusOr<Json> config = ParseJson(model_config_json, "the model config");
      !config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", config.status().message()));
  }
  absl::StatusOr<Json> extra = ParseJson(t.extra_json, "trainer extra_json");
  if (!extra.ok() || !extra->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": trainer extra_json is not a JSON object: ", t.extra_json));
  }
  return absl::OkStatus();
}

std::string TempFolder(const std::string& root, int64_t step) {
  return JoinPath(root, absl::StrCat(".", CheckpointFolderName(step), ".tmp"));
}

}  // namespace

std::string CheckpointFolderName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string TrainerStateToJson(const TrainerState& s) {
  Json rng = Json::array();
  for (uint64_t word : s.rng_state) rng.push_back(U64ToHex(word));
  Json j = {
      {"format", kTrainerFormat},
      {"version", kTrainerVersion},
      {"step", s.step},
      {"tokens_seen", s.tokens_seen},
      {"sampler", CursorToJson(s.sampler)},
      {"rng_state", rng},
      {"lr_schedule",
       {{"peak_lr", s.schedule.peak_lr},
        {"min_lr", s.schedule.min_lr},
        {"warmup_steps", s.schedule.warmup_steps},
        {"total_steps", s.schedule.total_steps},
        {"lr_at_next_step", s.schedule.At(s.step + 1)}}},
      {"adamw",
       {{"beta1", s.adamw.beta1},
        {"beta2", s.adamw.beta2},
        {"epsilon", s.adamw.epsilon},
        {"weight_decay", s.adamw.weight_decay}}},
      {"max_grad_norm", std::isinf(s.max_grad_norm) ? Json(nullptr) : Json(s.max_grad_norm)},
  };
  try {
    j["extra"] = Json::parse(s.extra_json);
  } catch (const Json::exception&) {
    j["extra"] = s.extra_json;  // SaveCheckpoint refuses this case before writing anything.
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<TrainerState> TrainerStateFromJson(absl::string_view text, const std::string& name) {
  absl::StatusOr<Json> j = ParseJson(text, name);
  if (!j.ok()) return j.status();
  Fields f(*j, name);
  TrainerState s;
  std::string format;
  DATTN_ASSIGN(format, f.String("format"));
  if (format != kTrainerFormat) return f.Bad("format", absl::StrCat("is \"", format, "\""));
  int64_t version;
  DATTN_ASSIGN(version, f.Int("version"));
  if (version != kTrainerVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": version ", version, ", this build reads ", kTrainerVersion));
  }
  DATTN_ASSIGN(s.step, f.Int("step"));
  DATTN_ASSIGN(s.tokens_seen, f.Int("tokens_seen"));
  const Json* sampler;
  DATTN_ASSIGN(sampler, f.Get("sampler"));
  DATTN_ASSIGN(s.sampler, CursorFromJson(f.Sub(*sampler, "sampler")));
  const Json* rng;
  DATTN_ASSIGN(rng, f.Get("rng_state"));
  if (!rng->is_array() || rng->size() != 4) return f.Bad("rng_state", "is not 4 words");
  for (size_t i = 0; i < 4; ++i) {
    if (!(*rng)[i].is_string()) return f.Bad("rng_state", "holds a non-string");
    absl::StatusOr<uint64_t> word = HexToU64((*rng)[i].get<std::string>());
    if (!word.ok()) return f.Bad("rng_state", word.status().message());
    s.rng_state[i] = *word;
  }
  const Json* schedule;
  DATTN_ASSIGN(schedule, f.Get("lr_schedule"));
  Fields fs = f.Sub(*schedule, "lr_schedule");
  DATTN_ASSIGN(s.schedule.peak_lr, fs.Double("peak_lr"));
  DATTN_ASSIGN(s.schedule.min_lr, fs.Double("min_lr"));
  DATTN_ASSIGN(s.schedule.warmup_steps, fs.Int("warmup_steps"));
  DATTN_ASSIGN(s.schedule.total_steps, fs.Int("total_steps"));
  const Json* adamw;
  DATTN_ASSIGN(adamw, f.Get("adamw"));
  Fields fa = f.Sub(*adamw, "adamw");
  DATTN_ASSIGN(s.adamw.beta1, fa.Double("beta1"));
  DATTN_ASSIGN(s.adamw.beta2, fa.Double("beta2"));
  DATTN_ASSIGN(s.adamw.epsilon, fa.Double("epsilon"));
  DATTN_ASSIGN(s.adamw.weight_decay, fa.Double("weight_decay"));
  const Json* clip;
  DATTN_ASSIGN(clip, f.Get("max_grad_norm"));
  if (clip->is_null()) {
    s.max_grad_norm = std::numeric_limits<double>::infinity();
  } else if (clip->is_number()) {
    s.max_grad_norm = clip->get<double>();
  } else {
    return f.Bad("max_grad_norm", "is not a number or null");
  }
  const Json* extra;
  DATTN_ASSIGN(extra, f.Get("extra"));
  if (!extra->is_object()) return f.Bad("extra", "is not an object");
  s.extra_json = extra->dump();
  return s;
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& root, const CheckpointContents& c) {
  if (c.layout == nullptr || c.optimizer == nullptr) {
    return absl::InvalidArgumentError("SaveCheckpoint: layout and optimizer are required");
  }
  const int64_t total = c.layout->total();
  if (static_cast<int64_t>(c.params.size()) != total ||
      static_cast<int64_t>(c.optimizer->m.size()) != total ||
      static_cast<int64_t>(c.optimizer->v.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SaveCheckpoint: the layout has ", total, " elements; params ", c.params.size(), ", m ",
        c.optimizer->m.size(), ", v ", c.optimizer->v.size()));
  }
  if (absl::Status s = CheckCommonContents(c.model_config_json, c.trainer, "SaveCheckpoint");
      !s.ok()) {
    return s;
  }

  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return FileError("create folder", root, ec.value());
  const std::string name = CheckpointFolderName(c.trainer.step);
  const std::string final_dir = JoinPath(root, name);
  if (Exists(final_dir)) {
    return absl::AlreadyExistsError(absl::StrCat(final_dir, " already exists"));
  }
  const std::string tmp = JoinPath(root, absl::StrCat(".", name, ".tmp"));
  if (absl::Status s = RemoveTree(tmp); !s.ok()) return s;
  if (::mkdir(tmp.c_str(), 0755) != 0) return FileError("create folder", tmp, errno);

  auto write_all = [&]() -> absl::Status {
    const ParamLayout& layout = *c.layout;
    const std::string step_text = absl::StrCat(c.trainer.step);
    std::vector<TensorToWrite> weights;
    for (const ParamEntry& e : layout.entries()) {
      weights.push_back(TensorToWrite::F32(e.name, e.shape, c.params.subspan(e.offset, e.numel)));
    }
    if (absl::Status s =
            WriteSafetensors(JoinPath(tmp, kWeightsFile), weights,
                             {{"format", "pt"}, {"dattn", "weights"}, {"step", step_text}},
                             /*sync=*/true);
        !s.ok()) {
      return s;
    }
    const int64_t opt_step = c.optimizer->step;
    std::vector<TensorToWrite> moments;
    const absl::Span<const float> m(c.optimizer->m), v(c.optimizer->v);
    for (const ParamEntry& e : layout.entries()) {
      moments.push_back(
          TensorToWrite::F32("exp_avg." + e.name, e.shape, m.subspan(e.offset, e.numel)));
    }
    for (const ParamEntry& e : layout.entries()) {
      moments.push_back(
          TensorToWrite::F32("exp_avg_sq." + e.name, e.shape, v.subspan(e.offset, e.numel)));
    }
    moments.push_back(
        TensorToWrite{"step",
                      SafeDtype::kI64,
                      {},
                      absl::string_view(reinterpret_cast<const char*>(&opt_step), 8)});
    if (absl::Status s =
            WriteSafetensors(JoinPath(tmp, kOptimizerFile), moments,
                             {{"format", "pt"}, {"dattn", "adamw"}, {"step", step_text}},
                             /*sync=*/true);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = WriteWholeFile(JoinPath(tmp, kConfigFile), c.model_config_json, true);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            WriteWholeFile(JoinPath(tmp, kTrainerStateFile), TrainerStateToJson(c.trainer), true);
        !s.ok()) {
      return s;
    }
    Json files = Json::array();
    for (const char* file : kDataFiles) {
      absl::StatusOr<CheckpointFile> f = DescribeFile(tmp, file);
      if (!f.ok()) return f.status();
      files.push_back(Json{{"name", f->name}, {"bytes", f->bytes}, {"sha256", f->sha256}});
    }
    Json manifest = {{"format", kManifestFormat},
                     {"version", kManifestVersion},
                     {"step", c.trainer.step},
                     {"files", files}};
    return WriteManifestAndCommit(root, tmp, final_dir, std::move(manifest));
  };
  absl::Status s = write_all();
  if (!s.ok()) {
    (void)RemoveTree(tmp);
    return s;
  }
  return final_dir;
}

std::string WeightsShardFileName(int shard, int shards) {
  return absl::StrFormat("weights-%05d-of-%05d.safetensors", shard, shards);
}

std::string OptimizerShardFileName(int shard, int shards) {
  return absl::StrFormat("optimizer-%05d-of-%05d.safetensors", shard, shards);
}

std::vector<int> WeightsShardOfEntries(const ParamLayout& layout, int shards) {
  std::vector<int> out;
  const __int128 total = std::max<int64_t>(layout.total(), 1);
  for (const ParamEntry& e : layout.entries()) {
    // Twice the midpoint, against twice the total: exact in integers.
    const __int128 mid2 = 2 * static_cast<__int128>(e.offset) + e.numel;
    const int shard = static_cast<int>(static_cast<__int128>(shards) * mid2 / (2 * total));
    out.push_back(std::min(std::max(shard, 0), shards - 1));
  }
  return out;
}

std::vector<ElementRange> WeightsShardRanges(const ParamLayout& layout, int shards) {
  const std::vector<int> of = WeightsShardOfEntries(layout, shards);
  std::vector<ElementRange> ranges(static_cast<size_t>(std::max(shards, 0)),
                                   ElementRange{layout.total(), layout.total()});
  // `of` is non-decreasing: one pass. `next` is the first shard no entry has reached yet; an empty
  // shard before an entry's is an empty range at that entry.
  int next = 0;
  for (size_t i = 0; i < of.size(); ++i) {
    const ParamEntry& e = layout.entries()[i];
    const int t = of[i];
    for (; next < t; ++next) ranges[static_cast<size_t>(next)] = {e.offset, e.offset};
    if (next == t) {
      ranges[static_cast<size_t>(t)] = {e.offset, e.offset + e.numel};
      ++next;
    } else {
      ranges[static_cast<size_t>(t)].end = e.offset + e.numel;
    }
  }
  return ranges;
}

ElementRange WeightsShardRange(const ParamLayout& layout, int shard, int shards) {
  if (shard < 0 || shard >= shards) return {layout.total(), layout.total()};
  return WeightsShardRanges(layout, shards)[static_cast<size_t>(shard)];
}

absl::StatusOr<std::string> BeginShardedCheckpoint(const std::string& root, int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("BeginShardedCheckpoint: step ", step));
  }
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return FileError("create folder", root, ec.value());
  const std::string final_dir = JoinPath(root, CheckpointFolderName(step));
  if (Exists(final_dir)) {
    return absl::AlreadyExistsError(absl::StrCat(final_dir, " already exists"));
  }
  const std::string tmp = TempFolder(root, step);
  if (absl::Status s = RemoveTree(tmp); !s.ok()) return s;
  if (::mkdir(tmp.c_str(), 0755) != 0) return FileError("create folder", tmp, errno);
  return tmp;
}

absl::StatusOr<std::vector<CheckpointFile>> WriteCheckpointShard(const std::string& tmp_dir,
                                                                 const CheckpointShard& c) {
  if (c.layout == nullptr) {
    return absl::InvalidArgumentError("WriteCheckpointShard: a layout is required");
  }
  if (c.shards < 1 || c.shards > kMaxShards || c.shard < 0 || c.shard >= c.shards) {
    return absl::InvalidArgumentError(absl::StrCat("WriteCheckpointShard: shard ", c.shard, " of ",
                                                   c.shards, " (shards must be 1 .. ", kMaxShards,
                                                   ")"));
  }
  const ParamLayout& layout = *c.layout;
  const ElementRange weights = WeightsShardRange(layout, c.shard, c.shards);
  const int64_t params_end = c.weights_begin + static_cast<int64_t>(c.params.size());
  if (c.weights_begin > weights.begin || params_end < weights.end) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteCheckpointShard: params cover elements [", c.weights_begin, ", ",
                     params_end, "); weights file ", c.shard, " of ", c.shards, " holds [",
                     weights.begin, ", ", weights.end, ")"));
  }
  const int64_t moments_end = c.moments_begin + static_cast<int64_t>(c.m.size());
  if (c.m.size() != c.v.size() || c.moments_begin < 0 || moments_end > layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteCheckpointShard: moments of ", c.m.size(), " and ", c.v.size(),
        " elements from element ", c.moments_begin, " in a layout of ", layout.total()));
  }
  const std::string step_text = absl::StrCat(c.step);
  const std::string shard_text = absl::StrCat(c.shard);
  const std::string shards_text = absl::StrCat(c.shards);
  const std::vector<int> of = WeightsShardOfEntries(layout, c.shards);
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < of.size(); ++i) {
    if (of[i] != c.shard) continue;
    const ParamEntry& e = layout.entries()[i];
    tensors.push_back(
        TensorToWrite::F32(e.name, e.shape, c.params.subspan(e.offset - c.weights_begin, e.numel)));
  }
  const std::string weights_name = WeightsShardFileName(c.shard, c.shards);
  if (absl::Status s = WriteSafetensors(JoinPath(tmp_dir, weights_name), tensors,
                                        {{"format", "pt"},
                                         {"dattn", "weights-shard"},
                                         {"step", step_text},
                                         {"shard", shard_text},
                                         {"shards", shards_text}},
                                        /*sync=*/true);
      !s.ok()) {
    return s;
  }
  const int64_t len = static_cast<int64_t>(c.m.size());
  const int64_t opt_step = c.optimizer_step;
  std::vector<TensorToWrite> moments = {
      TensorToWrite::F32("exp_avg", {len}, c.m), TensorToWrite::F32("exp_avg_sq", {len}, c.v),
      TensorToWrite{"step",
                    SafeDtype::kI64,
                    {},
                    absl::string_view(reinterpret_cast<const char*>(&opt_step), 8)}};
  const std::string optimizer_name = OptimizerShardFileName(c.shard, c.shards);
  if (absl::Status s = WriteSafetensors(JoinPath(tmp_dir, optimizer_name), moments,
                                        {{"format", "pt"},
                                         {"dattn", "adamw-shard"},
                                         {"step", step_text},
                                         {"shard", shard_text},
                                         {"shards", shards_text},
                                         {"begin", absl::StrCat(c.moments_begin)},
                                         {"end", absl::StrCat(moments_end)},
                                         {"total", absl::StrCat(layout.total())}},
                                        /*sync=*/true);
      !s.ok()) {
    return s;
  }
  std::vector<CheckpointFile> files;
  for (const std::string& name : {weights_name, optimizer_name}) {
    absl::StatusOr<CheckpointFile> f = DescribeFile(tmp_dir, name);
    if (!f.ok()) return f.status();
    files.push_back(*std::move(f));
  }
  return files;
}

absl::StatusOr<std::string> CommitShardedCheckpoint(const std::string& root,
                                                    const ShardedCheckpointCommit& c) {
  if (c.layout == nullptr) {
    return absl::InvalidArgumentError("CommitShardedCheckpoint: a layout is required");
  }
  if (c.shards < 1 || c.shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommitShardedCheckpoint: ", c.shards, " shards (1 .. ", kMaxShards, ")"));
  }
  if (absl::Status s =
          CheckCommonContents(c.model_config_json, c.trainer, "CommitShardedCheckpoint");
      !s.ok()) {
    return s;
  }
  // Exactly the files the shards write, each once.
  std::set<std::string> expected;
  for (int r = 0; r < c.shards; ++r) {
    expected.insert(WeightsShardFileName(r, c.shards));
    expected.insert(OptimizerShardFileName(r, c.shards));
  }
  std::set<std::string> given;
  for (const CheckpointFile& f : c.shard_files) {
    if (!expected.count(f.name) || !given.insert(f.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("CommitShardedCheckpoint: file \"", f.name,
                                                     "\" is not one of the ", c.shards,
                                                     " shards' files, or is listed twice"));
    }
  }
  if (given.size() != expected.size()) {
    for (const std::string& name : expected) {
      if (!given.count(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("CommitShardedCheckpoint: no digest of ", name));
      }
    }
  }
  const std::string tmp = TempFolder(root, c.trainer.step);
  const std::string final_dir = JoinPath(root, CheckpointFolderName(c.trainer.step));
  if (Exists(final_dir)) {
    return absl::AlreadyExistsError(absl::StrCat(final_dir, " already exists"));
  }
  // The index of the weights, as Hugging Face's model.safetensors.index.json.
  Json weight_map = Json::object();
  const std::vector<int> of = WeightsShardOfEntries(*c.layout, c.shards);
  for (size_t i = 0; i < of.size(); ++i) {
    weight_map[c.layout->entries()[i].name] = WeightsShardFileName(of[i], c.shards);
  }
  const Json index = {{"metadata", {{"total_size", c.layout->total() * 4}}},
                      {"weight_map", weight_map}};
  if (absl::Status s = WriteWholeFile(JoinPath(tmp, kWeightsIndexFile), index.dump(2) + "\n", true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteWholeFile(JoinPath(tmp, kConfigFile), c.model_config_json, true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          WriteWholeFile(JoinPath(tmp, kTrainerStateFile), TrainerStateToJson(c.trainer), true);
      !s.ok()) {
    return s;
  }
  Json files = Json::array();
  for (int r = 0; r < c.shards; ++r) {
    for (const std::string& name :
         {WeightsShardFileName(r, c.shards), OptimizerShardFileName(r, c.shards)}) {
      for (const CheckpointFile& f : c.shard_files) {
        if (f.name == name) {
          files.push_back(Json{{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
        }
      }
    }
  }
  for (const char* name : {kWeightsIndexFile, kConfigFile, kTrainerStateFile}) {
    absl::StatusOr<CheckpointFile> f = DescribeFile(tmp, name);
    if (!f.ok()) return f.status();
    files.push_back(Json{{"name", f->name}, {"bytes", f->bytes}, {"sha256", f->sha256}});
  }
  Json manifest = {{"format", kManifestFormat},
                   {"version", kShardedManifestVersion},
                   {"step", c.trainer.step},
                   {"world", c.shards},
                   {"files", files}};
  if (absl::Status s = WriteManifestAndCommit(root, tmp, final_dir, std::move(manifest)); !s.ok()) {
    return s;
  }
  return final_dir;
}

absl::Status AbortShardedCheckpoint(const std::string& root, int64_t step) {
  return RemoveTree(TempFolder(root, step));
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir, bool verify_checksums) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no checkpoint at ", dir));
    return FileError("stat", dir, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a checkpoint folder"));
  }
  const std::string manifest_path = JoinPath(dir, kManifestFile);
  absl::StatusOr<std::string> manifest_text = ReadSmallFile(manifest_path, kMaxJsonFile);
  if (!manifest_text.ok()) {
    if (absl::IsNotFound(manifest_text.status())) {
      return absl::DataLossError(
          absl::StrCat(manifest_path,
                       " is missing: the checkpoint is incomplete (a save that did not finish, "
                       "or a copy that lost files)"));
    }
    return absl::DataLossError(manifest_text.status().message());
  }
  absl::StatusOr<Json> manifest = ParseJson(*manifest_text, manifest_path);
  if (!manifest.ok()) return manifest.status();
  Fields mf(*manifest, manifest_path);
  std::string recorded;
  DATTN_ASSIGN(recorded, mf.String("manifest_sha256"));
  absl::StatusOr<std::string> actual = ManifestDigest(*manifest);
  if (!actual.ok()) return actual.status();
  if (*actual != recorded) {
    return absl::DataLossError(absl::StrCat(
        manifest_path, ": its content does not match its own checksum (the manifest is corrupt)"));
  }
  std::string format;
  DATTN_ASSIGN(format, mf.String("format"));
  if (format != kManifestFormat) return mf.Bad("format", absl::StrCat("is \"", format, "\""));
  int64_t version;
  DATTN_ASSIGN(version, mf.Int("version"));
  if (version != kManifestVersion && version != kShardedManifestVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest_path, ": checkpoint version ", version, ", this build reads ",
                     kManifestVersion, " and ", kShardedManifestVersion));
  }
  const Json* files;
  DATTN_ASSIGN(files, mf.Get("files"));
  if (!files->is_array()) return mf.Bad("files", "is not a list");
  int64_t world = 1;
  if (version == kShardedManifestVersion) {
    DATTN_ASSIGN(world, mf.Int("world"));
    if (world < 1 || world > kMaxShards) {
      return mf.Bad("world", absl::StrCat("is ", world, ", not in 1 .. ", kMaxShards));
    }
  }
  std::vector<std::string> required;
  if (version == kManifestVersion) {
    for (const char* file : kDataFiles) required.push_back(file);
  } else {
    for (int r = 0; r < world; ++r) {
      required.push_back(WeightsShardFileName(r, static_cast<int>(world)));
      required.push_back(OptimizerShardFileName(r, static_cast<int>(world)));
    }
    for (const char* file : {kWeightsIndexFile, kConfigFile, kTrainerStateFile}) {
      required.push_back(file);
    }
  }
  for (const std::string& file : required) {
    if (absl::Status s = VerifyListedFile(dir, manifest_path, *files, file, verify_checksums);
        !s.ok()) {
      return s;
    }
  }

  Checkpoint ck;
  ck.dir_ = dir;
  const std::string config_path = JoinPath(dir, kConfigFile);
  absl::StatusOr<std::string> config = ReadSmallFile(config_path, kMaxJsonFile);
  if (!config.ok()) return absl::DataLossError(config.status().message());
  if (absl::StatusOr<Json> parsed = ParseJson(*config, config_path); !parsed.ok()) {
    return parsed.status();
  }
  ck.config_ = std::move(*config);
  const std::string state_path = JoinPath(dir, kTrainerStateFile);
  absl::StatusOr<std::string> state_text = ReadSmallFile(state_path, kMaxJsonFile);
  if (!state_text.ok()) return absl::DataLossError(state_text.status().message());
  DATTN_ASSIGN(ck.trainer_, TrainerStateFromJson(*state_text, state_path));
  int64_t manifest_step;
  DATTN_ASSIGN(manifest_step, mf.Int("step"));
  if (manifest_step != ck.trainer_.step) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": step ", manifest_step, " but ",
                                            state_path, " says ", ck.trainer_.step));
  }
  ck.version_ = static_cast<int>(version);
  ck.world_ = static_cast<int>(world);
  if (version == kShardedManifestVersion) {
    if (absl::Status s = ck.OpenV2(world); !s.ok()) return s;
    return ck;
  }
  ck.weights_.resize(1);
  ck.optimizer_.resize(1);
  DATTN_ASSIGN(ck.weights_[0], SafetensorsFile::Open(JoinPath(dir, kWeightsFile)));
  DATTN_ASSIGN(ck.optimizer_[0], SafetensorsFile::Open(JoinPath(dir, kOptimizerFile)));
  const SafetensorsFile& opt = ck.optimizer_[0];
  absl::StatusOr<const SafeTensorInfo*> step = opt.Find("step");
  if (!step.ok() || (*step)->dtype != SafeDtype::kI64 || !(*step)->shape.empty()) {
    return absl::DataLossError(absl::StrCat(opt.name(), ": no tensor \"step\" (an I64 scalar)"));
  }
  std::memcpy(&ck.optimizer_step_, opt.Data(**step).data(), 8);
  return ck;
}

absl::Status Checkpoint::OpenV2(int64_t world) {
  const int shards = static_cast<int>(world);
  // The weights files and their index: every tensor of the files in the index, mapped to the file
  // that holds it, and nothing else in the index.
  std::map<std::string, int> holder;  // Tensor name -> file.
  for (int r = 0; r < shards; ++r) {
    absl::StatusOr<SafetensorsFile> f =
        SafetensorsFile::Open(JoinPath(dir_, WeightsShardFileName(r, shards)));
    if (!f.ok()) return f.status();
    for (const SafeTensorInfo& t : f->tensors()) {
      if (!holder.emplace(t.name, r).second) {
        return absl::DataLossError(absl::StrCat(f->name(), ": tensor \"", t.name, "\" is also in ",
                                                WeightsShardFileName(holder[t.name], shards)));
      }
    }
    weights_.push_back(*std::move(f));
  }
  const std::string index_path = JoinPath(dir_, kWeightsIndexFile);
  absl::StatusOr<std::string> index_text = ReadSmallFile(index_path, kMaxJsonFile);
  if (!index_text.ok()) return absl::DataLossError(index_text.status().message());
  absl::StatusOr<Json> index = ParseJson(*index_text, index_path);
  if (!index.ok()) return index.status();
  Fields fi(*index, index_path);
  const Json* weight_map;
  DATTN_ASSIGN(weight_map, fi.Get("weight_map"));
  if (!weight_map->is_object()) return fi.Bad("weight_map", "is not an object");
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    auto held = holder.find(it.key());
    if (held == holder.end()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": tensor \"", it.key(), "\" is in no weights file"));
    }
    const std::string file = WeightsShardFileName(held->second, shards);
    if (!it.value().is_string() || it.value().get<std::string>() != file) {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor \"", it.key(), "\" maps to ",
                                              it.value().dump(), ", it is in ", file));
    }
  }
  if (weight_map->size() != holder.size()) {
    for (const auto& [name, r] : holder) {
      if (!weight_map->contains(name)) {
        return absl::DataLossError(absl::StrCat(index_path, ": tensor \"", name, "\" of ",
                                                WeightsShardFileName(r, shards),
                                                " is not in the index"));
      }
    }
  }
  // The optimizer shards: consecutive ranges tiling [0, total), one update count.
  int64_t next = 0;
  for (int r = 0; r < shards; ++r) {
    absl::StatusOr<SafetensorsFile> f =
        SafetensorsFile::Open(JoinPath(dir_, OptimizerShardFileName(r, shards)));
    if (!f.ok()) return f.status();
    int64_t begin, end, total;
    DATTN_ASSIGN(begin, MetadataInt(*f, "begin"));
    DATTN_ASSIGN(end, MetadataInt(*f, "end"));
    DATTN_ASSIGN(total, MetadataInt(*f, "total"));
    if (begin != next || end < begin || (r > 0 && total != moments_total_) ||
        (r == shards - 1 && end != total)) {
      return absl::DataLossError(
          absl::StrCat(f->name(), ": elements [", begin, ", ", end, ") of ", total,
                       " do not continue the shards before it (which end at ", next, ")"));
    }
    moments_total_ = total;
    next = end;
    for (const char* name : {"exp_avg", "exp_avg_sq"}) {
      absl::StatusOr<const SafeTensorInfo*> t = f->Find(name);
      if (!t.ok() || (*t)->dtype != SafeDtype::kF32 ||
          (*t)->shape != std::vector<int64_t>{end - begin}) {
        return absl::DataLossError(
            absl::StrCat(f->name(), ": no tensor \"", name, "\" of F32[", end - begin, "]"));
      }
    }
    absl::StatusOr<const SafeTensorInfo*> step = f->Find("step");
    if (!step.ok() || (*step)->dtype != SafeDtype::kI64 || !(*step)->shape.empty()) {
      return absl::DataLossError(absl::StrCat(f->name(), ": no tensor \"step\" (an I64 scalar)"));
    }
    int64_t updates;
    std::memcpy(&updates, f->Data(**step).data(), 8);
    if (r > 0 && updates != optimizer_step_) {
      return absl::DataLossError(absl::StrCat(f->name(), ": step ", updates, ", ",
                                              OptimizerShardFileName(0, shards), " says ",
                                              optimizer_step_));
    }
    optimizer_step_ = updates;
    moment_ranges_.push_back({begin, end});
    optimizer_.push_back(*std::move(f));
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::CheckWeights(const ParamLayout& layout) const {
  if (version_ == kManifestVersion) return CheckAgainstLayout(weights_[0], layout, {""}, {});
  const std::string index = JoinPath(dir_, kWeightsIndexFile);
  for (const ParamEntry& e : layout.entries()) {
    const SafeTensorInfo* info = nullptr;
    const SafetensorsFile* file = nullptr;
    for (const SafetensorsFile& f : weights_) {
      absl::StatusOr<const SafeTensorInfo*> t = f.Find(e.name);
      if (t.ok()) {
        info = *t;
        file = &f;
        break;
      }
    }
    if (info == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(index, ": no tensor \"", e.name, "\", which the model's layout has"));
    }
    if (info->shape != e.shape) {
      return absl::FailedPreconditionError(
          absl::StrCat(file->name(), ": tensor \"", e.name, "\" has shape ",
                       ShapeString(info->shape), ", the model's layout ", ShapeString(e.shape)));
    }
    if (info->dtype != SafeDtype::kF32) {
      return absl::FailedPreconditionError(absl::StrCat(file->name(), ": tensor \"", e.name,
                                                        "\" is ", SafeDtypeName(info->dtype),
                                                        ", expected F32"));
    }
  }
  std::set<std::string> names;
  for (const ParamEntry& e : layout.entries()) names.insert(e.name);
  for (const SafetensorsFile& f : weights_) {
    for (const SafeTensorInfo& t : f.tensors()) {
      if (!names.count(t.name)) {
        return absl::FailedPreconditionError(
            absl::StrCat(f.name(), ": tensor \"", t.name, "\" is not in the model's layout"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::ReadWeights(const ParamLayout& layout, int64_t begin,
                                     absl::Span<float> out) const {
  if (absl::Status s = CheckRange(layout, begin, static_cast<int64_t>(out.size())); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckWeights(layout); !s.ok()) return s;
  if (version_ == kManifestVersion) {
    CopyRange(weights_[0], layout, "", begin, out);
    return absl::OkStatus();
  }
  const int64_t end = begin + static_cast<int64_t>(out.size());
  for (const ParamEntry& e : layout.entries()) {
    const int64_t lo = std::max(begin, e.offset);
    const int64_t hi = std::min(end, e.offset + e.numel);
    if (lo >= hi) continue;
    for (const SafetensorsFile& f : weights_) {
      absl::StatusOr<const SafeTensorInfo*> info = f.Find(e.name);
      if (!info.ok()) continue;
      const char* src = f.Data(**info).data() + (lo - e.offset) * 4;
      std::memcpy(out.data() + (lo - begin), src, static_cast<size_t>(hi - lo) * 4);
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::ReadMoments(const ParamLayout& layout, int64_t begin, absl::Span<float> m,
                                     absl::Span<float> v) const {
  if (m.size() != v.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadMoments: m has ", m.size(), " elements, v ", v.size()));
  }
  if (absl::Status s = CheckRange(layout, begin, static_cast<int64_t>(m.size())); !s.ok()) {
    return s;
  }
  if (version_ == kManifestVersion) {
    if (absl::Status s =
            CheckAgainstLayout(optimizer_[0], layout, {"exp_avg.", "exp_avg_sq."}, {"step"});
        !s.ok()) {
      return s;
    }
    CopyRange(optimizer_[0], layout, "exp_avg.", begin, m);
    CopyRange(optimizer_[0], layout, "exp_avg_sq.", begin, v);
    return absl::OkStatus();
  }
  // The moments are flat: the layout must have their total (and the weights its tensors).
  if (moments_total_ != layout.total()) {
    return absl::FailedPreconditionError(
        absl::StrCat(optimizer_[0].name(), ": moments of ", moments_total_,
                     " elements, the model's layout has ", layout.total()));
  }
  if (absl::Status s = CheckWeights(layout); !s.ok()) return s;
  const int64_t end = begin + static_cast<int64_t>(m.size());
  for (size_t r = 0; r < optimizer_.size(); ++r) {
    const ElementRange& range = moment_ranges_[r];
    const int64_t lo = std::max(begin, range.begin);
    const int64_t hi = std::min(end, range.end);
    if (lo >= hi) continue;
    const SafetensorsFile& f = optimizer_[r];
    const size_t bytes = static_cast<size_t>(hi - lo) * 4;
    std::memcpy(m.data() + (lo - begin),
                f.Data(**f.Find("exp_avg")).data() + (lo - range.begin) * 4, bytes);
    std::memcpy(v.data() + (lo - begin),
                f.Data(**f.Find("exp_avg_sq")).data() + (lo - range.begin) * 4, bytes);
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::Restore(const ParamLayout& layout, absl::Span<float> params,
                                 AdamWState* state) const {
  if (state == nullptr) return absl::InvalidArgumentError("Checkpoint::Restore: null state");
  if (static_cast<int64_t>(params.size()) != layout.total()) {
    return absl::InvalidArgumentError(absl::StrCat("Checkpoint::Restore: params has ",
                                                   params.size(), " elements, the layout ",
                                                   layout.total()));
  }
  if (absl::Status s = ReadWeights(layout, 0, params); !s.ok()) return s;
  AdamWState restored;
  restored.m.resize(static_cast<size_t>(layout.total()));
  restored.v.resize(static_cast<size_t>(layout.total()));
  if (absl::Status s =
          ReadMoments(layout, 0, absl::MakeSpan(restored.m), absl::MakeSpan(restored.v));
      !s.ok()) {
    return s;
  }
  restored.step = optimizer_step_;
  *state = std::move(restored);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  fs::directory_iterator it(root, ec);
  if (ec) return FileError("list", root, ec.value());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) continue;
    const std::string digits = name.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) continue;
    int64_t step;
    if (!absl::SimpleAtoi(digits, &step)) continue;
    std::error_code dir_ec;
    if (!fs::is_directory(it->path(), dir_ec)) continue;
    CheckpointEntry e;
    e.step = step;
    e.path = JoinPath(root, name);
    e.has_manifest = Exists(JoinPath(e.path, kManifestFile));
    out.push_back(std::move(e));
  }
  if (ec) return FileError("list", root, ec.value());
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

absl::StatusOr<CheckpointEntry> LatestCheckpoint(const std::string& root,
                                                 std::vector<std::string>* skipped) {
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root);
  if (!all.ok()) return all.status();
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    absl::Status problem = Checkpoint::Open(it->path, /*verify_checksums=*/false).status();
    if (problem.ok()) return *it;
    if (skipped != nullptr) skipped->push_back(absl::StrCat(it->path, ": ", problem.message()));
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint under ", root));
}

absl::Status PinCheckpoint(const std::string& step_folder, const std::string& pin) {
  if (!Exists(JoinPath(step_folder, kManifestFile))) {
    return absl::NotFoundError(absl::StrCat("pin ", step_folder, ": no ", kManifestFile,
                                            " (the step never completed, or was pruned)"));
  }
  if (Exists(pin)) return absl::AlreadyExistsError(absl::StrCat("pin ", pin, ": exists"));
  const std::string parent = ParentDir(pin);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return FileError("create", parent, ec.value());
  const std::string tmp = pin + ".tmp";
  if (absl::Status s = RemoveTree(tmp); !s.ok()) return s;
  fs::create_directory(tmp, ec);
  if (ec) return FileError("create", tmp, ec.value());
  auto fail = [&](absl::Status s) {
    (void)RemoveTree(tmp);
    return s;
  };
  fs::directory_iterator it(step_folder, ec);
  if (ec) return fail(FileError("list", step_folder, ec.value()));
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    const std::string name = it->path().filename().string();
    const std::string link = JoinPath(tmp, name);
    fs::create_hard_link(it->path(), link, ec);
    if (ec)
      return fail(FileError(absl::StrCat("link ", it->path().string(), " as"), link, ec.value()));
  }
  if (ec) return fail(FileError("list", step_folder, ec.value()));
  if (absl::Status s = FsyncPath(tmp); !s.ok()) return fail(s);
  if (::rename(tmp.c_str(), pin.c_str()) != 0) {
    return fail(FileError(absl::StrCat("rename ", tmp, " to"), pin, errno));
  }
  if (absl::Status s = FsyncPath(parent); !s.ok()) return s;
  if (absl::Status s = Checkpoint::Open(pin, /*verify_checksums=*/false).status(); !s.ok()) {
    (void)RemoveTree(pin);
    return absl::DataLossError(absl::StrCat("pin ", step_folder,
                                            ": the step changed while it was "
                                            "linked (pruned?): ",
                                            s.message()));
  }
  return absl::OkStatus();
}

absl::Status RemoveCheckpointPin(const std::string& pin) {
  if (absl::Status s = RemoveTree(pin + ".tmp"); !s.ok()) return s;
  return RemoveTree(pin);
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& root, int64_t keep) {
  if (keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keep = ", keep, ": need >= 1"));
  }
  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(root);
  if (!all.ok()) return all.status();
  std::vector<int64_t> complete;
  for (const CheckpointEntry& e : *all) {
    if (e.has_manifest) complete.push_back(e.step);
  }
  std::vector<std::string> removed;
  if (complete.empty()) return removed;
  const int64_t newest = complete.back();
  const int64_t oldest_kept =
      static_cast<int64_t>(complete.size()) > keep ? complete[complete.size() - keep] : complete[0];
  for (const CheckpointEntry& e : *all) {
    if (e.step >= oldest_kept) continue;
    if (absl::Status s = RemoveTree(e.path); !s.ok()) return s;
    removed.push_back(e.path);
  }
  std::error_code ec;
  for (fs::directory_iterator it(root, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // ".step-<digits>.tmp"
    if (name.size() < 11 || name.compare(0, 6, ".step-") != 0 ||
        name.compare(name.size() - 4, 4, ".tmp") != 0) {
      continue;
    }
    int64_t step;
    if (!absl::SimpleAtoi(name.substr(6, name.size() - 10), &step) || step >= newest) continue;
    const std::string path = JoinPath(root, name);
    if (absl::Status s = RemoveTree(path); !s.ok()) return s;
    removed.push_back(path);
  }
  if (ec) return FileError("list", root, ec.value());
  if (!removed.empty()) {
    if (absl::Status s = FsyncPath(root); !s.ok()) return s;
  }
  return removed;
}

}  // namespace model
}  // namespace dattn
