// `kiln`: the command-line tool of the kiln inference server. `kiln help` lists the commands:
// generate, tokenize, models {list,load,unload,get}, health (over gRPC; cli_grpc.cc,
// cli_models.cc) and synth, run (in this process; cli_local.cc).
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "clients/cli.h"

namespace kiln::cli {
namespace {

// `kiln help [COMMAND...]`, also `kiln COMMAND --help`. `words` name the command.
int Help(const std::vector<std::string>& words, bool asked) {
  std::ostream& out = asked ? std::cout : std::cerr;
  if (words.empty()) {
    PrintOverview(out);
    return asked ? kExitOk : kExitUsage;
  }
  std::string name = words[0];
  if (name == "models" && words.size() > 1) name += " " + words[1];
  if (const Command* command = FindCommand(name)) {
    PrintCommandHelp(*command, out);
    return kExitOk;
  }
  bool any = false;  // "models": every models subcommand
  for (const Command& command : Commands()) {
    if (absl::string_view(command.name).substr(0, name.size() + 1) == name + " ") {
      if (any) out << "\n";
      PrintCommandHelp(command, out);
      any = true;
    }
  }
  if (any) return kExitOk;
  return UsageError("", absl::StrCat("unknown command \"", name, "\""));
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the command-line tool of the kiln inference server; see 'kiln help'");
  std::vector<std::string> words;
  bool help = false;
  std::vector<std::string> args = NormalizeArgs(argc, argv, &words, &help);
  std::vector<char*> arg_pointers;
  for (std::string& arg : args) arg_pointers.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  if (words.empty()) return Help(words, help);
  if (words[0] == "help") return Help({words.begin() + 1, words.end()}, true);
  if (help) return Help(words, true);
  size_t used = 1;
  std::string name = words[0];
  if (name == "models") {
    if (words.size() < 2) {
      Help(words, false);
      return kExitUsage;
    }
    name += " " + words[1];
    used = 2;
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) {
    return UsageError("", absl::StrCat("unknown command \"", name, "\""));
  }
  return command->run(Args(words.begin() + static_cast<ptrdiff_t>(used), words.end()));
}

}  // namespace
}  // namespace kiln::cli

int main(int argc, char** argv) { return kiln::cli::Main(argc, argv); }
