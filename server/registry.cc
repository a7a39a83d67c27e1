#include "server/registry.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/mtp_draft_source.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// True if `path` is `root` or lies below it (both absolute and normalized), compared by whole
// components so that /models/a2 is not inside /models/a.
bool IsWithin(const fs::path& root, const fs::path& path) {
  return std::mismatch(root.begin(), root.end(), path.begin(), path.end()).first == root.end();
}

bool InsideAny(const std::vector<fs::path>& roots, const fs::path& path) {
  return std::any_of(roots.begin(), roots.end(),
                     [&](const fs::path& root) { return IsWithin(root, path); });
}

std::string RootList(const std::vector<fs::path>& roots) {
  std::vector<std::string> names;
  for (const fs::path& root : roots) names.push_back(root.string());
  return absl::StrJoin(names, ", ");
}

bool ValidNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == ':' || c == '/';
}

}  // namespace

absl::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kLoading:
      return "LOADING";
    case ModelState::kReady:
      return "READY";
    case ModelState::kUnloading:
      return "UNLOADING";
    case ModelState::kFailed:
      return "FAILED";
  }
  return "?";
}

std::string DTypeApiName(DType dtype) { return absl::AsciiStrToLower(DTypeName(dtype)); }

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  if (spec.name.empty()) return absl::InvalidArgumentError("name: a model name is required");
  if (spec.name.size() > 128) {
    return absl::InvalidArgumentError("name: model names are at most 128 characters");
  }
  if (!std::all_of(spec.name.begin(), spec.name.end(), ValidNameChar)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name: '", spec.name, "' may hold only letters, digits and the characters - _ . : /"));
  }
  if (spec.path.empty()) {
    return absl::InvalidArgumentError("path: a model directory or Tensorizer file is required");
  }
  if (!spec.format.empty() && spec.format != "safetensors" && spec.format != "tensorizer") {
    return absl::InvalidArgumentError(
        absl::StrCat("format: '", spec.format,
                     "' is not supported (use \"\" to detect the format, \"safetensors\" or "
                     "\"tensorizer\")"));
  }
  const TensorizerSpec& tz = spec.tensorizer;
  const int secrets = !tz.encryption_key.empty() + !tz.encryption_passphrase.empty() +
                      !tz.encryption_key_file.empty() + !tz.encryption_passphrase_file.empty();
  if (secrets > 1) {
    return absl::InvalidArgumentError(
        "tensorizer: give at most one of encryption_key, encryption_passphrase, "
        "encryption_key_file and encryption_passphrase_file");
  }
  if (!tz.encryption_key.empty() && tz.encryption_key.size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensorizer.encryption_key: a key is 32 bytes, got ", tz.encryption_key.size()));
  }
  const std::string dtype = absl::AsciiStrToLower(spec.dtype);
  if (!dtype.empty() && dtype != "bf16" && dtype != "f32") {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: '", spec.dtype, "' is not supported (use \"\", \"bf16\" or \"f32\")"));
  }
  return absl::OkStatus();
}

// One registry entry. Its fields are guarded by the registry's mutex; RPCs read them through
// snapshots.
class ModelRegistry::Entry {
 public:
  explicit Entry(ModelSpec spec) { data.spec = std::move(spec); }
  ModelSnapshot data;
};

struct ModelRegistry::Built {
  std::shared_ptr<const PreparedModel> model;
  fs::path checkpoint_dir;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string no_tokenizer_reason;
  std::shared_ptr<Engine> engine;
  int64_t max_context = 0;
};

absl::StatusOr<std::unique_ptr<ModelRegistry>> ModelRegistry::Create(RegistryOptions options) {
  std::vector<fs::path> roots;
  for (const std::string& root : options.model_roots) {
    if (root.empty()) continue;
    std::error_code ec;
    fs::path canonical = fs::canonical(root, ec);
    if (ec || !fs::is_directory(canonical, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model root ", root, " is not an existing directory"));
    }
    if (std::find(roots.begin(), roots.end(), canonical) == roots.end()) {
      roots.push_back(std::move(canonical));
    }
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  if (roots.empty()) {
    LOG(WARNING) << "no model roots configured: LoadModel is refused (pass --model-root DIR)";
  } else {
    LOG(INFO) << "model roots: " << RootList(roots);
  }
  return std::unique_ptr<ModelRegistry>(
      new ModelRegistry(std::move(options), std::move(roots), std::move(backend)));
}

ModelRegistry::ModelRegistry(RegistryOptions options, std::vector<fs::path> roots,
                             std::shared_ptr<Backend> backend)
    : options_(std::move(options)), roots_(std::move(roots)), backend_(std::move(backend)) {}

ModelRegistry::~ModelRegistry() { Shutdown(); }

absl::StatusOr<fs::path> ModelRegistry::ResolveModelPath(const std::string& path,
                                                         absl::string_view what) const {
  if (roots_.empty()) {
    return absl::PermissionDeniedError(
        "no model roots are configured, so no model may be loaded: start kiln-server with "
        "--model-root DIR (or model_roots in --config)");
  }
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": a path is required"));
  const fs::path requested(path);
  std::vector<fs::path> candidates;
  if (requested.is_absolute()) {
    candidates.push_back(requested);
  } else {
    for (const fs::path& root : roots_) candidates.push_back(root / requested);
  }
  absl::Status denied, not_found;
  for (const fs::path& candidate : candidates) {
    std::error_code ec;
    // `..` and symlinks along the way are resolved before any check; a path that leaves every
    // root is refused whether or not its target exists.
    fs::path weak = fs::weakly_canonical(candidate, ec);
    if (ec) weak = candidate.lexically_normal();
    if (!InsideAny(roots_, weak)) {
      if (denied.ok()) {
        denied = absl::PermissionDeniedError(
            absl::StrCat(what, ": '", path, "' resolves to ", weak.string(),
                         ", which is outside the model roots (", RootList(roots_), ")"));
      }
      continue;
    }
    fs::path canonical = fs::canonical(candidate, ec);
    if (ec) {
      if (not_found.ok()) {
        not_found = absl::NotFoundError(
            absl::StrCat(what, ": '", path, "' does not exist (looked in ",
                         requested.is_absolute() ? path : RootList(roots_), ")"));
      }
      continue;
    }
    if (!InsideAny(roots_, canonical)) {  // belt and braces: canonical follows every link
      if (denied.ok()) {
        denied = absl::PermissionDeniedError(
            absl::StrCat(what, ": '", path, "' resolves to ", canonical.string(),
                         ", which is outside the model roots (", RootList(roots_), ")"));
      }
      continue;
    }
    if (!fs::is_directory(canonical, ec) && !fs::is_regular_file(canonical, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", canonical.string(), " is neither a directory nor a file"));
    }
    return canonical;
  }
  return !denied.ok() ? denied : not_found;
}

// Reads a secret from a server-side file. Errors name the file, never its content.
static absl::StatusOr<std::string> ReadSecretFile(const std::string& path,
                                                  absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": cannot read ", path));
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (secret.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is too large for a key"));
  }
  return secret;
}

absl::StatusOr<TensorizerCheckpointOptions> ModelRegistry::TensorizerOptionsFor(
    const ModelSpec& spec) const {
  const TensorizerSpec& tz = spec.tensorizer;
  TensorizerCheckpointOptions options;
  options.verify_hashes = !tz.skip_hash_verification;
  if (!tz.config_path.empty()) {
    KILN_ASSIGN_OR_RETURN(options.config_path,
                          ResolveModelPath(tz.config_path, "tensorizer.config_path"));
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

absl::StatusOr<ModelRegistry::Built> ModelRegistry::Build(const ModelSpec& spec,
                                                          const fs::path& path) const {
  KILN_ASSIGN_OR_RETURN(CheckpointLocation location, SniffCheckpoint(path));
  if (!spec.format.empty() && spec.format != CheckpointFormatName(location.format)) {
    return absl::InvalidArgumentError(absl::StrCat("format: ", path.string(), " is a ",
                                                   CheckpointFormatName(location.format),
                                                   " checkpoint, not ", spec.format));
  }
  LoadOptions load_options;
  const std::string dtype = absl::AsciiStrToLower(spec.dtype);
  if (dtype == "bf16") load_options.compute_dtype = DType::kBF16;
  if (dtype == "f32") load_options.compute_dtype = DType::kF32;
  KILN_ASSIGN_OR_RETURN(load_options.tensorizer, TensorizerOptionsFor(spec));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> loaded,
                        LoadModel(path, backend_, load_options));
  Built built;
  built.model = std::shared_ptr<const PreparedModel>(std::move(loaded));
  built.checkpoint_dir = location.dir;
  const ModelConfig& config = built.model->config();
  const fs::path& dir = location.dir;
  const std::map<std::string, std::string>& embedded = built.model->provenance().embedded_files;

  std::error_code ec;
  auto embedded_text = [&](const std::string& name) -> absl::string_view {
    auto it = embedded.find(name);
    return it == embedded.end() ? absl::string_view() : absl::string_view(it->second);
  };
  if (embedded.count("tokenizer.json") > 0) {
    // A native tensorized file carries its tokenizer.
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(
        embedded_text("tokenizer.json"), embedded_text("tokenizer_config.json"),
        embedded_text("generation_config.json"));
    if (!tokenizer.ok()) {
      return KilnAnnotate(tokenizer.status(), absl::StrCat("tokenizer inside ", path.string()));
    }
    built.tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tokenizer));
  } else if (fs::exists(dir / "tokenizer.json", ec) || fs::exists(dir / "encoder.json", ec)) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir);
    if (!tokenizer.ok()) return KilnAnnotate(tokenizer.status(), "tokenizer");
    built.tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tokenizer));
  } else {
    built.no_tokenizer_reason = absl::StrCat(
        "model '", spec.name,
        "' has no tokenizer (no tokenizer.json or encoder.json + vocab.bpe in ", dir.string(), ")");
  }
  if (built.tokenizer != nullptr && built.tokenizer->vocab_size() > config.vocab_size) {
    LOG(WARNING) << "model '" << spec.name << "': the tokenizer has "
                 << built.tokenizer->vocab_size() << " ids but the model only " << config.vocab_size
                 << "; prompts with larger ids are refused";
  }

  EngineOptions engine_options = options_.engine;
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
  built.max_context = engine_options.max_context;
  return built;
}

absl::StatusOr<ModelSnapshot> ModelRegistry::Load(const ModelSpec& spec) {
  return LoadImpl(spec, /*keep_failed=*/false);
}

absl::StatusOr<ModelSnapshot> ModelRegistry::LoadAtStartup(const ModelSpec& spec) {
  return LoadImpl(spec, /*keep_failed=*/true);
}

absl::StatusOr<ModelSnapshot> ModelRegistry::LoadImpl(const ModelSpec& spec, bool keep_failed) {
  KILN_RETURN_IF_ERROR(ValidateModelSpec(spec));
  auto entry = std::make_shared<Entry>(spec);
  {
    absl::MutexLock lock(&mutex_);
    if (shut_down_) return absl::FailedPreconditionError("the server is shutting down");
    auto it = entries_.find(spec.name);
    if (it != entries_.end()) {
      const ModelSnapshot& existing = it->second->data;
      return absl::AlreadyExistsError(absl::StrCat(
          "model '", spec.name, "' already exists (", ModelStateName(existing.state), ", from ",
          existing.resolved_path.empty() ? existing.spec.path : existing.resolved_path,
          "); unload it first to load another model under this name"));
    }
    entries_.emplace(spec.name, entry);
  }
  if (options_.on_loading_for_testing) options_.on_loading_for_testing(spec);

  const Clock::time_point start = Clock::now();
  absl::StatusOr<fs::path> dir = ResolveModelPath(spec.path);
  absl::StatusOr<Built> built = absl::UnknownError("not loaded");
  if (!dir.ok()) {
    built = dir.status();
  } else {
    LOG(INFO) << "loading model '" << spec.name << "' from " << dir->string()
              << (spec.dtype.empty() ? "" : absl::StrCat(" as ", spec.dtype));
    {
      absl::MutexLock lock(&mutex_);
      entry->data.resolved_path = dir->string();
    }
    built = Build(spec, *dir);
  }
  const double seconds = SecondsSince(start);

  if (!built.ok()) {
    absl::Status status =
        KilnAnnotate(built.status(), absl::StrCat("loading model '", spec.name, "'"));
    LOG(ERROR) << status.message() << (keep_failed ? " (listed as FAILED)" : "");
    absl::MutexLock lock(&mutex_);
    if (keep_failed) {
      entry->data.state = ModelState::kFailed;
      entry->data.error = std::string(status.message());
    } else if (auto it = entries_.find(spec.name); it != entries_.end() && it->second == entry) {
      entries_.erase(it);
    }
    return status;
  }

  const PreparedModel& model = *built->model;
  const StageTimings& timings = model.timings();
  LOG(INFO) << "model '" << spec.name << "' READY from " << dir->string() << ": "
            << model.config().architecture_name << ", " << model.parameter_count()
            << " parameters, " << DTypeApiName(model.compute_dtype()) << ", "
            << model.weight_bytes() << " bytes, " << model.provenance().format << " ("
            << LoadModeName(model.provenance().load_mode) << "); open " << timings.open_seconds
            << " s, bind " << timings.bind_seconds << " s, post-load " << timings.post_load_seconds
            << " s, total " << seconds << " s; max context " << built->max_context << "; "
            << (built->tokenizer ? "tokenizer loaded" : built->no_tokenizer_reason);
  LOG(INFO) << "model '" << spec.name << "' load report: " << model.report().Summary();
  for (const TensorSummary& tensor : model.report().carried) {
    LOG(INFO) << "model '" << spec.name << "' carried " << tensor.name << " (" << tensor.bytes
              << " bytes, " << tensor.origin << ")";
  }

  absl::MutexLock lock(&mutex_);
  ModelSnapshot& data = entry->data;
  data.model = std::move(built->model);
  data.checkpoint_dir = built->checkpoint_dir.string();
  data.tokenizer = std::move(built->tokenizer);
  data.no_tokenizer_reason = std::move(built->no_tokenizer_reason);
  data.engine = std::move(built->engine);
  data.max_context = built->max_context;
  data.load_seconds = seconds;
  data.state = ModelState::kReady;
  return data;
}

absl::Status ModelRegistry::Unload(const std::string& name) {
  std::shared_ptr<Entry> entry;
  std::shared_ptr<Engine> engine;
  {
    absl::MutexLock lock(&mutex_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("model '", name, "' is not loaded"));
    }
    entry = it->second;
    switch (entry->data.state) {
      case ModelState::kLoading:
        return absl::FailedPreconditionError(
            absl::StrCat("model '", name, "' is still LOADING; unload it once it is READY"));
      case ModelState::kUnloading:
        return absl::FailedPreconditionError(
            absl::StrCat("model '", name, "' is already UNLOADING"));
      case ModelState::kFailed:
        entries_.erase(it);
        LOG(INFO) << "removed FAILED model '" << name << "'";
        return absl::OkStatus();
      case ModelState::kReady:
        break;
    }
    entry->data.state = ModelState::kUnloading;
    engine = entry->data.engine;
  }
  LOG(INFO) << "unloading model '" << name << "': cancelling its requests";
  const Clock::time_point start = Clock::now();
  if (engine != nullptr) engine->Shutdown(/*drain=*/false);
  {
    absl::MutexLock lock(&mutex_);
    if (auto it = entries_.find(name); it != entries_.end() && it->second == entry) {
      entries_.erase(it);
    }
  }
  // The weights are freed when the last in-flight RPC lets go of its snapshot.
  LOG(INFO) << "unloaded model '" << name << "' in " << SecondsSince(start) << " s";
  return absl::OkStatus();
}

std::shared_ptr<ModelRegistry::Entry> ModelRegistry::Find(const std::string& name) const {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second;
}

absl::StatusOr<ModelSnapshot> ModelRegistry::Get(const std::string& name) const {
  absl::MutexLock lock(&mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::vector<std::string> names;
    for (const auto& [known, entry] : entries_) names.push_back(known);
    return absl::NotFoundError(absl::StrCat(
        "model '", name,
        "' is not loaded (loaded: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  return it->second->data;
}

absl::StatusOr<ModelSnapshot> ModelRegistry::GetReady(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(ModelSnapshot snapshot, Get(name));
  if (snapshot.state != ModelState::kReady || snapshot.engine == nullptr) {
    std::string message =
        absl::StrCat("model '", name, "' is ", ModelStateName(snapshot.state), ", not READY");
    if (!snapshot.error.empty()) absl::StrAppend(&message, ": ", snapshot.error);
    return absl::FailedPreconditionError(message);
  }
  return snapshot;
}

std::vector<ModelSnapshot> ModelRegistry::List() const {
  absl::MutexLock lock(&mutex_);
  std::vector<ModelSnapshot> list;
  for (const auto& [name, entry] : entries_) list.push_back(entry->data);
  return list;
}

void ModelRegistry::Shutdown() {
  std::vector<std::shared_ptr<Engine>> engines;
  {
    absl::MutexLock lock(&mutex_);
    shut_down_ = true;
    for (auto& [name, entry] : entries_) {
      if (entry->data.engine != nullptr) engines.push_back(entry->data.engine);
    }
  }
  for (const std::shared_ptr<Engine>& engine : engines) engine->Shutdown(/*drain=*/false);
}

absl::StatusOr<ModelRegistry::TensorizeResult> ModelRegistry::Tensorize(
    const std::string& name, const std::string& output_path, const std::string& dtype,
    bool overwrite) const {
  KILN_ASSIGN_OR_RETURN(ModelSnapshot snapshot, GetReady(name));
  const std::string lower = absl::AsciiStrToLower(dtype);
  NativeTensorizeOptions options;
  if (lower == "bf16") {
    options.dtype = DType::kBF16;
  } else if (lower == "f32") {
    options.dtype = DType::kF32;
  } else if (!lower.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: '", dtype, "' is not supported (use \"\", \"bf16\" or \"f32\")"));
  }
  if (output_path.empty()) return absl::InvalidArgumentError("output_path: a file is required");
  // The file need not exist yet: its directory must resolve inside a model root.
  const fs::path requested(output_path);
  if (!requested.has_filename() || requested.filename() == "." || requested.filename() == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("output_path: '", output_path, "' does not name a file"));
  }
  const fs::path parent = requested.parent_path().empty() ? fs::path(".") : requested.parent_path();
  KILN_ASSIGN_OR_RETURN(fs::path dir, ResolveModelPath(parent.string(), "output_path"));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_path: ", dir.string(), " is not a directory"));
  }
  const fs::path file = dir / requested.filename();
  if (fs::is_symlink(file, ec)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "output_path: ", file.string(), " is a symlink; kiln does not write through one"));
  }
  if (fs::exists(file, ec) && !overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat("output_path: ", file.string(), " exists (set overwrite to replace it)"));
  }
  const PreparedModel& model = *snapshot.model;
  options.embedded_files = model.provenance().embedded_files;
  if (options.embedded_files.empty() && !snapshot.checkpoint_dir.empty()) {
    KILN_ASSIGN_OR_RETURN(options.embedded_files, CollectEmbeddableFiles(snapshot.checkpoint_dir));
  }
  const Clock::time_point start = Clock::now();
  KILN_ASSIGN_OR_RETURN(NativeTensorizeResult written,
                        WriteNativeTensorized(file, model.source(), model.config(), options));
  TensorizeResult result;
  result.path = file;
  result.bytes = written.bytes;
  result.tensors = written.tensors;
  result.seconds = SecondsSince(start);
  LOG(INFO) << "model '" << name << "' tensorized to " << file.string() << " (" << result.bytes
            << " bytes, " << result.tensors << " tensors, " << result.seconds << " s)";
  return result;
}

}  // namespace kiln
