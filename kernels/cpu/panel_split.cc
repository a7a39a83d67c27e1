#include "kernels/cpu/panel_split.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/step_team.h"

namespace kiln::cpu {

void ForPanelStreams(int64_t panels, int streams, int threads,
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
  // One panel from each sub-run of thread `owner` that has one left, from the front or the back.
  auto take = [&](int owner, bool from_front) {
    int64_t first[4];
    int n = 0;
    for (int s = 0; s < streams; ++s) {
      uint32_t p = 0;
      if (shared[owner * streams + s].Claim(from_front, &p)) first[n++] = p;
    }
    if (n > 0) group(first, n);
    return n > 0;
  };
  RunOnThreads(threads, [&](int t, int /*count*/) {
    while (take(t, /*from_front=*/true)) {
    }
    // Then the others' runs, from the back (also the runs of threads that did not start).
    for (int step = 1; step < threads; ++step) {
      while (take((t + step) % threads, /*from_front=*/false)) {
      }
    }
  });
}

}  // namespace kiln::cpu
