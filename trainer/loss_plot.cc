#include "trainer/loss_plot.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/file_io.h"

namespace dattn {
namespace trainer {
namespace {

constexpr double kWidth = 800, kHeight = 500;
constexpr double kLeft = 80, kRight = 30, kTop = 70, kBottom = 60;
constexpr char kTrainColor[] = "#1f77b4";
constexpr char kValidationColor[] = "#d62728";
// Training and validation colours of LossCurve::others, in order.
constexpr const char* kOtherColors[kMaxOtherRuns][2] = {
    {"#2ca02c", "#ff7f0e"}, {"#9467bd", "#8c564b"}, {"#17becf", "#e377c2"}, {"#7f7f7f", "#bcbd22"}};

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 1, 2 or 5 times a power of ten, near span / target.
double NiceStep(double span, int target) {
  const double raw = span / std::max(1, target);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / power;
  const double nice = f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10;
  return nice * power;
}

struct Axis {
  double lo = 0, hi = 1;
  double step = 0.1;
  std::vector<double> ticks;
  // Pixels: value lo at p0, hi at p1.
  double p0 = 0, p1 = 1;
  double Map(double v) const { return p0 + (v - lo) / (hi - lo) * (p1 - p0); }
};

Axis MakeAxis(double lo, double hi, int target, double p0, double p1) {
  Axis a;
  a.ticks = NiceTicks(lo, hi, target);
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  a.step = a.ticks[1] - a.ticks[0];
  a.p0 = p0;
  a.p1 = p1;
  return a;
}

std::string TickLabel(double v, double step) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  if (std::abs(v) < step * 1e-6) v = 0;  // No "-0".
  if (decimals == 0 && std::abs(v) >= 1e6) return absl::StrFormat("%.3g", v);
  return absl::StrFormat("%.*f", decimals, v);
}

// Averages of consecutive buckets when there are more than `max_points` points.
std::vector<std::pair<double, double>> Thin(const std::vector<std::pair<double, double>>& points,
                                            int64_t max_points) {
  const int64_t n = static_cast<int64_t>(points.size());
  if (n <= max_points) return points;
  std::vector<std::pair<double, double>> out;
  out.reserve(static_cast<size_t>(max_points));
  for (int64_t b = 0; b < max_points; ++b) {
    const int64_t begin = b * n / max_points, end = (b + 1) * n / max_points;
    double x = 0, y = 0;
    int64_t count = 0;
    for (int64_t i = begin; i < end; ++i) {
      const auto& [px, py] = points[static_cast<size_t>(i)];
      if (!std::isfinite(py)) continue;
      x += px;
      y += py;
      ++count;
    }
    if (count == 0) {
      out.push_back(
          {points[static_cast<size_t>(begin)].first, std::numeric_limits<double>::quiet_NaN()});
    } else {
      out.push_back({x / count, y / count});
    }
  }
  return out;
}

// Polylines through the finite points (a non-finite value ends one and starts the next).
std::string Polylines(const std::vector<std::pair<double, double>>& points, const Axis& x,
                      const Axis& y, const std::string& style) {
  std::string out, current;
  int count = 0;
  auto flush = [&] {
    if (count >= 2) absl::StrAppend(&out, "<polyline ", style, " points=\"", current, "\"/>\n");
    current.clear();
    count = 0;
  };
  for (const auto& [px, py] : points) {
    if (!std::isfinite(px) || !std::isfinite(py)) {
      flush();
      continue;
    }
    absl::StrAppend(&current, count > 0 ? " " : "",
                    absl::StrFormat("%.1f,%.1f", x.Map(px), y.Map(py)));
    ++count;
  }
  flush();
  return out;
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  std::vector<double> ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return ticks;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double step = NiceStep(hi - lo, target);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  for (double k = first; k <= last; k += 1) ticks.push_back(k * step);
  if (ticks.size() < 2) ticks.push_back(ticks.back() + step);
  return ticks;
}

std::string RenderLossCurveSvg(const LossCurve& curve) {
  const std::vector<std::pair<double, double>> train = Thin(curve.train, kMaxPolylinePoints);
  const size_t others = std::min<size_t>(curve.others.size(), kMaxOtherRuns);
  std::vector<std::vector<std::pair<double, double>>> other_train;
  for (size_t i = 0; i < others; ++i) {
    other_train.push_back(Thin(curve.others[i].train, kMaxPolylinePoints));
  }
  std::vector<const std::vector<std::pair<double, double>>*> all = {&train, &curve.validation};
  for (size_t i = 0; i < others; ++i) {
    all.push_back(&other_train[i]);
    all.push_back(&curve.others[i].validation);
  }
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const auto* series : all) {
    for (const auto& [px, py] : *series) {
      if (!std::isfinite(px) || !std::isfinite(py)) continue;
      x_lo = std::min(x_lo, px);
      x_hi = std::max(x_hi, px);
      y_lo = std::min(y_lo, py);
      y_hi = std::max(y_hi, py);
    }
  }
  const bool empty = !std::isfinite(x_lo);
  if (empty) {
    x_lo = 0;
    x_hi = 1;
    y_lo = 0;
    y_hi = 1;
  }
  x_lo = std::min(x_lo, 0.0);  // Steps start at 0.
  const Axis x = MakeAxis(x_lo, x_hi, 8, kLeft, kWidth - kRight);
  const Axis y = MakeAxis(y_lo, y_hi, 6, kHeight - kBottom, kTop);

  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
      kWidth, kHeight, kWidth, kHeight);
  absl::StrAppend(&svg, "<title>", Escape(curve.title), "</title>\n");
  absl::StrAppend(&svg, "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppend(&svg,
                  absl::StrFormat("<text class=\"title\" x=\"%.1f\" y=\"28\" font-size=\"18\" "
                                  "text-anchor=\"middle\">%s</text>\n",
                                  kWidth / 2, Escape(curve.title)));
  if (!curve.subtitle.empty()) {
    absl::StrAppend(&svg,
                    absl::StrFormat("<text class=\"subtitle\" x=\"%.1f\" y=\"50\" font-size=\"12\" "
                                    "fill=\"#444\" text-anchor=\"middle\">%s</text>\n",
                                    kWidth / 2, Escape(curve.subtitle)));
  }
  // Grid and ticks.
  absl::StrAppend(&svg, "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
  const std::vector<double>& xticks = x.ticks;
  const std::vector<double>& yticks = y.ticks;
  for (double t : xticks) {
    absl::StrAppend(
        &svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x.Map(t),
                              y.p0, x.Map(t), y.p1));
  }
  for (double t : yticks) {
    absl::StrAppend(
        &svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x.p0,
                              y.Map(t), x.p1, y.Map(t)));
  }
  absl::StrAppend(&svg, "</g>\n");
  // Axes.
  absl::StrAppend(&svg,
                  absl::StrFormat("<g class=\"axes\" stroke=\"black\" stroke-width=\"1.5\">\n"
                                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n"
                                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n</g>\n",
                                  x.p0, y.p0, x.p1, y.p0, x.p0, y.p0, x.p0, y.p1));
  absl::StrAppend(&svg, "<g class=\"ticks\" font-size=\"12\">\n");
  for (double t : xticks) {
    absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                          "stroke=\"black\"/><text x=\"%.1f\" y=\"%.1f\" "
                                          "text-anchor=\"middle\">%s</text>\n",
                                          x.Map(t), y.p0, x.Map(t), y.p0 + 5, x.Map(t), y.p0 + 20,
                                          TickLabel(t, x.step)));
  }
  for (double t : yticks) {
    absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                          "stroke=\"black\"/><text x=\"%.1f\" y=\"%.1f\" "
                                          "text-anchor=\"end\">%s</text>\n",
                                          x.p0 - 5, y.Map(t), x.p0, y.Map(t), x.p0 - 8,
                                          y.Map(t) + 4, TickLabel(t, y.step)));
  }
  absl::StrAppend(&svg, "</g>\n");
  // Axis labels.
  absl::StrAppend(&svg,
                  absl::StrFormat("<text class=\"xlabel\" x=\"%.1f\" y=\"%.1f\" font-size=\"14\" "
                                  "text-anchor=\"middle\">step</text>\n",
                                  (x.p0 + x.p1) / 2, kHeight - 15));
  absl::StrAppend(&svg, absl::StrFormat("<text class=\"ylabel\" x=\"20\" y=\"%.1f\" "
                                        "font-size=\"14\" text-anchor=\"middle\" "
                                        "transform=\"rotate(-90 20 %.1f)\">loss (nats per "
                                        "token)</text>\n",
                                        (y.p0 + y.p1) / 2, (y.p0 + y.p1) / 2));
  if (empty) {
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" font-size=\"16\" "
                                          "fill=\"#888\" text-anchor=\"middle\">no data</text>\n",
                                          (x.p0 + x.p1) / 2, (y.p0 + y.p1) / 2));
  }
  // Curves: this run, then the others.
  auto draw = [&](const std::string& suffix, const std::vector<std::pair<double, double>>& t,
                  const std::vector<std::pair<double, double>>& v, const char* train_color,
                  const char* validation_color) {
    absl::StrAppend(&svg, "<g class=\"train", suffix, "\">\n",
                    Polylines(t, x, y,
                              absl::StrCat("fill=\"none\" stroke=\"", train_color,
                                           "\" stroke-width=\"1.2\" stroke-linejoin=\"round\"")),
                    "</g>\n");
    absl::StrAppend(&svg, "<g class=\"validation", suffix, "\">\n",
                    Polylines(v, x, y,
                              absl::StrCat("fill=\"none\" stroke=\"", validation_color,
                                           "\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"")));
    for (const auto& [px, py] : v) {
      if (!std::isfinite(px) || !std::isfinite(py)) continue;
      absl::StrAppend(&svg,
                      absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                                      x.Map(px), y.Map(py), validation_color));
    }
    absl::StrAppend(&svg, "</g>\n");
  };
  draw("", train, curve.validation, kTrainColor, kValidationColor);
  for (size_t i = 0; i < others; ++i) {
    draw(" other", other_train[i], curve.others[i].validation, kOtherColors[i][0],
         kOtherColors[i][1]);
  }
  // Legend (top right of the plot area): a line per curve, a dot per set of validation points.
  struct Row {
    std::string text;
    const char* color;
    bool line;
  };
  auto named = [](const std::string& label, const std::string& what) {
    return label.empty() ? what : absl::StrCat(label, ": ", what);
  };
  std::vector<Row> rows = {
      {named(curve.label, absl::StrFormat("training (%d steps)", curve.train.size())), kTrainColor,
       true},
      {named(curve.label, absl::StrFormat("validation (%d points)", curve.validation.size())),
       kValidationColor, false}};
  for (size_t i = 0; i < others; ++i) {
    const LossSeries& o = curve.others[i];
    rows.push_back({named(o.label, absl::StrFormat("training (%d steps)", o.train.size())),
                    kOtherColors[i][0], true});
    if (!o.validation.empty()) {
      rows.push_back(
          {named(o.label, absl::StrFormat("validation (%d points)", o.validation.size())),
           kOtherColors[i][1], false});
    }
  }
  size_t longest = 0;
  for (const Row& r : rows) longest = std::max(longest, r.text.size());
  const double width = std::max(180.0, 48.0 + 6.6 * static_cast<double>(longest));
  const double lx = x.p1 - width - 10, ly = y.p1 + 12;
  absl::StrAppend(&svg, "<g class=\"legend\" font-size=\"12\">\n",
                  absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.0f\" height=\"%.0f\" "
                                  "fill=\"white\" stroke=\"#bbb\"/>\n",
                                  lx, ly, width, 8.0 + 18.0 * static_cast<double>(rows.size())));
  for (size_t i = 0; i < rows.size(); ++i) {
    const double ry = ly + 14 + 18 * static_cast<double>(i);
    if (rows[i].line) {
      absl::StrAppend(&svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                                            "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>",
                                            lx + 8, ry, lx + 32, ry, rows[i].color));
    } else {
      absl::StrAppend(&svg, absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" "
                                            "fill=\"%s\"/>",
                                            lx + 20, ry, rows[i].color));
    }
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 40,
                                          ry + 4, Escape(rows[i].text)));
  }
  absl::StrAppend(&svg, "</g>\n");
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

absl::Status WriteLossCurveSvg(const std::string& path, const LossCurve& curve) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  absl::Status s = model::WriteWholeFile(tmp, RenderLossCurveSvg(curve), /*sync=*/true);
  if (!s.ok()) return s;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return model::FileError("rename to", path, err);
  }
  return absl::OkStatus();
}

}  // namespace trainer
}  // namespace dattn
