#include "kernels/cpu/step_team.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace kiln::cpu {
namespace {

thread_local StepTeam* tls_team = nullptr;
std::atomic<bool> step_teams_enabled{true};

// Waiting for the other core: spin (a job is handed over in well under a microsecond), and after
// about 30 µs without one also yield the core, so that a waiting thread does not hold up the
// thread it waits for when there are more runnable threads than cores (two models stepping at
// once, parallel test processes).
class Backoff {
 public:
  void Wait() {
    if (!yielding_) {
      _mm_pause();
      // The clock every 64 pauses (1-3 µs, by CPU): a pause is 18 ns on Zen 5, 40 on Skylake.
      if (++spins_ % 64 == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (spins_ == 64) {
          start_ = now;
        } else if (now - start_ > std::chrono::microseconds(30)) {
          yielding_ = true;
        }
      }
      return;
    }
    std::this_thread::yield();
  }

 private:
  int64_t spins_ = 0;
  bool yielding_ = false;
  std::chrono::steady_clock::time_point start_;
};

// Clears tls_team and releases the waiting threads when body returns.
struct LeadScope {
  std::atomic<bool>* released;
  ~LeadScope() {
    tls_team = nullptr;
    released->store(true, std::memory_order_release);
  }
};

}  // namespace

bool StepTeamsEnabled() { return step_teams_enabled.load(std::memory_order_relaxed); }
void EnableStepTeams(bool enabled) { step_teams_enabled.store(enabled, std::memory_order_relaxed); }

StepTeam* StepTeam::Current() { return tls_team; }

absl::Status StepTeam::Hold(int threads, absl::FunctionRef<absl::Status()> body, Report* report) {
  if (report != nullptr) *report = Report{};
  if (threads <= 1 || omp_in_parallel() || tls_team != nullptr) return body();
  StepTeam team;
  team.done_ = std::vector<Done>(static_cast<size_t>(threads));
  absl::Status status;
#pragma omp parallel num_threads(threads)
  {
    if (omp_get_thread_num() == 0) {
      team.size_ = omp_get_num_threads();
      tls_team = &team;
      LeadScope scope{&team.post_.released};
      status = body();
    } else {
      team.Serve(omp_get_thread_num());
    }
  }
  if (report != nullptr) *report = team.report_;
  return status;
}

void StepTeam::Serve(int thread) {
  uint64_t seen = 0;
  while (true) {
    uint64_t generation;
    Backoff backoff;
    while ((generation = post_.generation.load(std::memory_order_acquire)) == seen) {
      if (post_.released.load(std::memory_order_acquire)) return;
      backoff.Wait();
    }
    seen = generation;
    if (thread < post_.threads) (*post_.job)(thread, post_.threads);
    done_[static_cast<size_t>(thread)].generation.store(generation, std::memory_order_release);
  }
}

void StepTeam::Run(int threads, absl::FunctionRef<void(int, int)> job) {
  const int count = std::clamp(threads, 1, size_);
  if (count == 1) {
    job(0, 1);
    return;
  }
  // Only this thread writes the post, and only once every waiting thread has answered the last
  // job: every one answers each job, so that none can miss one and see the next.
  post_.job = &job;
  post_.threads = count;
  const uint64_t generation = post_.generation.load(std::memory_order_relaxed) + 1;
  post_.generation.store(generation, std::memory_order_release);
  job(0, count);
  for (int t = 1; t < size_; ++t) {
    Backoff backoff;
    while (done_[static_cast<size_t>(t)].generation.load(std::memory_order_acquire) != generation) {
      backoff.Wait();
    }
  }
}

void RunOnThreads(int threads, absl::FunctionRef<void(int, int)> job) {
  if (threads <= 1) {
    job(0, 1);
    return;
  }
  if (StepTeam* team = StepTeam::Current(); team != nullptr) {
    team->Run(threads, job);
    return;
  }
#pragma omp parallel num_threads(threads)
  job(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace kiln::cpu
