// ForPanelsBalanced: every panel runs exactly once, in ranges of at most `chunk` panels, whatever
// the thread count; and a thread that is held up has its chunks taken by the others.
#include "kernels/cpu/panel_split.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <type_traits>
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

// Chunks are about 256 KiB; a multiple of the streams a kernel reads only where that leaves
// every thread at least four chunks, so that few large panels still split evenly; under two
// chunks a thread, one even chunk each.
TEST(PanelSplitTest, ChunksRoundToStreamsOnlyWhereThereAreManyPanels) {
  constexpr int64_t kKiB = 1024;
  EXPECT_EQ(PanelsPerChunk(2374, 112 * kKiB, 2, 1), 2);  // the LM head's bf16 panels
  EXPECT_EQ(PanelsPerChunk(2374, 112 * kKiB, 2, 4), 4);  // ... read as 4 streams
  EXPECT_EQ(PanelsPerChunk(152, 112 * kKiB, 2, 4), 4);   // gate/up: 19 chunks per thread
  EXPECT_EQ(PanelsPerChunk(18, 112 * kKiB, 2, 4), 2);    // qkv: chunks of 4 would be uneven
  EXPECT_EQ(PanelsPerChunk(14, 608 * kKiB, 2, 4), 1);    // down: one panel is 608 KiB
  EXPECT_EQ(PanelsPerChunk(14, 608 * kKiB, 1, 4), 1);
  EXPECT_EQ(PanelsPerChunk(100, 16 * kKiB, 2, 4), 16);  // small panels: already a multiple
  EXPECT_EQ(PanelsPerChunk(100, 24 * kKiB, 2, 4), 12);  // 10 of 24 KiB, rounded up to 12
  // Under two chunks per thread: one even chunk each (int4's o and qkv projections).
  EXPECT_EQ(PanelsPerChunk(28, 16 * kKiB, 2, 4), 14);
  EXPECT_EQ(PanelsPerChunk(36, 16 * kKiB, 2, 4), 18);
  EXPECT_EQ(PanelsPerChunk(3, 16 * kKiB, 2, 4), 2);
  EXPECT_EQ(PanelsPerChunk(36, 16 * kKiB, 1, 4), 16);  // one thread: chunks as ever
  EXPECT_EQ(PanelsPerChunk(100, 0, 0, 1), 262144);     // no division by zero
}

// Stream groups: every panel once; within a group the runs are equally long and side by side
// (first[s + 1] - first[s] is the run length), and each run is read in order.
TEST(PanelSplitTest, StreamGroupsPassEveryPanelOnceInRunsSideBySide) {
  auto check = [](int64_t begin, int64_t end, auto max_streams) {
    constexpr int kMax = decltype(max_streams)::value;
    std::vector<int> seen(static_cast<size_t>(end), 0);
    std::vector<int> sizes;
    int64_t last_first = -1;
    ForStreamGroups<kMax>(begin, end, [&]<int S>(const int64_t(&first)[S]) {
      sizes.push_back(S);
      for (int s = 1; s < S; ++s) EXPECT_EQ(first[s] - first[s - 1], first[1] - first[0]);
      EXPECT_GT(first[0], last_first) << "runs go forward";
      last_first = first[0];
      for (int s = 0; s < S; ++s) ++seen[static_cast<size_t>(first[s])];
    });
    for (int64_t p = 0; p < end; ++p) {
      EXPECT_EQ(seen[static_cast<size_t>(p)], p >= begin ? 1 : 0) << "panel " << p;
    }
    for (int size : sizes) EXPECT_LE(size, kMax);
    return sizes;
  };
  // 7 panels in 4 streams: one group of 4, one of 2, one single.
  EXPECT_EQ(check(3, 10, std::integral_constant<int, 4>{}), (std::vector<int>{4, 2, 1}));
  // 9 in 4: two groups of 4 (runs of 2), then 1.
  EXPECT_EQ(check(0, 9, std::integral_constant<int, 4>{}), (std::vector<int>{4, 4, 1}));
  EXPECT_EQ(check(0, 5, std::integral_constant<int, 2>{}), (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(check(0, 3, std::integral_constant<int, 1>{}), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(check(0, 1, std::integral_constant<int, 4>{}), (std::vector<int>{1}));
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
