#include "server/model_builder.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/mtp_draft_source.h"
#include "kernels/backend_registry.h"
#include "models/kv_pool.h"
#include "models/lifecycle.h"

namespace kiln {
namespace {

// The spec's chat template (its text, or its file) replaces the checkpoint's default. It was
// asked for by name, so one that cannot be read or parsed fails the load.
absl::Status ApplyChatTemplateOverride(const ModelSpec& spec, ChatTemplateSet& templates) {
  std::string source = spec.chat_template;
  std::string origin = "LoadModel's chat_template";
  if (source.empty() && !spec.chat_template_file.empty()) {
    std::ifstream in(spec.chat_template_file, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("chat template file ", spec.chat_template_file, " cannot be read"));
    }
    source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    origin = spec.chat_template_file;
  }
  if (source.empty()) return absl::OkStatus();
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) return KilnAnnotate(parsed.status(), absl::StrCat("chat template ", origin));
  templates.templates.insert_or_assign("default", *std::move(parsed));
  std::erase_if(templates.errors,
                [](const std::string& error) { return error.rfind("template 'default'", 0) == 0; });
  LOG(INFO) << "model '" << spec.name << "': chat template from " << origin;
  return absl::OkStatus();
}

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": cannot read ", path));
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (secret.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is too large for a key"));
  }
  return secret;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBuilder>> ModelBuilder::Create(const ModelRoots* roots,
                                                                   EngineOptions engine,
                                                                   KvPoolOptions kv_pool,
                                                                   std::string default_backend) {
  if (default_backend.empty()) default_backend = std::string(kDefaultBackend);
  KILN_RETURN_IF_ERROR(KilnAnnotate(CheckBackendAvailable(default_backend), "default backend"));
  if (kv_pool.block_size < 1 || kv_pool.block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_block_size must be between 1 and 1024 positions, got ", kv_pool.block_size));
  }
  return std::unique_ptr<ModelBuilder>(
      new ModelBuilder(roots, std::move(engine), kv_pool, std::move(default_backend)));
}

absl::StatusOr<std::shared_ptr<Backend>> ModelBuilder::BackendFor(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  auto it = backends_.find(name);
  if (it != backends_.end()) return it->second;
  // Created under the lock: two loads naming a new backend at once make it once.
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> created, CreateBackend(name));
  LOG(INFO) << "backend " << name << ": " << created->description() << " on "
            << created->device().ToString();
  std::shared_ptr<Backend> backend(std::move(created));
  backends_.emplace(name, backend);
  return backend;
}

absl::StatusOr<TensorizerCheckpointOptions> ModelBuilder::TensorizerOptionsFor(
    const ModelSpec& spec) const {
  const TensorizerSpec& tz = spec.tensorizer;
  TensorizerCheckpointOptions options;
  KILN_ASSIGN_OR_RETURN(options.hash_check, TensorizerHashCheck(tz));
  if (!tz.config_path.empty()) {
    KILN_ASSIGN_OR_RETURN(options.config_path,
                          roots_.Resolve(tz.config_path, "tensorizer.config_path"));
  }
  options.encryption_key = tz.encryption_key;
  options.encryption_passphrase = tz.encryption_passphrase;
  if (!tz.encryption_key_file.empty()) {
    KILN_ASSIGN_OR_RETURN(options.encryption_key,
                          ReadSecretFile(tz.encryption_key_file, "tensorizer.encryption_key_file"));
    if (options.encryption_key.size() != 32) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensorizer.encryption_key_file: ", tz.encryption_key_file, " holds ",
                       options.encryption_key.size(), " bytes; a key file holds the 32 raw bytes"));
    }
  }
  if (!tz.encryption_passphrase_file.empty()) {
    KILN_ASSIGN_OR_RETURN(
        options.encryption_passphrase,
        ReadSecretFile(tz.encryption_passphrase_file, "tensorizer.encryption_passphrase_file"));
    // A text file's trailing newline is not part of the passphrase.
    while (!options.encryption_passphrase.empty() &&
           (options.encryption_passphrase.back() == '\n' ||
            options.encryption_passphrase.back() == '\r')) {
      options.encryption_passphrase.pop_back();
    }
  }
  return options;
}

absl::StatusOr<BuiltModel> ModelBuilder::Build(const ModelSpec& spec, const fs::path& path) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, BackendFor(BackendName(spec)));
  LoadOptions load_options;
  KILN_ASSIGN_OR_RETURN(load_options.compute_dtype, ParseComputeDType(spec.dtype));
  KILN_ASSIGN_OR_RETURN(load_options.quantize, ParseQuantization(spec.quantize));
  KILN_ASSIGN_OR_RETURN(load_options.tensorizer, TensorizerOptionsFor(spec));

  KILN_ASSIGN_OR_RETURN(OpenedCheckpoint opened, OpenCheckpoint(path, load_options));
  const CheckpointLocation location = opened.location;
  if (!spec.format.empty() && spec.format != CheckpointFormatName(location.format)) {
    return absl::InvalidArgumentError(absl::StrCat("format: ", path.string(), " is a ",
                                                   CheckpointFormatName(location.format),
                                                   " checkpoint, not ", spec.format));
  }
  load_options.step_capacity = EngineStepCapacity(engine_, opened.config.num_mtp_layers > 0);
  // The pool: the spec's budget, else the server's, else room for max_running sequences of
  // max_context positions (vLLM sizes its pool from free memory instead; a CPU server's memory
  // is shared with everything else on the machine, so kiln asks for what its engine can use).
  load_options.kv_pool = kv_pool_;
  if (spec.kv_cache_bytes > 0) load_options.kv_pool.bytes = spec.kv_cache_bytes;
  if (!spec.kv_cache_dtype.empty()) {
    KILN_ASSIGN_OR_RETURN(load_options.kv_pool.dtype, ParseKvCacheDType(spec.kv_cache_dtype));
  }
  load_options.kv_pool.default_sequences = engine_.max_running;
  load_options.kv_pool.default_context = engine_.max_context;
  BuiltModel built;
  built.checkpoint_dir = location.dir;
  built.side_files = std::make_shared<const SideFiles>(std::move(opened.side_files));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> prepared,
                        PrepareCheckpoint(std::move(opened), backend, load_options));
  built.model = std::shared_ptr<const PreparedModel>(std::move(prepared));
  const ModelConfig& config = built.model->config();

  const SideFiles& side = *built.side_files;
  if (side.count("tokenizer.json") > 0 ||
      (side.count("encoder.json") > 0 && side.count("vocab.bpe") > 0)) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromFiles(
        side, location.file.empty() ? location.dir.string() : location.file.string());
    if (!tokenizer.ok()) return KilnAnnotate(tokenizer.status(), "tokenizer");
    built.tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tokenizer));
  } else {
    built.no_tokenizer_reason =
        absl::StrCat("model '", spec.name,
                     "' has no tokenizer (no tokenizer.json or encoder.json + vocab.bpe in ",
                     location.dir.string(), ")");
  }
  if (built.tokenizer != nullptr && built.tokenizer->vocab_size() > config.vocab_size) {
    LOG(WARNING) << "model '" << spec.name << "': the tokenizer has "
                 << built.tokenizer->vocab_size() << " ids but the model only " << config.vocab_size
                 << "; prompts with larger ids are refused";
  }

  absl::StatusOr<ChatTemplateSet> templates = ChatTemplateSet::FromSideFiles(side);
  if (!templates.ok()) return KilnAnnotate(templates.status(), "chat template");
  KILN_RETURN_IF_ERROR(ApplyChatTemplateOverride(spec, *templates));
  for (const std::string& error : templates->errors) {
    LOG(WARNING) << "model '" << spec.name << "': " << error
                 << "; chat requests that need it are refused, completions are served";
  }
  built.chat_templates = std::make_shared<const ChatTemplateSet>(*std::move(templates));

  EngineOptions engine_options = engine_;
  engine_options.prefix_caching = spec.prefix_caching;
  if (built.model->num_mtp_heads() > 0) {
    KILN_ASSIGN_OR_RETURN(engine_options.draft_source, MtpDraftSource::Create(built.model));
  } else {
    engine_options.default_num_draft_tokens = 0;  // the server default applies to MTP models
  }
  if (config.max_position_embeddings > 0) {
    engine_options.max_context =
        std::min<int64_t>(engine_options.max_context, config.max_position_embeddings);
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(built.model, built.tokenizer, engine_options));
  built.engine = std::shared_ptr<Engine>(std::move(engine));
  built.max_context = built.engine->max_context();
  return built;
}

}  // namespace kiln
