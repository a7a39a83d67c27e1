// This machine's memory read bandwidth, the roofline a batch-1 decode is held against:
// decode efficiency = weight bytes streamed per token × tokens/s ÷ read bandwidth.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "bench/bench_util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/host_memory.h"

namespace kiln::bench {

// Sums `bytes` (a multiple of 128 · S) as S sequential streams of equal parts, two vectors of
// each per step, each stream prefetched `prefetch` bytes ahead (0: the hardware prefetcher alone),
// so that memory, not the adder chain, limits the loop.
template <int S>
uint64_t SumStreams(const uint8_t* data, size_t bytes, size_t prefetch) {
#if defined(__AVX512F__)
  __m512i acc[S][2];
  KILN_UNROLL
  for (int s = 0; s < S; ++s) acc[s][0] = acc[s][1] = _mm512_setzero_si512();
  const size_t part = bytes / S;
  for (size_t i = 0; i < part; i += 128) {
    // Unrolled so the sums stay in registers: otherwise the adder chain through the stack, not
    // memory, limits the loop and the roofline reads low.
    KILN_UNROLL
    for (int s = 0; s < S; ++s) {
      const uint8_t* q = data + s * part + i;
      if (prefetch != 0) {
        _mm_prefetch(reinterpret_cast<const char*>(q + prefetch), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q + prefetch + 64), _MM_HINT_T0);
      }
      acc[s][0] = _mm512_add_epi64(acc[s][0], _mm512_load_si512(q));
      acc[s][1] = _mm512_add_epi64(acc[s][1], _mm512_load_si512(q + 64));
    }
  }
  __m512i total = _mm512_setzero_si512();
  KILN_UNROLL
  for (int s = 0; s < S; ++s)
    total = _mm512_add_epi64(total, _mm512_add_epi64(acc[s][0], acc[s][1]));
  // Through memory rather than _mm512_reduce_add_epi64, whose extracts GCC 12 reports as reading
  // an uninitialized pass-through operand.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, total);
  uint64_t sum = 0;
  for (uint64_t lane : lanes) sum += lane;
  return sum;
#else
  (void)prefetch;
  uint64_t sum = 0;
  const auto* words = reinterpret_cast<const uint64_t*>(data);
  for (size_t i = 0; i < bytes / 8; ++i) sum += words[i];
  return sum;
#endif
}

// An access pattern of the probe: streams per thread and software prefetch distance.
struct ReadPattern {
  int streams;
  size_t prefetch;
};

// Read bandwidth in bytes/s of all OpenMP threads over a buffer far larger than the caches,
// allocated as packed weights are (2 MiB pages: on 4 KiB pages the TLB misses of a VM's nested
// page walks cut the rate by up to half). Each pattern below is timed `repeats` times after a
// warm-up and the best pattern's median is returned: the decode kernels stream one panel after
// another with prefetching, and no single pattern is the fastest on every machine, so the
// roofline is the most this machine was seen to deliver, not what one loop happens to get.
inline double MeasureReadBandwidth(int repeats) {
  const size_t bytes = size_t{1} << 30;
  std::unique_ptr<uint8_t, void (*)(uint8_t*)> owner(
      static_cast<uint8_t*>(cpu::AllocateHost(bytes)), [](uint8_t* p) { cpu::FreeHost(p); });
  CHECK(owner != nullptr) << "out of memory for the bandwidth probe";
  uint8_t* const buffer = owner.get();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes; i += 4096) std::memset(buffer + i, static_cast<int>(i >> 12), 4096);
  constexpr ReadPattern kPatterns[] = {{1, 0}, {1, 1024}, {4, 0}, {4, 1024}, {8, 0}, {8, 1024}};
  double best = 0;
  uint64_t checksum = 0;
  for (const ReadPattern& pattern : kPatterns) {
    std::vector<double> rates;
    for (int r = 0; r < repeats + 1; ++r) {
      const auto start = Clock::now();
      uint64_t sum = 0;
#pragma omp parallel reduction(+ : sum)
      {
        const size_t threads = static_cast<size_t>(omp_get_num_threads());
        const size_t slice = bytes / threads / 1024 * 1024;  // 128 bytes × up to 8 streams
        const uint8_t* mine = buffer + static_cast<size_t>(omp_get_thread_num()) * slice;
        switch (pattern.streams) {
          case 1:
            sum += SumStreams<1>(mine, slice, pattern.prefetch);
            break;
          case 4:
            sum += SumStreams<4>(mine, slice, pattern.prefetch);
            break;
          default:
            sum += SumStreams<8>(mine, slice, pattern.prefetch);
            break;
        }
      }
      const double seconds = Seconds(start);
      checksum += sum;
      // Run 0 warms up; the slices cover the buffer but for < 1 KiB per thread.
      if (r > 0) rates.push_back(static_cast<double>(bytes) / seconds);
    }
    best = std::max(best, Median(rates));
  }
  if (checksum == 42) std::printf(" ");  // keeps the sums observable
  return best;
}

// The round trip of one cache line between OpenMP threads 0 and 1 (one writes, the other sees it
// and answers), in ns, median of 5 runs of 2000; 0 with one thread. It tells where the machine
// put the two threads. On the 2-core EPYC VMs three values came and went, minute by minute:
// about 28 ns (two hardware threads of one core, which then share its arithmetic units), about
// 65 ns (two cores of one CCX, sharing its L3) and about 300 ns (two CCDs, each with its own link
// to memory: the read bandwidth about twice that of one CCX, every hand-over between the threads
// about five times slower).
inline double MeasureThreadRoundTrip() {
  constexpr int kExchanges = 2000;
  alignas(64) std::atomic<int> line{0};
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    line.store(0);
    double nanoseconds = 0;
    int threads = 1;
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      if (t == 0) threads = omp_get_num_threads();
#pragma omp barrier
      if (omp_get_num_threads() == 2) {
        const auto start = Clock::now();
        for (int i = 0; i < kExchanges; ++i) {
          const int mine = 2 * i + t + 1;  // thread 0 writes the odd values, thread 1 the even
          while (line.load(std::memory_order_acquire) != mine - 1) _mm_pause();
          line.store(mine, std::memory_order_release);
        }
        if (t == 0) nanoseconds = Seconds(start) * 1e9 / kExchanges;
      }
    }
    if (threads < 2) return 0;
    runs.push_back(nanoseconds);
  }
  return Median(runs);
}

// MeasureThreadRoundTrip's results as one line: median and range.
inline std::string DescribeRoundTrips(const std::vector<double>& round_trips) {
  if (round_trips.empty() || Median(round_trips) == 0) return "one thread";
  return absl::StrFormat("%.0f ns median of the probes (%.0f to %.0f)", Median(round_trips),
                         *std::min_element(round_trips.begin(), round_trips.end()),
                         *std::max_element(round_trips.begin(), round_trips.end()));
}

}  // namespace kiln::bench
