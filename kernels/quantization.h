// Weight quantization PostLoad can apply to a model's linears (activations stay fp32 between ops).
//   int8: symmetric, one fp32 scale per output channel: s = max|w| / 127, q = round(w · 127 /
//         max|w|) in [-127, 127], w ≈ s · q.
//   int4: symmetric, one fp16 scale per group of kInt4GroupSize values along K per output
//         channel: d = fp16(m / -8) with m the group's value of largest magnitude (as llama.cpp's
//         q4_0, so all 16 levels are used), q = round(w / d) in [-8, 7], w ≈ d · q.
// The CPU kernels quantize each linear's input the same symmetric way to int8 (per row for int8
// weights, per group of kInt4GroupSize along K for int4), sum the integer products exactly and
// scale the sums: y = Σ s_w · s_x · Σ q_w · q_x over the row or groups. Rounding is to nearest,
// ties to even, in fp32.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

enum class Quantization { kNone, kInt8, kInt4 };

inline constexpr int64_t kInt4GroupSize = 32;

// "none", "int8", "int4".
absl::string_view QuantizationName(Quantization quantization);
// What a user names ("", "none", "int8" or "int4"; any case); InvalidArgument for anything else.
absl::StatusOr<Quantization> ParseQuantization(absl::string_view text);

}  // namespace kiln
