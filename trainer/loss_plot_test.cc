// The loss-curve SVG: ticks, labels, escaping, broken lines at non-finite values, thinning.
#include "trainer/loss_plot.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace trainer {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LossPlotTest, NiceTicks) {
  EXPECT_EQ(NiceTicks(0, 100, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(NiceTicks(2.2, 6.3, 6), (std::vector<double>{2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5}));
  EXPECT_EQ(NiceTicks(0, 60, 8), (std::vector<double>{0, 10, 20, 30, 40, 50, 60}));
  const std::vector<double> one = NiceTicks(5, 5, 4);  // A single value is widened.
  ASSERT_GE(one.size(), 2u);
  EXPECT_LT(one.front(), 5);
  EXPECT_GT(one.back(), 5);
  EXPECT_TRUE(NiceTicks(0, std::numeric_limits<double>::infinity(), 4).empty());
}

TEST(LossPlotTest, DrawsBothCurvesWithLabels) {
  LossCurve curve;
  curve.title = "a <b> & \"c\"";
  curve.subtitle = "sub";
  for (int s = 1; s <= 50; ++s) curve.train.push_back({s, 5.0 / std::sqrt(s)});
  curve.validation = {{0, 5.5}, {25, 1.2}, {50, 0.8}};
  const std::string svg = RenderLossCurveSvg(curve);
  EXPECT_NE(svg.find("<title>a &lt;b&gt; &amp; &quot;c&quot;</title>"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  EXPECT_NE(svg.find(">sub</text>"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">loss (nats per token)</text>"), std::string::npos);
  EXPECT_EQ(Count(svg, "<polyline "), 2);    // Training, validation.
  EXPECT_EQ(Count(svg, "<circle "), 3 + 1);  // Validation points and the legend's.
  EXPECT_NE(svg.find("training (50 steps)"), std::string::npos);
  EXPECT_NE(svg.find(">50</text>"), std::string::npos);  // The last x tick.
  EXPECT_NE(svg.find(">0</text>"), std::string::npos);   // The x axis starts at step 0.
}

TEST(LossPlotTest, OtherRunsShareTheAxesWithTheirOwnColoursAndLabels) {
  LossCurve curve;
  curve.label = "GPU <bf16>";
  for (int s = 1; s <= 40; ++s) curve.train.push_back({s, 5.0 / std::sqrt(s)});
  curve.validation = {{0, 5.5}, {40, 1.0}};
  LossSeries cpu;
  cpu.label = "CPU fp32";
  for (int s = 1; s <= 60; ++s) cpu.train.push_back({s, 9.0 / std::sqrt(s)});  // Wider range.
  cpu.validation = {{0, 5.6}, {20, 2.0}, {60, 1.1}};
  curve.others.push_back(cpu);
  const std::string svg = RenderLossCurveSvg(curve);
  EXPECT_EQ(Count(svg, "<polyline "), 4);  // Two runs' training and validation.
  EXPECT_EQ(Count(svg, "<g class=\"train other\">"), 1);
  EXPECT_NE(svg.find(">GPU &lt;bf16&gt;: training (40 steps)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">GPU &lt;bf16&gt;: validation (2 points)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">CPU fp32: training (60 steps)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">CPU fp32: validation (3 points)</text>"), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#2ca02c\""), std::string::npos);  // The other run's colour.
  EXPECT_EQ(Count(svg, "<circle "), 2 + 3 + 2);                  // Points, legend dots.
  EXPECT_NE(svg.find(">60</text>"), std::string::npos);          // The axes cover the other run.
  EXPECT_NE(svg.find(">9</text>"), std::string::npos);
  // More than kMaxOtherRuns: the rest are not drawn.
  for (int i = 0; i < kMaxOtherRuns + 2; ++i) curve.others.push_back(cpu);
  EXPECT_EQ(Count(RenderLossCurveSvg(curve), "<g class=\"train other\">"), kMaxOtherRuns);
}

TEST(LossPlotTest, NonFiniteValuesBreakTheLine) {
  LossCurve curve;
  for (int s = 1; s <= 10; ++s) {
    curve.train.push_back({s, s == 5 ? std::numeric_limits<double>::quiet_NaN() : 3.0 - 0.1 * s});
  }
  const std::string svg = RenderLossCurveSvg(curve);
  EXPECT_EQ(Count(svg, "<polyline "), 2);  // Steps 1-4 and 6-10.
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(LossPlotTest, ManyStepsAreAveragedAndEmptyCurvesSaySo) {
  LossCurve curve;
  for (int s = 1; s <= 100000; ++s) curve.train.push_back({s, 2.0});
  const std::string svg = RenderLossCurveSvg(curve);
  EXPECT_EQ(Count(svg, "<polyline "), 1);
  EXPECT_EQ(Count(svg.substr(svg.find("<polyline ")), ","), kMaxPolylinePoints);
  EXPECT_LT(svg.size(), 120000u);
  EXPECT_NE(svg.find("training (100000 steps)"), std::string::npos);
  EXPECT_NE(RenderLossCurveSvg(LossCurve()).find(">no data</text>"), std::string::npos);
}

}  // namespace
}  // namespace trainer
}  // namespace dattn
