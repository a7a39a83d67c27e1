// One decoder block (attention + gated MLP, Llama family) written once against the backend's op
// set, batched over all rows of a step. The main model's layers and the MTP heads' blocks run
// through it on every backend.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "models/model_config.h"
#include "models/step_buffers.h"

namespace kiln {

// A decoder block after PostLoad: packed projections and fp32 norms in the backend's memory.
// q_norm/k_norm are empty unless the architecture has per-head q/k norms.
struct DecoderLayerWeights {
  TensorView input_norm, post_attention_norm, q_norm, k_norm;
  std::unique_ptr<PackedLinear> qkv, o, gate_up, down;

  // Packed weights plus norms.
  size_t bytes() const;
};

AttentionShape AttentionShapeOf(const ModelConfig& config);

// x ← block(x) for the current step's rows, x being buffers.residual; writes the rows' keys and
// values into layer `cache_layer` of their sequences' caches (the caller advances the caches'
// lengths once every layer has run).
absl::Status RunDecoderLayer(ExecutionContext& context, const ModelConfig& config,
                             const DecoderLayerWeights& layer, const TensorView& rope_inv_freq,
                             int64_t cache_layer, const StepBuffers& buffers);

}  // namespace kiln
