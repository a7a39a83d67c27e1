#include "kernels/dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", std::string(name)));
}

absl::string_view DTypeApiName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

absl::StatusOr<DType> ParseDTypeApiName(absl::string_view text) {
  if (text == "f32" || text == "fp32" || text == "float32") return DType::kF32;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "f16" || text == "fp16" || text == "float16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a dtype (use bf16, f32 or f16)"));
}

float F16ToF32(uint16_t bits) {
  // _Float16 is native on this compiler for x86-64; it handles subnormals and NaN exactly.
  _Float16 half;
  std::memcpy(&half, &bits, sizeof(half));
  return static_cast<float>(half);
}

uint16_t F32ToF16(float value) {
  _Float16 half = static_cast<_Float16>(value);
  uint16_t bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

void ConvertToF32(DType dtype, const std::byte* src, int64_t n, float* dst) {
  if (n <= 0) return;  // src/dst may be null for empty tensors
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = BF16ToF32(bits);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = F16ToF32(bits);
      }
      return;
  }
}

void ConvertFromF32(DType dtype, const float* src, int64_t n, std::byte* dst) {
  if (n <= 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits = F32ToBF16(src[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits = F32ToF16(src[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      return;
  }
}

}  // namespace kiln
