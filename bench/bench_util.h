// Small helpers the benchmark programs share.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "engine/argmax.h"

namespace kiln::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The median: these machines are noisy, so benchmarks report medians of repeated runs.
inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// The index of the largest logit, the greedy next token: the engine's own pick, so a bench's decode
// loop costs what serving's does.
inline int32_t Argmax(const std::vector<float>& logits) { return ArgmaxFirst(logits); }

}  // namespace kiln::bench
