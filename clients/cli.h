// Shared pieces of the `kiln` command-line tool: the command table, exit codes, argument helpers
// and the handlers of each subcommand (cli_local.cc, cli_grpc.cc, cli_models.cc).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cli {

// Exit codes of `kiln`.
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,        // the server (or the local operation) returned an error
  kExitUsage = 2,        // bad command line
  kExitUnreachable = 3,  // UNAVAILABLE or DEADLINE_EXCEEDED: no answer from the server
  kExitNotServing = 4,   // `kiln health`: the server answered, but not SERVING
};

// Positional arguments after the command word(s), e.g. {"tiny", "/models/tiny"} for
// `kiln models load tiny /models/tiny`.
using Args = std::vector<std::string>;

struct Command {
  const char* name;                // "generate", "models load", ...
  const char* synopsis;            // arguments, shown after the name
  const char* summary;             // one or more lines of description
  std::vector<const char*> flags;  // flag names as shown in help (dashes or underscores)
  int (*run)(const Args& args);
};

// All commands, in help order.
const std::vector<Command>& Commands();
const Command* FindCommand(absl::string_view name);

// Prints the overview of all commands (`kiln help`).
void PrintOverview(std::ostream& out);
// Prints `kiln <command> --help`: synopsis, description and the flags the command reads.
void PrintCommandHelp(const Command& command, std::ostream& out);

// Prints "kiln: <message>" and a pointer to the command's help; returns kExitUsage.
int UsageError(absl::string_view command, absl::string_view message);
// Prints "kiln: CODE: message" (the status code's name, as gRPC names it) and returns the exit
// code that fits the status.
int ReportError(const absl::Status& status);
// Fails with a usage error unless there are exactly `count` positional arguments.
absl::Status ExpectArgs(const Args& args, size_t count, absl::string_view what);

// Parses "1,2,3" (commas and/or spaces) into token ids; `flag` names the flag in errors.
absl::StatusOr<std::vector<int32_t>> ParseIds(absl::string_view text, absl::string_view flag);

// Every value a repeatable flag (e.g. --stop) was given on the command line, in order, each
// split on commas and C-unescaped ("\n" is a newline). Filled by NormalizeArgs.
const std::vector<std::string>& RepeatedValues(absl::string_view flag);

// Rewrites argv before absl parses it: --flag-name becomes --flag_name where that names a
// flag, and repeated flags are collected for RepeatedValues. `positional` receives the
// non-flag arguments (without argv[0]); `help` is set when --help, -h or -help appears.
std::vector<std::string> NormalizeArgs(int argc, char** argv, std::vector<std::string>* positional,
                                       bool* help);

// Command handlers.
int Synth(const Args& args);
int Run(const Args& args);
int Perplexity(const Args& args);
int Generate(const Args& args);
int Tokenize(const Args& args);
int Health(const Args& args);
int ModelsList(const Args& args);
int ModelsLoad(const Args& args);
int ModelsUnload(const Args& args);
int ModelsGet(const Args& args);
int ModelsTensorize(const Args& args);
int TensorizeLocal(const Args& args);

}  // namespace kiln::cli
