#include "server/registry.h"

#include <algorithm>
#include <chrono>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
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
  if (spec.path.empty()) return absl::InvalidArgumentError("path: a model directory is required");
  if (!spec.format.empty() && spec.format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat("format: '", spec.format,
                                                   "' is not supported (use \"\" to detect the "
                                                   "format, or \"safetensors\")"));
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
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateCpuBackend());
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

absl::StatusOr<fs::path> ModelRegistry::ResolveModelPath(const std::string& path) const {
  if (roots_.empty()) {
    return absl::PermissionDeniedError(
        "no model roots are configured, so no model may be loaded: start kiln-server with "
        "--model-root DIR (or model_roots in --config)");
  }
  if (path.empty()) return absl::InvalidArgumentError("path: a model directory is required");
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
            absl::StrCat("path: '", path, "' resolves to ", weak.string(),
                         ", which is outside the model roots (", RootList(roots_), ")"));
      }
      continue;
    }
    fs::path canonical = fs::canonical(candidate, ec);
    if (ec) {
      if (not_found.ok()) {
        not_found = absl::NotFoundError(
            absl::StrCat("path: model directory '", path, "' does not exist (looked in ",
                         requested.is_absolute() ? path : RootList(roots_), ")"));
      }
      continue;
    }
    if (!InsideAny(roots_, canonical)) {  // belt and braces: canonical follows every link
      if (denied.ok()) {
        denied = absl::PermissionDeniedError(
            absl::StrCat("path: '", path, "' resolves to ", canonical.string(),
                         ", which is outside the model roots (", RootList(roots_), ")"));
      }
      continue;
    }
    if (!fs::is_directory(canonical, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("path: ", canonical.string(), " is not a model directory"));
    }
    return canonical;
  }
  return !denied.ok() ? denied : not_found;
}

absl::StatusOr<ModelRegistry::Built> ModelRegistry::Build(const ModelSpec& spec,
                                                          const fs::path& dir) const {
  KILN_ASSIGN_OR_RETURN(CheckpointFormat format, SniffCheckpoint(dir));
  if (!spec.format.empty() &&
      !(spec.format == "safetensors" && format == CheckpointFormat::kSafetensors)) {
    return absl::InvalidArgumentError(
        absl::StrCat("format: ", dir.string(), " does not hold a ", spec.format, " checkpoint"));
  }
  LoadOptions load_options;
  const std::string dtype = absl::AsciiStrToLower(spec.dtype);
  if (dtype == "bf16") load_options.compute_dtype = DType::kBF16;
  if (dtype == "f32") load_options.compute_dtype = DType::kF32;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<PreparedModel> loaded,
                        LoadModel(dir, backend_, load_options));
  Built built;
  built.model = std::shared_ptr<const PreparedModel>(std::move(loaded));
  const ModelConfig& config = built.model->config();

  std::error_code ec;
  if (fs::exists(dir / "tokenizer.json", ec) || fs::exists(dir / "encoder.json", ec)) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir);
    if (!tokenizer.ok()) return KilnAnnotate(tokenizer.status(), "tokenizer");
    built.tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tokenizer));
    if (built.tokenizer->vocab_size() > config.vocab_size) {
      LOG(WARNING) << "model '" << spec.name << "': the tokenizer has "
                   << built.tokenizer->vocab_size() << " ids but the model only "
                   << config.vocab_size << "; prompts with larger ids are refused";
    }
  } else {
    built.no_tokenizer_reason = absl::StrCat(
        "model '", spec.name,
        "' has no tokenizer (no tokenizer.json or encoder.json + vocab.bpe in ", dir.string(), ")");
  }

  EngineOptions engine_options = options_.engine;
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

}  // namespace kiln
