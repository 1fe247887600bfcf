// The loss-curve image dattn-train writes at the end of a run: training and validation loss
// against the step, as an SVG document written by hand.
//
// Why SVG by hand: it needs no library (Debian has no small C++ plotting library, and PNG would
// need one for the encoder and a font rasteriser for the labels), it is text (a test can check
// its content, and git diffs it), it scales without blurring, and browsers and GitHub render it.
// Layout: a title, a plot area with "nice" ticks (1, 2 or 5 times a power of ten) and light grid
// lines, the x axis labelled "step" and the y axis "loss (nats per token)", the training curve as
// a polyline, the validation points as circles joined by a line, and a legend. Non-finite values
// are left out (the line is broken there). More than kMaxPolylinePoints training points are
// averaged in consecutive buckets of equal size, so the file stays small (a million steps plot
// as kMaxPolylinePoints averages). Other runs (LossCurve::others: trainer/plot_runs overlays the
// GPU and the CPU run of one config) are drawn on the same axes, each in its own colour, training
// as a line and validation as points, and named in the legend.
//
// Everything here is pure and thread-safe.
#ifndef DATTN_TRAINER_LOSS_PLOT_H_
#define DATTN_TRAINER_LOSS_PLOT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace dattn {
namespace trainer {

inline constexpr int64_t kMaxPolylinePoints = 4000;

// One more run on the same axes.
struct LossSeries {
  std::string label;                                  // Its name in the legend (escaped here).
  std::vector<std::pair<double, double>> train;       // (step, loss), by increasing step.
  std::vector<std::pair<double, double>> validation;  // (step, loss), by increasing step.
};

struct LossCurve {
  std::string title;     // Escaped for XML here.
  std::string subtitle;  // A second, smaller line under the title (may be empty).
  std::vector<std::pair<double, double>> train;       // (step, loss), by increasing step.
  std::vector<std::pair<double, double>> validation;  // (step, loss), by increasing step.
  // The run's name in the legend ("<label>: training (N steps)"); empty: "training (N steps)".
  std::string label;
  // Other runs, drawn after this one in colours of their own (at most kMaxOtherRuns).
  std::vector<LossSeries> others;
};

inline constexpr int kMaxOtherRuns = 4;

// The SVG document (800 x 500 user units), UTF-8. An empty curve gives axes and a note "no data".
// Runs of `others` beyond kMaxOtherRuns are not drawn.
std::string RenderLossCurveSvg(const LossCurve& curve);

// RenderLossCurveSvg written to `path` (through a temporary file, fsynced and renamed). Errors
// name the path.
absl::Status WriteLossCurveSvg(const std::string& path, const LossCurve& curve);

// The ticks of an axis showing [lo, hi]: consecutive multiples of a step of 1, 2 or 5 times a
// power of ten chosen for about `target` intervals, from the largest multiple <= lo to the
// smallest >= hi (the axis runs from the first tick to the last). lo == hi is widened by 10% of
// |lo| (or 1) each way; non-finite bounds give no ticks.
std::vector<double> NiceTicks(double lo, double hi, int target);

}  // namespace trainer
}  // namespace dattn

#endif  // DATTN_TRAINER_LOSS_PLOT_H_
