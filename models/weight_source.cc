#include "models/weight_source.h"

#include "absl/strings/str_cat.h"

namespace kiln {

int64_t TensorRecord::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::string_view LoadModeName(LoadMode mode) {
  switch (mode) {
    case LoadMode::kMmapZeroCopy:
      return "mmap zero-copy";
    case LoadMode::kRead:
      return "read";
    case LoadMode::kReadConvert:
      return "read+convert";
  }
  return "?";
}

absl::string_view WeightLayoutName(WeightLayout layout) {
  return layout == WeightLayout::kEngine ? "engine (fused qkv, gate_up)" : "Hugging Face";
}

absl::Status WeightSource::Add(TensorRecord record) {
  auto [it, inserted] = index_.try_emplace(record.name, records_.size());
  if (!inserted) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", record.name, " appears in both ",
                                                   records_[it->second].origin, " and ",
                                                   record.origin));
  }
  records_.push_back(std::move(record));
  return absl::OkStatus();
}

const TensorRecord* WeightSource::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &records_[it->second];
}

absl::Status WeightSource::Merge(WeightSource other) {
  for (auto& backing : other.backing_) backing_.push_back(std::move(backing));
  for (auto& record : other.records_) {
    if (absl::Status status = Add(std::move(record)); !status.ok()) return status;
  }
  for (auto& file : other.provenance_.files) provenance_.files.push_back(std::move(file));
  provenance_.bytes_read += other.provenance_.bytes_read;
  return absl::OkStatus();
}

absl::StatusOr<WeightView> AsMatrix(const TensorRecord& record) {
  if (record.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", record.name, " in ", record.origin,
                                                   " must be 2-D but has ", record.shape.size(),
                                                   " dimensions"));
  }
  if (record.packed != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", record.name, " in ", record.origin,
                                                   " is stored packed (", record.packed->layout,
                                                   "); only a linear's weight may be, and only the "
                                                   "backend reads it"));
  }
  return WeightView{record.dtype, record.shape[0], record.shape[1], record.data};
}

}  // namespace kiln
