#include "clients/loadgen/svg_chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kiln::loadgen {
namespace {

// Tableau 10: distinguishable, and readable on white.
constexpr std::array<const char*, 10> kColors = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                 "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                                 "#9c755f", "#bab0ac"};

constexpr double kPanelWidth = 560, kPanelHeight = 330;
constexpr double kLeft = 64, kRight = 140, kTop = 34, kBottom = 48;  // margins inside a panel
constexpr double kTitleHeight = 44;

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

std::string TickLabel(double value) {
  if (value == 0) return "0";
  const double magnitude = std::fabs(value);
  if (magnitude >= 1e5 || magnitude < 1e-3) return absl::StrFormat("%.0e", value);
  return absl::StrFormat("%.6g", value);
}

// Powers of ten (with 2× and 5× when the range spans few decades) covering [low, high] > 0.
std::vector<double> LogTicks(double low, double high) {
  const int first = static_cast<int>(std::floor(std::log10(low)));
  const int last = static_cast<int>(std::ceil(std::log10(high)));
  std::vector<double> ticks;
  for (int e = first; e <= last; ++e) {
    const double base = std::pow(10.0, e);
    for (double m : (last - first <= 2 ? std::vector<double>{1, 2, 5} : std::vector<double>{1})) {
      ticks.push_back(m * base);
    }
  }
  // Trim to one tick beyond each end of the data.
  while (ticks.size() > 2 && ticks[1] <= low) ticks.erase(ticks.begin());
  while (ticks.size() > 2 && ticks[ticks.size() - 2] >= high) ticks.pop_back();
  return ticks;
}

// One panel at (x0, y0).
void RenderPanel(const ChartPanel& panel, double x0, double y0, std::string* svg) {
  const double plot_w = kPanelWidth - kLeft - kRight, plot_h = kPanelHeight - kTop - kBottom;
  const double px = x0 + kLeft, py = y0 + kTop;
  absl::StrAppendFormat(
      svg, "<g class=\"panel\">\n<text x=\"%.1f\" y=\"%.1f\" class=\"ptitle\">%s</text>\n",
      px + plot_w / 2, y0 + 20, Escape(panel.title));

  double x_low = std::numeric_limits<double>::infinity(), x_high = -x_low;
  double y_low = x_low, y_high = -x_low;
  for (const ChartSeries& series : panel.series) {
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (panel.log_y && y <= 0)) continue;
      x_low = std::min(x_low, x), x_high = std::max(x_high, x);
      y_low = std::min(y_low, y), y_high = std::max(y_high, y);
    }
  }
  const bool empty = !std::isfinite(x_low);
  if (empty) {
    x_low = 0, x_high = 1, y_low = panel.log_y ? 1 : 0, y_high = panel.log_y ? 10 : 1;
  }
  if (!panel.log_y) y_low = std::min(y_low, 0.0);
  for (const auto& [x, label] : panel.x_markers) {
    if (!empty) x_low = std::min(x_low, x), x_high = std::max(x_high, x);
  }
  const std::vector<double> x_ticks = NiceTicks(x_low, x_high);
  const std::vector<double> y_ticks =
      panel.log_y ? LogTicks(y_low, y_high) : NiceTicks(y_low, y_high);
  const double xa = x_ticks.front(), xb = x_ticks.back();
  const double ya = y_ticks.front(), yb = y_ticks.back();
  auto sx = [&](double x) { return px + (xb > xa ? (x - xa) / (xb - xa) : 0.5) * plot_w; };
  auto sy = [&](double y) {
    const double t = panel.log_y
                         ? (std::log10(y) - std::log10(ya)) / (std::log10(yb) - std::log10(ya))
                         : (yb > ya ? (y - ya) / (yb - ya) : 0.5);
    return py + plot_h - t * plot_h;
  };

  // Grid, ticks and their labels.
  for (double t : x_ticks) {
    absl::StrAppendFormat(svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">%s</text>\n",
                          sx(t), py, sx(t), py + plot_h, sx(t), py + plot_h + 16, TickLabel(t));
  }
  for (double t : y_ticks) {
    absl::StrAppendFormat(svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" class=\"ytick\">%s</text>\n",
                          px, sy(t), px + plot_w, sy(t), px - 6, sy(t) + 4, TickLabel(t));
  }
  absl::StrAppendFormat(
      svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n", px, py,
      plot_w, plot_h);
  absl::StrAppendFormat(svg, "<text x=\"%.1f\" y=\"%.1f\" class=\"xlabel\">%s</text>\n",
                        px + plot_w / 2, py + plot_h + 36, Escape(panel.x_label));
  absl::StrAppendFormat(svg,
                        "<text x=\"%.1f\" y=\"%.1f\" class=\"ylabel\" "
                        "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
                        x0 + 16, py + plot_h / 2, x0 + 16, py + plot_h / 2, Escape(panel.y_label));
  if (empty) {
    absl::StrAppendFormat(svg, "<text x=\"%.1f\" y=\"%.1f\" class=\"nodata\">no data</text>\n",
                          px + plot_w / 2, py + plot_h / 2);
  }
  for (const auto& [x, label] : panel.x_markers) {
    if (empty || x < xa || x > xb) continue;
    absl::StrAppendFormat(
        svg,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"marker\"/>\n"
        "<text x=\"%.1f\" y=\"%.1f\" class=\"mlabel\">%s</text>\n",
        sx(x), py, sx(x), py + plot_h, sx(x) + 4, py + 14, Escape(label));
  }

  // Series and the legend to the right of the plot.
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const ChartSeries& series = panel.series[i];
    const char* color = kColors[(series.color >= 0 ? series.color : i) % kColors.size()];
    std::vector<std::string> points;
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (panel.log_y && y <= 0)) continue;
      points.push_back(absl::StrFormat("%.1f,%.1f", sx(x), sy(y)));
    }
    absl::StrAppendFormat(svg, "<g class=\"series\" data-name=\"%s\">\n", Escape(series.name));
    if (points.size() > 1) {
      absl::StrAppendFormat(svg,
                            "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                            "stroke-width=\"2\"%s/>\n",
                            absl::StrJoin(points, " "), color,
                            series.dashed ? " stroke-dasharray=\"6 4\"" : "");
    }
    if (series.markers || points.size() == 1) {
      for (const std::string& point : points) {
        const size_t comma = point.find(',');
        absl::StrAppendFormat(svg, "<circle cx=\"%s\" cy=\"%s\" r=\"3.5\" fill=\"%s\"/>\n",
                              point.substr(0, comma), point.substr(comma + 1), color);
      }
    }
    svg->append("</g>\n");
    const double ly = py + 8 + 18 * static_cast<double>(i);
    absl::StrAppendFormat(svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"3\"%s/>\n"
                          "<text x=\"%.1f\" y=\"%.1f\" class=\"legend\">%s</text>\n",
                          px + plot_w + 12, ly, px + plot_w + 32, ly, color,
                          series.dashed ? " stroke-dasharray=\"6 4\"" : "", px + plot_w + 37,
                          ly + 4, Escape(series.name));
  }
  svg->append("</g>\n");
}

// At most `max_points` points of the empirical CDF of `values`, x scaled by `scale`.
std::vector<std::pair<double, double>> Cdf(std::vector<double> values, double scale,
                                           size_t max_points = 200) {
  std::vector<std::pair<double, double>> points;
  if (values.empty()) return points;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const size_t step = std::max<size_t>(1, n / max_points);
  for (size_t i = 0; i < n; i += step) {
    points.emplace_back(values[i] * scale, static_cast<double>(i + 1) / n);
  }
  if (points.back().second < 1) points.emplace_back(values.back() * scale, 1.0);
  return points;
}

// The smallest 1-2-5 step ≥ `raw`.
double NiceStep(double raw) {
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

// Output tokens per second since the phase started, in about 40 buckets, from each request's
// token arrival times (start + TTFT + the inter-token gaps).
std::vector<std::pair<double, double>> TokensOverTime(const PhaseResult& phase) {
  std::vector<double> times;
  for (const RequestRecord& r : phase.records) {
    if (r.ttft_seconds < 0) continue;
    double t = r.start_seconds + r.ttft_seconds;
    times.push_back(t);
    for (double gap : r.itl_seconds) times.push_back(t += gap);
  }
  std::vector<std::pair<double, double>> points;
  if (times.empty()) return points;
  const double span = *std::max_element(times.begin(), times.end());
  const double width = NiceStep(std::max(span / 40, 0.05));
  std::vector<double> counts(static_cast<size_t>(span / width) + 1, 0);
  for (double t : times) counts[static_cast<size_t>(t / width)] += 1;
  for (size_t i = 0; i < counts.size(); ++i) {
    points.emplace_back((static_cast<double>(i) + 0.5) * width, counts[i] / width);
  }
  return points;
}

}  // namespace

std::vector<double> NiceTicks(double low, double high, int target) {
  if (!(high > low)) high = low + 1;
  const double raw = (high - low) / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  const int64_t first = static_cast<int64_t>(std::floor(low / step + 1e-9));
  const int64_t last = std::max(first + 1, static_cast<int64_t>(std::ceil(high / step - 1e-9)));
  std::vector<double> ticks;
  for (int64_t k = first; k <= last; ++k) {
    // Multiples of the step, rounded so that 3 × 0.2 prints as 0.6.
    const double scale = std::pow(10.0, 12 - std::floor(std::log10(step)));
    ticks.push_back(std::round(static_cast<double>(k) * step * scale) / scale);
  }
  return ticks;
}

std::string RenderChart(const std::string& title, const std::vector<ChartPanel>& panels,
                        int columns) {
  columns =
      std::max(1, std::min<int>(columns, static_cast<int>(std::max<size_t>(1, panels.size()))));
  const int rows = static_cast<int>((panels.size() + columns - 1) / columns);
  const double width = columns * kPanelWidth, height = kTitleHeight + rows * kPanelHeight + 10;
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n"
      "<style>\n"
      ".title{font-size:18px;font-weight:bold;text-anchor:middle}\n"
      ".ptitle{font-size:14px;font-weight:bold;text-anchor:middle}\n"
      ".xtick{font-size:11px;text-anchor:middle;fill:#444}\n"
      ".ytick{font-size:11px;text-anchor:end;fill:#444}\n"
      ".xlabel,.ylabel{font-size:12px;text-anchor:middle;fill:#222}\n"
      ".legend{font-size:12px;fill:#222}\n"
      ".nodata{font-size:14px;text-anchor:middle;fill:#999}\n"
      ".grid{stroke:#e4e4e4;stroke-width:1}\n"
      ".frame{fill:none;stroke:#888;stroke-width:1}\n"
      ".marker{stroke:#888;stroke-width:1.5;stroke-dasharray:4 4}\n"
      ".mlabel{font-size:11px;fill:#666}\n"
      "</style>\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.1f\" y=\"28\" class=\"title\">%s</text>\n",
      width, height, width, height, width / 2, Escape(title));
  for (size_t i = 0; i < panels.size(); ++i) {
    const double x0 = static_cast<double>(i % columns) * kPanelWidth;
    const double y0 = kTitleHeight + static_cast<double>(i / columns) * kPanelHeight;
    RenderPanel(panels[i], x0, y0, &svg);
  }
  svg += "</svg>\n";
  return svg;
}

std::vector<ChartPanel> ReportPanels(const RunReport& report) {
  ChartPanel ttft{"Time to first token (CDF)", "TTFT (ms)", "fraction of requests", false, {}};
  ChartPanel itl{"Inter-token latency (CDF)", "ITL (ms)", "fraction of tokens", false, {}};
  ChartPanel e2e{"End-to-end latency (CDF)", "E2E latency (s)", "fraction of requests", false, {}};
  ChartPanel over_time{
      "Output throughput over time", "time since phase start (s)", "output tokens/s", false, {}};
  for (size_t p = 0; p < report.phases.size(); ++p) {
    const PhaseResult& phase = report.phases[p];
    const std::string name = p < report.summaries.size() ? report.summaries[p].label : "";
    std::vector<double> ttfts, itls, e2es;
    for (const RequestRecord& r : phase.records) {
      if (r.warmup || !r.succeeded()) continue;
      if (r.ttft_seconds >= 0) ttfts.push_back(r.ttft_seconds);
      itls.insert(itls.end(), r.itl_seconds.begin(), r.itl_seconds.end());
      e2es.push_back(r.e2e_seconds);
    }
    ttft.series.push_back({report.sweep() ? name : "TTFT", Cdf(ttfts, 1e3)});
    itl.series.push_back({report.sweep() ? name : "ITL", Cdf(itls, 1e3)});
    e2e.series.push_back({report.sweep() ? name : "E2E", Cdf(e2es, 1)});
    over_time.series.push_back({report.sweep() ? name : "tok/s", TokensOverTime(phase)});
    if (phase.config.warmup > absl::ZeroDuration() && over_time.x_markers.empty()) {
      over_time.x_markers.emplace_back(absl::ToDoubleSeconds(phase.config.warmup), "warm-up end");
    }
  }
  std::vector<ChartPanel> panels;
  if (report.sweep()) {
    ChartPanel sweep{
        "Latency vs throughput", "achieved throughput (req/s)", "latency (ms)", true, {}};
    // One color per metric; p99 dashed.
    ChartSeries ttft50{"TTFT p50", {}, true, false, 0}, ttft99{"TTFT p99", {}, true, true, 0};
    ChartSeries e2e50{"E2E p50", {}, true, false, 2}, e2e99{"E2E p99", {}, true, true, 2};
    for (const PhaseSummary& s : report.summaries) {
      const double x = s.requests_per_second;
      if (s.ttft.count > 0) {
        ttft50.points.emplace_back(x, s.ttft.p50 * 1e3);
        ttft99.points.emplace_back(x, s.ttft.p99 * 1e3);
      }
      if (s.e2e.count > 0) {
        e2e50.points.emplace_back(x, s.e2e.p50 * 1e3);
        e2e99.points.emplace_back(x, s.e2e.p99 * 1e3);
      }
    }
    sweep.series = {ttft50, ttft99, e2e50, e2e99};
    panels.push_back(std::move(sweep));
  }
  panels.push_back(std::move(ttft));
  panels.push_back(std::move(itl));
  panels.push_back(std::move(e2e));
  panels.push_back(std::move(over_time));
  return panels;
}

absl::Status WriteSvg(const RunReport& report, const std::string& path, const std::string& title) {
  std::ofstream out(path);
  if (!out) return absl::UnavailableError(absl::StrCat("--svg: cannot write ", path));
  out << RenderChart(title, ReportPanels(report));
  if (!out.flush()) return absl::UnavailableError(absl::StrCat("--svg: cannot write ", path));
  return absl::OkStatus();
}

}  // namespace kiln::loadgen
