// Converting a checkpoint to kiln's engine layout (fused q/k/v and gate/up), for writing native
// tensorized files. The parameters are found with the same manifest Bind uses; every tensor the
// manifest does not name (MTP heads, extras) is kept under its own name so that Restore finds
// it again in the written file.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "models/weight_source.h"

namespace kiln {

struct LayoutTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into `owned`, or into the source's records
  size_t size = 0;
  std::vector<std::byte> owned;  // set when the tensor was fused or converted

  LayoutTensor() = default;
  LayoutTensor(LayoutTensor&&) = default;  // a moved vector keeps its buffer, so `data` stays valid
  LayoutTensor& operator=(LayoutTensor&&) = default;
  LayoutTensor(const LayoutTensor&) = delete;
  LayoutTensor& operator=(const LayoutTensor&) = delete;
};

// `source` in either layout → engine layout, in manifest order followed by the carried tensors
// in source order. `dtype` converts every tensor (F32 or BF16); unset keeps each one's dtype.
// Fails naming the tensor when a required parameter is absent or mis-shaped.
absl::StatusOr<std::vector<LayoutTensor>> ToEngineLayout(const WeightSource& source,
                                                         const ModelConfig& config,
                                                         std::optional<DType> dtype);

}  // namespace kiln
