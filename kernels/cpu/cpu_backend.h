// The CPU backend: oneDNN brgemm linears packed once, kiln's own fp32 kernels for everything else,
// host memory throughout (so weights in a mapped checkpoint are read in place).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend();

}  // namespace kiln
