// ModelInfo messages from registry snapshots.
#pragma once

#include "kiln/v1/kiln.pb.h"
#include "server/registry.h"

namespace kiln {

// Every field that the snapshot's state allows: name, state, path and error always; the
// architecture, dtype, sizes, format, loader, timings and load report once the model is loaded.
void FillModelInfo(const ModelSnapshot& snapshot, v1::ModelInfo* info);

}  // namespace kiln
