#include "models/bind.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"

namespace kiln {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// At most `limit` names, then "and N more".
std::string NameList(const std::vector<std::string>& names, size_t limit = 16) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + static_cast<long>(std::min(limit, names.size())));
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > limit) absl::StrAppend(&text, ", and ", names.size() - limit, " more");
  return text;
}

TensorSummary Summarize(const TensorRecord& record) {
  return {record.name, record.byte_size, record.origin, "", ""};
}

}  // namespace

uint64_t LoadReport::placed_bytes() const {
  uint64_t total = 0;
  for (const TensorSummary& t : placed) total += t.bytes;
  return total;
}

std::string LoadReport::Summary() const {
  std::string text =
      absl::StrCat("placed ", placed.size(), " tensors (", placed_bytes(), " bytes), missing ",
                   missing.size(), ", carried ", carried.size(), ", restored ", restored.size(),
                   ", unplaced ", unplaced.size(), ", ignored ", ignored.size());
  for (const TensorSummary& t : restored) {
    absl::StrAppend(&text, "\n  restored ", t.name, " (", t.bytes, " bytes) -> ", t.head);
  }
  for (const TensorSummary& t : unplaced) {
    absl::StrAppend(&text, "\n  unplaced ", t.name, " (", t.bytes, " bytes, ", t.origin, ")");
  }
  for (const TensorSummary& t : ignored) {
    absl::StrAppend(&text, "\n  ignored ", t.name, " (", t.bytes, " bytes): ", t.reason);
  }
  for (const std::string& warning : warnings) absl::StrAppend(&text, "\n  warning: ", warning);
  return text;
}

absl::StatusOr<BoundModel> Bind(WeightSource source, const ModelConfig& config) {
  BoundModel bound;
  bound.config = config;
  bound.source = std::move(source);
  bound.layers.assign(static_cast<size_t>(config.num_hidden_layers), BoundParams{});

  const WeightLayout layout = bound.source.provenance().layout;
  for (const DroppedTensor& dropped : bound.source.provenance().dropped) {
    bound.report.ignored.push_back(
        {dropped.name, dropped.bytes, dropped.origin, "", dropped.reason});
  }
  absl::flat_hash_map<absl::string_view, const ParamSpec*> by_name;
  const std::vector<ParamSpec> manifest = BuildParamManifest(config, layout);
  for (const ParamSpec& spec : manifest) by_name.emplace(spec.name, &spec);

  std::vector<std::string> mismatches;
  for (const TensorRecord& record : bound.source.records()) {
    auto it = by_name.find(record.name);
    if (it == by_name.end()) {
      bound.carried.push_back(&record);
      bound.report.carried.push_back(Summarize(record));
      continue;
    }
    const ParamSpec& spec = *it->second;
    if (record.shape != spec.shape) {
      mismatches.push_back(absl::StrCat(
          record.name, " has shape ", ShapeString(record.shape), " but ", config.architecture_name,
          " (", WeightLayoutName(layout), " layout) expects ", ShapeString(spec.shape)));
      continue;
    }
    BoundParams& slot = spec.layer < 0 ? bound.model_params : bound.layers[spec.layer];
    slot[static_cast<int>(spec.role)] = &record;
    bound.report.placed.push_back(Summarize(record));
  }
  if (!mismatches.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint does not fit the architecture: ", NameList(mismatches)));
  }

  std::vector<std::string> missing;
  for (const ParamSpec& spec : manifest) {
    if (spec.required && bound.source.Find(spec.name) == nullptr) {
      missing.push_back(spec.name);
      bound.report.missing.push_back({spec.name, 0, "", "", ""});
    }
  }
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat("checkpoint lacks ", missing.size(),
                                            " required tensors: ", NameList(missing)));
  }
  return bound;
}

absl::Status RestoreCarried(BoundModel& model) {
  absl::StatusOr<MtpRestoration> mtp = RestoreMtpHeads(model.config, model.carried, model.report);
  if (!mtp.ok()) return mtp.status();
  model.mtp_heads = std::move(mtp->heads);
  for (const TensorRecord* record : mtp->unused) {
    model.report.unplaced.push_back(Summarize(*record));
    LOG(WARNING) << "tensor " << record->name << " (" << record->byte_size << " bytes, "
                 << record->origin << ") is not used by " << model.config.architecture_name;
  }
  return absl::OkStatus();
}

}  // namespace kiln
