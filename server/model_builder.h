// Building a servable model from a ModelSpec, in one pass: open the checkpoint once (location,
// config, weights and side files separately), prepare it on its backend, build its tokenizer from
// the side files and start its engine. Backends are made by name on first use and shared by the
// models that run on them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "loaders/load_model.h"
#include "loaders/model_root.h"
#include "models/prepared_model.h"
#include "server/model_spec.h"
#include "template/chat_template_set.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

using SideFiles = std::map<std::string, std::string>;

struct BuiltModel {
  std::shared_ptr<const PreparedModel> model;
  std::filesystem::path checkpoint_dir;  // the directory holding config.json and the tokenizer
  // The checkpoint's tokenizer and generation files (what Tensorize embeds again).
  std::shared_ptr<const SideFiles> side_files;
  std::shared_ptr<const Tokenizer> tokenizer;  // null when the checkpoint has none
  std::string no_tokenizer_reason;             // why there is none
  // Parsed from the side files; templates that did not parse are listed in its errors.
  std::shared_ptr<const ChatTemplateSet> chat_templates;
  std::shared_ptr<Engine> engine;
  int64_t max_context = 0;  // of one sequence, as the engine enforces it
};

class ModelBuilder {
 public:
  // `roots` must outlive the builder. InvalidArgument / FailedPrecondition when
  // `default_backend` is unknown or cannot run here.
  // `kv_pool` is every model's pool unless its spec sets a budget (bytes 0: derived from the
  // engine's max_running and max_context).
  static absl::StatusOr<std::unique_ptr<ModelBuilder>> Create(const ModelRoots* roots,
                                                              EngineOptions engine,
                                                              KvPoolOptions kv_pool,
                                                              std::string default_backend);

  // The backend `spec` runs on: its own, else the default.
  const std::string& BackendName(const ModelSpec& spec) const {
    return spec.backend.empty() ? default_backend_ : spec.backend;
  }
  // Builds the model of a validated `spec` whose path resolved to `path`.
  absl::StatusOr<BuiltModel> Build(const ModelSpec& spec, const std::filesystem::path& path);

 private:
  ModelBuilder(const ModelRoots* roots, EngineOptions engine, KvPoolOptions kv_pool,
               std::string default_backend)
      : roots_(*roots),
        engine_(std::move(engine)),
        kv_pool_(kv_pool),
        default_backend_(std::move(default_backend)) {}
  absl::StatusOr<std::shared_ptr<Backend>> BackendFor(const std::string& name);
  absl::StatusOr<TensorizerCheckpointOptions> TensorizerOptionsFor(const ModelSpec& spec) const;

  const ModelRoots& roots_;
  const EngineOptions engine_;
  const KvPoolOptions kv_pool_;
  const std::string default_backend_;
  absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<Backend>> backends_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace kiln
