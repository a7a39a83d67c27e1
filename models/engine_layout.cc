#include "models/engine_layout.h"

#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/manifest.h"

namespace kiln {
namespace {

// Row-stacks `blocks` (all with the same trailing shape) into one tensor of `dtype`.
LayoutTensor Stack(std::string name, const std::vector<const TensorRecord*>& blocks, DType dtype) {
  LayoutTensor out;
  out.name = std::move(name);
  out.dtype = dtype;
  out.shape = blocks.front()->shape;
  out.shape[0] = 0;
  int64_t elements = 0;
  for (const TensorRecord* block : blocks) {
    out.shape[0] += block->shape[0];
    elements += block->elements();
  }
  out.owned.resize(static_cast<size_t>(elements) * DTypeSize(dtype));
  std::byte* dst = out.owned.data();
  std::vector<float> staging;
  for (const TensorRecord* block : blocks) {
    const size_t bytes = static_cast<size_t>(block->elements()) * DTypeSize(dtype);
    if (block->dtype == dtype) {
      if (bytes > 0) std::memcpy(dst, block->data, bytes);
    } else {
      staging.resize(static_cast<size_t>(block->elements()));
      ConvertToF32(block->dtype, block->data, block->elements(), staging.data());
      ConvertFromF32(dtype, staging.data(), block->elements(), dst);
    }
    dst += bytes;
  }
  out.data = out.owned.data();
  out.size = out.owned.size();
  return out;
}

// One tensor as is (a view) or converted to `dtype`.
LayoutTensor Single(const std::string& name, const TensorRecord& record,
                    std::optional<DType> dtype) {
  if (dtype.has_value() && *dtype != record.dtype) return Stack(name, {&record}, *dtype);
  LayoutTensor out;
  out.name = name;
  out.dtype = record.dtype;
  out.shape = record.shape;
  out.data = record.data;
  out.size = record.byte_size;
  return out;
}

}  // namespace

absl::StatusOr<std::vector<LayoutTensor>> ToEngineLayout(const WeightSource& source,
                                                         const ModelConfig& config,
                                                         std::optional<DType> dtype) {
  if (dtype.has_value() && *dtype != DType::kF32 && *dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", DTypeName(*dtype), " is not offered for export (F32 or BF16)"));
  }
  for (const TensorRecord& record : source.records()) {
    if (record.packed != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(record.name, " in ", record.origin, " is stored packed (",
                       record.packed->layout, "); convert the original checkpoint instead"));
    }
  }
  const WeightLayout from = source.provenance().layout;
  const std::vector<ParamSpec> source_specs = BuildParamManifest(config, from);
  const std::vector<ParamSpec> engine_specs = BuildParamManifest(config, WeightLayout::kEngine);

  absl::flat_hash_set<std::string> placed;
  std::vector<std::string> problems;
  auto find = [&](const std::string& name,
                  const std::vector<int64_t>& shape) -> const TensorRecord* {
    const TensorRecord* record = source.Find(name);
    if (record == nullptr) return nullptr;
    if (record->shape != shape) {
      problems.push_back(absl::StrCat(name, " has shape [", absl::StrJoin(record->shape, ", "),
                                      "], expected [", absl::StrJoin(shape, ", "), "]"));
      return nullptr;
    }
    placed.insert(name);
    return record;
  };
  auto spec_of = [&](int64_t layer, ParamRole role) -> const ParamSpec* {
    for (const ParamSpec& spec : source_specs) {
      if (spec.layer == layer && spec.role == role) return &spec;
    }
    return nullptr;
  };

  std::vector<LayoutTensor> out;
  for (const ParamSpec& target : engine_specs) {
    std::vector<ParamRole> parts = {target.role};
    if (from == WeightLayout::kHuggingFace) {
      if (target.role == ParamRole::kQKV) parts = {ParamRole::kQ, ParamRole::kK, ParamRole::kV};
      if (target.role == ParamRole::kQKVBias) {
        parts = {ParamRole::kQBias, ParamRole::kKBias, ParamRole::kVBias};
      }
      if (target.role == ParamRole::kGateUp) parts = {ParamRole::kGate, ParamRole::kUp};
    }
    std::vector<const TensorRecord*> blocks;
    for (ParamRole part : parts) {
      const ParamSpec* spec = spec_of(target.layer, part);
      const TensorRecord* record = spec == nullptr ? nullptr : find(spec->name, spec->shape);
      if (record == nullptr) break;
      blocks.push_back(record);
    }
    if (blocks.size() != parts.size()) {
      if (target.required) problems.push_back(absl::StrCat(target.name, " cannot be built"));
      continue;
    }
    if (blocks.size() == 1) {
      out.push_back(Single(target.name, *blocks.front(), dtype));
    } else {
      out.push_back(Stack(target.name, blocks, dtype.value_or(blocks.front()->dtype)));
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot convert to the engine layout: ", absl::StrJoin(problems, "; ")));
  }
  for (const TensorRecord& record : source.records()) {
    if (!placed.contains(record.name)) out.push_back(Single(record.name, record, dtype));
  }
  return out;
}

}  // namespace kiln
