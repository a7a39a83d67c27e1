#include "clients/loadgen/options.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kiln::loadgen {
namespace {

absl::Status Bad(const std::string& flag, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

template <typename Int>
absl::Status ParseInt(const std::string& flag, const std::string& text, Int min, Int* out) {
  if (!absl::SimpleAtoi(text, out))
    return Bad(flag, absl::StrCat("'", text, "' is not an integer"));
  if (*out < min) return Bad(flag, absl::StrCat("must be at least ", min));
  return absl::OkStatus();
}

absl::Status ParsePositive(const std::string& flag, const std::string& text, double* out) {
  if (!absl::SimpleAtod(text, out) || !(*out > 0) || !std::isfinite(*out)) {
    return Bad(flag, absl::StrCat("'", text, "' is not a positive number"));
  }
  return absl::OkStatus();
}

absl::Status ParseFraction(const std::string& flag, const std::string& text, double* out) {
  if (!absl::SimpleAtod(text, out) || !(*out >= 0 && *out <= 1)) {
    return Bad(flag, absl::StrCat("'", text, "' is not a fraction in [0, 1]"));
  }
  return absl::OkStatus();
}

absl::Status ParseBool(const std::string& flag, const std::string& text, bool* out) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower.empty() || lower == "true" || lower == "1" || lower == "yes") {
    *out = true;
  } else if (lower == "false" || lower == "0" || lower == "no") {
    *out = false;
  } else {
    return Bad(flag, absl::StrCat("'", text, "' is not true or false"));
  }
  return absl::OkStatus();
}

// Length flags are combined after parsing: --X-tokens, --X-tokens-stddev, --X-tokens-dist.
struct LengthFlags {
  std::optional<int64_t> mean;
  std::optional<double> stddev;
  std::optional<std::string> dist;
};

absl::StatusOr<LengthDistribution> BuildLength(const std::string& name, const LengthFlags& flags,
                                               int64_t default_mean) {
  LengthDistribution out = LengthDistribution::Fixed(flags.mean.value_or(default_mean));
  if (flags.stddev && *flags.stddev > 0) {
    out = {LengthDistribution::Kind::kNormal, out.a, *flags.stddev};
  }
  if (flags.dist) {
    if (flags.stddev && *flags.stddev > 0) {
      return Bad(name + "-tokens-dist", absl::StrCat("give it or --", name, "-tokens-stddev"));
    }
    absl::StatusOr<LengthDistribution> parsed = LengthDistribution::Parse(*flags.dist, out);
    if (!parsed.ok()) return Bad(name + "-tokens-dist", std::string(parsed.status().message()));
    out = *parsed;
  }
  return out;
}

struct Flag {
  std::string name;        // with dashes
  std::string value_name;  // "" for a boolean
  std::string help;
};

const std::vector<Flag>& Flags() {
  static const std::vector<Flag> flags = {
      {"protocol", "grpc|openai",
       "grpc: kiln's Generate stream (the default); openai: an OpenAI-compatible HTTP server's "
       "streaming /v1/completions or /v1/chat/completions (kiln's HTTP API, vLLM, llama.cpp's "
       "llama-server)"},
      {"target", "ADDRESS",
       "grpc: HOST:PORT of a kiln-server (default 127.0.0.1:50051); openai: a base URL "
       "http://HOST:PORT[/PREFIX] (default http://127.0.0.1:8000), requests go to "
       "PREFIX/v1/completions or PREFIX/v1/chat/completions (a PREFIX ending in /v1 gets no "
       "second one); https is refused: no TLS for HTTP in this version"},
      {"model", "NAME", "model to generate with (default \"default\")"},
      {"api", "completions|chat",
       "openai: the endpoint (default completions). completions sends token-id prompts as an "
       "array of ids and text as a string; chat sends one user message, a token-id prompt "
       "becoming as many common words (so its length in tokens is approximate; the server's "
       "usage gives the real one)"},
      {"api-key", "KEY", "openai: sent as \"Authorization: Bearer KEY\""},
      {"tls", "", "grpc: connect with TLS, trusting the system's CA certificates"},
      {"tls-ca", "FILE", "grpc: connect with TLS, trusting the CA certificates (PEM) in FILE"},
      {"connections", "N",
       "grpc only: connections to spread the streams over (default 1); openai keeps a "
       "connection per request in flight, alive and reused while the server allows"},
      {"connect-timeout", "DURATION", "wait this long for the server before giving up (10s)"},
      {"request-timeout", "DURATION", "deadline of each request (default 10m)"},
      {"threads", "N", "completion-queue (grpc) or I/O (openai) threads (default 2)"},
      {"concurrency", "N",
       "closed loop: keep N requests in flight, each replaced as it ends (the default, N = 1, "
       "when no --rate is given)"},
      {"rate", "R", "open loop: Poisson arrivals at R requests/s"},
      {"rates", "R1,R2,...", "open loop sweep: one phase per rate, each for --duration/--requests"},
      {"max-concurrency", "N",
       "open loop: arrivals wait while N requests are in flight (0: no cap)"},
      {"duration", "DURATION",
       "issue requests for this long after the warm-up (e.g. 20s, 2m); requests still in flight "
       "then are waited for and counted"},
      {"requests", "N", "issue N counted requests (default 100 when no --duration is given)"},
      {"warmup", "DURATION", "requests started in this first period are not counted (default 0)"},
      {"input-tokens", "N", "prompt length in tokens (default 128)"},
      {"input-tokens-stddev", "SD", "draw prompt lengths from normal(N, SD) instead (default 0)"},
      {"input-tokens-dist", "DIST", "prompt lengths: fixed[:N], uniform:A:B or normal:MEAN:SD"},
      {"output-tokens", "N", "max_tokens of each request, sent with ignore_eos (default 128)"},
      {"output-tokens-stddev", "SD", "draw max_tokens from normal(N, SD) instead (default 0)"},
      {"output-tokens-dist", "DIST", "max_tokens: fixed[:N], uniform:A:B or normal:MEAN:SD"},
      {"prompt-kind", "ids|text",
       "synthetic prompts as random token ids (default) or as text of random words (one word per "
       "input token; the server reports the real token count)"},
      {"vocab-size", "N", "synthetic token ids are drawn from [0, N) (default 256)"},
      {"prompts-file", "FILE.jsonl",
       "prompts from a file instead, one JSON object per line: {\"prompt\": \"text\"} or "
       "{\"prompt_ids\": [1, 2]}, optionally \"max_tokens\"; used in order, repeated as needed"},
      {"ignore-eos", "BOOL",
       "generate max_tokens tokens whatever the model says (default true; openai: sent as "
       "\"ignore_eos\", a vLLM and llama.cpp extension, only when true)"},
      {"temperature", "T", "sampling temperature (default 0: greedy)"},
      {"seed", "N", "seed of prompts, lengths, arrivals and faults (default 0)"},
      {"cancel-fraction", "F",
       "cancel this fraction of the requests (0..1, chosen by the seeded generator) after a random "
       "number of received tokens, uniform in [1, max_tokens): grpc with ClientContext::TryCancel, "
       "openai by closing the connection in order (FIN; what the server still sends is drained "
       "until it closes too). Counted as cancelled, not as failures (default 0)"},
      {"disconnect-fraction", "F",
       "drop the connection of this fraction of the requests mid-stream, as above but without a "
       "cancel: grpc sends each such request over a TCP connection of its own and shuts it down "
       "under the call (no TLS); openai resets its connection (RST) and reads nothing more. "
       "Counted as disconnected, not as failures (default 0)"},
      {"goodput", "LIMITS",
       "count requests meeting every limit, e.g. ttft=0.5,itl=0.05,e2e=10 (seconds; itl is the "
       "request's mean inter-token latency, tpot= is a synonym)"},
      {"progress", "", "show the progress line even when stderr is not a terminal"},
      {"json", "FILE",
       "write the summary and every request as JSON, with a series of the p99 inter-token latency "
       "per --window"},
      {"window", "DURATION",
       "the window of the inter-token latency series: p50/p99 of the tokens that arrived in each "
       "(default 60s)"},
      {"csv", "FILE", "write one row per request as CSV"},
      {"svg", "FILE", "write a chart: latency CDFs, throughput over time, latency vs throughput"},
      {"title", "TEXT", "title of the SVG chart"},
      {"help", "", "print this help"},
  };
  return flags;
}

}  // namespace

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& text, const std::string& flag) {
  double seconds = 0;
  absl::Duration duration;
  if (absl::SimpleAtod(text, &seconds) && std::isfinite(seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &duration)) {
    return Bad(flag, absl::StrCat("'", text, "' is not a duration (e.g. 20s, 500ms, 2m)"));
  }
  if (duration < absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return Bad(flag, "must be a finite, non-negative duration");
  }
  return duration;
}

std::string HelpText() {
  std::string text =
      "kiln-loadgen: load a kiln-server's Generate RPC, or an OpenAI-compatible HTTP server,\n"
      "and measure latency and throughput.\n\n"
      "  kiln-loadgen --target HOST:PORT --model NAME [--concurrency N | --rate R | --rates "
      "R1,R2]\n"
      "               [--duration 20s | --requests N] [--warmup 2s] [--json F] [--csv F] "
      "[--svg F]\n"
      "  kiln-loadgen --protocol openai --target http://HOST:PORT [--api chat] [--api-key K] "
      "...\n\n"
      "Reports TTFT, inter-token latency (ITL), time per output token (TPOT) and end-to-end\n"
      "latency (mean, p50, p90, p95, p99), request and token throughput, goodput, and errors by\n"
      "gRPC status code, or over HTTP by label: http_STATUS (e.g. http_429), truncated (the\n"
      "stream ended without [DONE] or a finish_reason), stream_error (an error event),\n"
      "bad_response, timeout, connect_failed, connection_error. Over HTTP, streams ask for\n"
      "usage (stream_options.include_usage): output tokens are its completion_tokens (else one\n"
      "per content chunk), and a chunk carrying several tokens shares its gap among them.\n\n"
      "Exit status: 0 when no counted request failed (those cancelled or disconnected on\n"
      "purpose are not failures), 1 when any failed (or none completed), 2 for a usage error.\n"
      "Flags take --name=value or --name value; dashes and underscores are alike. DURATION:\n"
      "20s, 500ms, 2m, or plain seconds.\n\nFlags:\n";
  for (const Flag& flag : Flags()) {
    const std::string value = flag.value_name == "BOOL" ? "[=true|false]"
                              : flag.value_name.empty() ? ""
                                                        : " " + flag.value_name;
    const std::string head = absl::StrCat("  --", flag.name, value);
    // The help text wrapped at 100 columns, indented under its flag.
    constexpr size_t kIndent = 30, kWidth = 100;
    std::string line = head.size() < kIndent ? head + std::string(kIndent - head.size(), ' ')
                                             : head + "\n" + std::string(kIndent, ' ');
    size_t column = kIndent;
    bool first = true;
    for (absl::string_view word : absl::StrSplit(flag.help, ' ', absl::SkipEmpty())) {
      if (!first && column + 1 + word.size() > kWidth) {
        absl::StrAppend(&line, "\n", std::string(kIndent, ' '));
        column = kIndent;
        first = true;
      }
      absl::StrAppend(&line, first ? "" : " ", word);
      column += (first ? 0 : 1) + word.size();
      first = false;
    }
    absl::StrAppend(&text, line, "\n");
  }
  return text;
}

absl::StatusOr<LoadgenOptions> ParseOptions(int argc, const char* const* argv) {
  std::map<std::string, const Flag*> known;
  for (const Flag& flag : Flags()) known[flag.name] = &flag;
  LoadgenOptions o;
  LengthFlags input, output;
  std::optional<std::string> prompt_kind;
  bool have_duration = false, have_target = false, have_api = false, have_connections = false;

  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "-")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    arg = std::string(absl::StripPrefix(absl::StripPrefix(arg, "-"), "-"));
    std::string name = arg, value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq), value = arg.substr(eq + 1), has_value = true;
    }
    std::replace(name.begin(), name.end(), '_', '-');
    auto it = known.find(name);
    if (it == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    const Flag& flag = *it->second;
    if (!flag.value_name.empty() && !has_value && flag.value_name != "BOOL") {
      if (i + 1 >= argc) return Bad(name, absl::StrCat("needs a value (", flag.value_name, ")"));
      value = argv[++i];
    }
    absl::Status status;
    if (name == "protocol") {
      const std::string lower = absl::AsciiStrToLower(value);
      if (lower == "grpc") {
        o.protocol = Protocol::kGrpc;
      } else if (lower == "openai" || lower == "http") {
        o.protocol = Protocol::kOpenAi;
      } else {
        status = Bad(name, absl::StrCat("'", value, "' is not grpc or openai"));
      }
    } else if (name == "target") {
      o.target = value;
      have_target = true;
      if (value.empty()) status = Bad(name, "is empty");
    } else if (name == "api") {
      const std::string lower = absl::AsciiStrToLower(value);
      have_api = true;
      if (lower == "completions") {
        o.api = OpenAiApi::kCompletions;
      } else if (lower == "chat") {
        o.api = OpenAiApi::kChat;
      } else {
        status = Bad(name, absl::StrCat("'", value, "' is not completions or chat"));
      }
    } else if (name == "api-key") {
      o.api_key = value;
      if (value.empty()) status = Bad(name, "is empty");
    } else if (name == "model") {
      o.model = value;
      if (value.empty()) status = Bad(name, "is empty");
    } else if (name == "tls") {
      status = ParseBool(name, value, &o.tls);
    } else if (name == "tls-ca") {
      o.tls_ca = value;
    } else if (name == "connections") {
      status = ParseInt(name, value, 1, &o.connections);
      have_connections = true;
    } else if (name == "connect-timeout" || name == "request-timeout" || name == "duration" ||
               name == "warmup" || name == "window") {
      absl::StatusOr<absl::Duration> duration = ParseDurationFlag(value, name);
      if (!duration.ok()) return duration.status();
      if (name == "connect-timeout") o.connect_timeout = *duration;
      if (name == "request-timeout") o.request_timeout = *duration;
      if (name == "warmup") o.warmup = *duration;
      if (name == "window") o.window = *duration;
      if (name == "duration") o.duration = *duration, have_duration = true;
      if ((name == "duration" || name == "request-timeout" || name == "window") &&
          *duration <= absl::ZeroDuration()) {
        status = Bad(name, "must be positive");
      }
    } else if (name == "threads") {
      status = ParseInt(name, value, 1, &o.threads);
    } else if (name == "concurrency") {
      status = ParseInt(name, value, 1, &o.concurrency);
    } else if (name == "rate" || name == "rates") {
      o.rates.clear();
      for (absl::string_view piece : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
        double rate = 0;
        status = ParsePositive(name, std::string(absl::StripAsciiWhitespace(piece)), &rate);
        if (!status.ok()) break;
        o.rates.push_back(rate);
      }
      if (status.ok() && o.rates.empty()) status = Bad(name, "needs a rate");
      if (status.ok() && name == "rate" && o.rates.size() != 1) {
        status = Bad(name, "takes one rate (--rates takes a list)");
      }
    } else if (name == "max-concurrency") {
      status = ParseInt(name, value, 0, &o.max_concurrency);
    } else if (name == "requests") {
      status = ParseInt<int64_t>(name, value, 1, &o.requests);
    } else if (name == "input-tokens" || name == "output-tokens") {
      int64_t tokens = 0;
      status = ParseInt<int64_t>(name, value, 1, &tokens);
      (name == "input-tokens" ? input : output).mean = tokens;
    } else if (name == "input-tokens-stddev" || name == "output-tokens-stddev") {
      double sd = 0;
      if (!absl::SimpleAtod(value, &sd) || sd < 0 || !std::isfinite(sd)) {
        status = Bad(name, absl::StrCat("'", value, "' is not a non-negative number"));
      }
      (name == "input-tokens-stddev" ? input : output).stddev = sd;
    } else if (name == "input-tokens-dist" || name == "output-tokens-dist") {
      (name == "input-tokens-dist" ? input : output).dist = value;
    } else if (name == "prompt-kind") {
      prompt_kind = value;
      if (value == "ids") {
        o.workload.prompt_kind = PromptKind::kIds;
      } else if (value == "text") {
        o.workload.prompt_kind = PromptKind::kText;
      } else {
        status = Bad(name, absl::StrCat("'", value, "' is not ids or text"));
      }
    } else if (name == "vocab-size") {
      status = ParseInt(name, value, 1, &o.workload.vocab_size);
    } else if (name == "prompts-file") {
      o.workload.prompts_file = value;
    } else if (name == "ignore-eos") {
      status = ParseBool(name, value, &o.ignore_eos);
    } else if (name == "temperature") {
      if (!absl::SimpleAtof(value, &o.temperature) || o.temperature < 0) {
        status = Bad(name, absl::StrCat("'", value, "' is not a non-negative number"));
      }
    } else if (name == "cancel-fraction") {
      status = ParseFraction(name, value, &o.cancel_fraction);
    } else if (name == "disconnect-fraction") {
      status = ParseFraction(name, value, &o.disconnect_fraction);
    } else if (name == "seed") {
      status = ParseInt<uint64_t>(name, value, 0, &o.seed);
    } else if (name == "goodput") {
      absl::StatusOr<GoodputLimits> limits = ParseGoodput(value);
      if (!limits.ok()) return limits.status();
      o.goodput = *limits;
    } else if (name == "progress") {
      status = ParseBool(name, value, &o.progress);
    } else if (name == "json") {
      o.json_path = value;
    } else if (name == "csv") {
      o.csv_path = value;
    } else if (name == "svg") {
      o.svg_path = value;
    } else if (name == "title") {
      o.title = value;
    } else if (name == "help") {
      o.help = true;
    }
    if (!status.ok()) return status;
  }
  if (o.help) return o;

  if (o.protocol == Protocol::kOpenAi) {
    if (!have_target) o.target = kDefaultOpenAiTarget;
    if (absl::StatusOr<HttpUrl> url = ParseHttpUrl(o.target); !url.ok()) {
      return Bad("target", std::string(url.status().message()));
    }
    if (o.tls || !o.tls_ca.empty()) {
      return Bad(o.tls ? "tls" : "tls-ca",
                 "applies to --protocol grpc: no TLS for HTTP in this version");
    }
    if (have_connections) {
      return Bad("connections",
                 "applies to --protocol grpc (openai keeps a connection per request in flight)");
    }
  } else {
    if (have_api) return Bad("api", "applies to --protocol openai");
    if (!o.api_key.empty()) return Bad("api-key", "applies to --protocol openai");
    if (absl::StartsWithIgnoreCase(o.target, "http://") ||
        absl::StartsWithIgnoreCase(o.target, "https://")) {
      return Bad("target", absl::StrCat("'", o.target,
                                        "' is a URL: for an HTTP server, add --protocol openai"));
    }
  }

  if (o.cancel_fraction + o.disconnect_fraction > 1) {
    return absl::InvalidArgumentError(
        "--cancel-fraction and --disconnect-fraction sum to more than 1");
  }
  if (o.disconnect_fraction > 0 && o.protocol == Protocol::kGrpc && (o.tls || !o.tls_ca.empty())) {
    return Bad("disconnect-fraction",
               "drops plain TCP connections of its own: not with --tls or --tls-ca");
  }

  if (o.concurrency > 0 && !o.rates.empty()) {
    return absl::InvalidArgumentError(
        "give --concurrency (closed loop) or --rate/--rates, not both");
  }
  if (o.max_concurrency > 0 && o.rates.empty()) {
    return Bad("max-concurrency", "applies to the open loop (--rate/--rates)");
  }
  if (o.concurrency == 0 && o.rates.empty()) o.concurrency = 1;
  if (!have_duration && o.requests == 0) o.requests = 100;
  if (prompt_kind && !o.workload.prompts_file.empty()) {
    return Bad("prompt-kind", "applies to synthetic prompts, not to --prompts-file");
  }
  absl::StatusOr<LengthDistribution> in = BuildLength("input", input, 128);
  if (!in.ok()) return in.status();
  absl::StatusOr<LengthDistribution> out = BuildLength("output", output, 128);
  if (!out.ok()) return out.status();
  o.workload.input = *in;
  o.workload.output = *out;
  o.workload.seed = o.seed;
  return o;
}

}  // namespace kiln::loadgen
