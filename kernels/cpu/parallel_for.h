// OpenMP loops that run serially, outside any OpenMP construct, when they are too small to split.
// `#pragma omp parallel if (false)` is not free: libgomp still builds and tears down a team of one
// thread for it, 1.8 µs on the 2-core EPYC VMs against 0.04 µs for the 896-value add it wraps in
// a decode step, and a 0.5B model's decode step passes about 120 such small ops.
#pragma once

#include <atomic>
#include <cstdint>

#include "kernels/cpu/step_team.h"

namespace kiln::cpu {

// body(i) for i in [0, n): split statically over the OpenMP threads (the step's team when the
// caller leads one, step_team.h) when `parallel`, otherwise in order on the calling thread.
template <typename Body>
inline void ParallelFor(int64_t n, bool parallel, Body&& body) {
  if (!parallel || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  if (StepTeam* team = StepTeam::Current(); team != nullptr) {
    team->Run(team->size(), [&](int t, int count) {
      for (int64_t i = n * t / count; i < n * (t + 1) / count; ++i) body(i);
    });
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// As ParallelFor, handing out one index at a time (for items of unequal cost).
template <typename Body>
inline void ParallelForDynamic(int64_t n, bool parallel, Body&& body) {
  if (!parallel || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  if (StepTeam* team = StepTeam::Current(); team != nullptr) {
    std::atomic<int64_t> next{0};
    team->Run(team->size(), [&](int, int) {
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        body(i);
      }
    });
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace kiln::cpu
