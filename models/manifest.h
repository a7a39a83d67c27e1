// The parameter manifest of an architecture: every tensor it places, with its shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_config.h"
#include "models/weight_source.h"

namespace kiln {

enum class ParamRole {
  kEmbedding,
  kLmHead,
  kFinalNorm,
  kInputNorm,
  kPostAttentionNorm,
  kQ,
  kK,
  kV,
  kO,
  kQBias,
  kKBias,
  kVBias,
  kOBias,
  kQNorm,
  kKNorm,
  kGate,
  kUp,
  kDown,
  // Engine layout only: fused projections.
  kQKV,
  kQKVBias,
  kGateUp,
};
inline constexpr int kNumParamRoles = static_cast<int>(ParamRole::kGateUp) + 1;

struct ParamSpec {
  std::string name;  // checkpoint name in the layout the manifest was built for
  std::vector<int64_t> shape;
  ParamRole role;
  int64_t layer = -1;  // -1 for model-level parameters
  bool required = true;
};

// Every parameter the architecture described by `config` places, named and shaped as `layout`
// stores it.
std::vector<ParamSpec> BuildParamManifest(const ModelConfig& config,
                                          WeightLayout layout = WeightLayout::kHuggingFace);

}  // namespace kiln
