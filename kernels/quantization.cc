#include "kernels/quantization.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kiln {

absl::string_view QuantizationName(Quantization quantization) {
  switch (quantization) {
    case Quantization::kNone:
      return "none";
    case Quantization::kInt8:
      return "int8";
    case Quantization::kInt4:
      return "int4";
  }
  return "?";
}

absl::StatusOr<Quantization> ParseQuantization(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower.empty() || lower == "none") return Quantization::kNone;
  if (lower == "int8") return Quantization::kInt8;
  if (lower == "int4") return Quantization::kInt4;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown quantization '", text, "': expected none, int8 or int4"));
}

}  // namespace kiln
