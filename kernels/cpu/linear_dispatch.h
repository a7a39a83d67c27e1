// Which kernel runs a linear at each small M, chosen per weight shape by measuring both on the
// packed weights of this machine (these machines change between runs: Xeon with AMX, EPYC
// without), once per shape and process, and logged. KILN_LINEAR_KERNEL=brgemm|small_m pins the
// choice (auto, the default, measures). Likewise how many panels a thread of a decode kernel
// reads side by side (KILN_DECODE_STREAMS=1|2|4 pins it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/quantization.h"

namespace kiln::cpu {

struct LinearShape {
  int64_t k = 0;
  int64_t n = 0;
  DType dtype = DType::kF32;
  bool bias = false;
  Quantization quantization = Quantization::kNone;

  friend bool operator==(const LinearShape&, const LinearShape&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const LinearShape& shape) {
    return H::combine(std::move(h), shape.k, shape.n, shape.dtype, shape.bias, shape.quantization);
  }
};

struct KernelChoice {
  uint32_t small_m_rows = 0;   // bit m-1 set: the small-M kernel runs m rows (1 ≤ m ≤ 16)
  int64_t k_block = 0;         // PanelWeights::k_block that reproduces brgemm's sums
  bool bit_identical = false;  // that blocking was found
  std::string summary;         // for the log: the rows each kernel got and the times behind it
};

// Sets `k_block` on the shape's weights and says whether the small-M kernel then gives brgemm's
// results bit for bit.
using ProbeFn = absl::FunctionRef<bool(int64_t k_block)>;
// Runs one measurement round: every weight of the shape that the caller chose to time, once, at
// `m` rows, on the small-M kernel or on brgemm.
using RoundFn = absl::FunctionRef<void(int64_t m, bool small_m)>;

// The choice for `shape`, remembered per process (the caller then sets choice.k_block itself):
//  1. the K blocking under which the small-M kernel reproduces brgemm bit for bit is found with
//     `probe`; where none does, brgemm runs every M, so that which kernel a batch size picks never
//     changes a result (greedy output alone = in a batch = verified by speculation);
//  2. then the kernel per M is pinned by KILN_LINEAR_KERNEL, taken from `like` (a shape too large
//     to time: an LM head takes the choice of the largest timed shape with its K) when `like`'s
//     blocking reproduces this shape too, or measured with `round` (M = 1, 3, 8 and 16 stand
//     for 1, 2-4, 5-8 and 9-16; alternating kernels; medians). Thread-safe.
KernelChoice ChooseKernel(const LinearShape& shape, ProbeFn probe, RoundFn round,
                          const LinearShape* like_shape = nullptr,
                          const KernelChoice* like = nullptr);

// The choice already made for `shape` in this process (measured or pinned), if any.
bool KnownChoice(const LinearShape& shape, KernelChoice* choice);

// How many panels each thread of a one-row decode call reads side by side as sequential streams
// (1, 2 or 4; two rows read at most 2, see StreamsForRows in panel_split.h). More streams keep
// more reads in flight, but how many a core's prefetchers follow well, and how much compute
// between loads they can hide, differ between machines and kernels: on a 2-core Zen 4 EPYC the
// int4 kernel decoded 15-25 % faster with one stream a thread than with four, where a Zen 5 had
// gained from four.
struct StreamChoice {
  int streams = 4;
  std::string summary;  // for the log: the times behind it
};
// Runs one measurement round: the shape's weights that the caller chose to time, once each at one
// row, reading `streams` panels side by side. A round runs a shape's weights in turn up to
// kStreamRoundBytes (at least one weight), three times what a Zen 4 CCD's 32 MB last-level cache
// holds, so that it streams from memory as decode does where the model exceeds the caches; a
// weight above kLargestStreamTimedBytes (an LM head) takes the choice of a smaller timed shape.
inline constexpr size_t kStreamRoundBytes = size_t{96} << 20;
inline constexpr size_t kLargestStreamTimedBytes = size_t{64} << 20;
using StreamRoundFn = absl::FunctionRef<void(int streams)>;

// The stream count for `shape`, remembered per process: pinned by KILN_DECODE_STREAMS, taken
// from `like` (a shape too large to time takes that of a timed one), or measured with `round`
// (alternating counts; medians; two streams stay unless another count is clearly faster).
// Logged once. Thread-safe.
StreamChoice ChooseStreams(const LinearShape& shape, StreamRoundFn round,
                           const LinearShape* like_shape = nullptr,
                           const StreamChoice* like = nullptr);

// The counts ChooseStreams measures, the default first: two, which on the Zen 4 VMs read as much
// as four or more in every format at every bandwidth measured (up to 0.3 of the probe more at a
// high one), where a load timed while the bandwidth was low saw a tie.
inline constexpr int kStreamCounts[] = {2, 4, 1};
// The count that median seconds a round (in kStreamCounts' order) choose: the default unless
// another is more than 3 % faster, then the fastest such.
int PickStreams(absl::Span<const double> median_seconds);

// The stream count already chosen for `shape` in this process, if any.
bool KnownStreams(const LinearShape& shape, StreamChoice* choice);

// The weights of one shape among those a pack call made, for ChooseStreamsForShapes.
struct StreamShape {
  LinearShape shape;
  size_t weight_bytes = 0;                 // one weight's
  size_t total_bytes = 0;                  // all of the shape's
  std::function<void(int streams)> round;  // a StreamRoundFn over the shape's weights
};

// The stream count of each shape (ChooseStreams), in order. A shape is timed when a round over
// its weights streams from memory as decode does (together they fill kStreamRoundBytes), or
// when all the shapes together are smaller than that (a model that stays in the caches, timed
// from cache as it runs). The others, the small shapes of a model larger than the caches (timed
// alone their few weights would come from cache; decode reads them from memory between the
// others) and weights above kLargestStreamTimedBytes, take the choice of the timed shape with
// the most bytes, or are timed where there is none.
std::vector<int> ChooseStreamsForShapes(const std::vector<StreamShape>& shapes);

// Describes the shape for logs: "[K=896, N=1152] bf16 +bias" (" int4" for quantized weights).
std::string DescribeShape(const LinearShape& shape);

}  // namespace kiln::cpu
