// Drives one load phase against kiln.v1.Inference/Generate with gRPC's asynchronous API: every
// stream is a small state machine on a completion queue, so a few threads carry hundreds of
// concurrent streams.
//   closed loop: `concurrency` streams, each replaced as soon as it ends;
//   open loop:   new streams at Poisson arrivals of `rate` per second, whatever is in flight.
// The phase issues requests for `duration` after the warm-up (or until `requests` counted ones
// were issued), then waits for those in flight to end.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"
#include "grpcpp/channel.h"

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
  int threads = 2;    // completion queues, one thread each
  uint64_t seed = 0;  // of the arrival process
  bool ignore_eos = true;
  float temperature = 0;  // 0 = greedy
};

// Updated while a phase runs; read by the progress line.
struct LiveCounters {
  std::atomic<int64_t> started{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> output_tokens{0};
};

struct PhaseResult {
  PhaseConfig config;
  std::vector<RequestRecord> records;  // warm-up requests included (marked), by start time
  // The measurement window: warm-up end → the end of the last counted request.
  double measured_seconds = 0;
};

// InvalidArgument for a config that names neither a concurrency nor a rate, or neither a
// duration nor a request count. Request failures are results, not errors.
absl::StatusOr<PhaseResult> RunPhase(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                                     const PhaseConfig& config, PromptSource& prompts,
                                     LiveCounters* live = nullptr);

}  // namespace kiln::loadgen
