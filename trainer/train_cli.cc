#include "trainer/train_cli.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/trainable_model.h"
#include "model/trainer.h"
#include "model/trainer_config.h"
#include "nlohmann/json.hpp"
#include "trainer/exit_codes.h"
#include "trainer/loss_plot.h"

namespace dattn {
namespace trainer {
namespace {

using Json = nlohmann::json;
using model::Trainer;
using model::TrainerConfig;

// A flag that sets one field of the trainer config.
enum class Kind { kInt, kU64, kDouble, kNormOrNone, kString };
struct FieldFlag {
  const char* flag;
  const char* field;  // JSON path in the trainer config.
  Kind kind;
  const char* type_name;
  const char* help;
};

const std::vector<FieldFlag>& FieldFlags() {
  static const std::vector<FieldFlag> flags = {
      {"--format", "data.format", Kind::kString, "text|tokens",
       "text: byte-level tokens of a file or folder; tokens: token files (default text)"},
      {"--validation-fraction", "data.validation_fraction", Kind::kDouble, "X",
       "Fraction of the corpus held out for validation, its last tokens (default 0.01)"},
      {"--device", "device", Kind::kString, "NAME",
       "Where the model runs: cpu, or cuda in dattn-train-gpu (default cpu)"},
      {"--threads", "threads", Kind::kInt, "N", "CPU threads, 0 for every core (default 0)"},
      {"--steps", "steps", Kind::kInt, "N", "Training steps; the schedule ends there"},
      {"--seq-len", "seq_len", Kind::kInt, "N", "Tokens per sequence"},
      {"--batch-size", "batch_size", Kind::kInt, "N", "Sequences per step"},
      {"--micro-batches", "micro_batches", Kind::kInt, "N",
       "Forward/backward passes per step (gradient accumulation); divides --batch-size"},
      {"--seed", "seed", Kind::kU64, "N", "Seed of the weights, the data order and the trainer"},
      {"--lr", "optimizer.lr", Kind::kDouble, "X", "Peak learning rate"},
      {"--min-lr", "optimizer.min_lr", Kind::kDouble, "X", "Learning rate at the last step"},
      {"--warmup", "optimizer.warmup_steps", Kind::kInt, "N", "Linear warmup steps"},
      {"--weight-decay", "optimizer.weight_decay", Kind::kDouble, "X", "AdamW weight decay"},
      {"--max-grad-norm", "optimizer.max_grad_norm", Kind::kNormOrNone, "X|none",
       "Clip the gradient's global norm to X; none: no clipping"},
      {"--eval-every", "eval.every", Kind::kInt, "N",
       "Validation every N steps (0: at the end only)"},
      {"--eval-batches", "eval.batches", Kind::kInt, "N", "Validation micro-batches each time"},
      {"--retrieval-examples", "retrieval.examples", Kind::kInt, "N",
       "Pass-key retrieval examples scored at each evaluation (0: none)"},
      {"--retrieval-depth", "retrieval.depth", Kind::kDouble, "X",
       "Needle depth in [0, 1] (0: farthest from the question)"},
      {"--retrieval-seq-len", "retrieval.seq_len", Kind::kInt, "N",
       "Tokens per retrieval example (0: --seq-len)"},
      {"--retrieval-train-fraction", "retrieval.train_fraction", Kind::kDouble, "X",
       "Fraction of training rows replaced by retrieval examples"},
      {"--save-every", "checkpoint.every", Kind::kInt, "N",
       "Checkpoint every N steps (0: at the end only)"},
      {"--keep", "checkpoint.keep_last", Kind::kInt, "N", "Checkpoints kept"},
      {"--log-every", "log_every", Kind::kInt, "N", "Steps per progress line"},
  };
  return flags;
}

std::string Usage(const std::string& program, const std::string& message) {
  return absl::StrCat(program, ": error: ", message, "\nRun '", program, " --help' for usage.\n");
}

// The JSON value of a flag's text, or INVALID_ARGUMENT naming the flag.
absl::StatusOr<Json> FlagValue(const FieldFlag& f, const std::string& text) {
  switch (f.kind) {
    case Kind::kString:
      return Json(text);
    case Kind::kInt: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.flag, ": \"", text, "\" is not an integer"));
      }
      return Json(v);
    }
    case Kind::kU64: {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.flag, ": \"", text, "\" is not an integer in [0, 2^64)"));
      }
      return Json(v);
    }
    case Kind::kNormOrNone:
      if (text == "none") return Json(nullptr);
      [[fallthrough]];
    case Kind::kDouble: {
      double v = 0;
      if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.flag, ": \"", text, "\" is not a finite number",
                         f.kind == Kind::kNormOrNone ? " (or none)" : ""));
      }
      return Json(v);
    }
  }
  return absl::InternalError("unreachable");
}

void SetPath(Json* root, const std::string& path, Json value) {
  Json* node = root;
  for (const absl::string_view part : absl::StrSplit(path, '.')) {
    if (!node->is_object()) *node = Json::object();
    node = &(*node)[std::string(part)];
  }
  *node = std::move(value);
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path, const std::string& flag) {
  absl::StatusOr<std::string> text = model::ReadSmallFile(path, int64_t{64} << 20);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", text.status().message()));
  }
  try {
    return Json::parse(*text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not valid JSON: ", e.what()));
  }
}

// The trainer config saved in the newest checkpoint under `dir` (for --resume without --config).
absl::StatusOr<Json> ConfigOfNewestCheckpoint(const std::string& dir) {
  absl::StatusOr<model::CheckpointEntry> latest = model::LatestCheckpoint(dir);
  if (!latest.ok()) return latest.status();
  absl::StatusOr<model::Checkpoint> ck =
      model::Checkpoint::Open(latest->path, /*verify_checksums=*/false);
  if (!ck.ok()) return ck.status();
  const std::string where = model::JoinPath(latest->path, model::kTrainerStateFile);
  try {
    const Json extra = Json::parse(ck->trainer_state().extra_json);
    if (!extra.contains("trainer_config")) {
      return absl::DataLossError(
          absl::StrCat(where, ": no trainer_config in \"extra\" (not written by dattn-train)"));
    }
    return extra.at("trainer_config");
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(where, ": field \"extra\": ", e.what()));
  }
}

std::string HumanCount(double x) {
  if (x >= 1e9) return absl::StrFormat("%.2fG", x / 1e9);
  if (x >= 1e6) return absl::StrFormat("%.2fM", x / 1e6);
  if (x >= 1e3) return absl::StrFormat("%.1fK", x / 1e3);
  return absl::StrFormat("%.0f", x);
}

std::string HumanDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string Basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string EvalLine(const model::EvalResult& e) {
  std::string line = absl::StrFormat("eval step %d:", e.step);
  if (e.has_loss) {
    absl::StrAppend(&line, absl::StrFormat(" validation loss %.4f", e.loss));
    if (std::isfinite(e.bits_per_byte)) {
      absl::StrAppend(&line, absl::StrFormat(" (%.3f bits/byte)", e.bits_per_byte));
    }
    absl::StrAppend(&line, absl::StrFormat(" over %s tokens", HumanCount(e.targets)));
  }
  if (e.has_retrieval) {
    absl::StrAppend(
        &line, absl::StrFormat("%s retrieval at depth %.2f of %d tokens: %d/%d exact, %.1f%% of "
                               "answer digits (chance 10%%)",
                               e.has_loss ? ";" : "", e.retrieval_depth, e.retrieval_seq_len,
                               e.retrieval.exact, e.retrieval.examples,
                               100.0 * e.retrieval.token_accuracy()));
  }
  absl::StrAppend(&line, absl::StrFormat(" [%.1fs]", e.seconds));
  return line;
}

LossCurve CurveOf(const Trainer& trainer, const std::string& program) {
  const TrainerConfig& c = trainer.config();
  const model::TrainingHistory& h = trainer.history();
  LossCurve curve;
  curve.title =
      absl::StrCat(program, ": LongNet on ", c.data.paths.empty() ? "?" : Basename(c.data.paths[0]),
                   c.byte_level() ? " (bytes)" : " (tokens)", ", device ", c.device);
  curve.subtitle = absl::StrFormat(
      "d_model %d, %d layers, %d heads, ffn %d; seq_len %d x batch %d; lr %g, %d steps",
      c.model.d_model, c.model.num_layers, c.model.num_heads, c.model.ffn_dim, c.seq_len,
      c.batch_size, c.optimizer.lr, c.steps);
  for (const model::TrainingHistory::Point& p : h.train) {
    curve.train.push_back({static_cast<double>(p.step), p.loss});
  }
  for (const model::EvalResult& e : h.evals) {
    if (e.has_loss) curve.validation.push_back({static_cast<double>(e.step), e.loss});
  }
  if (!h.evals.empty() && h.evals.back().has_loss) {
    const model::EvalResult& last = h.evals.back();
    absl::StrAppend(&curve.subtitle, absl::StrFormat("; validation %.3f", last.loss));
    if (std::isfinite(last.bits_per_byte)) {
      absl::StrAppend(&curve.subtitle, absl::StrFormat(" (%.2f bits/byte)", last.bits_per_byte));
    }
  }
  return curve;
}

Json FiniteOrNull(double x) { return std::isfinite(x) ? Json(x) : Json(nullptr); }

// <out>/history.json: the run's losses (every step's, every evaluation's), its device and config,
// for tables and for --compare-with of another run.
std::string HistoryJson(const Trainer& trainer, const std::string& program,
                        const std::string& description) {
  const model::TrainingHistory& h = trainer.history();
  Json j;
  j["program"] = program;
  j["device"] = trainer.config().device;
  j["description"] = description;
  j["config"] = Json::parse(model::TrainerConfigToJson(trainer.config()));
  Json train = Json::array();
  for (const model::TrainingHistory::Point& p : h.train) {
    train.push_back(Json::array({p.step, FiniteOrNull(p.loss)}));
  }
  j["train"] = std::move(train);
  Json evals = Json::array();
  for (const model::EvalResult& e : h.evals) {
    Json x;
    x["step"] = e.step;
    if (e.has_loss) {
      x["loss"] = FiniteOrNull(e.loss);
      x["bits_per_byte"] = FiniteOrNull(e.bits_per_byte);
      x["targets"] = e.targets;
    }
    if (e.has_retrieval) {
      x["retrieval"] = {{"depth", e.retrieval_depth},
                        {"seq_len", e.retrieval_seq_len},
                        {"examples", e.retrieval.examples},
                        {"exact", e.retrieval.exact},
                        {"answer_tokens", e.retrieval.answer_tokens},
                        {"correct_tokens", e.retrieval.correct_tokens}};
    }
    evals.push_back(std::move(x));
  }
  j["evals"] = std::move(evals);
  return j.dump(1) + "\n";
}

// Progress lines: every log_every steps, the mean loss and the throughput of those steps.
class Progress {
 public:
  Progress(std::ostream& out, const TrainerConfig& config, double peak_flops)
      : out_(out), config_(config), peak_(peak_flops) {}

  void OnStep(const model::StepResult& r) {
    ++steps_;
    if (std::isfinite(r.loss)) {
      loss_sum_ += r.loss;
      ++finite_;
    }
    seconds_ += r.seconds;
    tokens_ += static_cast<double>(r.tokens);
    flops_ += r.flops;
    skipped_ += r.skipped;
    last_ = r;
    if (r.step % config_.log_every == 0 || r.step == config_.steps || r.step == 1) Flush();
  }

  // Prints the steps since the last line, if any (when a run ends early).
  void Finish() {
    if (steps_ > 0) Flush();
  }

 private:
  void Flush() {
    const double per_step = seconds_ / static_cast<double>(std::max<int64_t>(1, steps_));
    const double tps = seconds_ > 0 ? tokens_ / seconds_ : 0;
    const double mfu = seconds_ > 0 && peak_ > 0 ? flops_ / seconds_ / peak_ : 0;
    const int width = static_cast<int>(std::to_string(config_.steps).size());
    std::string line = absl::StrFormat(
        "step %*d/%d  loss %s  lr %.2e  grad-norm %.3g  %s tok/s  MFU %.1f%%  ETA %s", width,
        last_.step, config_.steps,
        finite_ > 0 ? absl::StrFormat("%.4f", loss_sum_ / static_cast<double>(finite_)) : "nan",
        last_.lr, last_.grad_norm, HumanCount(tps), 100.0 * mfu,
        HumanDuration(per_step * static_cast<double>(config_.steps - last_.step)));
    if (skipped_ > 0) {
      absl::StrAppend(&line, absl::StrFormat("  (%d step%s skipped: non-finite gradient norm)",
                                             skipped_, skipped_ == 1 ? "" : "s"));
    }
    out_ << line << std::endl;
    steps_ = finite_ = skipped_ = 0;
    loss_sum_ = seconds_ = tokens_ = flops_ = 0;
  }

  std::ostream& out_;
  const TrainerConfig& config_;
  const double peak_;
  model::StepResult last_;
  int64_t steps_ = 0, finite_ = 0, skipped_ = 0;
  double loss_sum_ = 0, seconds_ = 0, tokens_ = 0, flops_ = 0;
};

std::string Footer() {
  return absl::StrCat(
      "\nThe run folder --out holds config.json (the run's full config), checkpoints/, loss.svg "
      "and history.json.\nFlags override --config, which overrides the config saved in the newest "
      "checkpoint\n(with --resume), which overrides the defaults. Config fields: "
      "docs/TRAINING.md.\n\n",
      TrainExitCodeHelp());
}

}  // namespace

double MeasureSgemmFlops(int threads) {
  const int n = 1024;
  const int t =
      threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  openblas_set_num_threads(t);
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f;
    b[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f;
  }
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep > 0 && s > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s);
  }
  return best;
}

int RunTrainCli(int argc, const char* const* argv, std::ostream& out, std::ostream& err,
                const TrainCliEnvironment& env) {
  const std::string program = env.program;
  CLI::App app(absl::StrCat(program,
                            ": trains a LongNet language model on one device, from a text file or "
                            "folder (byte-level) or token files. Devices in this build: ",
                            absl::StrJoin(model::TrainingDevices(), ", "), "."),
               program);
  app.footer(Footer());
  std::vector<std::string> data;
  std::string config_file, model_config_file, out_dir, plot_path;
  bool resume = false, checkpoint_activations = false;
  std::string peak_text;
  app.add_option("--data", data,
                 "Training data: a text file or folder, or token files with --format tokens "
                 "(repeat the flag for several)")
      ->type_name("PATH");
  app.add_option("--out", out_dir,
                 "Run folder: config.json, checkpoints/, loss.svg, history.json (required)")
      ->type_name("DIR");
  app.add_option("--config", config_file, "Trainer config JSON (docs/TRAINING.md)")
      ->type_name("FILE");
  app.add_option("--model-config", model_config_file,
                 "Model config JSON (replaces the trainer config's \"model\")")
      ->type_name("FILE");
  app.add_flag("--resume", resume, "Continue from the newest checkpoint in --out");
  app.add_flag("--checkpoint-activations", checkpoint_activations,
               "Recompute each block in the backward pass (less memory, one more forward)");
  app.add_option("--peak-flops", peak_text,
                 "FLOP/s that MFU divides by (default: on a GPU its nominal dense bf16 rate, "
                 "989.4e12 on an H100 SXM or H200; on the CPU this machine's measured sgemm rate)")
      ->type_name("X")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--plot", plot_path, "Where the loss curve goes (default <out>/loss.svg)")
      ->type_name("FILE");
  std::vector<std::string> field_text(FieldFlags().size());
  std::vector<CLI::Option*> field_options;
  for (size_t i = 0; i < FieldFlags().size(); ++i) {
    const FieldFlag& f = FieldFlags()[i];
    field_options.push_back(app.add_option(f.flag, field_text[i], f.help)
                                ->type_name(f.type_name)
                                ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast));
  }
  try {
    app.parse(argc, const_cast<char**>(argv));
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    err << Usage(program, e.what());
    return kExitUsage;
  }

  // The config: defaults < the newest checkpoint's (--resume) < --config < --model-config < flags.
  if (out_dir.empty()) {
    err << Usage(program, "--out DIR is required (the run folder)");
    return kExitUsage;
  }
  const std::string checkpoint_dir = model::JoinPath(out_dir, "checkpoints");
  Json doc = Json::object();
  if (!config_file.empty()) {
    absl::StatusOr<Json> j = ReadJsonFile(config_file, "--config");
    if (!j.ok()) {
      err << Usage(program, std::string(j.status().message()));
      return kExitUsage;
    }
    doc = *std::move(j);
  } else if (resume) {
    absl::StatusOr<Json> j = ConfigOfNewestCheckpoint(checkpoint_dir);
    if (!j.ok()) {
      err << program << ": error: --resume: " << j.status().message() << '\n';
      return kExitResume;
    }
    doc = *std::move(j);
  }
  if (!doc.is_object()) {
    err << Usage(program, absl::StrCat("--config: ", config_file, " must hold a JSON object"));
    return kExitUsage;
  }
  if (!model_config_file.empty()) {
    absl::StatusOr<Json> j = ReadJsonFile(model_config_file, "--model-config");
    if (!j.ok()) {
      err << Usage(program, std::string(j.status().message()));
      return kExitUsage;
    }
    doc["model"] = *std::move(j);
  }
  if (!data.empty()) doc["data"]["paths"] = data;
  if (checkpoint_activations) doc["checkpoint_activations"] = true;
  std::vector<const FieldFlag*> given;
  for (size_t i = 0; i < FieldFlags().size(); ++i) {
    if (field_options[i]->count() == 0) continue;
    absl::StatusOr<Json> value = FlagValue(FieldFlags()[i], field_text[i]);
    if (!value.ok()) {
      err << Usage(program, std::string(value.status().message()));
      return kExitUsage;
    }
    SetPath(&doc, FieldFlags()[i].field, *std::move(value));
    given.push_back(&FieldFlags()[i]);
  }
  absl::StatusOr<TrainerConfig> parsed = model::ParseTrainerConfigJson(doc.dump());
  if (!parsed.ok()) {
    std::string message(parsed.status().message());
    for (const FieldFlag* f : given) {  // Name the flag that set the field, if one did.
      if (message.find(absl::StrCat("field \"", f->field, "\"")) != std::string::npos) {
        message = absl::StrCat(f->flag, ": ", message);
        break;
      }
    }
    if (message.find("field \"data.paths") != std::string::npos && !data.empty()) {
      message = absl::StrCat("--data: ", message);
    }
    err << Usage(program, message);
    return kExitUsage;
  }
  const TrainerConfig config = *std::move(parsed);
  if (config.data.paths.empty()) {
    err << Usage(program, "no training data: give --data PATH (or data.paths in --config)");
    return kExitUsage;
  }
  double peak = 0;
  if (!peak_text.empty() &&
      (!absl::SimpleAtod(peak_text, &peak) || !(peak > 0) || !std::isfinite(peak))) {
    err << Usage(program, absl::StrCat("--peak-flops: \"", peak_text, "\" is not a number > 0"));
    return kExitUsage;
  }

  // The run folder.
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    err << program << ": error: --out: cannot create " << out_dir << ": " << ec.message() << '\n';
    return kExitOutput;
  }
  absl::StatusOr<std::vector<model::CheckpointEntry>> existing =
      model::ListCheckpoints(checkpoint_dir);
  if (!existing.ok()) {
    err << program << ": error: " << existing.status().message() << '\n';
    return kExitOutput;
  }
  if (!resume && !existing->empty()) {
    err << program << ": error: " << checkpoint_dir << " already holds checkpoints (newest "
        << Basename(existing->back().path)
        << "): pass --resume to continue that run, or choose another --out\n";
    return kExitResume;
  }
  if (resume && existing->empty()) {
    err << program << ": error: --resume: no checkpoint under " << checkpoint_dir << '\n';
    return kExitResume;
  }

  // Data, model, trainer.
  model::CorpusReport report;
  absl::StatusOr<model::TokenCorpus> corpus = model::OpenTrainingCorpus(config, &report);
  if (!corpus.ok()) {
    err << program << ": error: --data: " << corpus.status().message() << '\n';
    return kExitData;
  }
  out << "data: " << absl::StrJoin(config.data.paths, ", ") << ": " << corpus->size() << " tokens ("
      << (config.byte_level() ? "bytes" : "token files") << ", vocabulary " << corpus->vocab_size()
      << ")";
  if (config.byte_level()) {
    out << ", " << report.files << " file" << (report.files == 1 ? "" : "s");
    if (!report.skipped.empty()) out << ", " << report.skipped.size() << " skipped";
  }
  out << '\n';
  model::ModelOptions model_options;
  model_options.checkpoint_activations = config.checkpoint_activations;
  absl::StatusOr<std::unique_ptr<model::TrainableModel>> trainable = model::NewTrainableModel(
      config.device, config.model, model_options, static_cast<int>(config.threads));
  if (!trainable.ok()) {
    err << program << ": error: " << trainable.status().message() << '\n';
    return trainable.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                           : kExitTrainingFailed;
  }
  const std::string description = (*trainable)->description();
  const int64_t parameters = (*trainable)->layout().total();
  model::TrainerOptions trainer_options;
  trainer_options.checkpoint_dir = checkpoint_dir;
  absl::StatusOr<std::unique_ptr<Trainer>> created =
      Trainer::Create(config, *corpus, *std::move(trainable), trainer_options);
  if (!created.ok()) {
    err << program << ": error: " << created.status().message() << '\n';
    return created.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                         : kExitTrainingFailed;
  }
  Trainer& trainer = **created;
  if (resume) {
    const absl::Status s = trainer.Resume();
    if (!s.ok()) {
      err << program << ": error: --resume: " << s.message() << '\n';
      return kExitResume;
    }
    out << "resumed from " << trainer.resumed_from() << " at step " << trainer.step() << '\n';
    for (const std::string& note : trainer.resume_notes()) {
      out << "  changed since the checkpoint: " << note << '\n';
    }
  }
  {
    const absl::Status s = model::WriteWholeFile(model::JoinPath(out_dir, "config.json"),
                                                 model::TrainerConfigToJson(config) + "\n", true);
    if (!s.ok()) {
      err << program << ": error: --out: " << s.message() << '\n';
      return kExitOutput;
    }
  }
  std::string peak_note = "given";
  if (peak == 0) {
    peak = trainer.model().NominalPeakFlops();
    if (peak > 0) {
      peak_note = "the nominal dense bf16 rate of this GPU";
    } else if (config.device == "cpu") {
      peak = MeasureSgemmFlops(static_cast<int>(config.threads));
      peak_note = "measured: sgemm 1024^3 on this CPU";
    } else {
      peak_note = "no nominal rate known for this device: pass --peak-flops";
    }
  }
  out << "model: " << parameters << " parameters (d_model " << config.model.d_model << ", "
      << config.model.num_layers << (config.model.num_layers == 1 ? " layer, " : " layers, ")
      << config.model.num_heads << (config.model.num_heads == 1 ? " head" : " heads") << ", ffn "
      << config.model.ffn_dim << "), " << description << '\n';
  out << "step: " << config.batch_size << " x " << config.seq_len << " tokens in "
      << config.micro_batches << " micro-batch" << (config.micro_batches == 1 ? "" : "es") << ", "
      << absl::StrFormat("%.3g", trainer.flops_per_step()) << " FLOPs; MFU against "
      << absl::StrFormat("%.3g", peak) << " FLOP/s (" << peak_note << ")\n";
  out << "split: " << trainer.split().train.size() << " training tokens, "
      << trainer.split().validation.size() << " held out\n";

  // Train.
  Progress progress(out, config, peak);
  model::RunCallbacks callbacks;
  callbacks.stop = env.stop;
  callbacks.on_step = [&](const model::StepResult& r) { progress.OnStep(r); };
  callbacks.on_eval = [&](const model::EvalResult& e) { out << EvalLine(e) << std::endl; };
  callbacks.on_checkpoint = [&](const std::string& path, int64_t step) {
    out << "checkpoint step " << step << ": " << path << std::endl;
  };
  const auto start = std::chrono::steady_clock::now();
  const absl::Status run = trainer.Run(callbacks);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.Finish();

  // The loss curve, whatever happened, once there is something to draw.
  int code = kExitOk;
  if (run.ok()) {
    out << "done: step " << trainer.step() << ", " << HumanCount(trainer.tokens_seen())
        << " tokens seen, " << HumanDuration(wall) << " in this process" << '\n';
  } else if (run.code() == absl::StatusCode::kCancelled) {
    err << program << ": " << run.message() << "; continue with --resume\n";
    code = kExitInterrupted;
  } else {
    err << program << ": error: " << run.message() << '\n';
    code = kExitTrainingFailed;
  }
  if (!trainer.history().train.empty()) {
    const std::string plot = plot_path.empty() ? model::JoinPath(out_dir, "loss.svg") : plot_path;
    const absl::Status s = WriteLossCurveSvg(plot, CurveOf(trainer, program));
    if (!s.ok()) {
      err << program << ": error: --plot: " << s.message() << '\n';
      if (code == kExitOk) code = kExitOutput;
    } else {
      out << "loss curve: " << plot << '\n';
    }
    const std::string history = model::JoinPath(out_dir, "history.json");
    const absl::Status h =
        model::WriteWholeFile(history, HistoryJson(trainer, program, description), true);
    if (!h.ok()) {
      err << program << ": error: --out: " << h.message() << '\n';
      if (code == kExitOk) code = kExitOutput;
    }
  }
  return code;
}

}  // namespace trainer
}  // namespace dattn
