// Bind: checkpoint records → the architecture's parameters, by accounting (internal to models/).
#pragma once

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "models/load_report.h"
#include "models/manifest.h"
#include "models/model_config.h"
#include "models/mtp.h"
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
  std::vector<MtpHeadParams> mtp_heads;      // restored from `carried` by RestoreCarried
  LoadReport report;

  BoundModel() = default;
  BoundModel(BoundModel&&) = default;
  BoundModel& operator=(BoundModel&&) = default;
};

// Places every record the manifest names (checking shape), collects the rest as carried, and
// fails naming every missing required tensor or every shape mismatch.
absl::StatusOr<BoundModel> Bind(WeightSource source, const ModelConfig& config);

// Restores MTP heads from the carried set (models/mtp.h) into mtp_heads. Whatever no head takes
// moves to report.unplaced and is logged; nothing carried disappears without being listed. MTP
// tensors are restored even when config.json does not advertise them (with a warning), so a
// checkpoint whose config lost num_nextn_predict_layers still drafts.
absl::Status RestoreCarried(BoundModel& model);

}  // namespace kiln
