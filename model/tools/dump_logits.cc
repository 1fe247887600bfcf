// dump_logits, dump_logits_gpu: the LongNet model's logits for a window of tokens, written as a
// NumPy .npy file, for comparisons with other implementations of the model (the seed-library
// parity of model/testing/seed_parity.py, the numpy reference of model/testing).
//
//   dump_logits (--checkpoint STEP_DIR | --model-config FILE --init-seed N [--save-weights DIR])
//               --data PATH [--format text|tokens] [--begin I] --batch B --seq-len N
//               [--device cpu|cuda] [--threads T] --out FILE.npy
//
// Weights: a checkpoint folder (model/checkpoint.h; verified, its config.json is the model's), or
// MAGNETO from a seed for a model config file; --save-weights DIR then writes
// DIR/weights.safetensors (F32, one tensor per parameter, named as in a checkpoint) and
// DIR/config.json (every field), so that another program loads exactly these weights. Tokens: rows
// b = 0..B-1 are tokens [I + b N, I + (b + 1) N) of the corpus (model/corpus.h: a text file's
// bytes, or token files). Device: cpu runs LongNetLM<float> (fp32, OpenBLAS; --threads, 0 for every
// core); cuda runs CudaLongNetLM (bf16 compute on fp32 master weights, GPU 0), in dump_logits_gpu
// only, which DATTN_DUMP_WITH_CUDA builds. Output: float32 [B, N, V], row-major, written whole then
// renamed. The tool computes one forward pass: FLOPs CountFlops(config, B, N).forward.
//
// Exit codes: 0 written; 2 a bad flag or value (named); 1 anything else (the data, the checkpoint,
// the device, the file), with the reason on stderr.
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/corpus.h"
#include "model/file_io.h"
#include "model/language_model.h"
#include "model/longnet.h"
#include "model/longnet_params.h"
#include "model/safetensors.h"
#ifdef DATTN_DUMP_WITH_CUDA
#include "model/cuda/cuda_longnet.h"
#endif

namespace dattn {
namespace model {
namespace {

#ifdef DATTN_DUMP_WITH_CUDA
constexpr char kProgram[] = "dump_logits_gpu";
#else
constexpr char kProgram[] = "dump_logits";
#endif

struct Weights {
  LongNetConfig config;
  ParamLayout layout;
  std::vector<float> params;
};

absl::StatusOr<Weights> FromCheckpoint(const std::string& dir) {
  absl::StatusOr<Checkpoint> ck = Checkpoint::Open(dir, /*verify_checksums=*/true);
  if (!ck.ok()) return ck.status();
  Weights w;
  absl::StatusOr<LongNetConfig> config = ParseConfigJson(ck->model_config_json());
  if (!config.ok()) {
    return absl::DataLossError(
        absl::StrCat(JoinPath(dir, kConfigFile), ": ", config.status().message()));
  }
  w.config = *config;
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(w.config);
  if (!layout.ok()) return layout.status();
  w.layout = *std::move(layout);
  w.params.resize(static_cast<size_t>(w.layout.total()));
  absl::Status s = ck->ReadWeights(w.layout, 0, absl::MakeSpan(w.params));
  if (!s.ok()) return s;
  return w;
}

absl::StatusOr<Weights> FromSeed(const std::string& config_file, uint64_t seed) {
  absl::StatusOr<std::string> text = ReadSmallFile(config_file, int64_t{1} << 20);
  if (!text.ok()) return text.status();
  absl::StatusOr<LongNetConfig> config = ParseConfigJson(*text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model-config ", config_file, ": ", config.status().message()));
  }
  Weights w;
  w.config = *config;
  absl::StatusOr<ParamLayout> layout = BuildParamLayout(w.config);
  if (!layout.ok()) return layout.status();
  w.layout = *std::move(layout);
  std::vector<double> values(static_cast<size_t>(w.layout.total()));
  absl::Status s = InitMagneto(w.config, w.layout, seed, values.data());
  if (!s.ok()) return s;
  w.params.assign(values.begin(), values.end());
  return w;
}

absl::Status SaveWeights(const Weights& w, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--save-weights: cannot create ", dir, ": ", ec.message()));
  }
  std::vector<TensorToWrite> tensors;
  for (const ParamEntry& e : w.layout.entries()) {
    tensors.push_back(TensorToWrite::F32(
        e.name, e.shape,
        absl::MakeConstSpan(w.params.data() + e.offset, static_cast<size_t>(e.numel))));
  }
  absl::Status s = WriteSafetensors(JoinPath(dir, kWeightsFile), tensors,
                                    {{"format", "pt"}, {"dattn", "weights"}}, /*sync=*/true);
  if (!s.ok()) return s;
  return WriteWholeFile(JoinPath(dir, kConfigFile), ConfigToJson(w.config) + "\n", true);
}

// A .npy (version 1.0) header for a little-endian float32 array of `shape`.
std::string NpyHeader(const std::vector<int64_t>& shape) {
  std::string dict = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                                  absl::StrJoin(shape, ", "), shape.size() == 1 ? ",), }" : "), }");
  const size_t unpadded = 10 + dict.size() + 1;  // magic + version + length, dict, '\n'.
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string header("\x93NUMPY\x01\x00", 8);
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>((dict.size() >> 8) & 0xff));
  return header + dict;
}

absl::Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape,
                      const std::vector<float>& values) {
  std::string bytes = NpyHeader(shape);
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  const std::string tmp = absl::StrCat(path, ".tmp");
  absl::Status s = WriteWholeFile(tmp, bytes, /*sync=*/true);
  if (!s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return FileError("rename to", path, errno);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LanguageModel<float>>> MakeModel(const std::string& device,
                                                                const LongNetConfig& config,
                                                                int threads) {
  if (device == "cpu") {
    absl::StatusOr<std::unique_ptr<LongNetLM<float>>> m =
        LongNetLM<float>::CreateCpu(config, {}, threads);
    if (!m.ok()) return m.status();
    return std::unique_ptr<LanguageModel<float>>(std::move(*m));
  }
#ifdef DATTN_DUMP_WITH_CUDA
  if (device == "cuda") {
    absl::StatusOr<std::unique_ptr<cuda::CudaLongNetLM>> m =
        cuda::CudaLongNetLM::Create(config, {});
    if (!m.ok()) return m.status();
    return std::unique_ptr<LanguageModel<float>>(std::move(*m));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device: \"", device, "\" is not one of cpu, cuda"));
#else
  return absl::InvalidArgumentError(absl::StrCat(
      "--device: \"", device, "\" is not available in this build (cpu)",
      device == "cuda" ? ": dump_logits links no CUDA library; use dump_logits_gpu" : ""));
#endif
}

int Run(int argc, char** argv) {
  CLI::App app(
      absl::StrCat(kProgram,
                   ": writes the LongNet model's logits for a window of tokens as a float32 "
                   ".npy [batch, seq_len, vocab_size]."),
      kProgram);
  std::string checkpoint, model_config, save_weights, data, format = "text", device = "cpu", out;
  uint64_t init_seed = 0;
  int64_t begin = 0, batch = 0, seq_len = 0;
  int threads = 0;
  app.add_option("--checkpoint", checkpoint, "A checkpoint step folder (weights and config)")
      ->type_name("DIR");
  app.add_option("--model-config", model_config, "A model config JSON, with --init-seed")
      ->type_name("FILE");
  CLI::Option* seed_option =
      app.add_option("--init-seed", init_seed, "MAGNETO weights from this seed")->type_name("N");
  app.add_option("--save-weights", save_weights,
                 "With --init-seed: write DIR/weights.safetensors and DIR/config.json")
      ->type_name("DIR");
  app.add_option("--data", data, "A text file or folder, or a token file")
      ->type_name("PATH")
      ->required();
  app.add_option("--format", format, "text (bytes) or tokens (default text)")
      ->type_name("text|tokens");
  app.add_option("--begin", begin, "The window's first token (default 0)")->type_name("I");
  app.add_option("--batch", batch, "Rows of the window")->type_name("B")->required();
  app.add_option("--seq-len", seq_len, "Tokens per row")->type_name("N")->required();
  app.add_option("--device", device, "cpu (fp32) or cuda (bf16 compute; dump_logits_gpu only)")
      ->type_name("NAME");
  app.add_option("--threads", threads, "CPU threads, 0 for every core")->type_name("T");
  app.add_option("--out", out, "The .npy file to write")->type_name("FILE")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return 2;
  }
  auto usage = [](const std::string& message) {
    std::cerr << kProgram << ": error: " << message << "\n";
    return 2;
  };
  auto failure = [](const absl::Status& s) {
    std::cerr << kProgram << ": error: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  };
  if (checkpoint.empty() == model_config.empty()) {
    return usage("give either --checkpoint DIR or --model-config FILE with --init-seed N");
  }
  if (!model_config.empty() && seed_option->count() == 0) {
    return usage("--model-config needs --init-seed N");
  }
  if (!save_weights.empty() && model_config.empty()) {
    return usage("--save-weights goes with --init-seed (a checkpoint already holds its weights)");
  }
  if (format != "text" && format != "tokens") {
    return usage(absl::StrCat("--format: \"", format, "\" must be text or tokens"));
  }
  if (batch < 1 || seq_len < 1 || begin < 0) {
    return usage(absl::StrCat("--batch ", batch, ", --seq-len ", seq_len, ", --begin ", begin,
                              ": need batch, seq_len >= 1 and begin >= 0"));
  }
  if (threads < 0) return usage(absl::StrCat("--threads: ", threads, " must be >= 0"));

  absl::StatusOr<Weights> weights =
      checkpoint.empty() ? FromSeed(model_config, init_seed) : FromCheckpoint(checkpoint);
  if (!weights.ok()) return failure(weights.status());
  if (!save_weights.empty()) {
    absl::Status s = SaveWeights(*weights, save_weights);
    if (!s.ok()) return failure(s);
  }
  absl::StatusOr<TokenCorpus> corpus =
      format == "text" ? TokenCorpus::FromText(data) : TokenCorpus::FromTokenFiles({data});
  if (!corpus.ok()) return failure(corpus.status());
  const int64_t n = batch * seq_len;
  if (begin > corpus->size() || n > corpus->size() - begin) {
    return usage(absl::StrCat("--begin ", begin, " + ", batch, " x ", seq_len,
                              " tokens run past the end of ", data, " (", corpus->size(),
                              " tokens)"));
  }
  if (corpus->vocab_size() > weights->config.vocab_size) {
    return usage(absl::StrCat(data, " has a vocabulary of ", corpus->vocab_size(), ", the model ",
                              weights->config.vocab_size));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  absl::Status s = corpus->Read(begin, absl::MakeSpan(tokens));
  if (!s.ok()) return failure(s);

  absl::StatusOr<std::unique_ptr<LanguageModel<float>>> model =
      MakeModel(device, weights->config, threads);
  if (!model.ok()) return failure(model.status());
  s = (*model)->CopyParamsFromHost(weights->params.data());
  if (!s.ok()) return failure(s);
  TokenBatch tb;
  tb.tokens = tokens.data();
  tb.batch = batch;
  tb.seq_len = seq_len;
  absl::StatusOr<LossResult> forward = (*model)->Forward(tb);
  if (!forward.ok()) return failure(forward.status());
  const int64_t v = weights->config.vocab_size;
  std::vector<float> logits(static_cast<size_t>(n * v));
  s = (*model)->CopyLogitsToHost(logits.data());
  if (!s.ok()) return failure(s);
  s = WriteNpy(out, {batch, seq_len, v}, logits);
  if (!s.ok()) return failure(s);
  std::cout << kProgram << ": logits [" << batch << ", " << seq_len << ", " << v << "] of "
            << (checkpoint.empty() ? absl::StrCat(model_config, " seed ", init_seed) : checkpoint)
            << " on " << device << " for tokens [" << begin << ", " << begin + n << ") of " << data
            << ": " << out << "\n";
  return 0;
}

}  // namespace
}  // namespace model
}  // namespace dattn

int main(int argc, char** argv) { return dattn::model::Run(argc, argv); }
