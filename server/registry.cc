#include "server/registry.h"

#include <malloc.h>

#include <chrono>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "loaders/tensorizer_checkpoint.h"
#include "models/lifecycle.h"
#include "models/prepack.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Hands the free pages of glibc's heaps back to the system. An unloaded model's many buffers,
// freed across the arenas of many gRPC threads, otherwise stay with the process: a model
// reloaded every 30 s under traffic grew RSS by 1-8 MiB a reload (scripts/soak.sh).
void ReleaseFreedMemory() { malloc_trim(0); }

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

// One registry entry. Its fields are guarded by the registry's mutex; RPCs read them through
// snapshots.
class ModelRegistry::Entry {
 public:
  explicit Entry(ModelSpec spec) { data.spec = std::move(spec); }
  ModelSnapshot data;
};

absl::StatusOr<std::unique_ptr<ModelRegistry>> ModelRegistry::Create(RegistryOptions options) {
  KILN_ASSIGN_OR_RETURN(ModelRoots roots, ModelRoots::Create(options.model_roots));
  if (roots.empty()) {
    LOG(WARNING) << "no model roots configured: LoadModel is refused (pass --model-root DIR)";
  } else {
    LOG(INFO) << "model roots: " << roots.List();
  }
  auto registry =
      std::unique_ptr<ModelRegistry>(new ModelRegistry(std::move(options), std::move(roots)));
  KILN_ASSIGN_OR_RETURN(
      registry->builder_,
      ModelBuilder::Create(&registry->roots_, registry->options_.engine, registry->options_.kv_pool,
                           registry->options_.default_backend));
  return registry;
}

ModelRegistry::~ModelRegistry() { Shutdown(); }

absl::StatusOr<ModelSnapshot> ModelRegistry::Load(const ModelSpec& spec) {
  return LoadImpl(spec, /*keep_failed=*/false);
}

absl::StatusOr<ModelSnapshot> ModelRegistry::LoadAtStartup(const ModelSpec& spec) {
  return LoadImpl(spec, /*keep_failed=*/true);
}

absl::StatusOr<ModelSnapshot> ModelRegistry::LoadImpl(const ModelSpec& spec, bool keep_failed) {
  KILN_RETURN_IF_ERROR(ValidateModelSpec(spec));
  auto entry = std::make_shared<Entry>(spec);
  entry->data.backend = builder_->BackendName(spec);
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
  ReleaseFreedMemory();  // what an earlier unload's last requests let go of since

  const Clock::time_point start = Clock::now();
  absl::StatusOr<fs::path> path = roots_.Resolve(spec.path, "path");
  if (!path.ok()) return Finish(entry, path.status(), SecondsSince(start), keep_failed);
  LOG(INFO) << "loading model '" << spec.name << "' from " << path->string() << " on backend "
            << entry->data.backend << (spec.dtype.empty() ? "" : absl::StrCat(" as ", spec.dtype));
  {
    absl::MutexLock lock(&mutex_);
    entry->data.resolved_path = path->string();
  }
  absl::StatusOr<BuiltModel> built = builder_->Build(spec, *path);
  return Finish(entry, std::move(built), SecondsSince(start), keep_failed);
}

absl::StatusOr<ModelSnapshot> ModelRegistry::Finish(const std::shared_ptr<Entry>& entry,
                                                    absl::StatusOr<BuiltModel> built,
                                                    double seconds, bool keep_failed) {
  const ModelSpec& spec = entry->data.spec;
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
  LOG(INFO) << "model '" << spec.name << "' READY from " << entry->data.resolved_path << ": "
            << model.config().architecture_name << ", " << model.parameter_count()
            << " parameters, " << DTypeApiName(model.compute_dtype())
            << (model.quantization() != Quantization::kNone
                    ? absl::StrCat(" (", QuantizationName(model.quantization()), " in ",
                                   model.quantized_linears(), " of ", model.linear_count(),
                                   " linears)")
                    : "")
            << ", " << model.weight_bytes() << " bytes, on backend " << model.backend_name() << " ("
            << model.backend_description() << "), " << model.provenance().format << " ("
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
  data.side_files = std::move(built->side_files);
  data.tokenizer = std::move(built->tokenizer);
  data.no_tokenizer_reason = std::move(built->no_tokenizer_reason);
  data.chat_templates = std::move(built->chat_templates);
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
  if (engine != nullptr) {
    engine->Shutdown(/*drain=*/false,
                     absl::UnavailableError(
                         absl::StrCat("model '", name, "' was unloaded while this request ran")));
  }
  {
    absl::MutexLock lock(&mutex_);
    if (auto it = entries_.find(name); it != entries_.end() && it->second == entry) {
      entries_.erase(it);
    }
  }
  // The weights are freed when the last in-flight RPC lets go of its snapshot.
  entry.reset();
  engine.reset();
  ReleaseFreedMemory();
  LOG(INFO) << "unloaded model '" << name << "' in " << SecondsSince(start) << " s";
  return absl::OkStatus();
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
    // Loading and unloading pass (a client may retry, as HTTP's 503 says); a failed load stays.
    return snapshot.state == ModelState::kFailed ? absl::FailedPreconditionError(message)
                                                 : absl::UnavailableError(message);
  }
  return snapshot;
}

std::vector<ModelSnapshot> ModelRegistry::List() const {
  absl::MutexLock lock(&mutex_);
  std::vector<ModelSnapshot> list;
  for (const auto& [name, entry] : entries_) list.push_back(entry->data);
  return list;
}

void ModelRegistry::Shutdown(absl::Status reason) {
  std::vector<std::shared_ptr<Engine>> engines;
  {
    absl::MutexLock lock(&mutex_);
    shut_down_ = true;
    for (auto& [name, entry] : entries_) {
      if (entry->data.engine != nullptr) engines.push_back(entry->data.engine);
    }
  }
  for (const std::shared_ptr<Engine>& engine : engines) engine->Shutdown(/*drain=*/false, reason);
}

absl::StatusOr<ModelRegistry::TensorizeResult> ModelRegistry::Tensorize(
    const std::string& name, const TensorizeOptions& request) const {
  KILN_ASSIGN_OR_RETURN(ModelSnapshot snapshot, GetReady(name));
  NativeTensorizeOptions options;
  absl::StatusOr<std::optional<DType>> stored_dtype = ParseComputeDType(request.dtype);
  if (!stored_dtype.ok()) return KilnAnnotate(stored_dtype.status(), "dtype");
  options.dtype = *stored_dtype;
  const PreparedModel& model = *snapshot.model;
  if (request.prepack) {
    if (options.dtype.has_value() && *options.dtype != model.compute_dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dtype: a prepacked file holds the linears as model '", name,
                       "' has them, in ", DTypeName(model.compute_dtype()),
                       "; leave dtype empty or load the model as ", DTypeName(*options.dtype)));
    }
    // The model's own packed linears (its images point into the model, which the snapshot keeps
    // alive until the file is written).
    options.packed = PackedImagesOf(model);
    if (options.packed.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "prepack: model '", name, "' on backend ", model.backend_name(),
          " has no linear whose packed layout a file can hold; write it without prepack"));
    }
  }
  KILN_ASSIGN_OR_RETURN(fs::path file, roots_.ResolveNewFile(request.output_path, "output_path"));
  std::error_code ec;
  if (fs::exists(file, ec) && !request.overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat("output_path: ", file.string(), " exists (set overwrite to replace it)"));
  }
  if (snapshot.side_files != nullptr) options.embedded_files = *snapshot.side_files;
  const Clock::time_point start = Clock::now();
  KILN_ASSIGN_OR_RETURN(NativeTensorizeResult written,
                        WriteNativeTensorized(file, model.source(), model.config(), options));
  TensorizeResult result;
  result.path = file;
  result.bytes = written.bytes;
  result.tensors = written.tensors;
  result.packed = written.packed;
  result.seconds = SecondsSince(start);
  LOG(INFO) << "model '" << name << "' tensorized to " << file.string() << " (" << result.bytes
            << " bytes, " << result.tensors << " tensors, " << result.packed << " of them packed, "
            << result.seconds << " s)";
  return result;
}

}  // namespace kiln
