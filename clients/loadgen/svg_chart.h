// A self-contained SVG chart of a load run (no plotting dependency): latency CDFs of TTFT, ITL
// and end-to-end latency, output tokens per second over time, and for a rate sweep latency
// (p50/p99) against throughput. Each panel has axes with tick labels, a legend and a title.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "clients/loadgen/report.h"

namespace kiln::loadgen {

struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in order
  bool markers = false;                           // a dot at every point
  bool dashed = false;
  int color = -1;  // index into the palette; -1: the series' position
};

struct ChartPanel {
  std::string title, x_label, y_label;
  bool log_y = false;  // values ≤ 0 are left out
  std::vector<ChartSeries> series;
  // Vertical dashed lines at these x values, with their labels (e.g. the end of the warm-up).
  std::vector<std::pair<double, std::string>> x_markers;
};

// Tick positions covering [low, high] at 1-2-5 steps, about `target` of them; the first and last
// ticks enclose the range.
std::vector<double> NiceTicks(double low, double high, int target = 5);

// Panels in a grid of `columns` under `title`: a complete SVG document.
std::string RenderChart(const std::string& title, const std::vector<ChartPanel>& panels,
                        int columns = 2);

// The panels for a run (see the file comment).
std::vector<ChartPanel> ReportPanels(const RunReport& report);

absl::Status WriteSvg(const RunReport& report, const std::string& path, const std::string& title);

}  // namespace kiln::loadgen
