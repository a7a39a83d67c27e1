// One load phase, whichever protocol carries it: its configuration, its live counters and its
// result, and the PhaseLedger that the runners (gRPC in runner.h, OpenAI HTTP in http_runner.h)
// share to decide which requests may still be issued, to count what is in flight and to collect
// the records.
//   closed loop: `concurrency` requests, each replaced as soon as it ends;
//   open loop:   new requests at Poisson arrivals of `rate` per second, whatever is in flight.
// The phase issues requests for `duration` after the warm-up (or until `requests` counted ones
// were issued), then waits for those in flight to end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"

namespace kiln::loadgen {

struct PhaseConfig {
  std::string model = "default";
  int concurrency = 0;      // > 0: closed loop
  double rate = 0;          // > 0: open loop (Poisson arrivals, requests per second)
  int max_concurrency = 0;  // open loop: arrivals wait while this many are in flight; 0 = no cap
  absl::Duration duration = absl::ZeroDuration();  // issue for this long after the warm-up, or
  int64_t requests = 0;                            // this many counted requests
  absl::Duration warmup = absl::ZeroDuration();    // requests started meanwhile are not counted
  absl::Duration request_timeout = absl::Minutes(10);
  // After a failed request, its closed-loop replacement waits this long, so that a server that
  // refuses everything is not hammered in a tight loop.
  absl::Duration failure_backoff = absl::Milliseconds(10);
  int threads = 2;    // gRPC: completion queues; HTTP: I/O threads; one thread each
  uint64_t seed = 0;  // of the arrival process
  bool ignore_eos = true;
  float temperature = 0;  // 0 = greedy
  // These fractions of the requests are cancelled, or have their connection dropped, by the
  // client after a random number of tokens (FaultPlanner, seeded with `seed`).
  double cancel_fraction = 0, disconnect_fraction = 0;
};

// Updated while a phase runs; read by the progress line.
struct LiveCounters {
  std::atomic<int64_t> started{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> errors{0};  // failures: not the requests the client ended on purpose
  std::atomic<int64_t> cancelled{0};
  std::atomic<int64_t> disconnected{0};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> output_tokens{0};
};

struct PhaseResult {
  PhaseConfig config;
  std::vector<RequestRecord> records;  // warm-up requests included (marked), by start time
  // The measurement window: warm-up end → the end of the last counted request.
  double measured_seconds = 0;
  // Since the phase started: the end of the issuing period (warm-up + duration; with a request
  // count, the last request's start), after which the requests in flight drain.
  double issue_end_seconds = 0;
  double start_unix_seconds = 0;  // the wall-clock time the phase started
};

// InvalidArgument for a config that names neither a concurrency nor a rate (or both), or
// neither a duration nor a request count, or a negative warm-up, or fault fractions outside
// [0, 1] or summing to more than 1.
absl::Status ValidatePhaseConfig(const PhaseConfig& config);

// Thread-safe. A request's life: Reserve (it counts in flight from then on, also while it waits
// for a delay), Admit (the phase may refuse it: then its reservation is gone), then Finish with
// its record, and Release. A closed-loop replacement is reserved before its predecessor is
// released, so that nothing in flight means nothing more will be issued.
class PhaseLedger {
 public:
  using Clock = std::chrono::steady_clock;

  PhaseLedger(const PhaseConfig& config, PromptSource& prompts, LiveCounters* live)
      : config_(config),
        live_(live),
        prompts_(prompts),
        faults_(config.cancel_fraction, config.disconnect_fraction, config.seed) {}

  // Starts the phase's clocks: the warm-up and the issuing period count from now.
  void Start();
  Clock::time_point start() const { return start_; }
  const PhaseConfig& config() const { return config_; }
  LiveCounters* live() const { return live_; }

  void Reserve() ABSL_LOCKS_EXCLUDED(mutex_);
  // Whether a reserved request may be issued now. If so, `spec` is its prompt and the record
  // has its id, warm-up mark, start, input tokens and planned fault; if not, its reservation is
  // released.
  bool Admit(RequestSpec* spec, RequestRecord* record) ABSL_LOCKS_EXCLUDED(mutex_);
  void AddOutputTokens(int64_t tokens) {
    if (live_ != nullptr) live_->output_tokens.fetch_add(tokens, std::memory_order_relaxed);
  }
  // Stores an admitted request's record; it ended at `end`.
  void Finish(RequestRecord record, Clock::time_point end) ABSL_LOCKS_EXCLUDED(mutex_);
  void Release() ABSL_LOCKS_EXCLUDED(mutex_);

  // The open loop, on the calling thread: at each Poisson arrival (waiting while
  // max_concurrency requests are in flight), Reserve and call `issue`, which returns whether
  // the request was admitted; the first refusal ends the arrivals.
  void RunArrivals(const std::function<bool()>& issue) ABSL_LOCKS_EXCLUDED(mutex_);
  // Blocks until nothing is in flight.
  void AwaitIdle() ABSL_LOCKS_EXCLUDED(mutex_);
  // The records by id and the measurement window; once, after AwaitIdle.
  PhaseResult TakeResult() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  bool MayIssueLocked(Clock::time_point now, bool* warmup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const PhaseConfig config_;
  LiveCounters* const live_;
  Clock::time_point start_, warmup_end_, issue_end_;
  double start_unix_seconds_ = 0;

  absl::Mutex mutex_;
  PromptSource& prompts_ ABSL_GUARDED_BY(mutex_);
  FaultPlanner faults_ ABSL_GUARDED_BY(mutex_);
  double last_start_seconds_ ABSL_GUARDED_BY(mutex_) = 0;  // of the last admitted request
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t counted_issued_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mutex_);
  Clock::time_point last_counted_end_ ABSL_GUARDED_BY(mutex_);
  bool counted_any_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace kiln::loadgen
