// Safetensors checkpoints: single files and sharded ones (model.safetensors.index.json),
// memory-mapped, every byte range validated before any view is handed out.
#pragma once

#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "models/weight_source.h"

namespace kiln {

// Opens one safetensors file `relative_path` inside `model_root` (the file must resolve inside
// the root, symlinks included) and appends its tensors to a new WeightSource.
absl::StatusOr<WeightSource> OpenSafetensorsFile(const std::filesystem::path& model_root,
                                                 const std::string& relative_path);

// Opens a model directory: model.safetensors.index.json (every shard it names), else
// model.safetensors. Errors name the file and tensor at fault.
absl::StatusOr<WeightSource> OpenSafetensorsCheckpoint(const std::filesystem::path& model_dir);

}  // namespace kiln
