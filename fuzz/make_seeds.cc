// Writes the seed inputs of the fuzz targets whose inputs are binary or made by the project's own
// writers, into the folder given (fuzz/corpus/): safetensors files from SerializeSafetensors, a
// checkpoint folder from SaveCheckpoint (joined as checkpoint_fuzz reads it), imported models (as
// model_folder_fuzz reads them), and the frames a
// TcpStore client sends during a rendezvous. Run by hand when a writer changes:
//   bazel run //fuzz:make_seeds -- $PWD/fuzz/corpus
// (requests_fuzz's seeds are protoc --encode of text protos, job_file_fuzz's the example job files:
// docs/FUZZING.md.)
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/tcp_store_wire.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "model/safetensors.h"

namespace {

namespace model = dattn::model;
namespace comm = dattn::comm;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
}

std::string OrDie(absl::StatusOr<std::string> s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
    std::exit(1);
  }
  return *s;
}

void SafetensorsSeeds(const std::string& dir) {
  const std::vector<float> w = {1.0f, -2.0f, 0.5f, 3.25f, -0.0f, 7.0f};
  const std::vector<uint16_t> bf16 = {model::FloatToBf16(1.5f), model::FloatToBf16(-3.0f)};
  const std::vector<int64_t> step = {42};
  std::vector<model::TensorToWrite> tensors = {
      model::TensorToWrite::F32("embed.weight", {2, 3}, w),
      {"norm.bf16",
       model::SafeDtype::kBF16,
       {2},
       absl::string_view(reinterpret_cast<const char*>(bf16.data()), 4)},
      {"step",
       model::SafeDtype::kI64,
       {},
       absl::string_view(reinterpret_cast<const char*>(step.data()), 8)},
      {"empty", model::SafeDtype::kF16, {0, 4}, absl::string_view()},
  };
  Write(dir + "/safetensors_fuzz/mixed",
        OrDie(model::SerializeSafetensors(tensors, {{"format", "pt"}, {"dattn", "weights"}})));
  Write(dir + "/safetensors_fuzz/one-f32",
        OrDie(model::SerializeSafetensors({model::TensorToWrite::F32("w", {3}, {1, 2, 3})})));
  Write(dir + "/safetensors_fuzz/no-tensors", OrDie(model::SerializeSafetensors({}, {{"k", "v"}})));
}

void CheckpointSeed(const std::string& dir) {
  model::ParamLayout layout;
  if (!layout.Add("embed.weight", {2, 3}).ok() || !layout.Add("head.bias", {2}).ok()) std::exit(1);
  std::vector<float> params = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, -1.0f, 1.0f};
  model::AdamWState adamw;
  adamw.step = 7;
  adamw.m.assign(8, 0.01f);
  adamw.v.assign(8, 0.001f);
  model::CheckpointContents c;
  c.layout = &layout;
  c.params = params;
  c.optimizer = &adamw;
  c.model_config_json = R"({"vocab_size": 256, "d_model": 8})";
  c.trainer.step = 7;
  c.trainer.tokens_seen = 1792;
  c.trainer.sampler.seed = 0x1234;
  c.trainer.sampler.seq_len = 32;
  c.trainer.sampler.batch_size = 8;
  c.trainer.sampler.range_end = 4096;
  c.trainer.rng_state = {1, 2, 3, 4};
  c.trainer.extra_json = R"({"run": "seed"})";
  const std::string root = dir + "/.checkpoint-seed.tmp";
  const std::string ck = OrDie(model::SaveCheckpoint(root, c));
  std::string joined;
  for (const char* file : {model::kManifestFile, model::kConfigFile, model::kTrainerStateFile,
                           model::kWeightsFile, model::kOptimizerFile}) {
    if (!joined.empty()) joined += "\n@@@@\n";
    joined += OrDie(model::ReadSmallFile(model::JoinPath(ck, file), 1 << 20));
  }
  Write(dir + "/checkpoint_fuzz/step-7", joined);
  Write(dir + "/checkpoint_fuzz/trainer-state-only",
        OrDie(model::ReadSmallFile(model::JoinPath(ck, model::kTrainerStateFile), 1 << 20)));
  std::system(("rm -rf '" + root + "'").c_str());
}

// Imported models, joined as model_folder_fuzz reads them: an empty index part and one file, or
// an index and its files.
void ModelFolderSeeds(const std::string& dir) {
  const std::vector<float> w = {0.5f, -1.0f, 2.0f, 0.25f, -0.0f, 3.0f};
  const std::vector<uint16_t> bf16 = {model::FloatToBf16(1.5f), model::FloatToBf16(-3.0f)};
  const std::vector<uint16_t> f16_nan = {0x3c00, 0x7e00};  // 1.0, NaN.
  const std::vector<double> f64 = {0.125, -8.0};
  const model::TensorToWrite embed = model::TensorToWrite::F32("token_embedding.weight", {2, 3}, w);
  const model::TensorToWrite norm = {
      "final_norm.weight",
      model::SafeDtype::kBF16,
      {2},
      absl::string_view(reinterpret_cast<const char*>(bf16.data()), 4)};
  const model::TensorToWrite bias = {
      "final_norm.bias",
      model::SafeDtype::kF64,
      {2},
      absl::string_view(reinterpret_cast<const char*>(f64.data()), 16)};
  const model::TensorToWrite nan = {
      "final_norm.weight",
      model::SafeDtype::kF16,
      {2},
      absl::string_view(reinterpret_cast<const char*>(f16_nan.data()), 4)};
  const std::string sep = "\n@@@@\n";
  Write(dir + "/model_folder_fuzz/single",
        sep + OrDie(model::SerializeSafetensors({embed, norm, bias}, {{"format", "pt"}})));
  Write(dir + "/model_folder_fuzz/non-finite",
        sep + OrDie(model::SerializeSafetensors({embed, nan})));
  Write(
      dir + "/model_folder_fuzz/sharded",
      std::string(R"({"metadata": {"total_size": 44}, "weight_map": {)"
                  R"("token_embedding.weight": "a.safetensors", )"
                  R"("final_norm.weight": "b.safetensors", "final_norm.bias": "b.safetensors"}})") +
          sep + OrDie(model::SerializeSafetensors({embed})) + sep +
          OrDie(model::SerializeSafetensors({norm, bias})));
}

void StoreSeeds(const std::string& dir) {
  // What ring ranks send during a rendezvous: a counter, an address, waits for the others.
  auto frame = [](uint8_t op, const std::string& key, const std::string& value, int64_t arg) {
    return comm::EncodeStoreRequest(comm::StoreRequest{op, key, value, arg});
  };
  // Every connection starts with a hello; tcp_store_fuzz.cc's store with a secret requires this
  // one.
  const std::string hello = frame(comm::kStoreHello, "", "fuzz-ring-secret-0123456789abcde", 0);
  Write(dir + "/tcp_store_fuzz/rendezvous",
        hello + frame(comm::kStoreAdd, "job-1/attempt-0/arrived", "", 1) +
            frame(comm::kStoreSet, "job-1/attempt-0/rank/0", "10.0.0.1:40123", 0) +
            frame(comm::kStoreGet, "job-1/attempt-0/rank/1", "", 30000) +
            frame(comm::kStoreAdd, "job-1/attempt-0/arrived", "", 1));
  Write(dir + "/tcp_store_fuzz/wrong-secret",
        frame(comm::kStoreHello, "", "fuzz-ring-secret-0123456789abcdX", 0) +
            frame(comm::kStoreSet, "k", "v", 0));
  Write(dir + "/tcp_store_fuzz/set-get", frame(comm::kStoreSet, "k", std::string("v\0w", 3), 0) +
                                             frame(comm::kStoreGet, "k", "", 0));
  Write(dir + "/tcp_store_fuzz/add-to-text",
        frame(comm::kStoreSet, "n", "x", 0) + frame(comm::kStoreAdd, "n", "", -3) +
            frame(comm::kStoreAdd, "m", "", -3) + frame(9, "", "", 0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_FOLDER\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (const char* target :
       {"safetensors_fuzz", "checkpoint_fuzz", "model_folder_fuzz", "tcp_store_fuzz"}) {
    std::system(absl::StrCat("mkdir -p '", dir, "/", target, "'").c_str());
  }
  SafetensorsSeeds(dir);
  CheckpointSeed(dir);
  ModelFolderSeeds(dir);
  StoreSeeds(dir);
  return 0;
}
