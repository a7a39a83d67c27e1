// One decoder block (attention + gated MLP, Llama family), batched over all tokens of a step.
// The main model's layers and the MTP heads' blocks run through this one implementation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "models/kv_cache.h"
#include "models/model_config.h"

namespace kiln {

// A decoder block after PostLoad: packed projections, fp32 norms. q_norm/k_norm are empty
// unless the architecture has per-head q/k norms.
struct DecoderLayerWeights {
  std::vector<float> input_norm, post_attention_norm, q_norm, k_norm;
  std::unique_ptr<PackedLinear> qkv, o, gate_up, down;

  // Packed weights plus norms.
  size_t bytes() const;
};

// The rows of one sequence in a batched step: `count` new tokens appended to `cache`, whose
// length() is the position of the first of them.
struct DecoderRows {
  KvCache* cache = nullptr;
  int64_t count = 0;
};

// Activation buffers of one step, reused across steps by each calling thread.
struct DecoderScratch {
  std::vector<float> normed, qkv, attention, projected, gate_up, activated;
  std::vector<int32_t> positions;

  // Sizes the buffers for `total` rows and fills `positions` from the caches' lengths.
  void Prepare(const ModelConfig& config, std::span<const DecoderRows> rows, int64_t total);
  static DecoderScratch& ForThisThread();
};

// x ← block(x) for `total` rows (the sequences of `rows`, in order); writes the new keys and
// values into layer `cache_layer` of each sequence's cache. Cache lengths are not advanced: the
// caller does that once every layer has run. `scratch` must have been prepared for these rows.
absl::Status RunDecoderLayer(const ModelConfig& config, const DecoderLayerWeights& layer,
                             const cpu::RopeTable& rope, int64_t cache_layer,
                             std::span<const DecoderRows> rows, int64_t total, float* x,
                             DecoderScratch& scratch);

}  // namespace kiln
