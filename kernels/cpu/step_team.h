// The CPU threads of one decode step, held in a single OpenMP parallel region for the whole step.
// A decode step of a 0.5B model makes about a hundred parallel calls (four linears a layer, the
// attention, the LM head), each a few to a few hundred microseconds; a libgomp fork and join
// costs about 2.8 µs on the 2-core EPYC VMs, against about 0.5 µs for handing a job to threads
// that already wait in the region (two cache-line transfers between the cores). The step's own
// thread runs the model's ops as thread 0; the others spin until it posts a job, run their share
// and spin again until the step ends.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace kiln::cpu {

class StepTeam {
 public:
  // What a held step met that tells its caller to run such steps without a team.
  struct Report {
    bool ran_serial_work = false;      // NoteSerialWork
    bool faster_without_team = false;  // NoteFasterWithoutTeam
  };
  // Runs body() on the calling thread as thread 0 of a team of `threads` OpenMP threads, whose
  // other threads run what Run posts until body returns; returns body's status. With threads ≤ 1,
  // or inside a parallel region already, body runs alone with no team. `report`, when not null,
  // is filled in (all false where no team formed).
  static absl::Status Hold(int threads, absl::FunctionRef<absl::Status()> body,
                           Report* report = nullptr);
  // The team the calling thread leads (inside Hold's body), or null.
  static StepTeam* Current();

  // Threads in the team, the caller included.
  int size() const { return size_; }
  // job(t, n) for t in [0, n), n = min(threads, size()), t = 0 on the calling thread (which must
  // lead the team); returns when every call has returned.
  void Run(int threads, absl::FunctionRef<void(int thread, int count)> job);
  // Marks that an op ran on thread 0 alone work it would have split over threads outside a team
  // (a oneDNN primitive: its own OpenMP region would be nested, so serial).
  void NoteSerialWork() { report_.ran_serial_work = true; }
  // Marks that an op ran a kernel the team can share where another, measured faster at this
  // size, needs a parallel region of its own (brgemm chosen over the small-M kernel).
  void NoteFasterWithoutTeam() { report_.faster_without_team = true; }

  StepTeam(const StepTeam&) = delete;
  StepTeam& operator=(const StepTeam&) = delete;

 private:
  StepTeam() = default;
  // A waiting thread's loop: runs each posted job until the team is released.
  void Serve(int thread);

  // A posted job, on one cache line, so that a waiting thread that sees the new generation gets
  // the job with it: the job and its thread count are written by thread 0 before it stores the
  // generation (release) and read by the others after they see it (acquire). With the threads on
  // two CCDs each line that crosses between them costs about 150 ns.
  struct alignas(64) Post {
    std::atomic<uint64_t> generation{0};
    absl::FunctionRef<void(int, int)>* job = nullptr;
    int threads = 0;
    std::atomic<bool> released{false};
  };
  // The last generation a waiting thread finished, on a line of its own that only it writes
  // (thread 0 reads them all), rather than one counter every thread takes in turn.
  struct alignas(64) Done {
    std::atomic<uint64_t> generation{0};
  };

  int size_ = 1;
  Report report_;
  Post post_;
  std::vector<Done> done_;  // one a thread of the team (entry 0 unused)
};

// Whether CPU contexts hold a team per decode-sized step (default true). Benches turn it off to
// measure the parallel region per op that it replaces.
bool StepTeamsEnabled();
void EnableStepTeams(bool enabled);

// job(t, n) for t in [0, n) on n ≤ threads threads: the team the caller leads when there is one
// (n up to its size), else an OpenMP parallel region (n as many threads as OpenMP gives);
// threads ≤ 1 runs job(0, 1) on the caller, outside any OpenMP construct.
void RunOnThreads(int threads, absl::FunctionRef<void(int thread, int count)> job);

}  // namespace kiln::cpu
