#include "kernels/backend.h"

namespace kiln {

absl::StatusOr<std::vector<std::unique_ptr<PackedLinear>>> Backend::PackLinears(
    absl::Span<const LinearPackSpec> specs) {
  std::vector<std::unique_ptr<PackedLinear>> packed;
  packed.reserve(specs.size());
  for (const LinearPackSpec& spec : specs) {
    absl::StatusOr<std::unique_ptr<PackedLinear>> linear = PackLinear(spec);
    if (!linear.ok()) return linear.status();
    packed.push_back(std::move(*linear));
  }
  return packed;
}

}  // namespace kiln
