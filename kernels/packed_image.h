// A packed weight's bytes as a backend laid them out, so that a file can keep them and a later
// load can hand them back instead of packing again (native tensorized files written with
// `kiln tensorize --prepack`). The layout name says whose layout it is and its version; a backend
// adopts an image only in a layout it packs into itself on this machine, and anything else is
// unpacked to plain weights and packed as usual (the CPU backend: CpuBackend::AdoptOrUnpack).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/quantization.h"

namespace kiln {

struct PackedImage {
  struct Part {
    std::string name;  // e.g. "weights", "scales"
    const std::byte* data = nullptr;
    size_t bytes = 0;
  };

  std::string layout;          // e.g. "cpu.onednn.BA16a64b2a.v1", "cpu.int8.panel64.v1"
  DType dtype = DType::kBF16;  // the compute dtype of the weights it stands for
  Quantization quantization = Quantization::kNone;
  int64_t rows = 0;         // output features (N)
  int64_t cols = 0;         // input features (K)
  std::vector<Part> parts;  // bias not included: it stays a plain tensor

  // Where a backend may keep using the parts' bytes after the load (rather than copy them): what
  // keeps them alive (the file's mapping), and whether the kernel maps them in 2 MiB pages, so
  // that streaming them costs no more TLB misses than the backend's own huge-page memory. Without
  // both, the bytes are only valid during the load and a backend copies them.
  std::shared_ptr<const void> backing;
  bool in_huge_pages = false;

  const Part* Find(absl::string_view name) const {
    for (const Part& part : parts) {
      if (part.name == name) return &part;
    }
    return nullptr;
  }
  size_t bytes() const {
    size_t total = 0;
    for (const Part& part : parts) total += part.bytes;
    return total;
  }
};

}  // namespace kiln
