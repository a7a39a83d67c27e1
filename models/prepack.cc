#include "models/prepack.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace kiln {

std::map<std::string, PackedImage> PackedImagesOf(const PreparedModel& model, int* unpackable) {
  std::map<std::string, PackedImage> images;
  for (const auto& [name, linear] : model.linears_by_record()) {
    if (std::optional<PackedImage> image = linear->Image(); image.has_value()) {
      images.emplace(name, *std::move(image));
    }
  }
  if (unpackable != nullptr) *unpackable = model.linear_count() - static_cast<int>(images.size());
  return images;
}

absl::StatusOr<PrepackedCheckpoint> PrepackCheckpoint(const WeightSource& source,
                                                      const ModelConfig& config,
                                                      std::optional<DType> dtype,
                                                      std::shared_ptr<Backend> backend,
                                                      PostLoadOptions options) {
  PrepackedCheckpoint out;
  KILN_ASSIGN_OR_RETURN(out.layout, ToEngineLayout(source, config, dtype));
  WeightSource engine;
  engine.provenance() = source.provenance();
  engine.provenance().layout = WeightLayout::kEngine;
  for (const LayoutTensor& tensor : out.layout) {
    TensorRecord record;
    record.name = tensor.name;
    record.dtype = tensor.dtype;
    record.shape = tensor.shape;
    record.data = tensor.data;
    record.byte_size = tensor.size;
    record.origin = "engine layout";
    KILN_RETURN_IF_ERROR(engine.Add(std::move(record)));
  }
  // Only the weights are wanted: the smallest KV pool and step the model accepts.
  options.kv_pool.bytes = 0;
  options.kv_pool.default_sequences = 1;
  options.kv_pool.default_context = options.kv_pool.block_size;
  options.step_capacity = StepCapacity{1, 1, 1};
  KILN_ASSIGN_OR_RETURN(out.model,
                        BuildPreparedModel(std::move(engine), config, std::move(backend), options));
  out.packed = PackedImagesOf(*out.model, &out.unpackable);
  LOG(INFO) << "prepacked " << out.packed.size() << " of " << out.model->linear_count()
            << " linears on backend " << out.model->backend_name() << " ("
            << out.model->backend_description() << ")";
  return out;
}

}  // namespace kiln
