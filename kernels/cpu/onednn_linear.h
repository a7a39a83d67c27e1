// Linear layers on oneDNN 2.6: weights packed once into the blocked layout brgemm picks for a
// concrete M (docs/onednn-2.6.md: 2.6 refuses brgemm for runtime dims); every call runs a
// primitive created (and cached) for its concrete M against that layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace kiln::cpu {

// Packs weights for one oneDNN CPU engine; its primitive cache is shared by every layer it packs.
class OneDnnPacker {
 public:
  static absl::StatusOr<std::unique_ptr<OneDnnPacker>> Create();
  ~OneDnnPacker();

  // Packs every spec on up to `threads` threads, one weight per thread (largest first). On error
  // nothing is returned and the status names the first failing spec.
  absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> Pack(
      absl::Span<const LinearPackSpec> specs, int threads);
  // Why Pack cannot adopt spec.prepacked on this machine (empty when it can): another layout,
  // dtype or size than it would pack into.
  std::string AdoptRefusal(const LinearPackSpec& spec);

 private:
  struct State;
  explicit OneDnnPacker(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Which kernel runs a call. kChosen is what serving uses: the small-M kernel for the row counts
// where it measured faster on this shape, brgemm otherwise. The others are for benches and tests.
enum class LinearPath { kChosen, kBrgemm, kSmallM };

// y[m, n] = x[m, k]·Wᵀ (+ bias) for a linear packed by a OneDnnPacker; x and y contiguous fp32.
// InvalidArgument for a linear another backend packed, or for kSmallM where that kernel cannot
// run (layout, CPU, or m > kSmallMMaxRows). Thread-safe.
absl::Status RunLinear(const PackedLinear& linear, const float* x, int64_t m, float* y,
                       LinearPath path = LinearPath::kChosen);

// Whether the small-M kernel can run this linear (packed layout and CPU features).
bool HasSmallMKernel(const PackedLinear& linear);
// Whether it gives brgemm's results bit for bit on this linear (linear_dispatch.h); where it does
// not, serving runs brgemm only.
bool SmallMKernelIsBitIdentical(const PackedLinear& linear);
// Whether LinearPath::kChosen runs the small-M kernel at `m` rows outside a step team (what the
// dispatcher measured or KILN_LINEAR_KERNEL pinned).
bool ChoosesSmallM(const PackedLinear& linear, int64_t m);

// How many panels a thread of the decode kernel (the bf16 small-M kernel or a quantized kernel)
// reads side by side at one row: what packing measured (linear_dispatch.h's ChooseStreams), 1, 2
// or 4; 0 for a linear without such a kernel. Setting it (benches, tests; not while the linear
// runs) changes no result: each panel's sums run in the same order whatever is beside it.
// InvalidArgument for another count or a linear without such a kernel.
int DecodeStreams(const PackedLinear& linear);
absl::Status SetDecodeStreams(PackedLinear& linear, int streams);

}  // namespace kiln::cpu
