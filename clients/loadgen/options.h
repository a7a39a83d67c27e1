// kiln-loadgen's command line: every flag, parsed into LoadgenOptions, and the --help text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"

namespace kiln::loadgen {

struct LoadgenOptions {
  // Connection.
  std::string target = "127.0.0.1:50051";
  std::string model = "default";
  bool tls = false;
  std::string tls_ca;  // PEM file; implies TLS
  int connections = 1;
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Minutes(10);
  int threads = 2;  // completion-queue threads

  // Load: closed loop (concurrency) or open loop (rates; one entry per sweep step).
  int concurrency = 0;
  std::vector<double> rates;
  int max_concurrency = 0;  // open loop: at most this many in flight; 0 = no cap
  absl::Duration duration = absl::ZeroDuration();
  int64_t requests = 0;
  absl::Duration warmup = absl::ZeroDuration();
  uint64_t seed = 0;

  // Requests.
  WorkloadOptions workload;
  bool ignore_eos = true;
  float temperature = 0;

  // Results.
  GoodputLimits goodput;
  bool progress = false;  // also when stderr is not a terminal
  std::string json_path, csv_path, svg_path;
  std::string title;  // of the SVG chart; default from the run
  bool help = false;
};

// Parses argv (argv[0] is skipped). Flags are --name=value or --name value, with dashes or
// underscores. InvalidArgument names the flag at fault.
absl::StatusOr<LoadgenOptions> ParseOptions(int argc, const char* const* argv);

// Every flag with its default.
std::string HelpText();

// "20s", "500ms", "1m30s", or plain seconds ("2.5").
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& text, const std::string& flag);

}  // namespace kiln::loadgen
