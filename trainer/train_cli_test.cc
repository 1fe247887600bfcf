// dattn-train in-process: help, bad flags and data (each a clear error and its exit code), short
// real runs on the built-in corpus that write checkpoints, config.json and an SVG whose content is
// checked, resume (and refusing what cannot be resumed), interruption, token files.
#include "trainer/train_cli.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "model/file_io.h"
#include "model/token_file.h"
#include "model/trainer_config.h"
#include "nlohmann/json.hpp"
#include "trainer/exit_codes.h"

namespace dattn {
namespace trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kKjv[] = "model/kjv.txt";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = model::JoinPath(dir != nullptr ? dir : "/tmp", name);
  fs::remove_all(path);
  return path;
}

// The tiny model of model/trainer_test.cc.
std::string TinyModelConfig() {
  const std::string path = TempPath("tiny_model.json");
  std::ofstream(path) << R"({"d_model": 64, "num_layers": 2, "num_heads": 4, "ffn_dim": 256,
    "attention": {"segment_lengths": [32, 64, 128], "dilation_rates": [1, 2, 4]}})";
  return path;
}

struct CliResult {
  int code = -1;
  std::string out, err;
};

CliResult Train(std::vector<std::string> args, const std::atomic<bool>* stop = nullptr) {
  args.insert(args.begin(), "dattn-train");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  TrainCliEnvironment env;
  env.stop = stop;
  CliResult r;
  r.code = RunTrainCli(static_cast<int>(argv.size()), argv.data(), out, err, env);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A short run's flags: the tiny model, 2 threads, MFU against a given peak (no measurement).
std::vector<std::string> Short(const std::string& out_dir, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"--data",         kKjv,    "--model-config", TinyModelConfig(),
                                   "--out",          out_dir, "--seq-len",      "128",
                                   "--batch-size",   "4",     "--threads",      "2",
                                   "--peak-flops",   "1e11",  "--warmup",       "2",
                                   "--eval-batches", "2",     "--lr",           "3e-3"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TrainCliTest, HelpListsFlagsAndExitCodes) {
  const CliResult r = Train({"--help"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  for (const char* text : {"--data", "--out", "--resume", "--config", "--steps", "--peak-flops",
                           "--device", "Exit codes:", "interrupted"}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text;
  }
}

TEST(TrainCliTest, BadFlagsAreUsageErrorsNamingTheFlagAndValue) {
  const std::string out = TempPath("bad_flags");
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expected;  // In the error message.
  };
  const std::vector<Case> cases = {
      {Short(out, {"--stpes", "5"}), {"--stpes"}},
      {Short(out, {"--steps", "abc"}), {"--steps", "\"abc\"", "not an integer"}},
      {Short(out, {"--steps", "0"}), {"--steps", "field \"steps\"", "0 must be >= 1"}},
      {Short(out, {"--lr", "-1"}), {"--lr", "optimizer.lr", "-1"}},
      {Short(out, {"--lr", "fast"}), {"--lr", "\"fast\""}},
      {Short(out, {"--device", "cuda"}),
       {"--device", "\"cuda\" is not available in this build (cpu)", "dattn-train-gpu"}},
      {Short(out, {"--micro-batches", "3"}), {"--micro-batches", "3 does not divide"}},
      {Short(out, {"--max-grad-norm", "0"}), {"--max-grad-norm", "0 must be > 0"}},
      {Short(out, {"--format", "words"}), {"--format", "\"words\""}},
      {Short(out, {"--retrieval-depth", "2"}), {"--retrieval-depth", "retrieval.depth", "2"}},
      {Short(out, {"--peak-flops", "-5"}), {"--peak-flops", "\"-5\""}},
      {Short(out, {"--config", "/nonexistent/run.json"}), {"--config", "/nonexistent/run.json"}},
      {{"--data", kKjv}, {"--out DIR is required"}},
      {{"--out", out}, {"no training data", "--data"}},
  };
  for (const Case& c : cases) {
    const CliResult r = Train(c.args);
    EXPECT_EQ(r.code, kExitUsage) << r.err;
    for (const std::string& e : c.expected) {
      EXPECT_NE(r.err.find(e), std::string::npos) << "expected \"" << e << "\" in: " << r.err;
    }
    EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(model::JoinPath(out, "checkpoints"))) << r.err;
  }
  // A flag given twice: the last one counts.
  const CliResult twice = Train(Short(out, {"--steps", "0", "--steps", "abc"}));
  EXPECT_NE(twice.err.find("--steps: \"abc\""), std::string::npos) << twice.err;
  // A config file with a bad value: the field is named.
  const std::string config = TempPath("bad_config.json");
  std::ofstream(config) << R"({"optimizer": {"beta2": 1.5}})";
  const CliResult r = Train(Short(out, {"--config", config}));
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("trainer config field \"optimizer.beta2\": 1.5"), std::string::npos)
      << r.err;
}

TEST(TrainCliTest, DataThatCannotBeReadIsNamed) {
  const CliResult missing = Train(Short(TempPath("no_data"), {"--data", "/nonexistent/corpus"}));
  // --data is repeatable: the second path makes two, which "text" refuses by name.
  EXPECT_EQ(missing.code, kExitUsage) << missing.err;
  EXPECT_NE(missing.err.find("--data"), std::string::npos) << missing.err;
  std::vector<std::string> args = Short(TempPath("no_data"));
  args[1] = "/nonexistent/corpus";
  const CliResult r = Train(args);
  EXPECT_EQ(r.code, kExitData) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/corpus"), std::string::npos) << r.err;
}

TEST(TrainCliTest, ShortRunWritesCheckpointsConfigAndLossCurve) {
  const std::string out = TempPath("short_run");
  const CliResult r = Train(Short(out, {"--steps", "6", "--save-every", "3", "--eval-every", "3",
                                        "--log-every", "2", "--retrieval-examples", "4"}));
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  // Progress lines: step, loss, tokens/s, MFU, ETA.
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(R"(step 6/6  loss [0-9.]+  lr [0-9.e+-]+  grad-norm [0-9.e+-]+  )"
                        R"([0-9.]+K? tok/s  MFU [0-9.]+%  ETA 0s)")))
      << r.out;
  EXPECT_EQ(Count(r.out, "  loss "), 4) << r.out;     // Steps 1, 2, 4, 6.
  EXPECT_EQ(Count(r.out, "eval step "), 3) << r.out;  // Steps 0, 3, 6.
  EXPECT_NE(r.out.find("bits/byte"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("retrieval at depth 0.50 of 128 tokens"), std::string::npos) << r.out;
  // Checkpoints at 3 and 6, complete and verified.
  for (int step : {3, 6}) {
    const std::string dir =
        model::JoinPath(model::JoinPath(out, "checkpoints"), model::CheckpointFolderName(step));
    absl::StatusOr<model::Checkpoint> ck = model::Checkpoint::Open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status();
    EXPECT_EQ(ck->step(), step);
    EXPECT_NE(r.out.find("checkpoint step " + std::to_string(step) + ": " + dir), std::string::npos)
        << r.out;
  }
  // config.json: the whole config of the run.
  const nlohmann::json config = nlohmann::json::parse(ReadAll(model::JoinPath(out, "config.json")));
  EXPECT_EQ(config["steps"], 6);
  EXPECT_EQ(config["model"]["d_model"], 64);
  EXPECT_EQ(config["data"]["paths"][0], kKjv);
  // The loss curve: an SVG with a title, labelled axes, 6 training points and 3 validation ones.
  const std::string svg = ReadAll(model::JoinPath(out, "loss.svg"));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find(">dattn-train: LongNet on kjv.txt (bytes), device cpu</text>"),
            std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">loss (nats per token)</text>"), std::string::npos);
  EXPECT_NE(svg.find("training (6 steps)"), std::string::npos);
  EXPECT_NE(svg.find("validation (3 points)"), std::string::npos);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      svg, m, std::regex(R"re(<g class="train">\n<polyline [^>]*points="([^"]*)")re")))
      << svg;
  EXPECT_EQ(Count(m[1].str(), ","), 6) << m[1];
  const size_t validation = svg.find("<g class=\"validation\">");
  ASSERT_NE(validation, std::string::npos);
  EXPECT_EQ(Count(svg.substr(validation), "<circle "), 3 + 1);  // Plus the legend's marker.
  EXPECT_NE(r.out.find("loss curve: " + model::JoinPath(out, "loss.svg")), std::string::npos);
  // history.json: the same losses as numbers, with the device and the config.
  const nlohmann::json history =
      nlohmann::json::parse(ReadAll(model::JoinPath(out, "history.json")));
  EXPECT_EQ(history["program"], "dattn-train");
  EXPECT_EQ(history["device"], "cpu");
  EXPECT_NE(history["description"].get<std::string>().find("cpu fp32"), std::string::npos);
  EXPECT_EQ(history["config"]["steps"], 6);
  ASSERT_EQ(history["train"].size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(history["train"][i][0], i + 1);
    EXPECT_GT(history["train"][i][1].get<double>(), 0.5);
  }
  ASSERT_EQ(history["evals"].size(), 3u);
  EXPECT_EQ(history["evals"][2]["step"], 6);
  EXPECT_NEAR(history["evals"][2]["bits_per_byte"].get<double>(),
              history["evals"][2]["loss"].get<double>() / std::log(2.0), 1e-12);
  EXPECT_EQ(history["evals"][2]["retrieval"]["examples"], 4);
}

TEST(TrainCliTest, ResumeContinuesAndRefusesWhatItCannotUse) {
  const std::string out = TempPath("resume_run");
  CliResult r = Train(Short(out, {"--steps", "4", "--save-every", "2", "--eval-every", "0"}));
  ASSERT_EQ(r.code, kExitOk) << r.err;
  // A fresh run into a folder with checkpoints would overwrite them: refused.
  r = Train(Short(out, {"--steps", "4"}));
  EXPECT_EQ(r.code, kExitResume);
  EXPECT_NE(r.err.find("already holds checkpoints"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;
  // --resume alone: the config comes from the checkpoint; --steps extends the run.
  r = Train({"--out", out, "--resume", "--steps", "6", "--peak-flops", "1e11"});
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  EXPECT_NE(r.out.find("resumed from " +
                       model::JoinPath(model::JoinPath(out, "checkpoints"),
                                       model::CheckpointFolderName(4)) +
                       " at step 4"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("changed since the checkpoint: steps: 4 there, 6 here"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step 6/6"), std::string::npos) << r.out;
  EXPECT_NE(ReadAll(model::JoinPath(out, "loss.svg")).find("training (6 steps)"),
            std::string::npos);
  // Another model over these checkpoints: refused, naming the field.
  const std::string other_model = TempPath("other_model.json");
  std::ofstream(other_model) << R"({"d_model": 32, "num_layers": 2, "num_heads": 4,
    "ffn_dim": 256, "attention": {"segment_lengths": [32, 64, 128], "dilation_rates": [1, 2, 4]}})";
  r = Train({"--out", out, "--resume", "--model-config", other_model, "--peak-flops", "1e11"});
  EXPECT_EQ(r.code, kExitResume) << r.err;
  EXPECT_NE(r.err.find("d_model: 64 there, 32 here"), std::string::npos) << r.err;
  // A bit flipped in the newest checkpoint: refused, naming the file.
  const std::string weights = model::JoinPath(
      model::JoinPath(model::JoinPath(out, "checkpoints"), model::CheckpointFolderName(6)),
      model::kWeightsFile);
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-64, std::ios::end);
    f.put('\x7f');
  }
  r = Train({"--out", out, "--resume", "--peak-flops", "1e11"});
  EXPECT_EQ(r.code, kExitResume) << r.err;
  EXPECT_NE(r.err.find(weights), std::string::npos) << r.err;
  // Nothing to resume.
  r = Train(Short(TempPath("resume_empty"), {"--resume"}));
  EXPECT_EQ(r.code, kExitResume) << r.err;
  EXPECT_NE(r.err.find("no complete checkpoint under"), std::string::npos) << r.err;
}

TEST(TrainCliTest, StopRequestWritesACheckpointAndExitsInterrupted) {
  const std::string out = TempPath("stopped");
  std::atomic<bool> stop{true};
  const CliResult r = Train(Short(out, {"--steps", "5", "--eval-every", "0"}), &stop);
  EXPECT_EQ(r.code, kExitInterrupted) << r.err;
  EXPECT_NE(r.err.find("continue with --resume"), std::string::npos) << r.err;
  EXPECT_TRUE(model::Checkpoint::Open(model::JoinPath(model::JoinPath(out, "checkpoints"),
                                                      model::CheckpointFolderName(0)))
                  .ok());
  const CliResult again = Train({"--out", out, "--resume", "--peak-flops", "1e11"});
  EXPECT_EQ(again.code, kExitOk) << again.err;
  EXPECT_NE(again.out.find("step 5/5"), std::string::npos) << again.out;
}

TEST(TrainCliTest, TrainsOnTokenFiles) {
  // The first 64K bytes of the corpus as a token file of vocabulary 300 (ids above 255 unused).
  absl::StatusOr<model::TokenCorpus> kjv = model::TokenCorpus::FromText(kKjv);
  ASSERT_TRUE(kjv.ok());
  std::vector<int32_t> tokens(65536);
  ASSERT_TRUE(kjv->Read(0, absl::MakeSpan(tokens)).ok());
  const std::string file = TempPath("kjv.tok");
  ASSERT_TRUE(model::WriteTokenFile(file, tokens, 300).ok());
  const std::string model_config = TempPath("tok_model.json");
  std::ofstream(model_config) << R"({"vocab_size": 300, "d_model": 32, "num_layers": 1,
    "num_heads": 2, "ffn_dim": 64, "attention": {"segment_lengths": [64], "dilation_rates": [1]}})";
  const CliResult r = Train({"--data",
                             file,
                             "--format",
                             "tokens",
                             "--model-config",
                             model_config,
                             "--out",
                             TempPath("tok_run"),
                             "--steps",
                             "2",
                             "--warmup",
                             "1",
                             "--seq-len",
                             "64",
                             "--batch-size",
                             "2",
                             "--threads",
                             "1",
                             "--peak-flops",
                             "1e11",
                             "--validation-fraction",
                             "0.1"});
  ASSERT_EQ(r.code, kExitOk) << r.err << r.out;
  EXPECT_NE(r.out.find("65536 tokens (token files, vocabulary 300)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval step 2: validation loss"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("bits/byte"), std::string::npos) << r.out;  // Not bytes.
}

// The demo's config (docs/TRAINING.md) stays valid, and says what the docs say it does.
TEST(TrainCliTest, TheDemoConfigIsValid) {
  absl::StatusOr<model::TrainerConfig> c =
      model::ParseTrainerConfigJson(ReadAll("trainer/configs/kjv-small.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.d_model, 128);
  EXPECT_EQ(c->model.num_layers, 4);
  EXPECT_EQ(c->steps, 300);
  EXPECT_EQ(c->data.paths, std::vector<std::string>{"bazel-bin/model/kjv.txt"});
}

}  // namespace
}  // namespace trainer
}  // namespace dattn
