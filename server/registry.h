// The model registry (design.md §2): name → entry with an explicit state, in the manner of
// Triton's ModelReadyState.
//
//   LoadModel ──► LOADING ──► READY ──► UNLOADING ──► (removed)
//                    │
//                    └──► (removed; the error goes back to the caller)
//                    └──► FAILED     (models named at start only: they stay visible with the error)
//
// Nothing half-loaded is ever visible as READY: the model, its tokenizer and its engine are all
// built before the state changes. Entries are shared: an RPC that took a snapshot keeps the
// engine and model it uses alive after an unload removed the entry.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "loaders/tensorizer_checkpoint.h"
#include "models/prepared_model.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

enum class ModelState { kLoading, kReady, kUnloading, kFailed };
absl::string_view ModelStateName(ModelState state);

// Tensorizer options of a ModelSpec (kiln.v1.TensorizerOptions in C++). Secrets are never logged.
struct TensorizerSpec {
  std::string config_path;  // inside a model root; "" = config.json beside the file
  bool skip_hash_verification = false;
  std::string encryption_key;  // 32 raw bytes
  std::string encryption_passphrase;
  std::string encryption_key_file;         // server-side file: 32 raw bytes
  std::string encryption_passphrase_file;  // server-side file: the passphrase (one line)
};

// What to load: LoadModelRequest and ServerConfig.models in C++.
struct ModelSpec {
  std::string name;
  std::string path;    // a model directory or a Tensorizer file inside one of the model roots
  std::string format;  // "" (detect), "safetensors" or "tensorizer"
  std::string dtype;   // "" (the checkpoint's), "bf16" or "f32"
  TensorizerSpec tensorizer;
};

// InvalidArgument naming the field at fault (name, path, format, dtype, tensorizer.*).
absl::Status ValidateModelSpec(const ModelSpec& spec);

// "f32", "bf16", "f16": the spelling the API uses for dtypes.
std::string DTypeApiName(DType dtype);

// A consistent copy of one entry, taken under its lock. The pointers are set from READY on.
struct ModelSnapshot {
  ModelSpec spec;
  ModelState state = ModelState::kLoading;
  std::string resolved_path;   // canonical model directory or file, once resolved
  std::string checkpoint_dir;  // the directory holding config.json and the tokenizer
  std::string error;           // FAILED: why
  std::shared_ptr<const PreparedModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // null when the model directory has none
  std::string no_tokenizer_reason;             // why there is none
  std::shared_ptr<Engine> engine;
  int64_t max_context = 0;  // of one sequence, as the engine enforces it
  double load_seconds = 0;  // wall time of the whole load
};

struct RegistryOptions {
  // Directories that model paths must resolve into (symlinks followed). Empty: every load is
  // refused.
  std::vector<std::string> model_roots;
  EngineOptions engine;  // max_context is further capped by each model's max_position_embeddings
  // Tests: runs on the loading thread once the LOADING entry is visible, before any file is read.
  std::function<void(const ModelSpec&)> on_loading_for_testing;
};

class ModelRegistry {
 public:
  // Fails if a model root does not exist or is not a directory, or no backend can be made.
  static absl::StatusOr<std::unique_ptr<ModelRegistry>> Create(RegistryOptions options);
  ~ModelRegistry();
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // Loads synchronously; returns the READY entry. On failure no entry is left behind.
  // ALREADY_EXISTS if the name is registered in any state (unload it first).
  absl::StatusOr<ModelSnapshot> Load(const ModelSpec& spec);
  // As Load, but a model that fails to load stays registered as FAILED with its error (for the
  // models named at server start).
  absl::StatusOr<ModelSnapshot> LoadAtStartup(const ModelSpec& spec);
  // READY → UNLOADING; cancels the model's running and queued requests (their streams end with
  // finish reason CANCELLED), stops its engine, then removes the entry. FAILED entries are simply
  // removed. NotFound for an unknown name; FailedPrecondition while LOADING or UNLOADING.
  absl::Status Unload(const std::string& name);

  // NotFound for an unknown name.
  absl::StatusOr<ModelSnapshot> Get(const std::string& name) const;
  // Like Get, but FailedPrecondition unless READY; the snapshot's engine is then set.
  absl::StatusOr<ModelSnapshot> GetReady(const std::string& name) const;
  // Every entry, by name.
  std::vector<ModelSnapshot> List() const;

  // Writes READY model `name` as a native tensorized file at `output_path` (resolved like model
  // paths; its directory must exist inside a model root). AlreadyExists if the file exists and
  // !overwrite.
  struct TensorizeResult {
    std::filesystem::path path;
    uint64_t bytes = 0;
    int tensors = 0;
    double seconds = 0;
  };
  absl::StatusOr<TensorizeResult> Tensorize(const std::string& name, const std::string& output_path,
                                            const std::string& dtype, bool overwrite) const;

  // Refuses further loads and stops every engine (in-flight requests end CANCELLED).
  void Shutdown();

  // The canonical model directory or file for a requested path: absolute, or relative to a
  // model root (tried in order). PermissionDenied when it resolves outside every root (symlinks
  // followed) or no root is configured; NotFound when it does not exist. `what` names the field
  // in errors.
  absl::StatusOr<std::filesystem::path> ResolveModelPath(const std::string& path,
                                                         absl::string_view what = "path") const;

  const std::vector<std::filesystem::path>& model_roots() const { return roots_; }

 private:
  class Entry;
  struct Built;

  ModelRegistry(RegistryOptions options, std::vector<std::filesystem::path> roots,
                std::shared_ptr<Backend> backend);
  absl::StatusOr<ModelSnapshot> LoadImpl(const ModelSpec& spec, bool keep_failed);
  absl::StatusOr<Built> Build(const ModelSpec& spec, const std::filesystem::path& path) const;
  absl::StatusOr<TensorizerCheckpointOptions> TensorizerOptionsFor(const ModelSpec& spec) const;
  std::shared_ptr<Entry> Find(const std::string& name) const;

  const RegistryOptions options_;
  const std::vector<std::filesystem::path> roots_;
  const std::shared_ptr<Backend> backend_;

  mutable absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mutex_);
  bool shut_down_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace kiln
