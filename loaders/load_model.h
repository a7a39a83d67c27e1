// From a path on disk to a PreparedModel: sniff the format, run its loader, then the one
// lifecycle (models/lifecycle.h). Each stage is timed and logged.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/lifecycle.h"
#include "models/prepared_model.h"

namespace kiln {

enum class CheckpointFormat { kSafetensors };

struct LoadOptions {
  std::optional<DType> compute_dtype;  // see PostLoadOptions
};

// The format of the checkpoint at `path` (a model directory), or an error saying what was
// looked for.
absl::StatusOr<CheckpointFormat> SniffCheckpoint(const std::filesystem::path& path);

absl::StatusOr<std::unique_ptr<PreparedModel>> LoadModel(const std::filesystem::path& path,
                                                         std::shared_ptr<Backend> backend,
                                                         const LoadOptions& options = {});

}  // namespace kiln
