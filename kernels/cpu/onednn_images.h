// The oneDNN panel layouts as packed images name them (kernels/packed_image.h), and their
// unpacking for loads that cannot adopt them.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/packed_image.h"

namespace kiln::cpu {

// oneDNN's BA16a64b2a (bf16) and BA16a64b (f32) of weights {K, N}: 64-column panels over all of K
// (padded to 16), the layout the small-M kernel reads. A change to either changes its version.
inline constexpr absl::string_view kBf16PanelLayout = "cpu.onednn.BA16a64b2a.v1";
inline constexpr absl::string_view kF32PanelLayout = "cpu.onednn.BA16a64b.v1";

// The plain row-major W[N, K] (in image.dtype) of an image in one of these layouts.
absl::StatusOr<std::vector<std::byte>> UnpackOneDnnImage(const PackedImage& image);

}  // namespace kiln::cpu
