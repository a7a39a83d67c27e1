#include "clients/loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"

namespace kiln::loadgen {

double RequestRecord::tpot_seconds() const {
  if (output_tokens < 2 || ttft_seconds < 0) return -1;
  return (e2e_seconds - ttft_seconds) / (output_tokens - 1);
}

std::string ClientFaultLabel(ClientFault fault) {
  switch (fault) {
    case ClientFault::kNone:
      return "";
    case ClientFault::kCancel:
      return "cancelled";
    case ClientFault::kDisconnect:
      return "disconnected";
  }
  return "";
}

std::string RequestRecord::code_name() const {
  return code_label.empty() ? StatusCodeName(code) : code_label;
}

std::string StatusCodeName(int code) {
  // The gRPC codes, which absl::StatusCode shares.
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return std::nan("");
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

LatencySummary Summarize(std::vector<double> values) {
  LatencySummary summary;
  if (values.empty()) return summary;
  std::sort(values.begin(), values.end());
  summary.count = static_cast<int64_t>(values.size());
  summary.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  summary.min = values.front();
  summary.max = values.back();
  summary.p50 = Percentile(values, 50);
  summary.p90 = Percentile(values, 90);
  summary.p95 = Percentile(values, 95);
  summary.p99 = Percentile(values, 99);
  return summary;
}

absl::StatusOr<GoodputLimits> ParseGoodput(const std::string& text) {
  GoodputLimits limits;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    const std::string value = kv.size() == 2 ? std::string(absl::StripAsciiWhitespace(kv[1])) : "";
    double seconds = 0;
    absl::Duration duration;
    if (absl::SimpleAtod(value, &seconds)) {
    } else if (absl::ParseDuration(value, &duration)) {
      seconds = absl::ToDoubleSeconds(duration);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: '", item, "' is not NAME=SECONDS (ttft, itl, tpot, e2e)"));
    }
    if (!(seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("--goodput: '", item, "' must be positive"));
    }
    if (key == "ttft") {
      limits.ttft = seconds;
    } else if (key == "itl" || key == "tpot") {
      limits.itl = seconds;
    } else if (key == "e2e" || key == "e2el") {
      limits.e2e = seconds;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput: unknown limit '", key, "' (ttft, itl, tpot, e2e)"));
    }
  }
  if (!limits.any()) return absl::InvalidArgumentError("--goodput: no limit given");
  return limits;
}

bool IsGood(const RequestRecord& record, const GoodputLimits& limits) {
  if (!record.succeeded()) return false;
  if (limits.ttft && (record.ttft_seconds < 0 || record.ttft_seconds > *limits.ttft)) return false;
  if (limits.itl && record.tpot_seconds() > *limits.itl) return false;
  if (limits.e2e && record.e2e_seconds > *limits.e2e) return false;
  return true;
}

PhaseSummary SummarizePhase(const std::vector<RequestRecord>& records, double seconds,
                            const GoodputLimits& limits) {
  PhaseSummary summary;
  summary.seconds = seconds;
  std::vector<double> ttft, itl, e2e, tpot;
  for (const RequestRecord& record : records) {
    if (record.warmup) continue;
    ++summary.requests;
    if (record.fault != ClientFault::kNone) {
      ++(record.fault == ClientFault::kCancel ? summary.cancelled : summary.disconnected);
      summary.fault_output_tokens += record.output_tokens;
      continue;
    }
    if (!record.ok()) {
      ++summary.failed;
      const std::string code = record.code_name();
      ++summary.errors_by_code[code];
      summary.error_examples.emplace(code, record.error);
      continue;
    }
    ++summary.succeeded;
    ++summary.finish_reasons[record.finish_reason];
    if (IsGood(record, limits)) ++summary.good;
    summary.input_tokens += record.input_tokens;
    summary.output_tokens += record.output_tokens;
    if (record.ttft_seconds >= 0) ttft.push_back(record.ttft_seconds);
    itl.insert(itl.end(), record.itl_seconds.begin(), record.itl_seconds.end());
    e2e.push_back(record.e2e_seconds);
    if (record.tpot_seconds() >= 0) tpot.push_back(record.tpot_seconds());
  }
  if (seconds > 0) {
    summary.requests_per_second = summary.succeeded / seconds;
    summary.output_tokens_per_second = summary.output_tokens / seconds;
    summary.total_tokens_per_second = (summary.input_tokens + summary.output_tokens) / seconds;
    summary.goodput_requests_per_second = summary.good / seconds;
  }
  summary.ttft = Summarize(std::move(ttft));
  summary.itl = Summarize(std::move(itl));
  summary.e2e = Summarize(std::move(e2e));
  summary.tpot = Summarize(std::move(tpot));
  return summary;
}

std::vector<ItlWindow> ItlSeries(const std::vector<RequestRecord>& records, double window_seconds,
                                 double full_until_seconds) {
  std::vector<ItlWindow> series;
  if (!(window_seconds > 0)) return series;
  std::vector<std::vector<double>> by_window;
  for (const RequestRecord& record : records) {
    if (!record.succeeded() || record.ttft_seconds < 0) continue;
    double arrival = record.start_seconds + record.ttft_seconds;
    for (double gap : record.itl_seconds) {
      arrival += gap;
      const size_t index = static_cast<size_t>(std::max(0.0, arrival / window_seconds));
      if (index >= by_window.size()) by_window.resize(index + 1);
      by_window[index].push_back(gap);
    }
  }
  for (size_t i = 0; i < by_window.size(); ++i) {
    ItlWindow window;
    window.start_seconds = static_cast<double>(i) * window_seconds;
    window.end_seconds = static_cast<double>(i + 1) * window_seconds;
    // A little slack for the rounding of window ends.
    window.full = window.end_seconds <= full_until_seconds + 1e-9 * window_seconds;
    window.itl = Summarize(std::move(by_window[i]));
    series.push_back(std::move(window));
  }
  return series;
}

}  // namespace kiln::loadgen
