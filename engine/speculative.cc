#include "engine/speculative.h"

#include <algorithm>

namespace kiln {

Verification VerifyDraft(Sampler& sampler, std::span<const float> rows, int64_t vocab,
                         const Draft& draft, int32_t top_logprobs) {
  Verification result;
  const size_t k = draft.tokens.size();
  const size_t v = static_cast<size_t>(vocab);
  std::vector<float> p, residual;
  for (size_t i = 0; i <= k; ++i) {
    const std::span<const float> row = rows.subspan(i * v, v);
    const bool bonus = i == k;
    int32_t token = 0;
    bool kept = false;
    if (sampler.greedy()) {
      token = sampler.Argmax(row);
      kept = !bonus && token == draft.tokens[i];
    } else {
      sampler.Distribution(row, &p);
      if (bonus) {
        token = sampler.Draw(p);
      } else {
        const int32_t x = draft.tokens[i];
        const size_t xi = static_cast<size_t>(x);
        const float q_x = draft.probs.empty() ? 1.0f : draft.probs[i][xi];
        // p(x) ≥ q(x) accepts for sure and spends no draw.
        kept = p[xi] >= q_x || sampler.Uniform() < static_cast<double>(p[xi]) / q_x;
        if (kept) {
          token = x;
        } else {
          residual.assign(v, 0.0f);
          double mass = 0;
          for (size_t j = 0; j < v; ++j) {
            const float q = draft.probs.empty() ? (j == xi ? 1.0f : 0.0f) : draft.probs[i][j];
            residual[j] = std::max(p[j] - q, 0.0f);
            mass += residual[j];
          }
          // In exact arithmetic a rejection implies mass ≥ q(x) − p(x) > 0; rounding could
          // leave nothing only when p and q coincide, and then p is the right distribution.
          token = mass > 0 ? sampler.Draw(residual) : sampler.Draw(p);
        }
      }
    }
    // Log-probabilities cost a pass of exp over the vocabulary: only when asked for.
    result.tokens.push_back(top_logprobs > 0 ? Sampler::Describe(row, token, top_logprobs)
                                             : SampledToken{token, 0.0f, {}});
    sampler.Accept(token);
    if (!kept) break;
    ++result.accepted;
  }
  return result;
}

}  // namespace kiln
