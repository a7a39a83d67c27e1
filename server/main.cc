// kiln-server: parses flags and the optional config file into ServerOptions, starts the server,
// prints the ready line and serves until SIGINT or SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "base/logging.h"
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
ABSL_FLAG(int32_t, max_queued, 64, "per model: waiting requests beyond which Generate is refused");
ABSL_FLAG(int32_t, max_running, 16, "per model: sequences decoded together in one step");
ABSL_FLAG(int64_t, max_context, 4096, "tokens of one sequence (prompt + output)");
ABSL_FLAG(int32_t, default_max_tokens, 256, "tokens generated when a request sets no max_tokens");

namespace kiln {
namespace {

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
  if (OnCommandLine(argc, argv, "max_context"))
    options.engine.max_context = absl::GetFlag(FLAGS_max_context);
  if (OnCommandLine(argc, argv, "default_max_tokens")) {
    options.default_max_tokens = absl::GetFlag(FLAGS_default_max_tokens);
  }
  // Repeatable flags add to the config's lists (a --model replaces a config model of its name).
  options.model_roots.insert(options.model_roots.end(), all_roots.begin(), all_roots.end());
  for (const std::string& text : model_flags) {
    absl::StatusOr<ModelSpec> spec = ParseModelFlag(text);
    if (!spec.ok()) return spec.status();
    AddOrReplaceModel(*std::move(spec), &options.models);
  }
  return options;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kiln-server --listen HOST:PORT --model-root DIR [--model NAME=PATH ...] [--config FILE]");
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
  // SIGINT/SIGTERM are blocked in every thread (the server's threads inherit the mask) and
  // taken synchronously below, so shutdown runs on an ordinary thread. A shell starts background
  // jobs with SIGINT ignored, and an ignored signal is discarded rather than left pending for
  // sigwait: restore the default disposition first.
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<RunningServer>> server = StartServer(*std::move(options));
  if (!server.ok()) {
    std::cerr << "kiln-server: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << (*server)->ReadyLine() << std::endl;  // endl flushes: scripts wait for this line

  int signal_number = 0;
  sigwait(&signals, &signal_number);
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
