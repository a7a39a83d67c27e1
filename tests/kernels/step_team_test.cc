// StepTeam: a step's ops run on the calling thread while the team's other threads take the jobs
// it posts; every job runs on each thread once, and what the threads wrote is visible when Run
// returns. ParallelFor, ParallelForDynamic and ForPanelStreams hand their work to the team.
#include "kernels/cpu/step_team.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/backend_registry.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/panel_split.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/small_m_linear.h"
#include "kernels/step.h"

namespace kiln::cpu {
namespace {

TEST(StepTeamTest, BodyRunsOnTheCallerAndJobsOnEveryThread) {
  const std::thread::id caller = std::this_thread::get_id();
  for (int threads : {2, 3, 4}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    // More threads than the 2-core test machines have wait by yielding: fewer jobs.
    const int jobs = threads == 2 ? 20000 : 1000;
    std::vector<int> sums;
    const absl::Status status = StepTeam::Hold(threads, [&]() -> absl::Status {
      StepTeam* team = StepTeam::Current();
      EXPECT_NE(team, nullptr);
      EXPECT_EQ(std::this_thread::get_id(), caller);
      if (team == nullptr) return absl::InternalError("no team");
      EXPECT_GE(team->size(), 1);
      EXPECT_LE(team->size(), threads);
      // Many jobs back to back: none is missed or run twice, and plain writes of each thread are
      // seen by the caller after Run.
      std::vector<int> per_thread(static_cast<size_t>(team->size()), 0);
      for (int job = 0; job < jobs; ++job) {
        team->Run(threads, [&](int t, int count) {
          EXPECT_EQ(count, team->size());
          if (t == 0) {
            EXPECT_EQ(std::this_thread::get_id(), caller);
          }
          per_thread[static_cast<size_t>(t)] += 1;
        });
      }
      sums = per_thread;
      // Fewer threads than the team: the others take no part.
      std::vector<std::atomic<int>> seen(static_cast<size_t>(team->size()));
      team->Run(1, [&](int t, int count) {
        EXPECT_EQ(count, 1);
        seen[static_cast<size_t>(t)].fetch_add(1);
      });
      EXPECT_EQ(seen[0].load(), 1);
      for (size_t t = 1; t < seen.size(); ++t) EXPECT_EQ(seen[t].load(), 0);
      return absl::OkStatus();
    });
    ASSERT_TRUE(status.ok()) << status;
    for (int count : sums) EXPECT_EQ(count, jobs);
    EXPECT_EQ(StepTeam::Current(), nullptr);
  }
}

TEST(StepTeamTest, OneThreadOrANestedHoldRunsTheBodyAlone) {
  bool ran = false;
  ASSERT_TRUE(StepTeam::Hold(1, [&] {
                ran = true;
                EXPECT_EQ(StepTeam::Current(), nullptr);
                return absl::OkStatus();
              }).ok());
  EXPECT_TRUE(ran);
  ASSERT_TRUE(StepTeam::Hold(2, [&] {
                StepTeam* outer = StepTeam::Current();
                return StepTeam::Hold(2, [&] {
                  EXPECT_EQ(StepTeam::Current(), outer);
                  return absl::OkStatus();
                });
              }).ok());
  // Inside a parallel region of its own, no team is formed.
  int teams = 0;
#pragma omp parallel num_threads(2) reduction(+ : teams)
  {
    (void)StepTeam::Hold(2, [&] {
      teams += StepTeam::Current() != nullptr;
      return absl::OkStatus();
    });
  }
  EXPECT_EQ(teams, 0);
}

TEST(StepTeamTest, TheBodysStatusAndTheReportComeBack) {
  StepTeam::Report report{true, true};
  absl::Status status = StepTeam::Hold(
      2, [] { return absl::InvalidArgumentError("layer 3: bad rows"); }, &report);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "layer 3: bad rows");
  EXPECT_FALSE(report.ran_serial_work);
  EXPECT_FALSE(report.faster_without_team);
  status = StepTeam::Hold(
      2,
      [] {
        StepTeam::Current()->NoteSerialWork();
        return absl::OkStatus();
      },
      &report);
  EXPECT_TRUE(status.ok());
  EXPECT_TRUE(report.ran_serial_work);
  EXPECT_FALSE(report.faster_without_team);
  status = StepTeam::Hold(
      2,
      [] {
        StepTeam::Current()->NoteFasterWithoutTeam();
        return absl::OkStatus();
      },
      &report);
  EXPECT_TRUE(status.ok());
  EXPECT_FALSE(report.ran_serial_work);
  EXPECT_TRUE(report.faster_without_team);
}

// The loops the CPU ops run on: inside a team every index runs exactly once.
TEST(StepTeamTest, LoopsInsideATeamRunEveryIndexOnce) {
  ASSERT_TRUE(StepTeam::Hold(2, [&] {
                for (int64_t n : {0, 1, 2, 7, 1000}) {
                  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
                  ParallelFor(n, true, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
                  ParallelForDynamic(n, true, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
                  ForPanelStreams(n, 4, 2, [&](const int64_t* first, int count) {
                    for (int i = 0; i < count; ++i) hits[static_cast<size_t>(first[i])]++;
                  });
                  for (int64_t i = 0; i < n; ++i) {
                    EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 3)
                        << "index " << i << " of " << n;
                  }
                }
                return absl::OkStatus();
              }).ok());
}

// In a team SiluMul splits even one decode row over the threads (each a piece of its own); the
// values are those one thread gives, bit for bit, for rows of every length around the split.
TEST(StepTeamTest, SiluMulInATeamEqualsSiluMulAlone) {
  for (int64_t inter : {2047, 2048, 2049, 4864, 5000}) {
    for (int64_t rows : {1, 3}) {
      std::vector<float> gate_up(static_cast<size_t>(rows * 2 * inter));
      for (size_t i = 0; i < gate_up.size(); ++i) {
        gate_up[i] = static_cast<float>(static_cast<int64_t>(i * 7919 % 2001) - 1000) / 97.0f;
      }
      std::vector<float> alone(static_cast<size_t>(rows * inter), -1.0f);
      std::vector<float> teamed(static_cast<size_t>(rows * inter) + 1, -1.0f);
      SiluMul(gate_up.data(), 2 * inter, rows, inter, alone.data(), inter);
      int team_size = 0;
      ASSERT_TRUE(StepTeam::Hold(2, [&] {
                    team_size = StepTeam::Current() == nullptr ? 1 : StepTeam::Current()->size();
                    SiluMul(gate_up.data(), 2 * inter, rows, inter, teamed.data(), inter);
                    return absl::OkStatus();
                  }).ok());
      if (team_size < 2) GTEST_SKIP() << "OpenMP gave this process one thread";
      EXPECT_EQ(std::memcmp(alone.data(), teamed.data(), alone.size() * sizeof(float)), 0)
          << inter << " values, " << rows << " rows";
      EXPECT_EQ(teamed.back(), -1.0f) << "wrote past the output";
    }
  }
}

// Without a team, RunOnThreads is an OpenMP region; with one thread, the caller alone.
TEST(StepTeamTest, RunOnThreadsWithoutATeam) {
  std::atomic<int> calls{0};
  std::atomic<bool> in_parallel{false};
  RunOnThreads(2, [&](int t, int count) {
    EXPECT_LT(t, count);
    calls++;
    if (omp_in_parallel()) in_parallel = true;
  });
  EXPECT_GE(calls.load(), 1);
  EXPECT_LE(calls.load(), 2);
  calls = 0;
  RunOnThreads(1, [&](int t, int count) {
    EXPECT_EQ(t, 0);
    EXPECT_EQ(count, 1);
    EXPECT_FALSE(omp_in_parallel());
    calls++;
  });
  EXPECT_EQ(calls.load(), 1);
}

// The CPU context holds a team for a step of up to 16 rows (decode of up to 16 streams,
// verification) and not for a larger one, nor while teams are turned off, nor for steps as large
// as one that met work the team could not share, nor for steps of as many rows as one whose
// linears would have run faster without a team.
TEST(StepTeamTest, CpuContextHoldsATeamForDecodeSizedSteps) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<std::unique_ptr<ExecutionContext>> ctx =
      (*backend)->CreateContext({.limits = {512, 8}, .scratch_bytes = 4096});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const KvPoolRef shape{nullptr, (*backend)->device(), 8, 4, 1, 4, DType::kF32};
  absl::StatusOr<DeviceBuffer> pool_memory =
      (*backend)->Allocate(static_cast<size_t>(shape.num_blocks * shape.block_elements()) * 4);
  ASSERT_TRUE(pool_memory.ok());
  KvPoolRef pool = shape;
  pool.data = pool_memory->data();
  auto team_during_step = [&](int64_t rows) {
    StepMetadata step;
    step.pool = pool;
    const std::vector<int32_t> ids(static_cast<size_t>(rows), 1);
    const std::vector<int32_t> table = {0, 1, 2, 3, 4};  // 20 positions
    step.AddSequence(ids.data(), rows, 0, table);
    EXPECT_TRUE((*ctx)->BeginStep(step).ok());
    StepTeam* team = nullptr;
    EXPECT_TRUE((*ctx)
                    ->RunStep([&] {
                      team = StepTeam::Current();
                      return absl::OkStatus();
                    })
                    .ok());
    return team != nullptr;
  };
  const bool expect_team = omp_get_max_threads() > 1 && Avx512Supported();
  EXPECT_EQ(team_during_step(1), expect_team);
  EXPECT_EQ(team_during_step(8), expect_team);
  EXPECT_EQ(team_during_step(kSmallMMaxRows), expect_team);
  EXPECT_FALSE(team_during_step(kSmallMMaxRows + 1));
  EnableStepTeams(false);
  EXPECT_FALSE(team_during_step(1));
  EnableStepTeams(true);
  EXPECT_EQ(team_during_step(1), expect_team);
  EXPECT_EQ(StepTeam::Current(), nullptr);
  if (!expect_team) return;
  // A step of 5 rows that ran work the team could not share (a oneDNN primitive on one thread):
  // steps of 5 rows and more then run without a team, smaller ones still with one.
  StepMetadata step;
  step.pool = pool;
  const std::vector<int32_t> ids(5, 1);
  const std::vector<int32_t> table = {0, 1};
  step.AddSequence(ids.data(), 5, 0, table);
  ASSERT_TRUE((*ctx)->BeginStep(step).ok());
  ASSERT_TRUE((*ctx)
                  ->RunStep([] {
                    StepTeam::Current()->NoteSerialWork();
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_FALSE(team_during_step(5));
  EXPECT_FALSE(team_during_step(kSmallMMaxRows));
  EXPECT_TRUE(team_during_step(4));
  // A step of 3 rows whose linear ran the small-M kernel where brgemm was measured faster: steps
  // of 3 rows then run without a team, steps of 2 and 4 rows still with one.
  const std::vector<int32_t> three(3, 1);
  StepMetadata step3;
  step3.pool = pool;
  step3.AddSequence(three.data(), 3, 0, table);
  ASSERT_TRUE((*ctx)->BeginStep(step3).ok());
  ASSERT_TRUE((*ctx)
                  ->RunStep([] {
                    StepTeam::Current()->NoteFasterWithoutTeam();
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_FALSE(team_during_step(3));
  EXPECT_TRUE(team_during_step(2));
  EXPECT_TRUE(team_during_step(4));
}

// After a load the CPU backend releases the loading thread's OpenMP workers; a later region on
// that thread starts them again, and a step team forms as before.
TEST(StepTeamTest, ThreadsReleasedAfterALoadStartAgain) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok()) << backend.status();
  const int threads = omp_get_max_threads();
  for (int round = 0; round < 3; ++round) {
    (*backend)->FinishLoadOnThisThread();
    std::atomic<int> ran{0};
#pragma omp parallel num_threads(threads)
    ran++;
    EXPECT_EQ(ran.load(), threads);
    (*backend)->FinishLoadOnThisThread();
    int team_size = 0;
    ASSERT_TRUE(StepTeam::Hold(threads, [&] {
                  StepTeam* team = StepTeam::Current();
                  team_size = team == nullptr ? 1 : team->size();
                  return absl::OkStatus();
                }).ok());
    EXPECT_EQ(team_size, threads);
  }
}

}  // namespace
}  // namespace kiln::cpu
