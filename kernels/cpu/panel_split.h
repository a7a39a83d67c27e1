// Splits a decode-path linear's panels over the threads so that each thread streams its own
// contiguous run as a few long sequential streams, yet a thread the machine slows (a busy sibling
// core, an interrupt) does not hold the layer: a thread whose run is done takes panels, one a
// stream, from the backs of the others' runs. Measured on a 2-core VM: with a static split the
// two threads spent 38 % and 28 % of the decode in the same kernel, the faster one waiting; with
// stealing in chunks of about 256 KiB, a call still ended with one thread idle for up to a chunk
// (6-8 µs of a 47 µs bf16 qkv projection, up to 40 % of an int4 one split one chunk a thread).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"

namespace kiln::cpu {

// A run of panels [front, back): its owner claims from the front a share of what is left at a
// time, another thread one panel at a time from the back.
struct alignas(64) PanelRun {
  std::atomic<uint64_t> bounds{0};  // front in the low 32 bits, back in the high 32

  static uint64_t Pack(uint32_t front, uint32_t back) { return uint64_t{back} << 32 | front; }
  void Reset(uint32_t front, uint32_t back) {
    bounds.store(Pack(front, back), std::memory_order_relaxed);
  }
  // Claims panels [*first, *first + count) and returns count (0 when the run is empty): from the
  // front (the owner) an eighth of what is left, at least one; from the back (another thread)
  // the last one. Each claim is a locked instruction, which on x86 waits for every load in
  // flight: claimed one panel at a time (16 KiB of int4 at K = 896), the LM head and gate_up
  // projections read 6-7 % and 1-4 % slower at a 54-58 GB/s probe (Zen 4, alternating call by
  // call in one decode). An eighth keeps the rest, seven eighths, for a thread that finishes
  // first to take.
  uint32_t Claim(bool from_front, uint32_t* first) {
    uint64_t seen = bounds.load(std::memory_order_relaxed);
    while (true) {
      const auto front = static_cast<uint32_t>(seen);
      const auto back = static_cast<uint32_t>(seen >> 32);
      if (front >= back) return 0;
      const uint32_t count = from_front ? std::max<uint32_t>(1, (back - front) / kFrontShare) : 1;
      const uint64_t next = from_front ? Pack(front + count, back) : Pack(front, back - count);
      if (bounds.compare_exchange_weak(seen, next, std::memory_order_relaxed)) {
        *first = from_front ? front : back - count;
        return count;
      }
    }
  }

  static constexpr uint32_t kFrontShare = 8;
};

// The most panels a decode kernel reads side by side for a pass of `rows` rows, as that many
// sequential streams: on a 2-core Zen 5 VM two threads read about 50 GB/s with one stream each and
// 70-80 GB/s with four. Bounded by the accumulators: four streams of one row or two of two fill
// half the 32 vector registers. On a Zen 4, with the kernels' prefetch into L2, two read as much
// as four or more: each linear caps the count at what was measured for its shape
// (linear_dispatch.h).
constexpr int StreamsForRows(int64_t rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }

// Calls group(first, n) for groups of 1 ≤ n ≤ `streams` panels (first[0..n)) read side by side,
// every panel of [0, panels) once, on up to `threads` threads (the step's team when the caller
// leads one). Each thread owns a contiguous run of panels, read as `streams` equal sub-runs side
// by side, one panel of each a call, so that its reads are `streams` long sequential streams; a
// thread whose run is done takes panels from the backs of the others' sub-runs, one of each a
// call, so that a thread the machine slows holds the layer up by at most about one panel.
void ForPanelStreams(int64_t panels, int streams, int threads,
                     absl::FunctionRef<void(const int64_t* first, int count)> group);
// As above, with start(first, n) called on each thread before its first group, first[0..n) the
// first panels of its own sub-runs (for a thread to set up its share of the call and ask for the
// lines it reads first while it does).
void ForPanelStreams(int64_t panels, int streams, int threads,
                     absl::FunctionRef<void(const int64_t* first, int count)> start,
                     absl::FunctionRef<void(const int64_t* first, int count)> group);

// Calls group.template operator()<S>(first) with S = count (1 ≤ count ≤ MaxStreams ≤ 4) and
// first the count panel indices, for kernels templated on the number of streams.
template <int MaxStreams, typename Group>
void ForStreamCount(const int64_t* first, int count, Group&& group) {
  static_assert(MaxStreams >= 1 && MaxStreams <= 4);
  auto call = [&]<int S>() {
    int64_t panels[S];
    for (int s = 0; s < S; ++s) panels[s] = first[s];
    group.template operator()<S>(panels);
  };
  if constexpr (MaxStreams >= 4) {
    if (count >= 4) return call.template operator()<4>();
  }
  if constexpr (MaxStreams >= 3) {
    if (count == 3) return call.template operator()<3>();
  }
  if constexpr (MaxStreams >= 2) {
    if (count == 2) return call.template operator()<2>();
  }
  call.template operator()<1>();
}

}  // namespace kiln::cpu
