// The compute backend seam: weight packing (run once, at PostLoad) and packed GEMM.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace kiln {

// A read-only row-major [rows, cols] matrix in its stored dtype. `data` may be unaligned
// (it often points into a memory-mapped checkpoint).
struct WeightView {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const std::byte* data = nullptr;

  int64_t elements() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(elements()) * DTypeSize(dtype); }
};

// What to pack: the weight of y = x·Wᵀ (+ bias). Several row blocks are stacked along the
// output dimension, which is how q/k/v and gate/up become one fused GEMM.
struct LinearPackSpec {
  std::string name;                    // for logs and errors, e.g. "layers.3.qkv"
  std::vector<WeightView> row_blocks;  // all with the same cols; concatenated by rows
  std::vector<float> bias;             // empty, or one value per output row
  DType compute_dtype = DType::kF32;   // kF32 or kBF16: the dtype the packed weight is kept in
};

// A weight packed for one backend. y[m, n] = Σ_k x[m, k]·W[n, k] (+ bias[n]).
// Activations are fp32 in and out; accumulation is fp32.
class PackedLinear {
 public:
  virtual ~PackedLinear() = default;
  PackedLinear(const PackedLinear&) = delete;
  PackedLinear& operator=(const PackedLinear&) = delete;

  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  virtual DType compute_dtype() const = 0;
  // Bytes of packed weight (and bias) this layer holds.
  virtual size_t packed_bytes() const = 0;
  // Kernel that runs it (e.g. oneDNN's impl string "brg:avx512_core_bf16"), for logs and benches.
  virtual std::string kernel_name() const = 0;

  // x: [m, in_features] fp32 row-major; y: [m, out_features] fp32 row-major. Thread-safe.
  virtual absl::Status Forward(const float* x, int64_t m, float* y) const = 0;

 protected:
  PackedLinear() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual absl::string_view name() const = 0;
  // Packs the weight into the layout the backend's fastest kernel wants. Shapes the fast path
  // does not support fall back to a slower layout instead of failing.
  virtual absl::StatusOr<std::unique_ptr<PackedLinear>> PackLinear(const LinearPackSpec& spec) = 0;
  // Packs a whole model's weights: one result per spec, in order. A backend may pack them
  // concurrently (the CPU backend does); this default packs them one after another. On error
  // nothing is returned and the status names the first failing spec.
  virtual absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> PackLinears(
      absl::Span<const LinearPackSpec> specs);
};

// The oneDNN CPU backend.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend();

}  // namespace kiln
