// Model messages ↔ registry types: ModelInfo from snapshots, ModelSpec from requests.
#pragma once

#include "kiln/v1/kiln.pb.h"
#include "server/registry.h"

namespace kiln {

// Every field that the snapshot's state allows: name, state, path and error always; the
// architecture, dtype, sizes, format, loader, timings and load report once the model is loaded.
void FillModelInfo(const ModelSnapshot& snapshot, v1::ModelInfo* info);

// A LoadModelRequest or a ServerConfig.models entry as a ModelSpec (validated by the registry).
ModelSpec ModelSpecFromProto(const v1::LoadModelRequest& request);
ModelSpec ModelSpecFromProto(const v1::ModelConfigEntry& entry);

}  // namespace kiln
