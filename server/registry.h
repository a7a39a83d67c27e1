// The model registry (design.md §2): name → entry with an explicit state, in the manner of
// Triton's ModelReadyState.
//
//   LoadModel ──► LOADING ──► READY ──► UNLOADING ──► (removed)
//                    │
//                    └──► (removed; the error goes back to the caller)
//                    └──► FAILED     (models named at start only: they stay visible with the error)
//
// Nothing half-loaded is ever visible as READY: the model, its tokenizer and its engine are all
// built (server/model_builder.h) before the state changes. Entries are shared: an RPC that took a
// snapshot keeps the engine and model it uses alive after an unload removed the entry.
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
#include "loaders/model_root.h"
#include "models/prepared_model.h"
#include "server/model_builder.h"
#include "server/model_spec.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

enum class ModelState { kLoading, kReady, kUnloading, kFailed };
absl::string_view ModelStateName(ModelState state);

// A consistent copy of one entry, taken under its lock. The pointers are set from READY on.
struct ModelSnapshot {
  ModelSpec spec;
  ModelState state = ModelState::kLoading;
  std::string backend;         // the backend it runs (or was to run) on
  std::string resolved_path;   // canonical model directory or file, once resolved
  std::string checkpoint_dir;  // the directory holding config.json and the tokenizer
  std::string error;           // FAILED: why
  std::shared_ptr<const PreparedModel> model;
  std::shared_ptr<const SideFiles> side_files;            // the checkpoint's tokenizer files
  std::shared_ptr<const Tokenizer> tokenizer;             // null when the model directory has none
  std::string no_tokenizer_reason;                        // why there is none
  std::shared_ptr<const ChatTemplateSet> chat_templates;  // from READY on
  std::shared_ptr<Engine> engine;
  int64_t max_context = 0;  // of one sequence, as the engine enforces it
  double load_seconds = 0;  // wall time of the whole load
};

struct RegistryOptions {
  // Directories that model paths must resolve into (symlinks followed). Empty: every load is
  // refused.
  std::vector<std::string> model_roots;
  EngineOptions engine;   // max_context is further capped by each model's max_position_embeddings
  KvPoolOptions kv_pool;  // each model's KV pool (a spec's kv_cache_bytes overrides the budget)
  // Backend of specs that name none; "" = "cpu". Must be available here.
  std::string default_backend;
  // Tests: runs on the loading thread once the LOADING entry is visible, before any file is read.
  std::function<void(const ModelSpec&)> on_loading_for_testing;
};

class ModelRegistry {
 public:
  // Fails if a model root does not exist or is not a directory, or the default backend is unknown
  // (InvalidArgument) or cannot run here (FailedPrecondition).
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
  struct TensorizeOptions {
    std::string output_path;  // inside a model root
    std::string dtype;        // "" = as loaded; "f32" or "bf16"
    bool overwrite = false;
    // Store the linears as the model's backend packed them: a load that packs the same way adopts
    // them (docs/design.md, "Prepacked native files").
    bool prepack = false;
  };
  struct TensorizeResult {
    std::filesystem::path path;
    uint64_t bytes = 0;
    int tensors = 0;
    int packed = 0;
    double seconds = 0;
  };
  absl::StatusOr<TensorizeResult> Tensorize(const std::string& name,
                                            const TensorizeOptions& request) const;

  // Refuses further loads and stops every engine: in-flight requests end CANCELLED, or with
  // `reason` as their error when it is not OK.
  void Shutdown(absl::Status reason = absl::OkStatus());

  const ModelRoots& roots() const { return roots_; }

 private:
  class Entry;

  ModelRegistry(RegistryOptions options, ModelRoots roots)
      : options_(std::move(options)), roots_(std::move(roots)) {}
  absl::StatusOr<ModelSnapshot> LoadImpl(const ModelSpec& spec, bool keep_failed);
  // LOADING → READY (the built model in place), or the failure recorded as `keep_failed` says.
  absl::StatusOr<ModelSnapshot> Finish(const std::shared_ptr<Entry>& entry,
                                       absl::StatusOr<BuiltModel> built, double seconds,
                                       bool keep_failed);

  const RegistryOptions options_;
  const ModelRoots roots_;
  std::unique_ptr<ModelBuilder> builder_;

  mutable absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<Entry>> entries_ ABSL_GUARDED_BY(mutex_);
  bool shut_down_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace kiln
