// The C++ side of //model:interop_test (interop_check.py is the Python side): writes files with
// known contents for Python to check, and checks files Python wrote.
//
//   interop_fixture write-safetensors PATH | read-safetensors PATH
//   interop_fixture write-token-file PATH  | read-token-file PATH
//   interop_fixture write-checkpoint ROOT  (prints the checkpoint folder's path)
//
// Exit status 0 on success; 1 with the reason on stderr.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/token_file.h"

namespace dattn {
namespace model {
namespace {

template <typename T>
absl::string_view Bytes(const std::vector<T>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

absl::Status WriteAllDtypes(const std::string& path) {
  const std::vector<double> f64 = {1.0 / 3, -2.5, 1e300};
  std::vector<float> f32(6);
  for (int i = 0; i < 6; ++i) f32[i] = static_cast<float>(i) * 0.5f - 1.0f;
  const std::vector<uint16_t> f16 = {0x3c00, 0xc100, 0x7bff, 0x0001};
  const std::vector<uint16_t> bf16 = {FloatToBf16(1.0f), FloatToBf16(-0.5f), FloatToBf16(3.140625f),
                                      FloatToBf16(-std::ldexp(1.0f, -100))};
  const std::vector<int64_t> i64 = {-1, int64_t{1} << 40};
  const std::vector<int32_t> i32 = {-7, 1 << 30};
  const std::vector<uint16_t> u16 = {0, 65535, 300};
  const std::vector<uint8_t> u8 = {0, 255, 1};
  const std::vector<float> scalar = {42.0f};
  const std::vector<TensorToWrite> tensors = {
      {"f64", SafeDtype::kF64, {3}, Bytes(f64)},
      TensorToWrite::F32("f32", {2, 3}, f32),
      {"f16", SafeDtype::kF16, {4}, Bytes(f16)},
      {"bf16", SafeDtype::kBF16, {2, 2}, Bytes(bf16)},
      {"i64", SafeDtype::kI64, {2}, Bytes(i64)},
      {"i32", SafeDtype::kI32, {1, 2}, Bytes(i32)},
      {"u16", SafeDtype::kU16, {3}, Bytes(u16)},
      {"u8", SafeDtype::kU8, {3}, Bytes(u8)},
      TensorToWrite::F32("scalar", {}, scalar),
      {"empty", SafeDtype::kF32, {0, 3}, absl::string_view()},
  };
  return WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "dattn"}}, true);
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::DataLossError(what);
}

absl::Status ReadPythonFile(const std::string& path) {
  absl::StatusOr<SafetensorsFile> st = SafetensorsFile::Open(path);
  if (!st.ok()) return st.status();
  if (absl::Status s =
          Expect(st->metadata() == SafetensorsMetadata{{"writer", "python"}}, "metadata");
      !s.ok()) {
    return s;
  }
  std::vector<float> weight(6);
  if (absl::Status s = st->ReadAsFloat32("weight", {3, 2}, absl::MakeSpan(weight)); !s.ok()) {
    return s;
  }
  for (int i = 0; i < 6; ++i) {
    if (absl::Status s = Expect(weight[i] == i * 0.25f - 0.5f, absl::StrCat("weight[", i, "]"));
        !s.ok()) {
      return s;
    }
  }
  std::vector<float> two(2);
  if (absl::Status s = st->ReadAsFloat32("half", {2}, absl::MakeSpan(two)); !s.ok()) return s;
  if (absl::Status s = Expect(two[0] == 0.5f && two[1] == -65504.0f, "half"); !s.ok()) return s;
  if (absl::Status s = st->ReadAsFloat32("bf", {2}, absl::MakeSpan(two)); !s.ok()) return s;
  if (absl::Status s = Expect(two[0] == 1.5f && two[1] == -3.0f, "bf"); !s.ok()) return s;
  absl::StatusOr<const SafeTensorInfo*> ids = st->Find("ids");
  if (!ids.ok()) return ids.status();
  int64_t values[3];
  if (absl::Status s = Expect((*ids)->dtype == SafeDtype::kI64 && (*ids)->numel == 3, "ids");
      !s.ok()) {
    return s;
  }
  std::memcpy(values, st->Data(**ids).data(), sizeof(values));
  return Expect(values[0] == 1 && values[1] == -2 && values[2] == 3, "ids values");
}

absl::Status ReadPythonTokenFile(const std::string& path) {
  absl::StatusOr<TokenFile> file = TokenFile::Open(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = Expect(file->vocab_size() == 1000 && file->size() == 500, "token header");
      !s.ok()) {
    return s;
  }
  for (int64_t i = 0; i < 500; ++i) {
    if (file->at(i) != i * 31 % 1000) return absl::DataLossError(absl::StrCat("token ", i));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WriteCheckpoint(const std::string& root) {
  ParamLayout layout;
  for (auto [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"embed.weight", {8, 4}},
                                                                 {"blocks.0.ln.weight", {4}},
                                                                 {"blocks.0.mlp.weight", {4, 6}}}) {
    if (absl::Status s = layout.Add(name, shape); !s.ok()) return s;
  }
  std::vector<float> params(layout.total());
  AdamWState state;
  state.m.resize(params.size());
  state.v.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = static_cast<float>(i) * 0.001f - 0.05f;
    state.m[i] = params[i] * 2.0f;
    state.v[i] = params[i] * params[i];
  }
  state.step = 2;
  CheckpointContents c;
  c.layout = &layout;
  c.params = params;
  c.optimizer = &state;
  c.model_config_json = R"({"d_model": 4, "n_layers": 1})";
  c.trainer.step = 3;
  c.trainer.tokens_seen = 3 * 256;
  c.trainer.sampler.seed = 42;
  c.trainer.max_grad_norm = std::numeric_limits<double>::infinity();
  c.trainer.extra_json = R"({"note": "interop"})";
  return SaveCheckpoint(root, c);
}

// The same tensors as WriteCheckpoint, saved by two ranks (version 2): the weights split between
// two safetensors files with an index, each rank's half of the moments in its own file.
absl::StatusOr<std::string> WriteShardedCheckpoint(const std::string& root) {
  ParamLayout layout;
  for (auto [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"embed.weight", {8, 4}},
                                                                 {"blocks.0.ln.weight", {4}},
                                                                 {"blocks.0.mlp.weight", {4, 6}}}) {
    if (absl::Status s = layout.Add(name, shape); !s.ok()) return s;
  }
  std::vector<float> params(layout.total()), m(params.size()), v(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = static_cast<float>(i) * 0.001f - 0.05f;
    m[i] = params[i] * 2.0f;
    v[i] = params[i] * params[i];
  }
  constexpr int kWorld = 2;
  ShardedCheckpointCommit commit;
  commit.layout = &layout;
  commit.shards = kWorld;
  commit.model_config_json = R"({"d_model": 4, "n_layers": 1})";
  commit.trainer.step = 3;
  commit.trainer.tokens_seen = 3 * 256;
  commit.trainer.sampler.seed = 42;
  commit.trainer.max_grad_norm = std::numeric_limits<double>::infinity();
  commit.trainer.extra_json = R"({"note": "interop"})";
  absl::StatusOr<std::string> tmp = BeginShardedCheckpoint(root, commit.trainer.step);
  if (!tmp.ok()) return tmp.status();
  const int64_t total = layout.total();
  for (int r = 0; r < kWorld; ++r) {
    CheckpointShard shard;
    shard.layout = &layout;
    shard.shard = r;
    shard.shards = kWorld;
    shard.step = commit.trainer.step;
    shard.params = params;
    const int64_t begin = total * r / kWorld, end = total * (r + 1) / kWorld;
    shard.moments_begin = begin;
    shard.m = absl::MakeConstSpan(m).subspan(begin, end - begin);
    shard.v = absl::MakeConstSpan(v).subspan(begin, end - begin);
    shard.optimizer_step = 2;
    absl::StatusOr<std::vector<CheckpointFile>> files = WriteCheckpointShard(*tmp, shard);
    if (!files.ok()) return files.status();
    commit.shard_files.insert(commit.shard_files.end(), files->begin(), files->end());
  }
  return CommitShardedCheckpoint(root, commit);
}

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: interop_fixture COMMAND PATH\n");
    return 2;
  }
  const std::string command = argv[1], path = argv[2];
  absl::Status status;
  if (command == "write-safetensors") {
    status = WriteAllDtypes(path);
  } else if (command == "read-safetensors") {
    status = ReadPythonFile(path);
  } else if (command == "write-token-file") {
    std::vector<int32_t> tokens(1000);
    for (int i = 0; i < 1000; ++i) tokens[i] = static_cast<int32_t>(int64_t{i} * 7919 % 50257);
    status = WriteTokenFile(path, tokens, 50257);
  } else if (command == "read-token-file") {
    status = ReadPythonTokenFile(path);
  } else if (command == "write-checkpoint") {
    absl::StatusOr<std::string> dir = WriteCheckpoint(path);
    status = dir.status();
    if (dir.ok()) std::printf("%s\n", dir->c_str());
  } else if (command == "write-sharded-checkpoint") {
    absl::StatusOr<std::string> dir = WriteShardedCheckpoint(path);
    status = dir.status();
    if (dir.ok()) std::printf("%s\n", dir->c_str());
  } else {
    status = absl::InvalidArgumentError("unknown command " + command);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "interop_fixture %s %s: %s\n", command.c_str(), path.c_str(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace model
}  // namespace dattn

int main(int argc, char** argv) { return dattn::model::Main(argc, argv); }
