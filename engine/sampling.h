// Turning one row of logits into the next token: penalties, temperature, top-k/top-p/min-p, a
// seeded random draw, and log-probabilities for the response.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace kiln {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // Hugging Face style, over prompt and output; 1 = off
  float presence_penalty = 0.0f;    // OpenAI style, over output tokens
  float frequency_penalty = 0.0f;   // OpenAI style, over output tokens
  std::optional<uint64_t> seed;     // unset: drawn from the engine's generator
};

// InvalidArgument naming the field (e.g. "sampling.top_p must be in (0, 1]").
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;           // of the chosen token under the model's distribution
  std::vector<TokenLogprob> top;  // the n most likely tokens, when asked for
};

// Per-sequence sampling state: its random generator and the token counts penalties need.
class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt);

  // Samples from `logits` (vocab values; modified in place). `top_logprobs` > 0 also returns the
  // chosen token's log-probability and the most likely tokens with theirs (0: logprob stays 0,
  // sparing a pass of exp over the vocabulary).
  SampledToken Sample(std::span<float> logits, int32_t top_logprobs);
  // Records a token that became part of the output (sampled or accepted).
  void Accept(int32_t token_id);

  // The following serve speculative decoding, which needs the distribution Sample draws from.
  bool greedy() const { return params_.temperature == 0.0f; }
  // The token greedy sampling picks: the argmax after penalties.
  int32_t Argmax(std::span<const float> logits);
  // Writes to `probs` (resized to vocab) the distribution Sample draws from given the tokens
  // accepted so far: penalties, temperature, top-k, top-p, min-p. Greedy gives a one-hot vector.
  void Distribution(std::span<const float> logits, std::vector<float>* probs);
  // Draws an index with probability proportional to `weights` (non-negative, sum > 0).
  int32_t Draw(std::span<const float> weights);
  // A uniform draw in [0, 1) from this sampler's generator.
  double Uniform();
  // The chosen token's log-probability under the model's raw distribution, plus the
  // `top_logprobs` most likely tokens: what Sample reports.
  static SampledToken Describe(std::span<const float> logits, int32_t token_id,
                               int32_t top_logprobs);

 private:
  void ApplyPenalties(std::span<float> logits) const;
  // `logits` with penalties applied (a copy in penalized_ when there are any).
  std::span<const float> Penalized(std::span<const float> logits);
  // Sorts the candidates that survive top-k into scratch_ (logit / temperature, id) and writes
  // their unnormalized weights after top-p and min-p to weights_; returns how many remain.
  size_t Truncate(std::span<const float> logits);

  SamplingParams params_;
  std::mt19937_64 rng_;
  absl::flat_hash_map<int32_t, int32_t> prompt_counts_;
  absl::flat_hash_map<int32_t, int32_t> output_counts_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<double> weights_;
  std::vector<float> penalized_;
};

}  // namespace kiln
