// kiln-loadgen's command line: every flag, parsed into LoadgenOptions, and the --help text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/loadgen/openai.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"

namespace kiln::loadgen {

// kiln's gRPC Generate stream, or an OpenAI-compatible HTTP API (kiln's, vLLM's, llama-server's).
enum class Protocol { kGrpc, kOpenAi };

inline constexpr char kDefaultGrpcTarget[] = "127.0.0.1:50051";
inline constexpr char kDefaultOpenAiTarget[] = "http://127.0.0.1:8000";

struct LoadgenOptions {
  // Connection.
  Protocol protocol = Protocol::kGrpc;
  std::string target = kDefaultGrpcTarget;  // openai: a base URL, checked by ParseHttpUrl
  std::string model = "default";
  OpenAiApi api = OpenAiApi::kCompletions;  // openai only
  std::string api_key;                      // openai only: "Authorization: Bearer KEY"
  bool tls = false;                         // gRPC only
  std::string tls_ca;                       // PEM file; implies TLS
  int connections = 1;                      // gRPC only
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Minutes(10);
  int threads = 2;  // completion-queue (gRPC) or I/O (openai) threads

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

  // Client-side faults: these fractions of the requests are cancelled, or have their connection
  // dropped, after a random number of tokens (PhaseConfig).
  double cancel_fraction = 0, disconnect_fraction = 0;

  // Results.
  GoodputLimits goodput;
  bool progress = false;  // also when stderr is not a terminal
  std::string json_path, csv_path, svg_path;
  absl::Duration window = absl::Seconds(60);  // of the p99 inter-token latency series
  std::string title;                          // of the SVG chart; default from the run
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
