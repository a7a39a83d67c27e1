// The activations of one step, as views into the execution context's arena. Sized once at
// PostLoad for the largest step the model runs in one go (StepCapacity); larger steps run as
// several sub-steps, so no step allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"
#include "models/model_config.h"

namespace kiln {

struct StepCapacity {
  int64_t max_rows = 1024;        // tokens of one sub-step (all sequences together)
  int64_t max_sequences = 256;    // sequences of one sub-step
  int64_t max_logits_rows = 256;  // rows the LM head runs on at once
};

struct StepBuffers {
  // [max_rows, width]
  TensorView residual, normed, qkv, attention, projected, gate_up, activated;
  // The MTP draft step's inputs (only when the model has MTP heads): [max_rows, width]
  TensorView embedded, concat, hidden_in;
  // The LM head: [max_logits_rows, hidden] and [max_logits_rows, vocab]
  TensorView selected, logits;

  // Arena bytes for `capacity` (each view kTensorAlignment-aligned).
  static size_t Bytes(const ModelConfig& config, const StepCapacity& capacity, bool mtp);
  // Views into `arena`, which holds at least Bytes() bytes.
  static StepBuffers Carve(const DeviceBuffer& arena, const ModelConfig& config,
                           const StepCapacity& capacity, bool mtp);
};

}  // namespace kiln
