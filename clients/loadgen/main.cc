// kiln-loadgen: a load generator for kiln-server's Generate RPC or an OpenAI-compatible HTTP
// server (closed loop, open loop, rate sweeps), reporting latency percentiles, throughput,
// goodput and errors. See --help.
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "clients/loadgen/http_runner.h"
#include "clients/loadgen/openai.h"
#include "clients/loadgen/options.h"
#include "clients/loadgen/report.h"
#include "clients/loadgen/runner.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/svg_chart.h"
#include "clients/loadgen/workload.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace kiln::loadgen {
namespace {

constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2;

absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> OpenChannels(
    const LoadgenOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca.empty()) {
    std::ifstream in(options.tls_ca, std::ios::binary);
    if (!in)
      return absl::InvalidArgumentError(absl::StrCat("--tls-ca: cannot read ", options.tls_ca));
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    credentials = grpc::SslCredentials(ssl);
  } else if (options.tls) {
    credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < options.connections; ++i) {
    grpc::ChannelArguments arguments;
    // Distinct arguments keep gRPC from sharing one connection between the channels.
    arguments.SetInt("kiln.loadgen.connection", i);
    arguments.SetMaxReceiveMessageSize(64 << 20);
    channels.push_back(grpc::CreateCustomChannel(options.target, credentials, arguments));
  }
  return channels;
}

std::vector<std::pair<std::string, std::string>> Settings(const LoadgenOptions& o) {
  std::vector<std::pair<std::string, std::string>> s;
  if (o.protocol == Protocol::kOpenAi) {
    s.emplace_back("protocol", "openai");
    s.emplace_back("api", o.api == OpenAiApi::kChat ? "chat" : "completions");
  } else {
    s.emplace_back("protocol", "grpc");
  }
  if (o.concurrency > 0) {
    s.emplace_back("concurrency", absl::StrCat(o.concurrency));
  } else {
    s.emplace_back("rates", absl::StrJoin(o.rates, ","));
    if (o.max_concurrency > 0) s.emplace_back("max_concurrency", absl::StrCat(o.max_concurrency));
  }
  if (o.duration > absl::ZeroDuration())
    s.emplace_back("duration", absl::FormatDuration(o.duration));
  if (o.requests > 0) s.emplace_back("requests", absl::StrCat(o.requests));
  s.emplace_back("warmup", absl::FormatDuration(o.warmup));
  if (o.workload.prompts_file.empty()) {
    s.emplace_back("input_tokens", o.workload.input.ToString());
    s.emplace_back("prompt_kind", o.workload.prompt_kind == PromptKind::kText ? "text" : "ids");
  } else {
    s.emplace_back("prompts_file", o.workload.prompts_file);
  }
  s.emplace_back("output_tokens", o.workload.output.ToString());
  s.emplace_back("ignore_eos", o.ignore_eos ? "true" : "false");
  s.emplace_back("temperature", absl::StrCat(o.temperature));
  s.emplace_back("seed", absl::StrCat(o.seed));
  if (o.protocol == Protocol::kGrpc) s.emplace_back("connections", absl::StrCat(o.connections));
  if (o.cancel_fraction > 0) s.emplace_back("cancel_fraction", absl::StrCat(o.cancel_fraction));
  if (o.disconnect_fraction > 0) {
    s.emplace_back("disconnect_fraction", absl::StrCat(o.disconnect_fraction));
  }
  s.emplace_back("window", absl::FormatDuration(o.window));
  return s;
}

std::string PhaseLabel(const PhaseConfig& config) {
  return config.concurrency > 0 ? absl::StrCat("concurrency ", config.concurrency)
                                : absl::StrFormat("rate %g/s", config.rate);
}

int Main(int argc, char** argv) {
  absl::StatusOr<LoadgenOptions> parsed = ParseOptions(argc, argv);
  if (!parsed.ok()) {
    std::cerr << "kiln-loadgen: " << parsed.status().message() << "\n(kiln-loadgen --help lists "
              << "every flag)\n";
    return kExitUsage;
  }
  const LoadgenOptions& options = *parsed;
  if (options.help) {
    std::cout << HelpText();
    return kExitOk;
  }
  absl::StatusOr<PromptSource> prompts = PromptSource::Create(options.workload);
  if (!prompts.ok()) {
    std::cerr << "kiln-loadgen: " << prompts.status().message() << "\n";
    return kExitUsage;
  }
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  OpenAiTarget http_target;
  if (options.protocol == Protocol::kGrpc) {
    absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> opened = OpenChannels(options);
    if (!opened.ok()) {
      std::cerr << "kiln-loadgen: " << opened.status().message() << "\n";
      return kExitUsage;
    }
    channels = *std::move(opened);
    for (const std::shared_ptr<grpc::Channel>& channel : channels) {
      if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                     absl::ToChronoNanoseconds(options.connect_timeout))) {
        std::cerr << "kiln-loadgen: cannot connect to " << options.target << " within "
                  << absl::FormatDuration(options.connect_timeout) << "\n";
        return kExitFailed;
      }
    }
  } else {
    absl::StatusOr<HttpUrl> url = ParseHttpUrl(options.target);  // checked by ParseOptions
    if (!url.ok()) {
      std::cerr << "kiln-loadgen: --target: " << url.status().message() << "\n";
      return kExitUsage;
    }
    http_target.url = *std::move(url);
    http_target.api = options.api;
    http_target.api_key = options.api_key;
    http_target.connect_timeout = options.connect_timeout;
    if (absl::Status probe = ProbeHttpTarget(http_target.url, options.connect_timeout);
        !probe.ok()) {
      std::cerr << "kiln-loadgen: " << probe.message() << "\n";
      return kExitFailed;
    }
  }

  std::vector<PhaseConfig> configs;
  PhaseConfig base;
  base.model = options.model;
  base.max_concurrency = options.max_concurrency;
  base.duration = options.duration;
  base.requests = options.requests;
  base.warmup = options.warmup;
  base.request_timeout = options.request_timeout;
  base.threads = options.threads;
  base.ignore_eos = options.ignore_eos;
  base.temperature = options.temperature;
  base.cancel_fraction = options.cancel_fraction;
  base.disconnect_fraction = options.disconnect_fraction;
  if (options.concurrency > 0) {
    base.concurrency = options.concurrency;
    base.seed = options.seed;
    configs.push_back(base);
  } else {
    for (size_t i = 0; i < options.rates.size(); ++i) {
      PhaseConfig config = base;
      config.rate = options.rates[i];
      config.seed = options.seed + i;
      configs.push_back(config);
    }
  }

  RunReport report;
  report.target = options.target;
  report.model = options.model;
  report.settings = Settings(options);
  report.goodput = options.goodput;
  const bool show_progress = options.progress || StderrIsTerminal();
  for (const PhaseConfig& config : configs) {
    LiveCounters live;
    std::unique_ptr<ProgressLine> progress;
    if (show_progress) progress = std::make_unique<ProgressLine>(&live, PhaseLabel(config));
    absl::StatusOr<PhaseResult> result =
        options.protocol == Protocol::kGrpc
            ? RunPhase(channels, config, *prompts, &live, options.target)
            : RunHttpPhase(http_target, config, *prompts, &live);
    progress.reset();
    if (!result.ok()) {
      std::cerr << "kiln-loadgen: " << result.status().message() << "\n";
      return result.status().code() == absl::StatusCode::kUnavailable ? kExitFailed : kExitUsage;
    }
    PhaseSummary summary =
        SummarizePhase(result->records, result->measured_seconds, options.goodput);
    summary.label = PhaseLabel(config);
    summary.concurrency = config.concurrency;
    summary.rate = config.rate;
    summary.itl_window_seconds = absl::ToDoubleSeconds(options.window);
    summary.itl_series =
        ItlSeries(result->records, summary.itl_window_seconds, result->issue_end_seconds);
    report.summaries.push_back(std::move(summary));
    report.phases.push_back(*std::move(result));
  }

  PrintSummary(report, std::cout);
  std::cout.flush();
  int status = kExitOk;
  auto write = [&status](const std::string& path, const absl::Status& written) {
    if (path.empty()) return;
    if (!written.ok()) {
      std::cerr << "kiln-loadgen: " << written.message() << "\n";
      status = kExitFailed;
    }
  };
  if (!options.json_path.empty()) write(options.json_path, WriteJson(report, options.json_path));
  if (!options.csv_path.empty()) write(options.csv_path, WriteCsv(report, options.csv_path));
  if (!options.svg_path.empty()) {
    const std::string title =
        !options.title.empty()
            ? options.title
            : absl::StrCat("kiln-loadgen: ", options.model, " @ ", options.target, " (",
                           report.sweep() ? "rate sweep" : report.summaries.front().label, ")");
    write(options.svg_path, WriteSvg(report, options.svg_path, title));
  }

  int64_t counted = 0, failed = 0;
  for (const PhaseSummary& summary : report.summaries) {
    counted += summary.requests;
    failed += summary.failed;
  }
  if (counted == 0) {
    std::cerr << "kiln-loadgen: no request was counted (is the warm-up longer than the run?)\n";
    return kExitFailed;
  }
  if (failed > 0) {
    std::map<std::string, int64_t> by_code;
    for (const PhaseSummary& summary : report.summaries) {
      for (const auto& [code, count] : summary.errors_by_code) by_code[code] += count;
    }
    std::vector<std::string> parts;
    for (const auto& [code, count] : by_code) parts.push_back(absl::StrCat(code, " ", count));
    std::cerr << "kiln-loadgen: " << failed << " of " << counted
              << " requests failed: " << absl::StrJoin(parts, ", ") << "\n";
    return kExitFailed;
  }
  return status;
}

}  // namespace
}  // namespace kiln::loadgen

int main(int argc, char** argv) {
  try {
    return kiln::loadgen::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kiln-loadgen: fatal: " << e.what() << "\n";
    return 1;
  }
}
