// kiln-loadgen's outputs: the human summary (stdout), JSON (summary + every request), CSV (one
// row per request) and the live progress line (stderr).
#pragma once

#include <atomic>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "clients/loadgen/phase.h"
#include "clients/loadgen/stats.h"

namespace kiln::loadgen {

struct RunReport {
  std::string target, model;
  std::vector<std::pair<std::string, std::string>> settings;  // flag → value, for the record
  GoodputLimits goodput;
  std::vector<PhaseResult> phases;
  std::vector<PhaseSummary> summaries;  // one per phase
  bool sweep() const { return phases.size() > 1; }
};

// Per phase: requests, throughput, goodput, errors by code, and a latency table (ms); for a
// sweep, a last table with one row per rate.
void PrintSummary(const RunReport& report, std::ostream& out);
// {"target", "model", "settings", "goodput_limits", "phases": [summary..., with "itl_series":
//  [{"start_s", "end_s", "full", "tokens", "p50_s", "p99_s", "max_s"}, ...]],
//  "requests": [{"phase", "id", "warmup", "start_s", "ttft_s", "itl_s": [...], ...}]}
absl::Status WriteJson(const RunReport& report, const std::string& path);
// phase,label,id,warmup,start_s,ttft_s,e2e_s,tpot_s,itl_mean_s,itl_max_s,input_tokens,
// output_tokens,code,finish_reason,error
absl::Status WriteCsv(const RunReport& report, const std::string& path);

// "[rate 2/s] 41 done, 3 in flight, 0 errors, 2.0 req/s, 250 tok/s" rewritten in place about
// once a second on stderr (a line per update when stderr is not a terminal).
class ProgressLine {
 public:
  ProgressLine(const LiveCounters* live, std::string label);
  ~ProgressLine();  // Stop()
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  void Stop();

 private:
  void Loop();

  const LiveCounters* const live_;
  const std::string label_;
  const bool tty_;
  absl::Mutex mutex_;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

// Whether stderr is a terminal.
bool StderrIsTerminal();

}  // namespace kiln::loadgen
