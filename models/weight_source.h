// What every loader yields: named tensor records with byte views, plus where they came from.
// A loader never builds a model; models/lifecycle.h turns a WeightSource into one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace kiln {

struct TensorRecord {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // shape-product × DTypeSize bytes; valid while the source lives. May be unaligned (Tensorizer
  // data offsets are arbitrary): readers go through memcpy-based conversions, never casts.
  const std::byte* data = nullptr;
  size_t byte_size = 0;
  std::string origin;  // file it came from, for reports and errors
  // Set for a linear's weight stored packed (native tensorized files written with --prepack):
  // `shape` and `dtype` are the logical weight's, `data`/`byte_size` the first part's, and only
  // PostLoad reads it, handing the image to the backend (AsMatrix refuses it).
  std::shared_ptr<const PackedImage> packed;

  int64_t elements() const;
};

// How the bytes reached memory; chosen in one place per loader and logged.
enum class LoadMode { kMmapZeroCopy, kRead, kReadConvert };
absl::string_view LoadModeName(LoadMode mode);

// How the records are named and shaped. Hugging Face checkpoints keep q/k/v and gate/up as
// separate tensors; kiln's engine layout (native tensorized files, and vLLM files once their
// names are mapped) stores them fused: `self_attn.qkv_proj` = [q; k; v] rows and
// `mlp.gate_up_proj` = [gate; up] rows.
enum class WeightLayout { kHuggingFace, kEngine };
absl::string_view WeightLayoutName(WeightLayout layout);

// A tensor the loader recognised and deliberately did not pass on (a format marker, a RoPE
// cache the model recomputes). Listed in the LoadReport so nothing disappears unseen.
struct DroppedTensor {
  std::string name;
  uint64_t bytes = 0;
  std::string origin;
  std::string reason;
};

struct SourceProvenance {
  std::string format;              // "safetensors", "tensorizer", ...
  std::string format_version;      // free text, e.g. "tensorizer v4"
  std::vector<std::string> files;  // files read, relative to the model root
  LoadMode load_mode = LoadMode::kMmapZeroCopy;
  std::string hash_check;  // Tensorizer: the stored hashes checked ("all", "crc32", "none")
  bool encrypted = false;
  uint64_t bytes_read = 0;  // payload bytes the loader exposed
  WeightLayout layout = WeightLayout::kHuggingFace;
  std::vector<DroppedTensor> dropped;
};

// Owns (or keeps alive) the memory that the records point into. Move-only.
class WeightSource {
 public:
  WeightSource() = default;
  WeightSource(WeightSource&&) = default;
  WeightSource& operator=(WeightSource&&) = default;
  WeightSource(const WeightSource&) = delete;
  WeightSource& operator=(const WeightSource&) = delete;

  // Fails if a record with the same name exists already, naming both origins.
  absl::Status Add(TensorRecord record);
  // Keeps `backing` alive for as long as this source (a mapping, an owned buffer).
  void KeepAlive(std::shared_ptr<const void> backing) { backing_.push_back(std::move(backing)); }

  const std::vector<TensorRecord>& records() const { return records_; }
  const TensorRecord* Find(absl::string_view name) const;
  SourceProvenance& provenance() { return provenance_; }
  const SourceProvenance& provenance() const { return provenance_; }

  // Keeps the backing of another source alive and takes its records (for sidecar files).
  absl::Status Merge(WeightSource other);

 private:
  std::vector<TensorRecord> records_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::vector<std::shared_ptr<const void>> backing_;
  SourceProvenance provenance_;
};

// A 2-D record as a WeightView; fails with the tensor named if it is not 2-D.
absl::StatusOr<WeightView> AsMatrix(const TensorRecord& record);

}  // namespace kiln
