// ForPanelStreams: every panel runs exactly once, in groups of at most `streams` distinct panels,
// whatever the thread count; a thread reads its own run as `streams` sequential streams; and a
// thread that is held up has its panels taken by the others.
#include "kernels/cpu/panel_split.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace kiln::cpu {
namespace {

TEST(PanelSplitTest, EveryPanelRunsOnceInGroupsOfAtMostTheStreams) {
  for (int64_t panels : {0, 1, 3, 7, 100, 2375}) {
    for (int streams : {1, 2, 3, 4}) {
      for (int threads : {1, 2, 3, 4}) {
        SCOPED_TRACE(testing::Message()
                     << panels << " panels, " << streams << " streams, " << threads << " threads");
        std::vector<std::atomic<int>> runs(static_cast<size_t>(panels));
        std::atomic<bool> bad_group{false};
        ForPanelStreams(panels, streams, threads, [&](const int64_t* first, int count) {
          if (count < 1 || count > streams) bad_group = true;
          for (int i = 0; i < count; ++i) {
            for (int j = 0; j < i; ++j) bad_group = bad_group || first[i] == first[j];
            runs[static_cast<size_t>(first[i])].fetch_add(1);
          }
        });
        EXPECT_FALSE(bad_group);
        for (int64_t p = 0; p < panels; ++p) {
          ASSERT_EQ(runs[static_cast<size_t>(p)].load(), 1) << "panel " << p;
        }
      }
    }
  }
}

// One thread: its run is read as `streams` equal sub-runs side by side, each in order, one panel
// of each a call.
TEST(PanelSplitTest, OneThreadReadsItsRunAsSequentialStreams) {
  std::vector<std::vector<int64_t>> groups;
  ForPanelStreams(10, 4, 1, [&](const int64_t* first, int count) {
    groups.emplace_back(first, first + count);
  });
  // Sub-runs [0, 2), [2, 5), [5, 7), [7, 10).
  const std::vector<std::vector<int64_t>> expected = {{0, 2, 5, 7}, {1, 3, 6, 8}, {4, 9}};
  EXPECT_EQ(groups, expected);
}

// The owner claims an eighth of what is left (at least one panel) with one atomic operation, so
// that a long run costs few locked instructions; another thread takes single panels from the back.
TEST(PanelSplitTest, AnOwnerClaimsAnEighthOfWhatIsLeft) {
  PanelRun run;
  run.Reset(100, 180);
  std::vector<std::pair<uint32_t, uint32_t>> claims;  // (first, count)
  uint32_t back = 0;
  ASSERT_EQ(run.Claim(/*from_front=*/false, &back), 1u);
  EXPECT_EQ(back, 179u);
  uint32_t first = 0;
  for (uint32_t count; (count = run.Claim(/*from_front=*/true, &first)) > 0;)
    claims.emplace_back(first, count);
  ASSERT_FALSE(claims.empty());
  EXPECT_EQ(claims[0], std::make_pair(100u, 9u));  // 79 left: 79 / 8
  EXPECT_EQ(claims[1], std::make_pair(109u, 8u));  // 70 left
  uint32_t next = 100;
  for (const auto& [at, count] : claims) {
    EXPECT_EQ(at, next) << "claims are contiguous, in order";
    EXPECT_GE(count, 1u);
    next = at + count;
  }
  EXPECT_EQ(next, 179u);
  EXPECT_EQ(claims.back().second, 1u) << "the last panels go one at a time";
  EXPECT_LT(claims.size(), 79u / 2) << "far fewer claims than panels";
  EXPECT_EQ(run.Claim(/*from_front=*/false, &back), 0u);
}

TEST(PanelSplitTest, AHeldUpThreadsPanelsAreTakenByTheOthers) {
  constexpr int64_t kPanels = 64;
  std::vector<int> ran_by(kPanels, -1);
  absl::Mutex mu;
  int threads_seen = 0;
  ForPanelStreams(kPanels, 1, 2, [](const int64_t*, int) {});  // the team exists from here on
  ForPanelStreams(kPanels, 1, 2, [&](const int64_t* first, int count) {
    const int thread = omp_get_thread_num();
    if (thread == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    absl::MutexLock lock(&mu);
    threads_seen = std::max(threads_seen, omp_get_num_threads());
    for (int i = 0; i < count; ++i) ran_by[static_cast<size_t>(first[i])] = thread;
  });
  if (threads_seen < 2) GTEST_SKIP() << "OpenMP gave this process one thread";
  int second_half_by_other = 0;
  for (int64_t p = kPanels / 2; p < kPanels; ++p) {
    second_half_by_other += ran_by[static_cast<size_t>(p)] == 0;
  }
  // Thread 1 sleeps 20 ms per panel; thread 0 finishes its own half at once and then takes most
  // of thread 1's, from the back.
  EXPECT_GT(second_half_by_other, kPanels / 4);
  EXPECT_EQ(ran_by[kPanels - 1], 0) << "the last panel is the first one taken from the back";
}

// Groups of any size up to the kernel's streams reach the kernel as a template argument.
TEST(PanelSplitTest, ForStreamCountPassesTheGroupAsItsSize) {
  const int64_t first[4] = {9, 3, 5, 7};
  for (int count = 1; count <= 4; ++count) {
    std::vector<int64_t> seen;
    int size = 0;
    ForStreamCount<4>(first, count, [&]<int S>(const int64_t(&panels)[S]) {
      size = S;
      seen.assign(panels, panels + S);
    });
    EXPECT_EQ(size, count);
    EXPECT_EQ(seen, std::vector<int64_t>(first, first + count));
  }
  int size = 0;
  ForStreamCount<1>(first, 1, [&]<int S>(const int64_t(&)[S]) { size = S; });
  EXPECT_EQ(size, 1);
}

}  // namespace
}  // namespace kiln::cpu
