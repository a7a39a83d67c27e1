// Packing a checkpoint's linears ahead of time, for native tensorized files that hold them packed
// (`kiln tensorize --prepack`): a load of such a file adopts the packed bytes and packs nothing
// (docs/design.md, "Prepacked native files").
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/engine_layout.h"
#include "models/lifecycle.h"
#include "models/model_config.h"
#include "models/prepared_model.h"
#include "models/weight_source.h"

namespace kiln {

struct PrepackedCheckpoint {
  std::vector<LayoutTensor> layout;           // the engine-layout tensors the model reads
  std::unique_ptr<PreparedModel> model;       // prepared from them; its source() is what to write
  std::map<std::string, PackedImage> packed;  // by tensor name; point into `model`
  int unpackable = 0;  // linears prepared from several records or without an image: kept plain
};

// Each linear of `model` prepared from one record whose packed layout a file can hold, as its
// image under that record's name (pointing into `model`); the other linears are counted in
// `unpackable` when given.
std::map<std::string, PackedImage> PackedImagesOf(const PreparedModel& model,
                                                  int* unpackable = nullptr);

// Converts `source` to the engine layout (in `dtype` when set), prepares it on `backend` as a load
// would (options.quantize applies) and takes each linear's packed image under its tensor's name.
// Fails for a source that is already packed.
absl::StatusOr<PrepackedCheckpoint> PrepackCheckpoint(const WeightSource& source,
                                                      const ModelConfig& config,
                                                      std::optional<DType> dtype,
                                                      std::shared_ptr<Backend> backend,
                                                      PostLoadOptions options);

}  // namespace kiln
