// Splits a decode-path linear's panels over OpenMP threads so that each thread streams its own
// contiguous run, yet a thread the machine slows (a busy sibling core, an interrupt) does not hold
// the layer: each thread takes chunks of its run from the front, and a thread whose run is done
// takes chunks from the back of the others' runs. Measured on a 2-core VM, the two threads of a
// static split spent 38 % and 28 % of the decode in the same kernel, the faster one waiting.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"

namespace kiln::cpu {

// A thread's run of chunks [front, back), claimed one at a time from either end.
struct alignas(64) ChunkRun {
  std::atomic<uint64_t> bounds{0};  // front in the low 32 bits, back in the high 32

  static uint64_t Pack(uint32_t front, uint32_t back) { return uint64_t{back} << 32 | front; }
  void Reset(uint32_t front, uint32_t back) {
    bounds.store(Pack(front, back), std::memory_order_relaxed);
  }
  // The next chunk from the front (the owner) or the back (another thread); false when empty.
  bool Claim(bool from_front, uint32_t* chunk) {
    uint64_t seen = bounds.load(std::memory_order_relaxed);
    while (true) {
      const auto front = static_cast<uint32_t>(seen);
      const auto back = static_cast<uint32_t>(seen >> 32);
      if (front >= back) return false;
      const uint64_t next = from_front ? Pack(front + 1, back) : Pack(front, back - 1);
      if (bounds.compare_exchange_weak(seen, next, std::memory_order_relaxed)) {
        *chunk = from_front ? front : back - 1;
        return true;
      }
    }
  }
};

// Panels a decode kernel reads side by side for a pass of `rows` rows, as that many sequential
// streams: on the 2-core Zen 4/5 VMs two threads read about 50 GB/s with one stream each and
// 70-80 GB/s with four. Bounded by the accumulators: four streams of one row or two of two fill
// half the 32 vector registers.
constexpr int StreamsForRows(int64_t rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }

// Reads panels [begin, end) as up to `MaxStreams` runs side by side: calls
// group.template operator()<S>(first) with first[s] the next panel of run s, first for S =
// MaxStreams over as many panels as divide into S runs, then what is left in fewer streams
// (4, 2, 1). Every panel is passed once, and each run in order.
template <int MaxStreams, typename Group>
void ForStreamGroups(int64_t begin, int64_t end, Group&& group) {
  static_assert(MaxStreams == 1 || MaxStreams == 2 || MaxStreams == 4);
  auto runs = [&]<int S>() {
    const int64_t per_run = (end - begin) / S;
    for (int64_t i = 0; i < per_run; ++i) {
      int64_t first[S];
      for (int s = 0; s < S; ++s) first[s] = begin + s * per_run + i;
      group.template operator()<S>(first);
    }
    begin += S * per_run;
  };
  if constexpr (MaxStreams >= 4) runs.template operator()<4>();
  if constexpr (MaxStreams >= 2) runs.template operator()<2>();
  runs.template operator()<1>();
}

// Panels per chunk for `panels` panels of `panel_bytes` on `threads` threads: about 256 KiB of
// weights, long enough runs for the prefetchers and enough chunks to even out the threads. A
// kernel that reads `streams` panels side by side gets chunks of a multiple of `streams` where
// that still leaves at least four chunks per thread; otherwise the chunk keeps its size and
// the kernel reads fewer streams (a 14-panel down projection in chunks of 4 left one thread 8
// panels and the other 6). A weight of less than two chunks per thread is split evenly, one chunk
// each (int4's 28-panel o projection in chunks of 16 left one thread 16 panels and the other 12).
inline int64_t PanelsPerChunk(int64_t panels, int64_t panel_bytes, int threads,
                              int64_t streams = 1) {
  const int64_t chunk =
      std::max<int64_t>(1, (int64_t{256} << 10) / std::max<int64_t>(1, panel_bytes));
  if (threads > 1) {
    const int64_t per_thread = (panels + threads - 1) / threads;
    if (per_thread < 2 * chunk) return std::max<int64_t>(per_thread, 1);
  }
  const int64_t rounded = (chunk + streams - 1) / streams * streams;
  return panels >= rounded * 4 * std::max(threads, 1) ? rounded : chunk;
}

// Calls run(begin, end) for consecutive ranges of [0, panels), `chunk` panels at a time (the
// last shorter), on `threads` OpenMP threads (1: in the caller, in order). Every panel is run once.
void ForPanelsBalanced(int64_t panels, int64_t chunk, int threads,
                       absl::FunctionRef<void(int64_t begin, int64_t end)> run);

}  // namespace kiln::cpu
