#include "clients/loadgen/report.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace kiln::loadgen {
namespace {

// JSON has no NaN: an empty statistic is null.
nlohmann::json Number(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

nlohmann::json LatencyJson(const LatencySummary& s) {
  return {{"count", s.count},     {"mean", Number(s.mean)}, {"min", Number(s.min)},
          {"max", Number(s.max)}, {"p50", Number(s.p50)},   {"p90", Number(s.p90)},
          {"p95", Number(s.p95)}, {"p99", Number(s.p99)}};
}

std::string Ms(double seconds, int64_t count) {
  return count == 0 ? "-" : absl::StrFormat("%.2f", seconds * 1e3);
}

std::string GoodputText(const GoodputLimits& limits) {
  std::vector<std::string> parts;
  if (limits.ttft) parts.push_back(absl::StrFormat("ttft ≤ %gs", *limits.ttft));
  if (limits.itl) parts.push_back(absl::StrFormat("itl ≤ %gs", *limits.itl));
  if (limits.e2e) parts.push_back(absl::StrFormat("e2e ≤ %gs", *limits.e2e));
  return absl::StrJoin(parts, ", ");
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

void PrintPhase(const RunReport& report, const PhaseSummary& s, std::ostream& out) {
  auto row = [&out](const std::string& name, const std::string& value) {
    out << absl::StrFormat("%-34s %s\n", name, value);
  };
  out << absl::StrFormat("============ %s ============\n", s.label);
  row("Requests (counted):", absl::StrCat(s.requests));
  row("Succeeded / failed:", absl::StrCat(s.succeeded, " / ", s.failed));
  if (s.cancelled > 0 || s.disconnected > 0) {
    row("Cancelled / disconnected (client):",
        absl::StrCat(s.cancelled, " / ", s.disconnected, " (", s.fault_output_tokens,
                     " tokens received before)"));
  }
  row("Measurement window (s):", absl::StrFormat("%.2f", s.seconds));
  row("Input / output tokens:", absl::StrCat(s.input_tokens, " / ", s.output_tokens));
  row("Request throughput (req/s):", absl::StrFormat("%.2f", s.requests_per_second));
  row("Output token throughput (tok/s):", absl::StrFormat("%.1f", s.output_tokens_per_second));
  row("Total token throughput (tok/s):", absl::StrFormat("%.1f", s.total_tokens_per_second));
  if (report.goodput.any()) {
    row("Goodput (req/s):", absl::StrFormat("%.2f (%d good; %s)", s.goodput_requests_per_second,
                                            s.good, GoodputText(report.goodput)));
  }
  if (!s.finish_reasons.empty()) {
    std::vector<std::string> parts;
    for (const auto& [reason, count] : s.finish_reasons) {
      parts.push_back(absl::StrCat(reason.empty() ? "(none)" : reason, " ", count));
    }
    row("Finish reasons:", absl::StrJoin(parts, ", "));
  }
  for (const auto& [code, count] : s.errors_by_code) {
    auto example = s.error_examples.find(code);
    row(absl::StrCat("Errors ", code, ":"),
        absl::StrCat(count, example == s.error_examples.end() || example->second.empty()
                                ? ""
                                : absl::StrCat(" (e.g. \"", example->second, "\")")));
  }
  out << absl::StrFormat("%-6s %10s %10s %10s %10s %10s %10s\n", "(ms)", "mean", "p50", "p90",
                         "p95", "p99", "max");
  for (const auto& [name, l] : {std::pair<const char*, const LatencySummary&>{"TTFT", s.ttft},
                                {"ITL", s.itl},
                                {"TPOT", s.tpot},
                                {"E2E", s.e2e}}) {
    out << absl::StrFormat("%-6s %10s %10s %10s %10s %10s %10s\n", name, Ms(l.mean, l.count),
                           Ms(l.p50, l.count), Ms(l.p90, l.count), Ms(l.p95, l.count),
                           Ms(l.p99, l.count), Ms(l.max, l.count));
  }
  if (!s.itl_series.empty()) {
    out << absl::StrFormat("ITL by %gs window since the start (ms; * = not full):\n",
                           s.itl_window_seconds);
    out << absl::StrFormat("%8s %10s %10s %10s %10s\n", "from (s)", "tokens", "p50", "p99", "max");
    for (const ItlWindow& w : s.itl_series) {
      out << absl::StrFormat("%8g %10d %10s %10s %10s%s\n", w.start_seconds, w.itl.count,
                             Ms(w.itl.p50, w.itl.count), Ms(w.itl.p99, w.itl.count),
                             Ms(w.itl.max, w.itl.count), w.full ? "" : " *");
    }
  }
}

}  // namespace

void PrintSummary(const RunReport& report, std::ostream& out) {
  out << "kiln-loadgen: " << report.target << ", model " << report.model << "\n";
  for (const PhaseSummary& summary : report.summaries) PrintPhase(report, summary, out);
  if (report.sweep()) {
    out << "============ sweep ============\n";
    out << absl::StrFormat("%-16s %9s %10s %10s %10s %10s %10s %7s\n", "phase", "req/s", "tok/s",
                           "TTFT p50", "TTFT p99", "E2E p50", "E2E p99", "errors");
    for (const PhaseSummary& s : report.summaries) {
      out << absl::StrFormat("%-16s %9.2f %10.1f %10s %10s %10s %10s %7d\n", s.label,
                             s.requests_per_second, s.output_tokens_per_second,
                             Ms(s.ttft.p50, s.ttft.count), Ms(s.ttft.p99, s.ttft.count),
                             Ms(s.e2e.p50, s.e2e.count), Ms(s.e2e.p99, s.e2e.count), s.failed);
    }
    out << "(latencies in ms)\n";
  }
}

absl::Status WriteJson(const RunReport& report, const std::string& path) {
  nlohmann::json json;
  json["tool"] = "kiln-loadgen";
  json["target"] = report.target;
  json["model"] = report.model;
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [name, value] : report.settings) settings[name] = value;
  json["settings"] = settings;
  nlohmann::json limits = nlohmann::json::object();
  if (report.goodput.ttft) limits["ttft_s"] = *report.goodput.ttft;
  if (report.goodput.itl) limits["itl_s"] = *report.goodput.itl;
  if (report.goodput.e2e) limits["e2e_s"] = *report.goodput.e2e;
  json["goodput_limits"] = limits;
  nlohmann::json phases = nlohmann::json::array();
  for (size_t p = 0; p < report.summaries.size(); ++p) {
    const PhaseSummary& s = report.summaries[p];
    nlohmann::json series = nlohmann::json::array();
    for (const ItlWindow& w : s.itl_series) {
      series.push_back({{"start_s", w.start_seconds},
                        {"end_s", w.end_seconds},
                        {"full", w.full},
                        {"tokens", w.itl.count},
                        {"p50_s", w.itl.count > 0 ? Number(w.itl.p50) : nullptr},
                        {"p99_s", w.itl.count > 0 ? Number(w.itl.p99) : nullptr},
                        {"max_s", w.itl.count > 0 ? Number(w.itl.max) : nullptr}});
    }
    const PhaseResult* result = p < report.phases.size() ? &report.phases[p] : nullptr;
    phases.push_back({{"label", s.label},
                      {"concurrency", s.concurrency},
                      {"rate", s.rate},
                      {"requests", s.requests},
                      {"succeeded", s.succeeded},
                      {"failed", s.failed},
                      {"cancelled", s.cancelled},
                      {"disconnected", s.disconnected},
                      {"fault_output_tokens", s.fault_output_tokens},
                      {"good", s.good},
                      {"errors_by_code", s.errors_by_code},
                      {"finish_reasons", s.finish_reasons},
                      {"start_unix_s", result != nullptr ? Number(result->start_unix_seconds)
                                                         : nlohmann::json(nullptr)},
                      {"issue_end_s", result != nullptr ? Number(result->issue_end_seconds)
                                                        : nlohmann::json(nullptr)},
                      {"seconds", s.seconds},
                      {"input_tokens", s.input_tokens},
                      {"output_tokens", s.output_tokens},
                      {"requests_per_second", s.requests_per_second},
                      {"output_tokens_per_second", s.output_tokens_per_second},
                      {"total_tokens_per_second", s.total_tokens_per_second},
                      {"goodput_requests_per_second", s.goodput_requests_per_second},
                      {"ttft_s", LatencyJson(s.ttft)},
                      {"itl_s", LatencyJson(s.itl)},
                      {"tpot_s", LatencyJson(s.tpot)},
                      {"e2e_s", LatencyJson(s.e2e)},
                      {"itl_window_s", s.itl_window_seconds},
                      {"itl_series", series}});
  }
  json["phases"] = phases;
  nlohmann::json requests = nlohmann::json::array();
  for (size_t p = 0; p < report.phases.size(); ++p) {
    for (const RequestRecord& r : report.phases[p].records) {
      nlohmann::json itl = nlohmann::json::array();
      for (double gap : r.itl_seconds) itl.push_back(gap);
      nlohmann::json request = {{"phase", p},
                                {"id", r.id},
                                {"warmup", r.warmup},
                                {"start_s", r.start_seconds},
                                {"ttft_s", r.ttft_seconds >= 0 ? Number(r.ttft_seconds) : nullptr},
                                {"e2e_s", r.e2e_seconds},
                                {"itl_s", itl},
                                {"input_tokens", r.input_tokens},
                                {"output_tokens", r.output_tokens},
                                {"code", r.code_name()},
                                {"error", r.error},
                                {"finish_reason", r.finish_reason}};
      if (r.planned_fault != ClientFault::kNone) {
        request["planned_fault"] =
            r.planned_fault == ClientFault::kCancel ? "cancel" : "disconnect";
        request["fault_after_tokens"] = r.fault_after_tokens;
        request["client_fault"] = ClientFaultLabel(r.fault);  // "" when the stream ended first
      }
      requests.push_back(std::move(request));
    }
  }
  json["requests"] = requests;
  std::ofstream out(path);
  if (!out) return absl::UnavailableError(absl::StrCat("--json: cannot write ", path));
  out << json.dump(1) << "\n";
  if (!out.flush()) return absl::UnavailableError(absl::StrCat("--json: cannot write ", path));
  return absl::OkStatus();
}

absl::Status WriteCsv(const RunReport& report, const std::string& path) {
  std::ofstream out(path);
  if (!out) return absl::UnavailableError(absl::StrCat("--csv: cannot write ", path));
  out << "phase,label,id,warmup,start_s,ttft_s,e2e_s,tpot_s,itl_mean_s,itl_max_s,input_tokens,"
         "output_tokens,code,finish_reason,error\n";
  for (size_t p = 0; p < report.phases.size(); ++p) {
    const std::string label = p < report.summaries.size() ? report.summaries[p].label : "";
    for (const RequestRecord& r : report.phases[p].records) {
      const double itl_mean =
          r.itl_seconds.empty() ? -1
                                : std::accumulate(r.itl_seconds.begin(), r.itl_seconds.end(), 0.0) /
                                      r.itl_seconds.size();
      const double itl_max = r.itl_seconds.empty()
                                 ? -1
                                 : *std::max_element(r.itl_seconds.begin(), r.itl_seconds.end());
      auto optional = [](double v) { return v < 0 ? std::string() : absl::StrFormat("%.6f", v); };
      out << absl::StrJoin(
                 {absl::StrCat(p), CsvField(label), absl::StrCat(r.id),
                  std::string(r.warmup ? "1" : "0"), absl::StrFormat("%.6f", r.start_seconds),
                  optional(r.ttft_seconds), absl::StrFormat("%.6f", r.e2e_seconds),
                  optional(r.tpot_seconds()), optional(itl_mean), optional(itl_max),
                  absl::StrCat(r.input_tokens), absl::StrCat(r.output_tokens), r.code_name(),
                  CsvField(r.finish_reason), CsvField(r.error)},
                 ",")
          << "\n";
    }
  }
  if (!out.flush()) return absl::UnavailableError(absl::StrCat("--csv: cannot write ", path));
  return absl::OkStatus();
}

bool StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

ProgressLine::ProgressLine(const LiveCounters* live, std::string label)
    : live_(live), label_(std::move(label)), tty_(StderrIsTerminal()) {
  thread_ = std::thread([this] { Loop(); });
}

ProgressLine::~ProgressLine() { Stop(); }

void ProgressLine::Stop() {
  {
    absl::MutexLock lock(&mutex_);
    if (stop_) return;
    stop_ = true;
  }
  thread_.join();
}

void ProgressLine::Loop() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point last_time = start;
  int64_t last_completed = 0, last_tokens = 0;
  bool printed = false;
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return stop_; };
  while (true) {
    bool stop;
    {
      absl::MutexLock lock(&mutex_);
      stop = mutex_.AwaitWithTimeout(absl::Condition(&stopped), absl::Seconds(1));
    }
    const Clock::time_point now = Clock::now();
    const int64_t completed = live_->completed.load();
    const int64_t tokens = live_->output_tokens.load();
    // The last line gives the averages over the whole phase rather than its last moments.
    if (stop) last_time = start, last_completed = 0, last_tokens = 0;
    const double seconds = std::chrono::duration<double>(now - last_time).count();
    if (!stop || printed) {
      const int64_t cancelled = live_->cancelled.load(), disconnected = live_->disconnected.load();
      const std::string line = absl::StrFormat(
          "[%s] %d done, %d in flight, %d errors%s, %.1f req/s, %.0f tok/s", label_, completed,
          live_->in_flight.load(), live_->errors.load(),
          cancelled + disconnected > 0
              ? absl::StrFormat(", %d cancelled, %d disconnected", cancelled, disconnected)
              : "",
          seconds > 0 ? (completed - last_completed) / seconds : 0.0,
          seconds > 0 ? (tokens - last_tokens) / seconds : 0.0);
      if (tty_) {
        std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), stop ? "\n" : "");
      } else {
        std::fprintf(stderr, "%s\n", line.c_str());
      }
      std::fflush(stderr);
      printed = true;
    }
    if (stop) return;
    last_time = now;
    last_completed = completed;
    last_tokens = tokens;
  }
}

}  // namespace kiln::loadgen
