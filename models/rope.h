// Rotary position embedding parameters and the RoPE table PostLoad places on the backend.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

// Llama-3 style scaling of the inverse frequencies (config.json "rope_scaling" with
// rope_type "llama3").
struct RopeScaling {
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// The head_dim / 2 inverse frequencies of the Hugging Face "rotate_half" convention (rotary_dim
// == head_dim for every architecture kiln supports), computed op by op in fp32 as transformers'
// _compute_default_rope_parameters and _compute_llama3_parameters do. The RopeAndAppendKv op
// rotates by position · inv_freq[i].
std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta,
                                          const RopeScaling& scaling);

}  // namespace kiln
