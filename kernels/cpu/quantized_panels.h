// The quantized CPU linears' panel layouts and the kernels that read them (quantized_linear.h
// packs the weights and runs these): the activations quantized to int8, and int8/int4 panels
// multiplied against them with VNNI, summing exactly in int32.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/quantization.h"

namespace kiln::cpu::quantized {

#define KILN_VNNI_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

// int8 panels: 64 columns; for each quad of K values, 4 vectors × 16 columns × 4 bytes (the
// operand layout of vpdpbusd), each byte q + 128 (unsigned).
constexpr int64_t kInt8PanelColumns = 64;
constexpr int64_t kQuadBytesInt8 = kInt8PanelColumns * 4;
// int4 panels: 32 columns; per group of 32 K values, 2 vectors × 4 loads of 64 bytes (the low
// nibbles hold one quad of K, the high nibbles the next), each nibble q + 8, then the group's 32
// fp16 scales. A panel is one contiguous stream.
constexpr int64_t kInt4PanelColumns = 32;
constexpr int64_t kInt4GroupWeightBytes = 2 * 4 * 64;
constexpr int64_t kInt4GroupBytes = kInt4GroupWeightBytes + kInt4PanelColumns * 2;
static_assert(kInt4GroupSize == 32, "the int4 layout holds 8 quads of K per group");
// K is padded to whole groups with zero weights (and zero activations).
constexpr int64_t kKAlign = 32;
// Exact int32 sums: |Σ (q + 128)·x| ≤ K·255·127 < 2³¹.
constexpr int64_t kMaxK = 65536;
// Rows per pass over a panel: the int accumulators of 4 rows fill half the register file.
constexpr int kMaxRowsPerPass = 4;

// The packed weights as the kernels read them.
struct PackedView {
  Quantization kind = Quantization::kInt8;
  int64_t k = 0;
  int64_t k_padded = 0;
  int64_t n = 0;
  int64_t panels = 0;
  int64_t panel_bytes = 0;
  const uint8_t* data = nullptr;
  const float* scales = nullptr;  // int8: one per column, panels × 64 values (padding 0)
  const float* bias = nullptr;    // n values, or null
};

// Activations quantized for one call: int8 values [m][k_padded]; per row (int8 weights) or per
// row and group (int4) a scale and the offset the unsigned weights add to the int32 sums
// (128·Σq or 8·Σq over the row or group).
struct QuantizedActivations {
  std::vector<int8_t> values;
  std::vector<float> scales;
  std::vector<int32_t> offsets;
};

// Quantizes the m rows of x (K values each) for w: per row (int8 weights) or per row and group
// (int4), zero-padded to w.k_padded.
void QuantizeActivations(const PackedView& w, const float* x, int64_t m, QuantizedActivations& a);

// Asks for the first lines of panels first[0..count) of w, those the kernel reads before its own
// prefetches run ahead of it, into L2.
void PrefetchPanelStarts(const PackedView& w, const int64_t* first, int count);

// Panels first[0..count) of w times the m rows of `a`, into y (row stride w.n): side by side
// for m ≤ 4 rows (count ≤ StreamsForRows(m)), else each panel in turn in passes of 4 rows.
void RunPanelGroup(const PackedView& w, const QuantizedActivations& a, int64_t m,
                   const int64_t* first, int count, float* y);

}  // namespace kiln::cpu::quantized
