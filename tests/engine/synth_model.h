// The engine tests' models: a synthetic checkpoint written into a scratch directory and loaded
// on the CPU backend, through the same LoadModel path as the server.
#pragma once

#include <filesystem>
#include <memory>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "clients/synth.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"

namespace kiln::testing_util {

inline absl::StatusOr<std::unique_ptr<PreparedModel>> WriteAndLoad(const std::filesystem::path& dir,
                                                                   const ModelConfig& config,
                                                                   const SynthOptions& options) {
  KILN_RETURN_IF_ERROR(WriteSynthCheckpoint(dir, config, options));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  return LoadModel(dir, std::shared_ptr<Backend>(std::move(backend)));
}

}  // namespace kiln::testing_util
