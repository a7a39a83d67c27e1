#include "loaders/load_model.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "loaders/model_root.h"
#include "loaders/safetensors.h"

namespace kiln {

namespace fs = std::filesystem;

absl::string_view CheckpointFormatName(CheckpointFormat format) {
  return format == CheckpointFormat::kTensorizer ? "tensorizer" : "safetensors";
}

absl::StatusOr<CheckpointLocation> SniffCheckpoint(const fs::path& path) {
  std::error_code error;
  if (fs::is_regular_file(path, error)) {
    if (!HasTensorizerMagic(path)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(),
                       " is a file but not a Tensorizer file (no \"|TZR|\" magic); give a "
                       "model directory or a .tensors file"));
    }
    return CheckpointLocation{CheckpointFormat::kTensorizer, path.parent_path(), path};
  }
  if (!fs::is_directory(path, error)) {
    return absl::NotFoundError(
        absl::StrCat(path.string(), " is neither a model directory nor a Tensorizer file"));
  }
  if (fs::exists(path / "model.safetensors.index.json", error) ||
      fs::exists(path / "model.safetensors", error)) {
    return CheckpointLocation{CheckpointFormat::kSafetensors, path, {}};
  }
  // vLLM's default name inside a tensorizer directory, else the only .tensors file.
  if (fs::is_regular_file(path / "model.tensors", error)) {
    return CheckpointLocation{CheckpointFormat::kTensorizer, path, path / "model.tensors"};
  }
  std::vector<fs::path> tensors_files;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, error)) {
    if (entry.path().extension() == ".tensors" && entry.is_regular_file(error)) {
      tensors_files.push_back(entry.path());
    }
  }
  if (tensors_files.size() == 1) {
    return CheckpointLocation{CheckpointFormat::kTensorizer, path, tensors_files.front()};
  }
  if (tensors_files.size() > 1) {
    std::vector<std::string> names;
    for (const fs::path& file : tensors_files) names.push_back(file.filename().string());
    std::sort(names.begin(), names.end());
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " holds several Tensorizer files (", absl::StrJoin(names, ", "),
                     "); name the one to load"));
  }
  return absl::NotFoundError(
      absl::StrCat(path.string(),
                   " holds no checkpoint kiln can read (looked for model.safetensors.index.json, "
                   "model.safetensors, model.tensors and *.tensors)"));
}

absl::StatusOr<std::map<std::string, std::string>> ReadSideFiles(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                           "encoder.json", "vocab.bpe", "chat_template.jinja"}) {
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(dir / name, ec))) continue;
    KILN_ASSIGN_OR_RETURN(fs::path path, ResolveInsideRoot(dir, name));
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
    files[name].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return files;
}

absl::StatusOr<OpenedCheckpoint> OpenCheckpoint(const fs::path& path, const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  OpenedCheckpoint opened;
  KILN_ASSIGN_OR_RETURN(opened.location, SniffCheckpoint(path));
  switch (opened.location.format) {
    case CheckpointFormat::kSafetensors: {
      KILN_ASSIGN_OR_RETURN(opened.config,
                            ReadModelConfig((opened.location.dir / "config.json").string()));
      KILN_ASSIGN_OR_RETURN(opened.source, OpenSafetensorsCheckpoint(opened.location.dir));
      break;
    }
    case CheckpointFormat::kTensorizer: {
      KILN_ASSIGN_OR_RETURN(TensorizerCheckpoint checkpoint,
                            OpenTensorizerCheckpoint(opened.location.file, options.tensorizer));
      opened.config = std::move(checkpoint.config);
      opened.source = std::move(checkpoint.source);
      opened.side_files = std::move(checkpoint.embedded_files);
      break;
    }
  }
  if (opened.side_files.empty()) {
    KILN_ASSIGN_OR_RETURN(opened.side_files, ReadSideFiles(opened.location.dir));
  }
  opened.open_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const SourceProvenance& provenance = opened.source.provenance();
  LOG(INFO) << "opened " << path.string() << ": " << provenance.format << " ("
            << provenance.format_version << "), " << provenance.files.size() << " file(s), "
            << opened.source.records().size() << " tensors, " << provenance.bytes_read << " bytes, "
            << opened.side_files.size() << " side file(s), load mode "
            << LoadModeName(provenance.load_mode) << ", " << opened.open_seconds << " s";
  return opened;
}

absl::StatusOr<std::unique_ptr<PreparedModel>> PrepareCheckpoint(OpenedCheckpoint opened,
                                                                 std::shared_ptr<Backend> backend,
                                                                 const LoadOptions& options) {
  PostLoadOptions post_load;
  post_load.compute_dtype = options.compute_dtype;
  post_load.quantize = options.quantize;
  post_load.step_capacity = options.step_capacity;
  post_load.kv_pool = options.kv_pool;
  const std::string where =
      opened.location.file.empty() ? opened.location.dir.string() : opened.location.file.string();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      BuildPreparedModel(std::move(opened.source), opened.config, std::move(backend), post_load);
  if (!model.ok()) return KilnAnnotate(model.status(), where);
  (*model)->timings().open_seconds = opened.open_seconds;
  return model;
}

absl::StatusOr<std::unique_ptr<PreparedModel>> LoadModel(const fs::path& path,
                                                         std::shared_ptr<Backend> backend,
                                                         const LoadOptions& options) {
  KILN_ASSIGN_OR_RETURN(OpenedCheckpoint opened, OpenCheckpoint(path, options));
  return PrepareCheckpoint(std::move(opened), std::move(backend), options);
}

}  // namespace kiln
