// Element types of weights as stored in checkpoints, and conversions to fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// Safetensors spelling: "F32", "F16", "BF16".
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> DTypeFromName(absl::string_view name);
// The spelling of kiln's API, config files and CLI: "f32", "bf16", "f16". Parsing also takes
// "fp32"/"float32", "bfloat16" and "fp16"/"float16".
absl::string_view DTypeApiName(DType dtype);
absl::StatusOr<DType> ParseDTypeApiName(absl::string_view text);

inline float BF16ToF32(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// Round to nearest even, as torch's .to(torch.bfloat16) does; NaN stays NaN.
inline uint16_t F32ToBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

// Converts n elements of `dtype` at `src` (any alignment) to fp32.
void ConvertToF32(DType dtype, const std::byte* src, int64_t n, float* dst);
// Converts n fp32 values to `dtype` at `dst` (any alignment).
void ConvertFromF32(DType dtype, const float* src, int64_t n, std::byte* dst);

}  // namespace kiln
