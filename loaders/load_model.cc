#include "loaders/load_model.h"

#include <chrono>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "loaders/safetensors.h"

namespace kiln {

absl::StatusOr<CheckpointFormat> SniffCheckpoint(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    return absl::NotFoundError(absl::StrCat(path.string(), " is not a model directory"));
  }
  if (std::filesystem::exists(path / "model.safetensors.index.json", error) ||
      std::filesystem::exists(path / "model.safetensors", error)) {
    return CheckpointFormat::kSafetensors;
  }
  return absl::NotFoundError(absl::StrCat(
      path.string(),
      " holds no checkpoint kiln can read (looked for model.safetensors.index.json and "
      "model.safetensors)"));
}

absl::StatusOr<std::unique_ptr<PreparedModel>> LoadModel(const std::filesystem::path& path,
                                                         std::shared_ptr<Backend> backend,
                                                         const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(CheckpointFormat format, SniffCheckpoint(path));
  KILN_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig((path / "config.json").string()));
  WeightSource source;
  switch (format) {
    case CheckpointFormat::kSafetensors: {
      KILN_ASSIGN_OR_RETURN(source, OpenSafetensorsCheckpoint(path));
      break;
    }
  }
  const double open_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const SourceProvenance& provenance = source.provenance();
  LOG(INFO) << "opened " << path.string() << ": " << provenance.format << ", "
            << provenance.files.size() << " file(s), " << source.records().size() << " tensors, "
            << provenance.bytes_read << " bytes, load mode " << LoadModeName(provenance.load_mode)
            << ", " << open_seconds << " s";

  PostLoadOptions post_load;
  post_load.compute_dtype = options.compute_dtype;
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      BuildPreparedModel(std::move(source), config, std::move(backend), post_load);
  if (!model.ok()) return KilnAnnotate(model.status(), path.string());
  (*model)->timings().open_seconds = open_seconds;
  return model;
}

}  // namespace kiln
