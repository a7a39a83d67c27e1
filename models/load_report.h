// What the load pipeline did with every tensor of a checkpoint (design.md §1, invariant 3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct TensorSummary {
  std::string name;
  uint64_t bytes = 0;
  std::string origin;  // file, for placed/carried/unplaced tensors
  std::string head;    // for restored tensors: the MTP head that took it
  std::string reason;  // for ignored tensors: why the loader did not pass them on
};

struct LoadReport {
  std::vector<TensorSummary> placed;    // bound to a parameter of the architecture
  std::vector<TensorSummary> missing;   // required by the architecture, absent (load fails)
  std::vector<TensorSummary> carried;   // in the checkpoint, not placed by the architecture
  std::vector<TensorSummary> restored;  // carried tensors taken by a restored MTP head
  std::vector<TensorSummary> unplaced;  // carried tensors nothing took: listed, never dropped
  std::vector<TensorSummary> ignored;   // recognised by the loader and not needed (markers,
                                        // recomputed RoPE caches), with the reason
  std::vector<std::string> warnings;

  uint64_t placed_bytes() const;
  // Multi-line human-readable summary for logs.
  std::string Summary() const;
};

}  // namespace kiln
