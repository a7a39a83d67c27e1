// From a path on disk to a PreparedModel: sniff the format, run its loader, then the one
// lifecycle (models/lifecycle.h). Each stage is timed and logged.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

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
  std::optional<DType> compute_dtype;  // see PostLoadOptions
  TensorizerCheckpointOptions tensorizer;
};

// `path` is a model directory (model.safetensors.index.json, model.safetensors, model.tensors,
// or exactly one *.tensors file) or a Tensorizer file. Errors say what was looked for.
absl::StatusOr<CheckpointLocation> SniffCheckpoint(const std::filesystem::path& path);

absl::StatusOr<std::unique_ptr<PreparedModel>> LoadModel(const std::filesystem::path& path,
                                                         std::shared_ptr<Backend> backend,
                                                         const LoadOptions& options = {});

// The loader stage alone: the WeightSource and config of the checkpoint at `path`, before Bind
// (for `kiln tensorize` and benchmarks).
struct OpenedCheckpoint {
  CheckpointLocation location;
  ModelConfig config;
  WeightSource source;
};
absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(const std::filesystem::path& path,
                                                const LoadOptions& options = {});

}  // namespace kiln
