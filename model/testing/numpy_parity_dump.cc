// Writes one fp64 run of the CPU model for the numpy reference (longnet_reference.py) to check:
//
//   numpy_parity_dump CONFIG_JSON OUT_DIR BATCH SEQ_LEN SEED
//
// builds LongNetLM<double> from the config file, initialises it (MAGNETO, then every parameter
// moved by a uniform draw in [-0.2, 0.2], so that biases and norm gains are not 0 and 1), draws
// tokens and next-token targets (every fifth target ignored on average), runs Forward with
// poisoned scratch, and writes into OUT_DIR:
//   config.json   the config as the model read it (ConfigToJson)
//   layout.json   [{"name", "shape", "offset"}, ...] of the flat parameter buffer
//   params.f64    the flat parameter buffer, little-endian float64
//   tokens.i32, targets.i32   [BATCH, SEQ_LEN] int32 (targets: -1 = ignored)
//   logits.f64    [BATCH, SEQ_LEN, vocab] float64
//   run.json      {"batch", "seq_len", "loss" (the mean), "loss_sum", "num_targets"} (17 digits)
// Exit status 0 on success; 1 with a message on stderr otherwise.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/longnet.h"
#include "nlohmann/json.hpp"

namespace {

using dattn::model::LongNetConfig;
using dattn::model::LongNetLM;

// SplitMix64, for the perturbation and the tokens.
uint64_t Next(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool WriteFile(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.close();
  if (!out) std::cerr << "numpy_parity_dump: cannot write " << path << "\n";
  return static_cast<bool>(out);
}

int Run(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: numpy_parity_dump CONFIG_JSON OUT_DIR BATCH SEQ_LEN SEED\n";
    return 1;
  }
  const std::string out_dir = argv[2];
  const int64_t batch = std::atoll(argv[3]), seq_len = std::atoll(argv[4]);
  uint64_t state = std::strtoull(argv[5], nullptr, 10);
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    std::cerr << "numpy_parity_dump: cannot read " << argv[1] << "\n";
    return 1;
  }
  absl::StatusOr<LongNetConfig> config = dattn::model::ParseConfigJson(text.str());
  if (!config.ok()) {
    std::cerr << argv[1] << ": " << config.status() << "\n";
    return 1;
  }
  dattn::model::ModelOptions options;
  options.poison_scratch = true;
  absl::StatusOr<std::unique_ptr<LongNetLM<double>>> model =
      LongNetLM<double>::CreateCpu(*config, options, 1);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  LongNetLM<double>& m = **model;
  absl::Status s = m.InitParams(state);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  const int64_t total = m.layout().total();
  for (int64_t i = 0; i < total; ++i) {
    m.params()[i] += 0.4 * (static_cast<double>(Next(&state) >> 11) * 0x1.0p-53 - 0.5);
  }
  const int64_t tokens_count = batch * seq_len;
  std::vector<int32_t> tokens(tokens_count), targets(tokens_count);
  const uint64_t vocab = static_cast<uint64_t>(config->vocab_size);
  for (int64_t i = 0; i < tokens_count; ++i) {
    tokens[i] = static_cast<int32_t>(Next(&state) % vocab);
    targets[i] = Next(&state) % 5 == 0 ? dattn::model::kIgnoreTarget
                                       : static_cast<int32_t>(Next(&state) % vocab);
  }
  dattn::model::TokenBatch b;
  b.tokens = tokens.data();
  b.targets = targets.data();
  b.batch = batch;
  b.seq_len = seq_len;
  absl::StatusOr<dattn::model::LossResult> loss = m.Forward(b);
  if (!loss.ok()) {
    std::cerr << loss.status() << "\n";
    return 1;
  }
  std::vector<double> logits(static_cast<size_t>(tokens_count * config->vocab_size));
  s = m.CopyLogitsToHost(logits.data());
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  nlohmann::json layout = nlohmann::json::array();
  for (const dattn::model::ParamEntry& e : m.layout().entries()) {
    layout.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}});
  }
  const std::string config_json = dattn::model::ConfigToJson(*config);
  const std::string layout_json = layout.dump();
  std::ostringstream loss_json;
  loss_json.precision(17);
  loss_json << "{\"batch\": " << batch << ", \"seq_len\": " << seq_len
            << ", \"loss\": " << loss->loss << ", \"loss_sum\": " << loss->loss_sum
            << ", \"num_targets\": " << loss->num_targets << "}";
  const std::string loss_text = loss_json.str();
  const bool ok = WriteFile(out_dir + "/config.json", config_json.data(), config_json.size()) &&
                  WriteFile(out_dir + "/layout.json", layout_json.data(), layout_json.size()) &&
                  WriteFile(out_dir + "/params.f64", m.params(), static_cast<size_t>(total) * 8) &&
                  WriteFile(out_dir + "/tokens.i32", tokens.data(), tokens.size() * 4) &&
                  WriteFile(out_dir + "/targets.i32", targets.data(), targets.size() * 4) &&
                  WriteFile(out_dir + "/logits.f64", logits.data(), logits.size() * 8) &&
                  WriteFile(out_dir + "/run.json", loss_text.data(), loss_text.size());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
