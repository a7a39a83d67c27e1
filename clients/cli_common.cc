#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "clients/cli.h"

namespace kiln::cli {
namespace {

// Flags every gRPC command reads.
#define KILN_CONNECTION_FLAGS "server", "timeout", "tls-ca", "tls"
#define KILN_ADMIN_FLAGS KILN_CONNECTION_FLAGS, "admin-token", "admin-token-file"

// Flags whose every occurrence counts (RepeatedValues), not just the last.
constexpr const char* kRepeatableFlags[] = {"stop"};

std::map<std::string, std::vector<std::string>, std::less<>>& Repeated() {
  static auto* values = new std::map<std::string, std::vector<std::string>, std::less<>>;
  return *values;
}

bool IsRepeatable(absl::string_view name) {
  for (const char* flag : kRepeatableFlags) {
    if (name == flag) return true;
  }
  return false;
}

void RecordRepeated(absl::string_view name, absl::string_view value) {
  for (absl::string_view piece : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    std::string unescaped;
    if (!absl::CUnescape(piece, &unescaped)) unescaped = std::string(piece);
    Repeated()[std::string(name)].push_back(std::move(unescaped));
  }
}

std::string FlagKey(absl::string_view shown) { return absl::StrReplaceAll(shown, {{"-", "_"}}); }

}  // namespace

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"generate",
       "--model NAME (--prompt TEXT | --prompt_ids 1,2,3) [flags]",
       "Generate from a loaded model. The text streams to stdout as it arrives; the finish\n"
       "reason, token counts, time to first token and tokens/s go to stderr at the end.",
       {"model",
        "prompt",
        "prompt_ids",
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "add_special_tokens",
        "draft_tokens",
        "ids",
        KILN_CONNECTION_FLAGS},
       &Generate},
      {"tokenize",
       "--model NAME --text TEXT",
       "Tokenize text with a loaded model's tokenizer; prints the ids (usable as --prompt_ids)\n"
       "and the tokens.",
       {"model", "text", "add_special_tokens", "json", KILN_CONNECTION_FLAGS},
       &Tokenize},
      {"models list",
       "",
       "List the models the server holds.",
       {"json", KILN_ADMIN_FLAGS},
       &ModelsList},
      {"models load",
       "NAME PATH [--dtype bf16|f32] [--quantize int8|int4] [--kv_cache_dtype auto|f32|bf16]\n"
       "    [--backend cpu] [--format F] [tensorizer flags]",
       "Load PATH (a model directory or a Tensorizer .tensors file inside one of the server's\n"
       "model roots) as NAME. Key and passphrase files are read by the server, on its machine.",
       {"dtype", "quantize", "kv_cache_dtype", "backend", "format", "chat_template",
        "tensorizer_config", "encryption_key_file", "encryption_passphrase_file",
        "skip_hash_verification", "hash_check", "json", KILN_ADMIN_FLAGS},
       &ModelsLoad},
      {"models tensorize",
       "NAME OUT [--dtype bf16|f32] [--prepack] [--overwrite]",
       "Write loaded model NAME as a native tensorized file OUT (a path inside one of the\n"
       "server's model roots): kiln's engine layout with the config and tokenizer inside.\n"
       "--prepack stores the linears as the server packed (and quantized) them, so that a load\n"
       "packs nothing.",
       {"dtype", "prepack", "overwrite", KILN_ADMIN_FLAGS},
       &ModelsTensorize},
      {"models unload", "NAME", "Unload a model.", {KILN_ADMIN_FLAGS}, &ModelsUnload},
      {"models get",
       "NAME",
       "Show a model: state, backend, architecture, dtype, parameters, memory, loader, load\n"
       "timings and the load report.",
       {"json", "verbose", KILN_ADMIN_FLAGS},
       &ModelsGet},
      {"health",
       "[--service NAME]",
       "Ask the server's grpc.health.v1 service. Prints the status; exits 0 only if SERVING\n"
       "(4 if the server answers otherwise, 3 if it cannot be reached).",
       {"service", "wait", KILN_CONNECTION_FLAGS},
       &Health},
      {"synth",
       "--out DIR [--preset kiln-tiny] [--dtype bf16] [--seed 0]",
       "Write a deterministic random-weight checkpoint of a real model's shape (no server).",
       {"out", "preset", "dtype", "seed", "max_shard_bytes", "mtp_layers"},
       &Synth},
      {"run",
       "--model PATH [--prompt_ids 1,2,3] [--max_tokens 16] [--dtype bf16|f32]\n"
       "    [--quantize int8|int4] [--backend cpu]",
       "Load a model (directory or .tensors file) in this process and generate greedily from\n"
       "token ids (no server).",
       {"model", "prompt_ids", "max_tokens", "dtype", "quantize", "backend", "tensorizer_config",
        "encryption_key_file", "encryption_passphrase_file", "skip_hash_verification",
        "hash_check"},
       &Run},
      {"perplexity",
       "--model PATH --text_file FILE [--context 512] [--max_windows N] [--dtype bf16|f32]\n"
       "    [--quantize int8|int4]",
       "Load a model in this process and print its perplexity on a text file, from kiln's own\n"
       "logits: the documents (separated by blank lines, each followed by EOS) are one token\n"
       "stream, cut into windows of --context positions that each start from an empty cache.\n"
       "Models with MTP heads also get the first head's perplexity on the token after next.",
       {"model", "text_file", "context", "max_windows", "dtype", "quantize", "backend", "json",
        "tensorizer_config", "encryption_key_file", "encryption_passphrase_file",
        "skip_hash_verification", "hash_check"},
       &Perplexity},
      {"tensorize",
       "--model PATH --out FILE [--dtype bf16|f32] [--prepack [--quantize int8|int4]]\n"
       "    [tensorizer flags]",
       "Convert a checkpoint (safetensors directory or Tensorizer file) into a native tensorized\n"
       "file: kiln's engine layout (fused q/k/v and gate/up, MTP heads kept) with the config and\n"
       "tokenizer inside, so the file alone loads. Readable by the Tensorizer library too.\n"
       "--prepack also stores the linears packed (and quantized) for the CPU kernels, so that\n"
       "loading the file packs nothing.",
       {"model", "out", "dtype", "prepack", "quantize", "overwrite", "tensorizer_config",
        "encryption_key_file", "encryption_passphrase_file", "skip_hash_verification",
        "hash_check"},
       &TensorizeLocal},
  };
  return *commands;
}

const Command* FindCommand(absl::string_view name) {
  for (const Command& command : Commands()) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

void PrintOverview(std::ostream& out) {
  out << "kiln: the command-line tool of the kiln inference server.\n\n"
         "usage: kiln COMMAND [ARGS] [FLAGS]\n\n";
  for (const Command& command : Commands()) {
    out << "  kiln " << command.name;
    if (*command.synopsis != '\0') out << " " << command.synopsis;
    out << "\n";
    const std::vector<absl::string_view> lines = absl::StrSplit(command.summary, '\n');
    out << "      " << lines.front() << (lines.size() > 1 ? " ..." : "") << "\n";
  }
  out << "\n'kiln help COMMAND' or 'kiln COMMAND --help' shows a command's flags. Flag names take\n"
         "- or _ alike (--admin-token = --admin_token). Exit codes: 0 ok, 1 error, 2 bad usage,\n"
         "3 server unreachable, 4 not serving.\n";
}

void PrintCommandHelp(const Command& command, std::ostream& out) {
  out << "usage: kiln " << command.name;
  if (*command.synopsis != '\0') out << " " << command.synopsis;
  out << "\n\n" << command.summary << "\n";
  if (command.flags.empty()) return;
  out << "\nflags:\n";
  for (const char* shown : command.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(FlagKey(shown));
    if (flag == nullptr) continue;
    out << "  --" << shown;
    const std::string default_value = flag->DefaultValue();
    if (!flag->IsOfType<bool>() && !default_value.empty()) {
      out << " (default " << default_value << ")";
    }
    out << "\n      " << flag->Help() << "\n";
  }
}

int UsageError(absl::string_view command, absl::string_view message) {
  std::cerr << "kiln: " << message << "\n";
  if (command.empty()) {
    std::cerr << "(see 'kiln help')\n";
  } else {
    std::cerr << "(see 'kiln " << command << " --help')\n";
  }
  return kExitUsage;
}

int ReportError(const absl::Status& status) {
  std::cerr << "kiln: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    default:
      return kExitError;
  }
}

absl::Status ExpectArgs(const Args& args, size_t count, absl::string_view what) {
  if (args.size() == count) return absl::OkStatus();
  if (args.size() < count) return absl::InvalidArgumentError(absl::StrCat("missing ", what));
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected argument \"", args[count], "\" (expected ", what, ")"));
}

absl::StatusOr<std::vector<int32_t>> ParseIds(absl::string_view text, absl::string_view flag) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id) || id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", piece, "\" is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

const std::vector<std::string>& RepeatedValues(absl::string_view flag) {
  static const auto* empty = new std::vector<std::string>;
  auto it = Repeated().find(flag);
  return it == Repeated().end() ? *empty : it->second;
}

std::vector<std::string> NormalizeArgs(int argc, char** argv, std::vector<std::string>* positional,
                                       bool* help) {
  std::vector<std::string> out = {argv[0]};
  std::string value_of;  // a flag whose value is the next argument
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!value_of.empty()) {
      if (IsRepeatable(value_of)) RecordRepeated(value_of, arg);
      value_of.clear();
      out.push_back(arg);
      continue;
    }
    if (arg == "--") {
      for (int j = i + 1; j < argc; ++j) positional->push_back(argv[j]);
      out.insert(out.end(), argv + i, argv + argc);
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      positional->push_back(arg);
      out.push_back(arg);
      continue;
    }
    absl::string_view body = arg;
    body.remove_prefix(absl::StartsWith(body, "--") ? 2 : 1);
    const size_t equals = body.find('=');
    const absl::string_view name = body.substr(0, equals);
    if (name == "help" || name == "h") {
      *help = true;
      continue;
    }
    std::string key = FlagKey(name);
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(key);
    if (flag == nullptr && absl::StartsWith(key, "no")) {
      const absl::CommandLineFlag* negated = absl::FindCommandLineFlag(key.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        out.push_back(absl::StrCat("--", key, body.substr(name.size())));
        continue;
      }
    }
    if (flag == nullptr) {  // absl reports it
      out.push_back(arg);
      continue;
    }
    out.push_back(absl::StrCat("--", key, body.substr(name.size())));
    if (equals == absl::string_view::npos) {
      if (!flag->IsOfType<bool>()) value_of = key;
    } else if (IsRepeatable(key)) {
      RecordRepeated(key, body.substr(equals + 1));
    }
  }
  return out;
}

}  // namespace kiln::cli
