// Model messages ↔ registry types: ModelInfo from snapshots, ModelSpec from requests.
#pragma once

#include "kiln/v1/kiln.pb.h"
#include "server/registry.h"

namespace kiln {

// Every field that the snapshot's state allows: name, state, path and error always; the
// architecture, dtype, sizes, format, loader, timings and load report once the model is loaded.
void FillModelInfo(const ModelSnapshot& snapshot, v1::ModelInfo* info);

// LoadModelRequest / ServerConfig.models entries as a ModelSpec (not yet validated).
ModelSpec ModelSpecFromProto(const std::string& name, const std::string& path,
                             const std::string& format, const std::string& dtype,
                             const v1::TensorizerOptions& tensorizer);

}  // namespace kiln
