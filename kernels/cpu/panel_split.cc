#include "kernels/cpu/panel_split.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/step_team.h"

namespace kiln::cpu {

void ForPanelsBalanced(int64_t panels, int64_t chunk, int threads,
                       absl::FunctionRef<void(int64_t begin, int64_t end)> run) {
  chunk = std::max<int64_t>(1, chunk);
  const int64_t chunks = (panels + chunk - 1) / chunk;
  threads = static_cast<int>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(chunks, 1)));
  if (threads <= 1) {
    if (panels > 0) run(0, panels);
    return;
  }
  // Per calling thread; only grows. The runs are set before the region and read inside it.
  thread_local std::vector<ChunkRun> runs;
  if (runs.size() < static_cast<size_t>(threads)) runs = std::vector<ChunkRun>(threads);
  for (int t = 0; t < threads; ++t) {
    runs[t].Reset(static_cast<uint32_t>(chunks * t / threads),
                  static_cast<uint32_t>(chunks * (t + 1) / threads));
  }
  ChunkRun* const shared = runs.data();
  auto run_chunk = [&](uint32_t c) {
    const int64_t begin = static_cast<int64_t>(c) * chunk;
    run(begin, std::min(panels, begin + chunk));
  };
  RunOnThreads(threads, [&](int t, int /*count*/) {
    uint32_t c = 0;
    while (shared[t].Claim(/*from_front=*/true, &c)) run_chunk(c);
    // Also the runs of threads that did not start, if fewer ran than asked.
    for (int step = 1; step < threads; ++step) {
      ChunkRun& other = shared[(t + step) % threads];
      while (other.Claim(/*from_front=*/false, &c)) run_chunk(c);
    }
  });
}

}  // namespace kiln::cpu
