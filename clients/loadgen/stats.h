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

// What the client does to a request on purpose (--cancel-fraction, --disconnect-fraction).
//   kCancel:     gRPC: ClientContext::TryCancel; HTTP: an orderly close (FIN), after which the
//                server's remaining bytes are drained, uncounted, until it closes too.
//   kDisconnect: the connection dropped without a cancellation: gRPC: the request's own TCP
//                connection shut down under it; HTTP: an abortive close (RST), nothing more read.
enum class ClientFault { kNone, kCancel, kDisconnect };
// "", "cancelled", "disconnected": how reports label a request that the client ended.
std::string ClientFaultLabel(ClientFault fault);

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
  // The fault planned for this request, after how many received tokens, and the one the client
  // carried out (kNone when the stream ended first). A request the client ended on purpose is
  // neither a success nor a failure, whatever status it then got.
  ClientFault planned_fault = ClientFault::kNone;
  int32_t fault_after_tokens = 0;
  ClientFault fault = ClientFault::kNone;
  bool ok() const { return code == 0; }
  bool succeeded() const { return code == 0 && fault == ClientFault::kNone; }
  bool failed() const { return code != 0 && fault == ClientFault::kNone; }
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

// The p99 (and p50, max) of the inter-token latencies of the tokens that arrived in one window of
// a phase, by arrival time since the phase started.
struct ItlWindow {
  double start_seconds = 0, end_seconds = 0;
  bool full = false;  // the whole window lies within the issuing period (load was steady)
  LatencySummary itl;
};

// The windows [0, w), [w, 2w), ... up to the last token's arrival, over the successful requests
// (warm-up ones too: the series is by time). A token arrives at start + ttft + the sum of its
// request's inter-token latencies up to it. Windows ending after `full_until_seconds` (the end
// of the issuing period, when in-flight requests drain) are not full.
std::vector<ItlWindow> ItlSeries(const std::vector<RequestRecord>& records, double window_seconds,
                                 double full_until_seconds);

struct PhaseSummary {
  std::string label;     // "concurrency 4", "rate 2/s"
  int concurrency = 0;   // closed loop
  double rate = 0;       // open loop: the offered rate (req/s)
  int64_t requests = 0;  // counted (not warm-up): succeeded + failed + cancelled + disconnected
  int64_t succeeded = 0, failed = 0, good = 0;
  int64_t cancelled = 0, disconnected = 0;        // ended by the client on purpose: not failures
  int64_t fault_output_tokens = 0;                // the tokens those received before it
  std::map<std::string, int64_t> errors_by_code;  // "UNAVAILABLE" → count (failures only)
  std::map<std::string, std::string> error_examples;  // "UNAVAILABLE" → its first message
  std::map<std::string, int64_t> finish_reasons;      // of successful requests: "LENGTH" → count
  double seconds = 0;                                 // the measurement window
  int64_t input_tokens = 0, output_tokens = 0;        // of successful requests
  double requests_per_second = 0, output_tokens_per_second = 0, total_tokens_per_second = 0;
  double goodput_requests_per_second = 0;  // good requests / seconds (when limits are set)
  LatencySummary ttft, itl, e2e, tpot;     // of successful requests
  double itl_window_seconds = 0;           // of itl_series; 0: no series
  std::vector<ItlWindow> itl_series;       // filled by the caller (ItlSeries)
};

// `seconds`: the measurement window (warm-up end → last counted request's end).
PhaseSummary SummarizePhase(const std::vector<RequestRecord>& records, double seconds,
                            const GoodputLimits& limits);

}  // namespace kiln::loadgen
