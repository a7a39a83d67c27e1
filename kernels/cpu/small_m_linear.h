// The decode-path linear: y = x·Wᵀ for a few rows (decode, speculative verification), over the
// panel layout the CPU backend packs weights into. A panel is 64 output columns for the whole of
// K, stored contiguously (oneDNN's BA16a64b2a for bf16, BA16a64b for f32), so each thread streams
// its own run of panels once for all rows, with fp32 accumulators in registers (`vdpbf16ps` for
// bf16); for one or two bf16 rows a thread reads up to four panels side by side (more sequential
// streams in flight); 5-16 rows (speculative verification, a batched decode step) take each
// panel in 8 KiB chunks, passes of rows and columns over a chunk from L1. Larger M stays with
// oneDNN's brgemm.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kiln::cpu {

// Columns per panel.
inline constexpr int64_t kPanelColumns = 64;
// The most rows one call takes; larger M goes to brgemm.
inline constexpr int64_t kSmallMMaxRows = 16;

struct PanelWeights {
  const void* data = nullptr;  // ceil(n / 64) panels, each k_padded × 64 values
  DType dtype = DType::kBF16;  // kBF16 or kF32
  int64_t k = 0;
  int64_t k_padded = 0;  // K rounded up to the layout's block (16); the padding is zero
  int64_t n = 0;
  const float* bias = nullptr;  // n values, or null
  // Sums run over K in blocks of this many values (0: all of K), each block from zero and then
  // added to the total, as brgemm blocks K: with brgemm's blocking the two kernels give the same
  // bits, so a row's result does not depend on which kernel its batch size picked.
  int64_t k_block = 0;
  // The most panels a bf16 thread reads side by side (linear_dispatch.h's ChooseStreams).
  int max_streams = 2;  // kStreamCounts[0] until chosen
};

// Whether this CPU runs the small-M kernel for `dtype` (bf16 needs AVX-512 BF16, f32 AVX-512F).
bool SmallMKernelSupported(DType dtype);

// y[m, n] = x[m, k]·Wᵀ (+ bias) for 1 ≤ m ≤ kSmallMMaxRows, on up to `threads` threads (each its
// own run of panels first, then the others' from the back; see panel_split.h). x and y are
// contiguous fp32. The caller checks SmallMKernelSupported.
void RunSmallM(const PanelWeights& weights, const float* x, int64_t m, float* y, int threads);

}  // namespace kiln::cpu
