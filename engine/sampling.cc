#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// log-softmax normaliser of raw logits: log Σ exp(x).
float LogSumExp(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
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

SampledToken Sampler::Sample(std::span<float> logits, int32_t top_logprobs) {
  SampledToken result;
  // Log-probabilities describe the model's own distribution, before any processing.
  const float log_normalizer = LogSumExp(logits);
  if (top_logprobs > 0) {
    const size_t n = std::min<size_t>(static_cast<size_t>(top_logprobs), logits.size());
    scratch_.clear();
    for (size_t i = 0; i < logits.size(); ++i) {
      scratch_.emplace_back(logits[i], static_cast<int32_t>(i));
    }
    std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<long>(n), scratch_.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < n; ++i) {
      result.top.push_back({scratch_[i].second, scratch_[i].first - log_normalizer});
    }
  }
  std::vector<float> raw;
  raw.assign(logits.begin(), logits.end());

  ApplyPenalties(logits);
  if (params_.temperature == 0.0f) {
    result.token_id =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else if (params_.top_k == 0 && params_.top_p >= 1.0f && params_.min_p == 0.0f) {
    // Plain sampling at the temperature: no sort needed.
    const float max = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (float& x : logits) {
      x = static_cast<float>(std::exp(static_cast<double>((x - max) / params_.temperature)));
      total += x;
    }
    const double draw = std::uniform_real_distribution<double>(0.0, total)(rng_);
    double cumulative = 0;
    result.token_id = static_cast<int32_t>(logits.size()) - 1;
    for (size_t i = 0; i < logits.size(); ++i) {
      cumulative += logits[i];
      if (draw < cumulative) {
        result.token_id = static_cast<int32_t>(i);
        break;
      }
    }
  } else {
    // Candidates sorted by logit, then softmax over them at the temperature.
    scratch_.clear();
    for (size_t i = 0; i < logits.size(); ++i) {
      scratch_.emplace_back(logits[i] / params_.temperature, static_cast<int32_t>(i));
    }
    size_t keep = scratch_.size();
    if (params_.top_k > 0) keep = std::min<size_t>(keep, static_cast<size_t>(params_.top_k));
    std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<long>(keep), scratch_.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    const float max = scratch_.front().first;
    std::vector<double> probs(keep);
    double total = 0;
    for (size_t i = 0; i < keep; ++i) {
      probs[i] = std::exp(static_cast<double>(scratch_[i].first - max));
      total += probs[i];
    }
    // top_p: the smallest prefix whose mass reaches top_p.
    if (params_.top_p < 1.0f) {
      double mass = 0;
      size_t kept = 0;
      while (kept < keep) {
        mass += probs[kept] / total;
        ++kept;
        if (mass >= params_.top_p) break;
      }
      keep = kept;
    }
    // min_p: drop tokens below min_p × the top probability.
    if (params_.min_p > 0.0f) {
      size_t kept = 0;
      while (kept < keep && probs[kept] >= params_.min_p * probs[0]) ++kept;
      keep = std::max<size_t>(kept, 1);
    }
    double kept_total = 0;
    for (size_t i = 0; i < keep; ++i) kept_total += probs[i];
    const double draw = std::uniform_real_distribution<double>(0.0, kept_total)(rng_);
    double cumulative = 0;
    result.token_id = scratch_[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (draw < cumulative) {
        result.token_id = scratch_[i].second;
        break;
      }
    }
  }
  result.logprob = raw[static_cast<size_t>(result.token_id)] - log_normalizer;
  return result;
}

}  // namespace kiln
