// Writes safetensors files (used by `kiln synth` and by tests that make checkpoints).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace kiln {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // exactly elements × DTypeSize bytes
};

// One file; `metadata` goes into "__metadata__".
absl::Status WriteSafetensorsFile(const std::filesystem::path& path,
                                  std::span<const TensorToWrite> tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// A checkpoint in `dir`: model.safetensors when everything fits in `max_shard_bytes`, otherwise
// model-0000i-of-0000N.safetensors shards plus model.safetensors.index.json.
absl::Status WriteSafetensorsCheckpoint(const std::filesystem::path& dir,
                                        std::span<const TensorToWrite> tensors,
                                        uint64_t max_shard_bytes);

}  // namespace kiln
