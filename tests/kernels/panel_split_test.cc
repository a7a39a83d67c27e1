// ForPanelsBalanced: every panel runs exactly once, in ranges of at most `chunk` panels, whatever
// the thread count; and a thread that is held up has its chunks taken by the others.
#include "kernels/cpu/panel_split.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace kiln::cpu {
namespace {

TEST(PanelSplitTest, EveryPanelRunsOnceInChunkSizedRanges) {
  for (int64_t panels : {0, 1, 7, 100, 2375}) {
    for (int64_t chunk : {1, 3, 16}) {
      for (int threads : {1, 2, 3, 4}) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(panels));
        std::atomic<bool> too_long{false};
        ForPanelsBalanced(panels, chunk, threads, [&](int64_t begin, int64_t end) {
          // One thread takes the whole range in one call.
          if (end <= begin || (threads > 1 && end - begin > chunk)) too_long = true;
          for (int64_t p = begin; p < end; ++p) runs[static_cast<size_t>(p)].fetch_add(1);
        });
        EXPECT_FALSE(too_long) << panels << " panels, chunk " << chunk << ", " << threads;
        for (int64_t p = 0; p < panels; ++p) {
          ASSERT_EQ(runs[static_cast<size_t>(p)].load(), 1)
              << "panel " << p << " of " << panels << ", chunk " << chunk << ", " << threads
              << " threads";
        }
      }
    }
  }
}

TEST(PanelSplitTest, AHeldUpThreadsChunksAreTakenByTheOthers) {
  constexpr int64_t kPanels = 64;
  std::vector<int> ran_by(kPanels, -1);
  absl::Mutex mu;
  int threads_seen = 0;
  ForPanelsBalanced(kPanels, 1, 2, [](int64_t, int64_t) {});  // the team exists from here on
  ForPanelsBalanced(kPanels, 1, 2, [&](int64_t begin, int64_t end) {
    const int thread = omp_get_thread_num();
    if (thread == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    absl::MutexLock lock(&mu);
    threads_seen = std::max(threads_seen, omp_get_num_threads());
    for (int64_t p = begin; p < end; ++p) ran_by[static_cast<size_t>(p)] = thread;
  });
  if (threads_seen < 2) GTEST_SKIP() << "OpenMP gave this process one thread";
  int second_half_by_other = 0;
  for (int64_t p = kPanels / 2; p < kPanels; ++p) {
    second_half_by_other += ran_by[static_cast<size_t>(p)] == 0;
  }
  // Thread 1 sleeps 20 ms per chunk; thread 0 finishes its own half at once and then takes most
  // of thread 1's, from the back.
  EXPECT_GT(second_half_by_other, kPanels / 4);
  EXPECT_EQ(ran_by[kPanels - 1], 0) << "the last chunk is the first one taken from the back";
}

}  // namespace
}  // namespace kiln::cpu
