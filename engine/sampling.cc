#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/argmax.h"

namespace kiln {
namespace {

// log-softmax normaliser of raw logits: log Σ exp(x).
float LogSumExp(std::span<const float> logits) {
  const float max = MaxValue(logits);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  return max + static_cast<float>(std::log(sum));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](const char* field, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", field, " ", rule));
  };
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return bad("temperature", "must be ≥ 0");
  }
  if (p.top_k < 0) return bad("top_k", "must be ≥ 0 (0 turns it off)");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", "must be in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", "must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return bad("repetition_penalty", "must be > 0 (1 turns it off)");
  }
  if (!std::isfinite(p.presence_penalty) || std::abs(p.presence_penalty) > 2.0f) {
    return bad("presence_penalty", "must be in [-2, 2]");
  }
  if (!std::isfinite(p.frequency_penalty) || std::abs(p.frequency_penalty) > 2.0f) {
    return bad("frequency_penalty", "must be in [-2, 2]");
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt)
    : params_(params), rng_(seed) {
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t token : prompt) ++prompt_counts_[token];
  }
}

void Sampler::Accept(int32_t token_id) { ++output_counts_[token_id]; }

void Sampler::ApplyPenalties(std::span<float> logits) const {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t token) {
      if (token < 0 || token >= vocab) return;
      float& x = logits[static_cast<size_t>(token)];
      x = x > 0 ? x / params_.repetition_penalty : x * params_.repetition_penalty;
    };
    for (const auto& [token, count] : prompt_counts_) {
      if (!output_counts_.contains(token)) penalize(token);
    }
    for (const auto& [token, count] : output_counts_) penalize(token);
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [token, count] : output_counts_) {
      if (token < 0 || token >= vocab) continue;
      logits[static_cast<size_t>(token)] -=
          params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
    }
  }
}

SampledToken Sampler::Describe(std::span<const float> logits, int32_t token_id,
                               int32_t top_logprobs) {
  SampledToken result;
  result.token_id = token_id;
  // Log-probabilities describe the model's own distribution, before any processing.
  const float log_normalizer = LogSumExp(logits);
  if (top_logprobs > 0) {
    const size_t n = std::min<size_t>(static_cast<size_t>(top_logprobs), logits.size());
    std::vector<std::pair<float, int32_t>> order;
    order.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i)
      order.emplace_back(logits[i], static_cast<int32_t>(i));
    std::partial_sort(order.begin(), order.begin() + static_cast<long>(n), order.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < n; ++i) {
      result.top.push_back({order[i].second, order[i].first - log_normalizer});
    }
  }
  result.logprob = logits[static_cast<size_t>(token_id)] - log_normalizer;
  return result;
}

size_t Sampler::Truncate(std::span<const float> logits) {
  scratch_.clear();
  for (size_t i = 0; i < logits.size(); ++i) {
    scratch_.emplace_back(logits[i] / params_.temperature, static_cast<int32_t>(i));
  }
  const auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first; };
  const auto begin = scratch_.begin();
  // top_k: the candidates are the k largest (in any order so far).
  size_t limit = scratch_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < limit) {
    limit = static_cast<size_t>(params_.top_k);
    std::nth_element(begin, begin + static_cast<long>(limit - 1), scratch_.end(), by_logit);
  }
  const float max =
      std::max_element(begin, begin + static_cast<long>(limit), [](const auto& a, const auto& b) {
        return a.first < b.first;
      })->first;
  double total = 0;
  for (size_t i = 0; i < limit; ++i)
    total += std::exp(static_cast<double>(scratch_[i].first - max));
  // Sorted only as far as top-p and min-p can keep: a vocabulary of 150k tokens under top_p 0.9
  // usually needs tens of them sorted, not all.
  size_t sorted = std::min<size_t>(limit, 64);
  while (true) {
    std::partial_sort(begin, begin + static_cast<long>(sorted), begin + static_cast<long>(limit),
                      by_logit);
    if (sorted == limit) break;
    const bool top_p = params_.top_p < 1.0f;
    const bool min_p = params_.min_p > 0.0f;
    double mass = 0;
    for (size_t i = 0; i < sorted; ++i)
      mass += std::exp(static_cast<double>(scratch_[i].first - max));
    const double last = std::exp(static_cast<double>(scratch_[sorted - 1].first - max));
    // More may be kept when top-p's mass is not reached yet, when the last sorted token still
    // passes min-p, or when top-k alone decides (all of its candidates are kept).
    const bool more = (!top_p && !min_p) || (top_p && mass / total < params_.top_p) ||
                      (min_p && last >= params_.min_p);
    if (!more) break;
    sorted = std::min(limit, sorted * 4);
  }
  size_t keep = sorted;
  weights_.resize(keep);
  for (size_t i = 0; i < keep; ++i) {
    weights_[i] = std::exp(static_cast<double>(scratch_[i].first - max));
  }
  // top_p: the smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double mass = 0;
    size_t kept = 0;
    while (kept < keep) {
      mass += weights_[kept] / total;
      ++kept;
      if (mass >= params_.top_p) break;
    }
    keep = kept;
  }
  // min_p: drop tokens below min_p × the top probability.
  if (params_.min_p > 0.0f) {
    size_t kept = 0;
    while (kept < keep && weights_[kept] >= params_.min_p * weights_[0]) ++kept;
    keep = std::max<size_t>(kept, 1);
  }
  return keep;
}

SampledToken Sampler::Sample(std::span<float> logits, int32_t top_logprobs) {
  // Log-probabilities describe the logits before penalties, and cost a pass of exp over the
  // vocabulary: only when asked for.
  std::vector<float> raw;
  if (top_logprobs > 0) raw.assign(logits.begin(), logits.end());

  ApplyPenalties(logits);
  int32_t token_id = 0;
  if (params_.temperature == 0.0f) {
    token_id = ArgmaxFirst(logits);
  } else if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p == 0.0f) {
    // Plain sampling at the temperature: no sort needed.
    const float max = MaxValue(logits);
    double total = 0;
    for (float& x : logits) {
      x = static_cast<float>(std::exp(static_cast<double>((x - max) / params_.temperature)));
      total += x;
    }
    const double draw = std::uniform_real_distribution<double>(0.0, total)(rng_);
    double cumulative = 0;
    token_id = static_cast<int32_t>(logits.size()) - 1;
    for (size_t i = 0; i < logits.size(); ++i) {
      cumulative += logits[i];
      if (draw < cumulative) {
        token_id = static_cast<int32_t>(i);
        break;
      }
    }
  } else {
    // Candidates sorted by logit, then softmax over them at the temperature.
    const size_t keep = Truncate(logits);
    double kept_total = 0;
    for (size_t i = 0; i < keep; ++i) kept_total += weights_[i];
    const double draw = std::uniform_real_distribution<double>(0.0, kept_total)(rng_);
    double cumulative = 0;
    token_id = scratch_[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += weights_[i];
      if (draw < cumulative) {
        token_id = scratch_[i].second;
        break;
      }
    }
  }
  if (top_logprobs == 0) return SampledToken{token_id, 0.0f, {}};
  return Describe(raw, token_id, top_logprobs);
}

std::span<const float> Sampler::Penalized(std::span<const float> logits) {
  const bool penalties = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                         params_.frequency_penalty != 0.0f;
  if (!penalties) return logits;  // spares a vocab-sized copy per verified position
  penalized_.assign(logits.begin(), logits.end());
  ApplyPenalties(penalized_);
  return penalized_;
}

int32_t Sampler::Argmax(std::span<const float> logits) {
  const std::span<const float> x = Penalized(logits);
  return ArgmaxFirst(x);
}

void Sampler::Distribution(std::span<const float> logits, std::vector<float>* probs) {
  const std::span<const float> x = Penalized(logits);
  probs->assign(x.size(), 0.0f);
  if (params_.temperature == 0.0f) {
    (*probs)[static_cast<size_t>(ArgmaxFirst(x))] = 1.0f;
  } else if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p == 0.0f) {
    const float max = MaxValue(x);
    double total = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      // The same float rounding as Sample's fast path.
      (*probs)[i] =
          static_cast<float>(std::exp(static_cast<double>((x[i] - max) / params_.temperature)));
      total += (*probs)[i];
    }
    for (float& p : *probs) p = static_cast<float>(p / total);
  } else {
    const size_t keep = Truncate(x);
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += weights_[i];
    for (size_t i = 0; i < keep; ++i) {
      (*probs)[static_cast<size_t>(scratch_[i].second)] = static_cast<float>(weights_[i] / total);
    }
  }
}

int32_t Sampler::Draw(std::span<const float> weights) {
  double total = 0;
  for (float w : weights) total += w;
  const double draw = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double cumulative = 0;
  int32_t last_positive = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0f) continue;
    cumulative += weights[i];
    last_positive = static_cast<int32_t>(i);
    if (draw < cumulative) return last_positive;
  }
  return last_positive;  // rounding left the draw past the last step
}

double Sampler::Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

}  // namespace kiln
