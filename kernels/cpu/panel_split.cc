#include "kernels/cpu/panel_split.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/step_team.h"

namespace kiln::cpu {

void ForPanelStreams(int64_t panels, int streams, int threads,
                     absl::FunctionRef<void(const int64_t* first, int count)> group) {
  ForPanelStreams(
      panels, streams, threads, [](const int64_t*, int) {}, group);
}

void ForPanelStreams(int64_t panels, int streams, int threads,
                     absl::FunctionRef<void(const int64_t* first, int count)> start,
                     absl::FunctionRef<void(const int64_t* first, int count)> group) {
  if (panels <= 0) return;
  streams = std::clamp(streams, 1, 4);
  threads = static_cast<int>(std::clamp<int64_t>(threads, 1, panels));
  // Per calling thread; only grows. Sub-run (t, s) is runs[t * streams + s].
  thread_local std::vector<PanelRun> runs;
  const size_t count = static_cast<size_t>(threads) * static_cast<size_t>(streams);
  if (runs.size() < count) runs = std::vector<PanelRun>(count);
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = panels * t / threads, length = panels * (t + 1) / threads - begin;
    for (int s = 0; s < streams; ++s) {
      runs[static_cast<size_t>(t * streams + s)].Reset(
          static_cast<uint32_t>(begin + length * s / streams),
          static_cast<uint32_t>(begin + length * (s + 1) / streams));
    }
  }
  PanelRun* const shared = runs.data();
  // Thread `owner`'s next panels from the front of each of its sub-runs, read side by side, one
  // of each a call.
  auto take_own = [&](int owner) {
    uint32_t first[4], claimed[4], most = 0;
    for (int s = 0; s < streams; ++s) {
      claimed[s] = shared[owner * streams + s].Claim(/*from_front=*/true, &first[s]);
      most = std::max(most, claimed[s]);
    }
    for (uint32_t i = 0; i < most; ++i) {
      int64_t panel[4];
      int n = 0;
      for (int s = 0; s < streams; ++s) {
        if (i < claimed[s]) panel[n++] = first[s] + i;
      }
      group(panel, n);
    }
    return most > 0;
  };
  // One panel from the back of each sub-run of thread `owner` that has one left.
  auto take_back = [&](int owner) {
    int64_t panel[4];
    int n = 0;
    for (int s = 0; s < streams; ++s) {
      uint32_t p = 0;
      if (shared[owner * streams + s].Claim(/*from_front=*/false, &p) > 0) panel[n++] = p;
    }
    if (n > 0) group(panel, n);
    return n > 0;
  };
  RunOnThreads(threads, [&](int t, int /*count*/) {
    int64_t first[4];
    int starts = 0;
    for (int s = 0; s < streams; ++s) {
      const uint64_t bounds = shared[t * streams + s].bounds.load(std::memory_order_relaxed);
      const auto front = static_cast<uint32_t>(bounds);
      if (front < static_cast<uint32_t>(bounds >> 32)) first[starts++] = front;
    }
    start(first, starts);
    while (take_own(t)) {
    }
    // Then the others' runs, from the back (also the runs of threads that did not start).
    for (int step = 1; step < threads; ++step) {
      while (take_back((t + step) % threads)) {
      }
    }
  });
}

}  // namespace kiln::cpu
