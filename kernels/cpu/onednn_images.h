// The oneDNN panel layouts as packed images name them (kernels/packed_image.h), and their
// unpacking for loads that cannot adopt them.
#pragma once

#include <cstddef>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/packed_image.h"

namespace kiln::cpu {

// oneDNN's BA16a64b2a (bf16) and BA16a64b (f32) of weights {K, N}: 64-column panels over all of K
// (padded to 16), the layout the small-M kernel reads. A change to either changes its version.
struct PanelLayout {
  absl::string_view name;  // as PackedImage::layout
  DType dtype;
  dnnl::memory::format_tag tag;
};
inline constexpr PanelLayout kPanelLayouts[] = {
    {"cpu.onednn.BA16a64b2a.v1", DType::kBF16, dnnl::memory::format_tag::BA16a64b2a},
    {"cpu.onednn.BA16a64b.v1", DType::kF32, dnnl::memory::format_tag::BA16a64b},
};
// The panel layout of `dtype` (kBF16 or kF32).
inline const PanelLayout& PanelLayoutFor(DType dtype) {
  return kPanelLayouts[dtype == DType::kBF16 ? 0 : 1];
}

// The plain row-major W[N, K] (in image.dtype) of an image in one of these layouts.
absl::StatusOr<std::vector<std::byte>> UnpackOneDnnImage(const PackedImage& image);

}  // namespace kiln::cpu
