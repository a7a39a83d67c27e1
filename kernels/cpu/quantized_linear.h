// Linears with quantized weights (kernels/quantization.h) on the CPU. The weights live in 64-column
// panels that each thread streams once per call for all rows, as the small-M kernel does, and are
// multiplied with VNNI (`vpdpbusd`) against the activations quantized to int8: per row for int8
// weights, per group of 32 values for int4 (as each weight group has its own scale). Products are
// summed exactly in int32 and scaled once per row (int8) or per group (int4), so a row's result
// does not depend on the rows beside it or on the thread count. The same kernel runs every M:
// panels outside, groups of up to 4 rows inside, so prefill reads each panel from cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace kiln::cpu {

// Whether this CPU runs the quantized kernels (AVX-512 F/BW with VNNI, and F16C for int4 scales).
bool QuantizedKernelSupported();

// Why `spec` cannot be quantized on this CPU (an empty string when it can): no VNNI, or a K too
// large for exact int32 sums.
std::string QuantizedPackRefusal(const LinearPackSpec& spec);

// Quantizes and packs spec.row_blocks (any stored dtype) as spec.quantization says, on up to
// `threads` OpenMP threads. The caller checks QuantizedPackRefusal first.
absl::StatusOr<std::unique_ptr<PackedLinear>> PackQuantizedLinear(const LinearPackSpec& spec,
                                                                  int threads);

// Why spec.prepacked (an image of a quantized linear) cannot be adopted on this CPU as
// spec.quantization asks (empty when it can): its layout, parts or quantization differ.
std::string QuantizedAdoptRefusal(const LinearPackSpec& spec);
// A quantized linear on a copy of spec.prepacked's bytes (copied on up to `threads` OpenMP
// threads): nothing is quantized.
absl::StatusOr<std::unique_ptr<PackedLinear>> AdoptQuantizedLinear(const LinearPackSpec& spec,
                                                                   int threads);
// The fp32 W[N, K] a quantized image stands for (q · scale), for loads that cannot adopt it.
// Runs anywhere: no VNNI needed.
absl::StatusOr<std::vector<float>> DequantizeImage(const PackedImage& image);

// Whether PackQuantizedLinear or AdoptQuantizedLinear made `linear`.
bool IsQuantizedLinear(const PackedLinear& linear);
// y[m, n] = x[m, k]·Wᵀ (+ bias) for a linear PackQuantizedLinear made, on up to `threads` OpenMP
// threads; x and y contiguous fp32. InvalidArgument for any other linear.
absl::Status RunQuantizedLinear(const PackedLinear& linear, const float* x, int64_t m, float* y,
                                int threads);

// Chooses for each shape of quantized linear among `linears` (others are skipped) how many panels
// a thread reads side by side at one row (linear_dispatch.h's ChooseStreamsForShapes: rounds over
// the shape's weights at one row on up to `threads` threads, once per shape and process) and
// sets it on every linear of the shape.
void ChooseQuantizedStreams(absl::Span<PackedLinear* const> linears, int threads);
// The count a quantized linear reads at one row, and setting it (the caller checks
// IsQuantizedLinear and that streams is 1, 2 or 4; onednn_linear.h's SetDecodeStreams does).
int QuantizedStreams(const PackedLinear& linear);
void SetQuantizedStreams(PackedLinear& linear, int streams);

}  // namespace kiln::cpu
