// plot_runs: several dattn-train runs' loss curves on one SVG (trainer/loss_plot.h), from the
// history.json each run wrote into its folder (trainer/train_cli.h):
//
//   plot_runs --out FILE.svg [--title TEXT] HISTORY.json [HISTORY.json ...]
//
// The first run is drawn as dattn-train draws its own (blue training line, red validation
// points), the others (at most kMaxOtherRuns) in colours of their own; each is named in the legend
// by its device and description ("cuda: ... NVIDIA H200 ..."), shortened to 60 characters. The
// subtitle is the first run's model and batch. For docs: the GPU and the CPU run of one config
// (scripts/gpu-train-check.sh).
//
// Exit codes: 0 written; 2 a bad command line, or a file that is not a dattn-train history
// (named); 1 the SVG cannot be written.
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/file_io.h"
#include "nlohmann/json.hpp"
#include "trainer/loss_plot.h"

namespace dattn {
namespace trainer {
namespace {

using Json = nlohmann::json;
constexpr char kProgram[] = "plot_runs";

struct RunCurve {
  LossSeries series;
  std::string subtitle;
};

double NumberOrNan(const Json& j) {
  return j.is_number() ? j.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

absl::StatusOr<RunCurve> ReadRun(const std::string& path) {
  absl::StatusOr<std::string> text = model::ReadSmallFile(path, int64_t{256} << 20);
  if (!text.ok()) return text.status();
  RunCurve run;
  try {
    const Json h = Json::parse(*text);
    std::string label = absl::StrCat(h.at("device").get<std::string>(), ": ",
                                     h.at("description").get<std::string>());
    if (label.size() > 60) label = label.substr(0, 57) + "...";
    run.series.label = label;
    for (const Json& p : h.at("train")) {
      run.series.train.push_back({p.at(0).get<double>(), NumberOrNan(p.at(1))});
    }
    for (const Json& e : h.at("evals")) {
      if (e.contains("loss")) {
        run.series.validation.push_back({e.at("step").get<double>(), NumberOrNan(e.at("loss"))});
      }
    }
    const Json& c = h.at("config");
    const Json& m = c.at("model");
    run.subtitle = absl::StrFormat(
        "d_model %d, %d layers, %d heads, ffn %d; seq_len %d x batch %d; lr %g, %d steps",
        m.at("d_model").get<int64_t>(), m.at("num_layers").get<int64_t>(),
        m.at("num_heads").get<int64_t>(), m.at("ffn_dim").get<int64_t>(),
        c.at("seq_len").get<int64_t>(), c.at("batch_size").get<int64_t>(),
        c.at("optimizer").at("lr").get<double>(), c.at("steps").get<int64_t>());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a dattn-train history.json: ", e.what()));
  }
  return run;
}

int Run(int argc, char** argv) {
  CLI::App app("plot_runs: several dattn-train runs' loss curves (their history.json) on one SVG.",
               kProgram);
  std::string out, title = "LongNet training runs";
  std::vector<std::string> histories;
  app.add_option("--out", out, "The SVG to write")->type_name("FILE")->required();
  app.add_option("--title", title, "The title");
  app.add_option("histories", histories, "history.json of each run (the first drawn first)")
      ->type_name("HISTORY.json")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << kProgram << ": error: " << e.what() << "\n";
    return 2;
  }
  if (histories.size() > static_cast<size_t>(1 + kMaxOtherRuns)) {
    std::cerr << kProgram << ": error: " << histories.size() << " runs; at most "
              << 1 + kMaxOtherRuns << " are drawn\n";
    return 2;
  }
  LossCurve curve;
  curve.title = title;
  for (size_t i = 0; i < histories.size(); ++i) {
    absl::StatusOr<RunCurve> run = ReadRun(histories[i]);
    if (!run.ok()) {
      std::cerr << kProgram << ": error: " << run.status().message() << "\n";
      return 2;
    }
    if (i == 0) {
      curve.label = run->series.label;
      curve.train = run->series.train;
      curve.validation = run->series.validation;
      curve.subtitle = run->subtitle;
    } else {
      curve.others.push_back(run->series);
    }
  }
  const absl::Status s = WriteLossCurveSvg(out, curve);
  if (!s.ok()) {
    std::cerr << kProgram << ": error: " << s.message() << "\n";
    return 1;
  }
  std::cout << kProgram << ": " << histories.size() << " runs: " << out << "\n";
  return 0;
}

}  // namespace
}  // namespace trainer
}  // namespace dattn

int main(int argc, char** argv) { return dattn::trainer::Run(argc, argv); }
