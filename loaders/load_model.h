// From a path on disk to a PreparedModel: sniff the format, run its loader, then the one
// lifecycle (models/lifecycle.h). Each stage is timed and logged. The checkpoint is opened once:
// OpenCheckpoint yields where it is, its config, its weights and its side files (the tokenizer),
// separately; PrepareCheckpoint turns the weights into a PreparedModel.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "loaders/tensorizer_checkpoint.h"
#include "models/lifecycle.h"
#include "models/prepared_model.h"

namespace kiln {

enum class CheckpointFormat { kSafetensors, kTensorizer };
absl::string_view CheckpointFormatName(CheckpointFormat format);

// Where a checkpoint's weights are. `dir` holds config.json and the tokenizer (for a Tensorizer
// file: the directory it is in); `file` is the Tensorizer file, empty for safetensors.
struct CheckpointLocation {
  CheckpointFormat format = CheckpointFormat::kSafetensors;
  std::filesystem::path dir;
  std::filesystem::path file;
};

struct LoadOptions {
  std::optional<DType> compute_dtype;           // see PostLoadOptions
  StepCapacity step_capacity;                   // see PostLoadOptions
  KvPoolOptions kv_pool;                        // see PostLoadOptions
  Quantization quantize = Quantization::kNone;  // see PostLoadOptions
  TensorizerCheckpointOptions tensorizer;
};

// `path` is a model directory (model.safetensors.index.json, model.safetensors, model.tensors,
// or exactly one *.tensors file) or a Tensorizer file. Errors say what was looked for.
absl::StatusOr<CheckpointLocation> SniffCheckpoint(const std::filesystem::path& path);

// The checkpoint at `path`, opened once: the loader stage, before Bind.
struct OpenedCheckpoint {
  CheckpointLocation location;
  ModelConfig config;
  WeightSource source;
  // Files that travel with the weights, by file name (tokenizer.json, tokenizer_config.json,
  // chat_template.jinja,
  // generation_config.json, encoder.json, vocab.bpe): a native tensorized file's embedded ones,
  // else those in the checkpoint's directory (each confined to it).
  std::map<std::string, std::string> side_files;
  double open_seconds = 0;
};
absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(const std::filesystem::path& path,
                                                const LoadOptions& options = {});

// Bind → Restore → PostLoad of an opened checkpoint's weights on `backend`.
absl::StatusOr<std::unique_ptr<PreparedModel>> PrepareCheckpoint(OpenedCheckpoint opened,
                                                                 std::shared_ptr<Backend> backend,
                                                                 const LoadOptions& options = {});

// OpenCheckpoint, then PrepareCheckpoint (side files dropped).
absl::StatusOr<std::unique_ptr<PreparedModel>> LoadModel(const std::filesystem::path& path,
                                                         std::shared_ptr<Backend> backend,
                                                         const LoadOptions& options = {});

// The side files in `dir` (see OpenedCheckpoint::side_files); PermissionDenied for one that leaves
// the directory through a symlink.
absl::StatusOr<std::map<std::string, std::string>> ReadSideFiles(const std::filesystem::path& dir);

}  // namespace kiln
