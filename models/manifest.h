// The parameter manifest of an architecture: every tensor it places, with its shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model_config.h"

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
};
inline constexpr int kNumParamRoles = static_cast<int>(ParamRole::kDown) + 1;

struct ParamSpec {
  std::string name;  // Hugging Face checkpoint name
  std::vector<int64_t> shape;
  ParamRole role;
  int64_t layer = -1;  // -1 for model-level parameters
  bool required = true;
};

// Every parameter the architecture described by `config` places, in checkpoint naming.
std::vector<ParamSpec> BuildParamManifest(const ModelConfig& config);

}  // namespace kiln
