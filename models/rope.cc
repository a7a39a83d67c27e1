#include "models/rope.h"

#include <cmath>
#include <numbers>

namespace kiln {

// torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar; the order below matches.
std::vector<float> RopeInverseFrequencies(int64_t head_dim, double theta,
                                          const RopeScaling& scaling) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  const float base = static_cast<float>(theta);
  const float dim = static_cast<float>(head_dim);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(base, exponent);
  }
  if (!scaling.llama3) return inv_freq;
  const float factor = static_cast<float>(scaling.factor);
  const float low = static_cast<float>(scaling.low_freq_factor);
  const double old_context = scaling.original_max_position_embeddings;
  const float low_freq_wavelen = static_cast<float>(old_context / scaling.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context / scaling.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float high_minus_low =
      static_cast<float>(scaling.high_freq_factor - scaling.low_freq_factor);
  for (float& inv : inv_freq) {
    const float wavelen = (1.0f / inv) * two_pi;
    if (wavelen < high_freq_wavelen) continue;  // high frequency: kept
    if (wavelen > low_freq_wavelen) {           // low frequency: scaled down
      inv = inv / factor;
      continue;
    }
    const float smooth =
        ((1.0f / wavelen) * static_cast<float>(old_context) - low) / high_minus_low;
    inv = (1.0f - smooth) * inv / factor + smooth * inv;
  }
  return inv_freq;
}

}  // namespace kiln
