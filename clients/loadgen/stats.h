// kiln-loadgen's numbers: one record per request, percentiles, goodput limits, and the summary
// of one load phase (one concurrency, or one rate of a sweep).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::loadgen {

// What one request measured, from the client's side.
struct RequestRecord {
  int64_t id = 0;
  bool warmup = false;       // started during the warm-up: not counted
  double start_seconds = 0;  // since the phase started
  double ttft_seconds = -1;  // -1: no token arrived
  double e2e_seconds = 0;
  std::vector<double> itl_seconds;  // one per token after the first
  int32_t input_tokens = 0;         // the server's usage.prompt_tokens when it reported it
  int32_t output_tokens = 0;
  int code = 0;               // gRPC status code (0 = OK); over HTTP, the nearest one
  std::string code_label;     // over HTTP, what failed: "http_429", "truncated", ...
  std::string error;          // the status message when not OK
  std::string finish_reason;  // gRPC: "LENGTH", "EOS", ...; HTTP: "length", "stop", ... ("" when
                              // the stream ended without one)
  bool ok() const { return code == 0; }
  // How reports name the outcome: the label when set, else the gRPC code's name ("OK", ...).
  std::string code_name() const;
  // (e2e − ttft) / (output tokens − 1); -1 with fewer than two tokens.
  double tpot_seconds() const;
};

// "OK", "NOT_FOUND", ... for a gRPC status code.
std::string StatusCodeName(int code);

// The p-th percentile (0 ≤ p ≤ 100) of `sorted` (ascending), interpolating linearly between the
// closest ranks (numpy's default): p50 of {1, 2, 3, 4} is 2.5. NaN when empty.
double Percentile(const std::vector<double>& sorted, double p);

struct LatencySummary {
  int64_t count = 0;
  double mean = 0, min = 0, max = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0;  // seconds
};
LatencySummary Summarize(std::vector<double> values);

// A request is "good" when it succeeded and meets every limit that is set (seconds): time to
// first token, its mean inter-token latency (= TPOT), end-to-end latency.
struct GoodputLimits {
  std::optional<double> ttft, itl, e2e;
  bool any() const { return ttft || itl || e2e; }
};
// "ttft=0.5,itl=0.05,e2e=10" (tpot= is a synonym of itl=; values in seconds, or with a unit:
// 500ms).
absl::StatusOr<GoodputLimits> ParseGoodput(const std::string& text);
bool IsGood(const RequestRecord& record, const GoodputLimits& limits);

struct PhaseSummary {
  std::string label;     // "concurrency 4", "rate 2/s"
  int concurrency = 0;   // closed loop
  double rate = 0;       // open loop: the offered rate (req/s)
  int64_t requests = 0;  // counted (not warm-up)
  int64_t succeeded = 0, failed = 0, good = 0;
  std::map<std::string, int64_t> errors_by_code;      // "UNAVAILABLE" → count
  std::map<std::string, std::string> error_examples;  // "UNAVAILABLE" → its first message
  double seconds = 0;                                 // the measurement window
  int64_t input_tokens = 0, output_tokens = 0;        // of successful requests
  double requests_per_second = 0, output_tokens_per_second = 0, total_tokens_per_second = 0;
  double goodput_requests_per_second = 0;  // good requests / seconds (when limits are set)
  LatencySummary ttft, itl, e2e, tpot;     // of successful requests
};

// `seconds`: the measurement window (warm-up end → last counted request's end).
PhaseSummary SummarizePhase(const std::vector<RequestRecord>& records, double seconds,
                            const GoodputLimits& limits);

}  // namespace kiln::loadgen
