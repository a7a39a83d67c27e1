// Bind: checkpoint records → the architecture's parameters, by accounting (internal to models/).
#pragma once

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "models/load_report.h"
#include "models/manifest.h"
#include "models/model_config.h"
#include "models/weight_source.h"

namespace kiln {

// Records of one decoder layer (or of the model level), indexed by ParamRole; null if absent.
using BoundParams = std::array<const TensorRecord*, kNumParamRoles>;

// The output of Bind and Restore, the input of PostLoad. Has no forward pass.
struct BoundModel {
  ModelConfig config;
  WeightSource source;
  BoundParams model_params{};                // embedding, lm_head, final norm
  std::vector<BoundParams> layers;           // one per decoder layer
  std::vector<const TensorRecord*> carried;  // checkpoint tensors the manifest does not name
  LoadReport report;

  BoundModel() = default;
  BoundModel(BoundModel&&) = default;
  BoundModel& operator=(BoundModel&&) = default;
};

// Places every record the manifest names (checking shape), collects the rest as carried, and
// fails naming every missing required tensor or every shape mismatch.
absl::StatusOr<BoundModel> Bind(WeightSource source, const ModelConfig& config);

// Restores MTP heads from the carried set. Whatever no head takes moves to report.unplaced and
// is logged; nothing carried disappears without being listed.
absl::Status RestoreCarried(BoundModel& model);

}  // namespace kiln
