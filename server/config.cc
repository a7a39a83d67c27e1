#include "server/config.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "kernels/quantization.h"
#include "models/kv_pool.h"
#include "server/model_info.h"

namespace kiln {
namespace {

// Collects text-format parse errors with their position.
class ErrorCollector final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!errors_.empty()) errors_ += "; ";
    absl::StrAppend(&errors_, line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

std::string Rebase(const std::string& base_dir, const std::string& path) {
  if (base_dir.empty() || path.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(base_dir) / path).string();
}

}  // namespace

absl::StatusOr<v1::ServerConfig> ParseServerConfig(absl::string_view text,
                                                   absl::string_view file_name) {
  v1::ServerConfig config;
  ErrorCollector errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ":", errors.errors()));
  }
  return config;
}

absl::StatusOr<v1::ServerConfig> ReadServerConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, " cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseServerConfig(text, path);
}

absl::Status ApplyServerConfig(const v1::ServerConfig& config, const std::string& base_dir,
                               ServerOptions* options) {
  if (!config.listen().empty()) options->listen = config.listen();
  for (const std::string& root : config.model_roots()) {
    options->model_roots.push_back(Rebase(base_dir, root));
  }
  for (const v1::ModelConfigEntry& model : config.models()) {
    if (model.name().empty() || model.path().empty()) {
      return absl::InvalidArgumentError("models: every entry needs a name and a path");
    }
    ModelSpec spec = ModelSpecFromProto(model);
    // Key and passphrase files, like other files a config names, are relative to the config.
    TensorizerSpec& tz = spec.tensorizer;
    if (!tz.encryption_key_file.empty()) {
      tz.encryption_key_file = Rebase(base_dir, tz.encryption_key_file);
    }
    if (!tz.encryption_passphrase_file.empty()) {
      tz.encryption_passphrase_file = Rebase(base_dir, tz.encryption_passphrase_file);
    }
    if (!spec.chat_template_file.empty()) {
      spec.chat_template_file = Rebase(base_dir, spec.chat_template_file);
    }
    AddOrReplaceModel(std::move(spec), &options->models);
  }
  if (config.max_queued_requests() < 0 || config.max_running_sequences() < 0 ||
      config.max_context() < 0 || config.default_max_tokens() < 0) {
    return absl::InvalidArgumentError(
        "max_queued_requests, max_running_sequences, max_context and default_max_tokens must "
        "not be negative");
  }
  if (config.max_queued_requests() > 0) options->engine.max_queued = config.max_queued_requests();
  if (config.has_default_num_draft_tokens()) {
    if (config.default_num_draft_tokens() != kDraftSourceDefault &&
        (config.default_num_draft_tokens() < 0 ||
         config.default_num_draft_tokens() > kMaxDraftTokens)) {
      return absl::InvalidArgumentError(absl::StrCat("default_num_draft_tokens must be in [0, ",
                                                     kMaxDraftTokens, "], or -1 for the default"));
    }
    options->engine.default_num_draft_tokens = config.default_num_draft_tokens();
  }
  if (config.max_running_sequences() > 0) {
    options->engine.max_running = config.max_running_sequences();
  }
  if (config.max_context() > 0) options->engine.max_context = config.max_context();
  if (config.default_max_tokens() > 0) options->default_max_tokens = config.default_max_tokens();
  if (!config.admin_token_file().empty()) {
    options->admin_token_file = Rebase(base_dir, config.admin_token_file());
  }
  if (!config.tls_cert_file().empty())
    options->tls_cert_file = Rebase(base_dir, config.tls_cert_file());
  if (!config.metrics_listen().empty()) options->metrics_listen = config.metrics_listen();
  if (!config.http_listen().empty()) options->http_listen = config.http_listen();
  if (!config.api_key_file().empty()) {
    options->api_key_file = Rebase(base_dir, config.api_key_file());
  }
  if (!config.default_backend().empty()) options->default_backend = config.default_backend();
  if (config.kv_cache_bytes() > 0) options->kv_pool.bytes = config.kv_cache_bytes();
  if (config.kv_block_size() < 0) {
    return absl::InvalidArgumentError("kv_block_size must not be negative");
  }
  if (config.kv_block_size() > 0) options->kv_pool.block_size = config.kv_block_size();
  if (!config.kv_cache_dtype().empty()) {
    KILN_ASSIGN_OR_RETURN(options->kv_pool.dtype, ParseKvCacheDType(config.kv_cache_dtype()));
  }
  if (!config.tls_key_file().empty())
    options->tls_key_file = Rebase(base_dir, config.tls_key_file());
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> ParseModelFlag(absl::string_view text) {
  const size_t eq = text.find('=');
  if (eq == absl::string_view::npos || eq == 0 || eq + 1 == text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", text, "' is not NAME=PATH (e.g. --model default=models/tiny)"));
  }
  ModelSpec spec;
  spec.name = std::string(text.substr(0, eq));
  spec.path = std::string(text.substr(eq + 1));
  return spec;
}

std::vector<std::string> CollectRepeatedFlag(int argc, char** argv, absl::string_view name,
                                             bool split_commas) {
  std::vector<std::string> raw;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (!absl::ConsumePrefix(&arg, name)) continue;
    if (arg.empty()) {
      if (i + 1 < argc) raw.emplace_back(argv[++i]);
    } else if (absl::ConsumePrefix(&arg, "=")) {
      raw.emplace_back(arg);
    }
  }
  if (!split_commas) return raw;
  std::vector<std::string> values;
  for (const std::string& value : raw) {
    for (absl::string_view piece : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      values.emplace_back(piece);
    }
  }
  return values;
}

void AddOrReplaceModel(ModelSpec spec, std::vector<ModelSpec>* models) {
  for (ModelSpec& existing : *models) {
    if (existing.name == spec.name) {
      existing = std::move(spec);
      return;
    }
  }
  models->push_back(std::move(spec));
}

namespace {

// A per-model flag's value: "NAME=VALUE" for the startup model NAME, else VALUE for every startup
// model; `set` stores a value into a spec.
template <typename Set>
absl::Status ApplyToStartupModels(absl::string_view flag, absl::string_view text,
                                  std::vector<ModelSpec>* models, Set&& set) {
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": empty value"));
  const size_t eq = text.find('=');
  if (eq != absl::string_view::npos) {
    const absl::string_view name = text.substr(0, eq);
    for (ModelSpec& model : *models) {
      if (model.name == name) return set(model, text.substr(eq + 1));
    }
  }
  if (models->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " ", text, ": no startup model to apply it to (give --model first)"));
  }
  for (ModelSpec& model : *models) KILN_RETURN_IF_ERROR(set(model, text));
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyChatTemplateFlag(absl::string_view text, std::vector<ModelSpec>* models) {
  return ApplyToStartupModels("chat-template", text, models,
                              [](ModelSpec& model, absl::string_view file) {
                                model.chat_template_file = std::string(file);
                                return absl::OkStatus();
                              });
}

absl::Status ApplyQuantizeFlag(absl::string_view text, std::vector<ModelSpec>* models) {
  return ApplyToStartupModels(
      "quantize", text, models, [](ModelSpec& model, absl::string_view mode) {
        KILN_RETURN_IF_ERROR(KilnAnnotate(ParseQuantization(mode).status(), "--quantize"));
        model.quantize = std::string(mode);
        return absl::OkStatus();
      });
}

}  // namespace kiln
