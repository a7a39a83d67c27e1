// Writer for CoreWeave Tensorizer `.tensors` files, laid out exactly as tensorizer 2.11 writes an
// unencrypted file (shared/docs/tensorizer-format.md): a 256 KiB index, records back to back with
// CRC32 + SHA-256 each, then the end-of-records marker. Given the same tensors in the same order,
// the output is byte-identical to tensorizer's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loaders/tensorizer_format.h"

namespace kiln::tensorizer {

struct WriteTensor {
  std::string name;  // raw bytes, at most 65535
  TensorType type = TensorType::kStateDict;
  uint16_t module_idx = 0;
  ElementType element_type = ElementType::kF32;
  std::vector<int64_t> shape;  // at most 255 dims, each in [0, 2^32)
  const std::byte* data = nullptr;
  size_t size = 0;    // must equal the shape's byte size (0 for meta tensors)
  bool meta = false;  // written without data (data_length 0); reads back as zeros
  // The raw dtype field; empty means DTypeString(element_type). Set it to reproduce another
  // writer's spelling (e.g. "<V2\0torch.uint16"); it must parse to element_type.
  std::string dtype_string;
};

// Writes `tensors` in order to `path` through a temporary file in the same directory that is
// renamed over `path`. The data version is the one tensorizer picks: 1, 2 when a dtype is opaque
// (bfloat16, complex32, float8...), 4 when a meta tensor is present. InvalidArgument for
// duplicate names, sizes that do not match shapes, fields too long for the format, or an index
// larger than tensorizer's 256 KiB ("metadata overflow").
absl::Status WriteTensorizerFile(const std::filesystem::path& path,
                                 std::span<const WriteTensor> tensors);

// Where WriteTensorizerFile puts the first record, and the size of the header it writes before
// `tensor`'s data: records follow each other with nothing between, so a caller can place data at
// the alignment it wants (kiln's native files insert small padding tensors to align weights).
inline constexpr uint64_t kFirstRecordOffset = kFileHeaderSize + kStandardIndexSize;
uint64_t RecordHeaderSize(const WriteTensor& tensor);

}  // namespace kiln::tensorizer
