// kiln-server: parses flags and the optional config file into ServerOptions, starts the server,
// prints the ready line and serves until SIGINT or SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"
#include "models/kv_pool.h"
#include "server/config.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "HOST:PORT to serve gRPC on (port 0: any)");
ABSL_FLAG(std::vector<std::string>, model_root, {},
          "directory that model paths must resolve into; repeatable and comma-separated. "
          "Without one, LoadModel is refused");
ABSL_FLAG(std::vector<std::string>, model, {}, "NAME=PATH of a model to load at start; repeatable");
ABSL_FLAG(std::string, config, "", "protobuf text-format kiln.v1.ServerConfig; flags override it");
ABSL_FLAG(std::string, admin_token_file, "",
          "file holding the token the Models service requires ('authorization: Bearer <token>')");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain (with --tls-key: serve TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key (with --tls-cert: serve TLS)");
ABSL_FLAG(int32_t, max_queued, 1024,
          "per model: waiting requests beyond which Generate is refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(int32_t, max_running, 64,
          "per model: sequences decoded together in one step, at most (within it, requests are "
          "admitted while the KV pool has blocks for them)");
ABSL_FLAG(int32_t, num_draft_tokens, -1,
          "speculative decoding on models with MTP heads: draft tokens per step for requests that "
          "do not set speculative.num_draft_tokens (-1 = the MTP draft source's measured choice: "
          "2 for greedy requests, 1 up to temperature 0.3, none above, and only in steps that "
          "run at most --default-drafts-max-running sequences; 0 = off; at most 16)");
ABSL_FLAG(int32_t, default_drafts_max_running, 1,
          "with --num-draft-tokens -1: requests on the default draft only in steps that run at "
          "most this many sequences (on a 2-core CPU speculation paid only at one)");
ABSL_FLAG(int64_t, max_context, 4096, "tokens of one sequence (prompt + output)");
ABSL_FLAG(uint64_t, kv_cache_bytes, 0,
          "per model: bytes of its paged KV pool, allocated at load (a LoadModel or config "
          "model's kv_cache_bytes overrides it); 0: room for max_running sequences of max_context "
          "tokens, at most a quarter of the backend's free memory");
ABSL_FLAG(int32_t, kv_block_size, 16,
          "positions per KV block (prefix caching shares whole blocks)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "per model: what its KV pool stores keys and values as: auto (the model's compute "
          "dtype), f32, or bf16 (half the memory, so twice the positions for a budget, and half "
          "the bytes each attention reads); a LoadModel or config model's kv_cache_dtype "
          "overrides it");
ABSL_FLAG(int32_t, max_threads, 2048,
          "gRPC threads, which bound the concurrent streams (requests beyond max_running wait in "
          "each model's queue)");
ABSL_FLAG(int32_t, default_max_tokens, 256, "tokens generated when a request sets no max_tokens");
ABSL_FLAG(std::string, backend, "cpu",
          "compute backend of models that name none (LoadModel's backend field, a config "
          "model's backend); one this build or machine cannot run stops the server with the list "
          "of those it can");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on (HTTP GET /metrics; port 0: any); "
          "empty: no metrics endpoint");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT to serve the OpenAI-compatible HTTP API on (/v1/chat/completions, "
          "/v1/completions, /v1/models, /health, /version, /tokenize, /detokenize, /metrics; "
          "port 0: any); empty: no HTTP API");
ABSL_FLAG(std::string, api_key, "",
          "HTTP API: the bearer token /v1/* requires ('Authorization: Bearer <key>'); also "
          "read from the KILN_API_KEY environment variable; empty: open");
ABSL_FLAG(std::string, api_key_file, "", "HTTP API: a file holding the API key (overrides it)");
ABSL_FLAG(std::vector<std::string>, chat_template, {},
          "FILE or NAME=FILE: a Jinja2 chat template replacing the checkpoint's default, for "
          "every startup model or for model NAME; repeatable");
ABSL_FLAG(std::vector<std::string>, quantize, {},
          "MODE or NAME=MODE (none, int8 per output channel, int4 in groups of 32): weight "
          "quantization of every startup model or of model NAME; repeatable");
ABSL_FLAG(int32_t, max_stop_strings, 16, "stop strings one request may set, at most");
ABSL_FLAG(int32_t, max_stop_string_bytes, 512, "bytes of one stop string, at most");
ABSL_FLAG(int32_t, max_choices, 16,
          "HTTP API: choices one request may ask for (n, times the prompts of a completion), at "
          "most; up to 128");
ABSL_FLAG(int32_t, max_logprobs, 20,
          "top log-probabilities per token a request may ask for (logprobs, top_logprobs), at "
          "most; up to 20");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{8} << 20,
          "bytes of one request, at most: an HTTP body (larger: 413) and a gRPC message (larger: "
          "RESOURCE_EXHAUSTED)");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(30),
          "HTTP API: a request's body must arrive within this of its header (else 408 and the "
          "connection closes), so that a slow client cannot hold a connection");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(3),
          "after SIGTERM or SIGINT, running requests may finish for this long; streams still "
          "running then end with UNAVAILABLE (gRPC) or an error event (HTTP) saying why");
ABSL_FLAG(absl::Duration, token_delay_for_testing, absl::ZeroDuration(),
          "for tests and benchmarks only: delay every streamed token by this long (e.g. 20ms), "
          "so that a load generator measures a known inter-token latency");

namespace kiln {
namespace {

int g_signal_pipe[2] = {-1, -1};

std::atomic<int> g_signals_received{0};

// Async-signal-safe: a lock-free atomic, write(2) and _exit(2). A second signal ends the process
// at once, without waiting for the graceful shutdown.
void OnSignal(int signal_number) {
  if (g_signals_received.fetch_add(1) > 0) _exit(128 + signal_number);
  const char byte = static_cast<char>(signal_number);
  [[maybe_unused]] const ssize_t written = write(g_signal_pipe[1], &byte, 1);
}

// Whether argv sets flag `name` (abseil 20220623 keeps IsSpecifiedOnCommandLine private).
bool OnCommandLine(int argc, char** argv, absl::string_view name) {
  return !CollectRepeatedFlag(argc, argv, name, /*split_commas=*/false).empty();
}

// "--model-root=x" → "--model_root=x" for every flag kiln-server defines (absl flag names are
// identifiers; the documented spelling uses dashes). Values are left alone.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;
    const size_t name_start = arg.find_first_not_of('-');
    if (name_start == 0 || name_start == std::string::npos || name_start > 2) continue;
    const size_t name_end = std::min(arg.find('='), arg.size());
    std::string name = arg.substr(name_start, name_end - name_start);
    std::replace(name.begin(), name.end(), '-', '_');
    if (absl::FindCommandLineFlag(name) != nullptr)
      arg.replace(name_start, name_end - name_start, name);
  }
  return args;
}

absl::StatusOr<ServerOptions> BuildOptions(int argc, char** argv) {
  // absl keeps only the last occurrence of a flag; the repeatable ones are collected here.
  const std::vector<std::string> all_roots = CollectRepeatedFlag(argc, argv, "model_root", true);
  const std::vector<std::string> model_flags = CollectRepeatedFlag(argc, argv, "model", true);

  ServerOptions options;
  if (const std::string config_path = absl::GetFlag(FLAGS_config); !config_path.empty()) {
    absl::StatusOr<v1::ServerConfig> config = ReadServerConfig(config_path);
    if (!config.ok()) return config.status();
    const std::string base_dir = std::filesystem::path(config_path).parent_path().string();
    if (absl::Status status = ApplyServerConfig(*config, base_dir, &options); !status.ok()) {
      return status;
    }
  }
  if (OnCommandLine(argc, argv, "listen")) options.listen = absl::GetFlag(FLAGS_listen);
  if (OnCommandLine(argc, argv, "admin_token_file")) {
    options.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  }
  if (OnCommandLine(argc, argv, "tls_cert")) options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  if (OnCommandLine(argc, argv, "tls_key")) options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  if (OnCommandLine(argc, argv, "max_queued"))
    options.engine.max_queued = absl::GetFlag(FLAGS_max_queued);
  if (OnCommandLine(argc, argv, "max_running"))
    options.engine.max_running = absl::GetFlag(FLAGS_max_running);
  if (OnCommandLine(argc, argv, "num_draft_tokens")) {
    options.engine.default_num_draft_tokens = absl::GetFlag(FLAGS_num_draft_tokens);
  }
  if (OnCommandLine(argc, argv, "default_drafts_max_running")) {
    options.engine.default_drafts_max_running = absl::GetFlag(FLAGS_default_drafts_max_running);
  }
  if (OnCommandLine(argc, argv, "max_context"))
    options.engine.max_context = absl::GetFlag(FLAGS_max_context);
  if (OnCommandLine(argc, argv, "kv_cache_bytes"))
    options.kv_pool.bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  if (OnCommandLine(argc, argv, "kv_block_size"))
    options.kv_pool.block_size = absl::GetFlag(FLAGS_kv_block_size);
  if (OnCommandLine(argc, argv, "kv_cache_dtype")) {
    absl::StatusOr<std::optional<DType>> kv_dtype =
        ParseKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype));
    if (!kv_dtype.ok()) return KilnAnnotate(kv_dtype.status(), "--kv-cache-dtype");
    options.kv_pool.dtype = *kv_dtype;
  }
  if (OnCommandLine(argc, argv, "max_threads"))
    options.max_threads = absl::GetFlag(FLAGS_max_threads);
  if (OnCommandLine(argc, argv, "default_max_tokens")) {
    options.default_max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  }
  if (OnCommandLine(argc, argv, "metrics_listen")) {
    options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  }
  if (OnCommandLine(argc, argv, "backend")) options.default_backend = absl::GetFlag(FLAGS_backend);
  if (OnCommandLine(argc, argv, "http_listen")) {
    options.http_listen = absl::GetFlag(FLAGS_http_listen);
  }
  if (const char* key = std::getenv("KILN_API_KEY"); key != nullptr && *key != '\0') {
    options.api_key = key;
  }
  if (OnCommandLine(argc, argv, "api_key")) options.api_key = absl::GetFlag(FLAGS_api_key);
  if (OnCommandLine(argc, argv, "api_key_file")) {
    options.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  }
  options.token_delay_for_testing = absl::GetFlag(FLAGS_token_delay_for_testing);
  options.limits.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  options.limits.max_stop_string_bytes = absl::GetFlag(FLAGS_max_stop_string_bytes);
  options.limits.max_choices = absl::GetFlag(FLAGS_max_choices);
  options.limits.max_logprobs = absl::GetFlag(FLAGS_max_logprobs);
  options.limits.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  options.limits.http_read_timeout = absl::GetFlag(FLAGS_http_read_timeout);
  options.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  // Repeatable flags add to the config's lists (a --model replaces a config model of its name).
  options.model_roots.insert(options.model_roots.end(), all_roots.begin(), all_roots.end());
  for (const std::string& text : model_flags) {
    absl::StatusOr<ModelSpec> spec = ParseModelFlag(text);
    if (!spec.ok()) return spec.status();
    AddOrReplaceModel(*std::move(spec), &options.models);
  }
  for (const std::string& text : CollectRepeatedFlag(argc, argv, "chat_template", true)) {
    if (absl::Status status = ApplyChatTemplateFlag(text, &options.models); !status.ok()) {
      return status;
    }
  }
  for (const std::string& text : CollectRepeatedFlag(argc, argv, "quantize", true)) {
    if (absl::Status status = ApplyQuantizeFlag(text, &options.models); !status.ok()) {
      return status;
    }
  }
  return options;
}

int Main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "kiln-server --listen HOST:PORT --model-root DIR [--model NAME=PATH ...] [--config FILE]\n"
      "            [--http-listen HOST:PORT] [--metrics-listen HOST:PORT] [--backend cpu]\n"
      "Flags may be spelled with dashes or underscores (--model-root = --model_root).");
  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  const int arg_count = static_cast<int>(arg_pointers.size());
  arg_pointers.push_back(nullptr);
  absl::ParseCommandLine(arg_count, arg_pointers.data());
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  absl::StatusOr<ServerOptions> options = BuildOptions(arg_count, arg_pointers.data());
  if (!options.ok()) {
    std::cerr << "kiln-server: " << options.status().message() << "\n";
    return 2;
  }
  // SIGINT/SIGTERM: whichever thread takes the signal (gRPC, oneDNN and the engines start
  // their own) only writes its number into a pipe; this thread reads it and shuts the server
  // down. sigaction also replaces the SIG_IGN that a shell gives background jobs for SIGINT.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    std::cerr << "kiln-server: pipe2: " << std::strerror(errno) << "\n";
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  absl::StatusOr<std::unique_ptr<RunningServer>> server = StartServer(*std::move(options));
  if (!server.ok()) {
    std::cerr << "kiln-server: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << (*server)->ReadyLine() << std::endl;  // endl flushes: scripts wait for this line

  char signal_number = 0;
  while (read(g_signal_pipe[0], &signal_number, 1) != 1 && errno == EINTR) {
  }
  LOG(INFO) << "received " << (signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->Shutdown();
  (*server)->Wait();
  server->reset();
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  try {
    return kiln::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kiln-server: fatal: " << e.what() << "\n";
    return 1;
  }
}
