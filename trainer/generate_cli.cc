#include "trainer/generate_cli.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/file_io.h"
#include "model/generation.h"
#include "model/longnet.h"

namespace dattn {
namespace trainer {
namespace {

constexpr char kProgram[] = "dattn-generate";

std::string Usage(const std::string& message) {
  return absl::StrCat(kProgram, ": error: ", message, "\nRun '", kProgram,
                      " --help' for the flags.\n");
}

// The checkpoint at `path`: a step folder, or the newest under path/checkpoints or path.
absl::StatusOr<model::Checkpoint> FindCheckpoint(const std::string& path) {
  absl::StatusOr<model::Checkpoint> direct = model::Checkpoint::Open(path);
  if (direct.ok()) return direct;
  for (const std::string& root : {model::JoinPath(path, "checkpoints"), path}) {
    absl::StatusOr<model::CheckpointEntry> latest = model::LatestCheckpoint(root);
    if (latest.ok()) return model::Checkpoint::Open(latest->path);
  }
  return absl::NotFoundError(
      absl::StrCat("--checkpoint ", path, ": not a checkpoint folder (", direct.status().message(),
                   "), and neither it nor its checkpoints/ folder holds one"));
}

absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& text,
                                                    const std::string& flag) {
  std::vector<int32_t> tokens;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t t = 0;
    if (!absl::SimpleAtoi(piece, &t)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", piece, "' is not a token id (comma-separated integers)"));
    }
    tokens.push_back(t);
  }
  return tokens;
}

std::vector<int32_t> Bytes(const std::string& text) {
  std::vector<int32_t> tokens;
  for (unsigned char c : text) tokens.push_back(c);
  return tokens;
}

}  // namespace

int RunGenerateCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app(absl::StrCat(kProgram,
                            ": continue a prompt with a model dattn-train wrote, on the CPU "
                            "(docs/TRAINING.md, \"Generating text\")"));
  app.set_help_all_flag("--help-all");
  std::string checkpoint_path, prompt, prompt_file, prompt_tokens;
  std::vector<std::string> stops, stop_tokens;
  model::GenerateOptions options;
  options.max_tokens = 200;
  int64_t max_context = 0;
  int threads = 0;
  bool print_tokens = false;
  app.add_option("--checkpoint", checkpoint_path,
                 "A checkpoint step folder, or a run folder (its newest checkpoint)")
      ->required()
      ->type_name("DIR");
  app.add_option("--prompt", prompt, "The prompt as text (byte-level models)")->type_name("TEXT");
  app.add_option("--prompt-file", prompt_file, "The prompt as a text file (byte-level models)")
      ->type_name("FILE");
  app.add_option("--prompt-tokens", prompt_tokens, "The prompt as token ids: 1,2,3")
      ->type_name("IDS");
  app.add_option("--max-tokens", options.max_tokens, "Tokens to generate at most (default 200)");
  app.add_option("--temperature", options.sampling.temperature,
                 "0: greedy; otherwise softmax(logits / T) (default 1)");
  app.add_option("--top-k", options.sampling.top_k, "Keep the k most probable tokens (0: all)");
  app.add_option("--top-p", options.sampling.top_p,
                 "Keep the most probable tokens up to this probability (1: all)");
  app.add_option("--seed", options.sampling.seed, "Sampling seed (default 0)");
  app.add_option("--stop", stops, "Stop before this text (repeatable; byte-level models)")
      ->type_name("TEXT");
  app.add_option("--stop-tokens", stop_tokens, "Stop before these token ids (repeatable): 1,2")
      ->type_name("IDS");
  app.add_option("--max-context", max_context,
                 "The longest sequence (prompt + tokens) the cache is planned for (default: "
                 "exactly that)");
  app.add_option("--threads", threads, "CPU threads (0: every core)");
  app.add_flag("--print-tokens", print_tokens, "Print token ids (one per line) instead of bytes");
  try {
    app.parse(argc, const_cast<char**>(argv));
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kGenerateOk;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return kGenerateOk;
  } catch (const CLI::ParseError& e) {
    err << Usage(e.what());
    return kGenerateUsage;
  }
  const int prompts = !prompt.empty() + !prompt_file.empty() + !prompt_tokens.empty();
  if (prompts != 1) {
    err << Usage("give the prompt once: --prompt, --prompt-file or --prompt-tokens");
    return kGenerateUsage;
  }
  if (threads < 0) {
    err << Usage(absl::StrCat("--threads ", threads, " must be >= 0"));
    return kGenerateUsage;
  }

  absl::StatusOr<model::Checkpoint> checkpoint = FindCheckpoint(checkpoint_path);
  if (!checkpoint.ok()) {
    err << kProgram << ": error: " << checkpoint.status().message() << '\n';
    return kGenerateCheckpoint;
  }
  absl::StatusOr<model::LongNetConfig> config =
      model::ParseConfigJson(checkpoint->model_config_json());
  if (!config.ok()) {
    err << kProgram << ": error: " << checkpoint->dir()
        << ": the model config: " << config.status().message() << '\n';
    return kGenerateCheckpoint;
  }
  const bool bytes = config->vocab_size == 256;
  if ((!prompt.empty() || !prompt_file.empty() || !stops.empty()) && !bytes) {
    err << Usage(
        absl::StrCat("--prompt, --prompt-file and --stop are text, for byte-level "
                     "models (vocab_size 256); this model's vocab_size is ",
                     config->vocab_size, ": use --prompt-tokens and --stop-tokens"));
    return kGenerateUsage;
  }

  std::vector<int32_t> tokens;
  if (!prompt_tokens.empty()) {
    absl::StatusOr<std::vector<int32_t>> parsed = ParseTokenList(prompt_tokens, "--prompt-tokens");
    if (!parsed.ok()) {
      err << Usage(std::string(parsed.status().message()));
      return kGenerateUsage;
    }
    tokens = *std::move(parsed);
  } else if (!prompt_file.empty()) {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) {
      err << Usage(absl::StrCat("--prompt-file ", prompt_file, ": cannot be read"));
      return kGenerateUsage;
    }
    std::ostringstream text;
    text << in.rdbuf();
    tokens = Bytes(text.str());
  } else {
    tokens = Bytes(prompt);
  }
  for (const std::string& s : stops) options.stop_sequences.push_back(Bytes(s));
  for (const std::string& s : stop_tokens) {
    absl::StatusOr<std::vector<int32_t>> parsed = ParseTokenList(s, "--stop-tokens");
    if (!parsed.ok()) {
      err << Usage(std::string(parsed.status().message()));
      return kGenerateUsage;
    }
    options.stop_sequences.push_back(*std::move(parsed));
  }
  absl::Status valid = model::ValidateGenerateOptions(options, config->vocab_size);
  if (!valid.ok()) {
    err << Usage(std::string(valid.message()));
    return kGenerateUsage;
  }
  const int64_t needed =
      static_cast<int64_t>(tokens.size()) + std::max<int64_t>(options.max_tokens - 1, 0);
  if (max_context == 0) max_context = std::max<int64_t>(needed, 1);

  absl::StatusOr<std::unique_ptr<model::LongNetLM<float>>> lm =
      model::LongNetLM<float>::CreateCpu(*config, {}, threads);
  if (!lm.ok()) {
    err << kProgram << ": error: " << lm.status().message() << '\n';
    return kGenerateFailed;
  }
  std::vector<float> params(static_cast<size_t>((*lm)->layout().total()));
  absl::Status s = checkpoint->ReadWeights((*lm)->layout(), 0, absl::MakeSpan(params));
  if (s.ok()) s = (*lm)->CopyParamsFromHost(params.data());
  if (!s.ok()) {
    err << kProgram << ": error: " << checkpoint->dir() << ": " << s.message() << '\n';
    return kGenerateCheckpoint;
  }
  absl::StatusOr<std::unique_ptr<model::Decoder<float>>> decoder =
      model::Decoder<float>::Create(lm->get(), max_context);
  if (!decoder.ok()) {
    err << Usage(absl::StrCat("--max-context: ", decoder.status().message()));
    return kGenerateUsage;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<model::GenerateResult> result =
      model::Generate<float>(**decoder, tokens, options, [&](const model::GeneratedToken& t) {
        if (print_tokens || !bytes) {
          out << t.token << '\n';
        } else {
          out << static_cast<char>(t.token);
        }
        out.flush();
        return static_cast<bool>(out);
      });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) {
    const bool usage = result.status().code() == absl::StatusCode::kInvalidArgument ||
                       result.status().code() == absl::StatusCode::kOutOfRange;
    err << (usage ? Usage(std::string(result.status().message()))
                  : absl::StrCat(kProgram, ": error: ", result.status().message(), "\n"));
    return usage ? kGenerateUsage : kGenerateFailed;
  }
  if (bytes && !print_tokens) out << '\n';
  err << kProgram << ": " << result->tokens.size() << " tokens after a prompt of "
      << result->prompt_tokens << " in " << absl::StrFormat("%.2f", seconds) << " s ("
      << absl::StrFormat("%.1f",
                         seconds > 0 ? static_cast<double>(result->tokens.size()) / seconds : 0.0)
      << " tokens/s), finish: " << model::FinishReasonName(result->finish) << ", cache "
      << (*decoder)->geometry().ElementsPerSequence() * 4 << " bytes, step " << checkpoint->step()
      << " of " << checkpoint->dir() << '\n';
  return kGenerateOk;
}

}  // namespace trainer
}  // namespace dattn
