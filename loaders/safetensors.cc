#include "loaders/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/logging.h"
#include "loaders/loader_util.h"
#include "loaders/mapped_file.h"
#include "loaders/model_root.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using loader_internal::JsonTypeName;
using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB, as the reference implementation
constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

// Everything about one tensor entry that was checked against the file.
struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Prefixes every error with the file it concerns.
class FileErrors {
 public:
  explicit FileErrors(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }
  template <typename... Args>
  absl::Status Invalid(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file ", file_, ": ", args...));
  }
  template <typename... Args>
  absl::Status Truncated(const Args&... args) const {
    return absl::DataLossError(absl::StrCat("safetensors file ", file_, ": ", args...));
  }

 private:
  std::string file_;
};

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

// Shape dims are non-negative integers whose running product (in order) fits int64, so
// elements × dtype size can be computed without overflow anywhere downstream.
absl::StatusOr<Entry> ParseEntry(const FileErrors& err, const std::string& name, const json& value,
                                 uint64_t data_size) {
  const std::string tensor = absl::StrCat("tensor ", name);
  if (!value.is_object()) {
    return err.Invalid(tensor, " must be a JSON object, got ", JsonTypeName(value));
  }
  Entry entry;
  entry.name = name;
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) return err.Invalid(tensor, " has no \"", field, "\"");
  }
  const json& dtype = value.at("dtype");
  if (!dtype.is_string()) {
    return err.Invalid(tensor, ": \"dtype\" must be a string, got ", JsonTypeName(dtype));
  }
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  absl::StatusOr<DType> parsed_dtype = DTypeFromName(dtype_name);
  if (!parsed_dtype.ok()) return err.Invalid("unsupported dtype ", dtype_name, " in ", tensor);
  entry.dtype = *parsed_dtype;

  const json& shape = value.at("shape");
  if (!shape.is_array()) {
    return err.Invalid(tensor, ": \"shape\" must be an array, got ", JsonTypeName(shape));
  }
  uint64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& dim = shape[i];
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      return err.Invalid(tensor, ": negative dimension ", dim.get<int64_t>(), " at index ", i,
                         " of \"shape\"");
    }
    if (!dim.is_number_unsigned()) {
      return err.Invalid(tensor, ": \"shape\"[", i, "] must be a non-negative integer, got ",
                         JsonTypeName(dim));
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(elements, d, &elements) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return err.Invalid(tensor, ": shape ", shape.dump(), " has too many elements");
    }
    entry.shape.push_back(static_cast<int64_t>(d));
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(elements, DTypeSize(entry.dtype), &expected_bytes)) {
    return err.Invalid(tensor, ": shape ", shape.dump(), " has too many bytes");
  }

  const json& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return err.Invalid(tensor, ": \"data_offsets\" must be [begin, end] of non-negative ",
                       "integers, got ", offsets.dump());
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    return err.Invalid(tensor, ": data_offsets [", entry.begin, ", ", entry.end,
                       "] begin after end");
  }
  if (entry.end > data_size) {
    return err.Truncated(tensor, ": data_offsets [", entry.begin, ", ", entry.end,
                         "] go past the end of the data region (", data_size, " bytes)");
  }
  if (entry.end - entry.begin != expected_bytes) {
    return err.Invalid(tensor, ": data_offsets [", entry.begin, ", ", entry.end, "] span ",
                       entry.end - entry.begin, " bytes but ", dtype_name, " shape ", shape.dump(),
                       " needs ", expected_bytes);
  }
  return entry;
}

absl::Status CheckMetadata(const FileErrors& err, const json& metadata) {
  if (!metadata.is_object()) {
    return err.Invalid("\"__metadata__\" must be an object, got ", JsonTypeName(metadata));
  }
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return err.Invalid("\"__metadata__\" entry ", Quoted(key), " must be a string, got ",
                         JsonTypeName(value));
    }
  }
  return absl::OkStatus();
}

// Parses and validates the header; on success every entry's byte range lies inside `data`.
absl::StatusOr<std::vector<Entry>> ParseHeader(const FileErrors& err,
                                               std::span<const std::byte> bytes,
                                               uint64_t* data_start) {
  if (bytes.size() < 8) {
    return err.Truncated("file is ", bytes.size(), " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(bytes[i]);
  if (header_len == 0) return err.Invalid("header length is 0");
  if (header_len > kMaxHeaderBytes) {
    return err.Invalid("header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes,
                       " bytes");
  }
  if (header_len > bytes.size() - 8) {
    return err.Truncated("header length ", header_len, " goes past the end of the file (",
                         bytes.size(), " bytes)");
  }
  *data_start = 8 + header_len;
  const uint64_t data_size = bytes.size() - *data_start;
  absl::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header_len);

  absl::StatusOr<json> header = loader_internal::ParseJsonStrict(
      text, absl::StrCat("header of safetensors file ", err.file()));
  if (!header.ok()) return header.status();
  if (!header->is_object()) {
    return err.Invalid("header must be a JSON object, got ", JsonTypeName(*header));
  }

  std::vector<Entry> entries;
  entries.reserve(header->size());
  for (const auto& [name, value] : header->items()) {
    if (name == "__metadata__") {
      if (absl::Status status = CheckMetadata(err, value); !status.ok()) return status;
      continue;
    }
    absl::StatusOr<Entry> entry = ParseEntry(err, name, value, data_size);
    if (!entry.ok()) return entry.status();
    entries.push_back(*std::move(entry));
  }

  // Overlap check over the tensors that occupy bytes; gaps between them are allowed.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = *by_offset[i - 1];
    const Entry& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return err.Invalid("tensors ", prev.name, " [", prev.begin, ", ", prev.end, ") and ",
                         cur.name, " [", cur.begin, ", ", cur.end, ") overlap");
    }
  }
  return entries;
}

bool PathExists(const fs::path& path) {
  std::error_code ec;
  // symlink_status: a dangling or escaping symlink still counts, so it is reported, not skipped.
  return fs::exists(fs::symlink_status(path, ec));
}

absl::StatusOr<WeightSource> OpenSharded(const fs::path& model_dir) {
  const std::string index_display = (model_dir / kIndexName).string();
  absl::StatusOr<fs::path> index_path = ResolveInsideRoot(model_dir, kIndexName);
  if (!index_path.ok()) return index_path.status();
  absl::StatusOr<std::shared_ptr<MappedFile>> index_file = MappedFile::Open(*index_path);
  if (!index_file.ok()) return index_file.status();
  std::span<const std::byte> index_bytes = (*index_file)->bytes();
  absl::StatusOr<json> index = loader_internal::ParseJsonStrict(
      absl::string_view(reinterpret_cast<const char*>(index_bytes.data()), index_bytes.size()),
      index_display);
  if (!index.ok()) return index.status();
  auto invalid = [&](const auto&... args) {
    return absl::InvalidArgumentError(absl::StrCat(index_display, ": ", args...));
  };
  if (!index->is_object()) return invalid("must be a JSON object, got ", JsonTypeName(*index));
  if (!index->contains("weight_map")) return invalid("has no \"weight_map\"");
  const json& weight_map = index->at("weight_map");
  if (!weight_map.is_object()) {
    return invalid("\"weight_map\" must be an object, got ", JsonTypeName(weight_map));
  }
  if (weight_map.empty()) return invalid("\"weight_map\" names no tensors");

  std::map<std::string, std::string> file_of;          // tensor → file, as the index says
  std::map<std::string, std::set<std::string>> named;  // file → tensors the index puts there
  for (const auto& [tensor, file] : weight_map.items()) {
    if (!file.is_string()) {
      return invalid("\"weight_map\" entry for tensor ", tensor,
                     " must be a file name string, got ", JsonTypeName(file));
    }
    const std::string& file_name = file.get_ref<const std::string&>();
    file_of[tensor] = file_name;
    named[file_name].insert(tensor);
  }

  WeightSource source;
  source.provenance().files.push_back(kIndexName);
  for (const auto& [file_name, tensors] : named) {
    absl::StatusOr<WeightSource> shard = OpenSafetensorsFile(model_dir, file_name);
    if (!shard.ok()) {
      return absl::Status(
          shard.status().code(),
          absl::StrCat(shard.status().message(), " (shard named by ", index_display, ")"));
    }
    for (const std::string& tensor : tensors) {
      if (shard->Find(tensor) == nullptr) {
        return invalid("tensor ", tensor, " is assigned to ", file_name,
                       " but that file does not contain it");
      }
    }
    for (const TensorRecord& record : shard->records()) {
      auto it = file_of.find(record.name);
      if (it == file_of.end()) {
        return invalid("tensor ", record.name, " in ", file_name,
                       " is not listed in \"weight_map\"");
      }
      if (it->second != file_name) {
        return invalid("tensor ", record.name, " is in ", file_name,
                       " but the index assigns it to ", it->second);
      }
    }
    if (absl::Status status = source.Merge(*std::move(shard)); !status.ok()) return status;
  }
  return source;
}

// model.safetensors or model-<digits>-of-<digits>.safetensors: main weights, never a sidecar.
bool IsMainShardName(absl::string_view name) {
  if (name == kSingleName) return true;
  if (!absl::ConsumePrefix(&name, "model-") || !absl::ConsumeSuffix(&name, ".safetensors")) {
    return false;
  }
  const size_t of = name.find("-of-");
  if (of == absl::string_view::npos) return false;
  auto digits = [](absl::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(name.substr(0, of)) && digits(name.substr(of + 4));
}

// Off-index sidecars (GLM-4.7 ships its MTP layer as mtp.safetensors, which the index may not
// list): every other *.safetensors file in the model directory is read as additional weights.
// Files already read are skipped, so no tensor is loaded twice; a tensor in two files fails in
// WeightSource::Add naming both; a symlink that leaves the root fails in OpenSafetensorsFile.
absl::Status AddSidecars(const fs::path& model_dir, WeightSource& source) {
  std::set<std::string> already_read;
  for (const std::string& file : source.provenance().files) {
    already_read.insert(fs::path(file).lexically_normal().string());
  }
  std::vector<std::string> sidecars;
  std::error_code ec;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::EndsWith(name, ".safetensors") || IsMainShardName(name) ||
        already_read.contains(name)) {
      continue;
    }
    std::error_code type_ec;
    if (!it->is_symlink(type_ec) && !it->is_regular_file(type_ec)) continue;
    sidecars.push_back(name);
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("listing model directory ", model_dir.string(), ": ", ec.message()));
  }
  std::sort(sidecars.begin(), sidecars.end());
  for (const std::string& name : sidecars) {
    absl::StatusOr<WeightSource> sidecar = OpenSafetensorsFile(model_dir, name);
    if (!sidecar.ok()) {
      return absl::Status(sidecar.status().code(),
                          absl::StrCat(sidecar.status().message(), " (sidecar file)"));
    }
    const size_t tensors = sidecar->records().size();
    if (absl::Status status = source.Merge(*std::move(sidecar)); !status.ok()) return status;
    LOG(INFO) << "safetensors: read sidecar file " << name << " (" << tensors << " tensors) from "
              << model_dir.string();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WeightSource> OpenSafetensorsFile(const fs::path& model_root,
                                                 const std::string& relative_path) {
  absl::StatusOr<fs::path> resolved = ResolveInsideRoot(model_root, relative_path);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<std::shared_ptr<MappedFile>> file = MappedFile::Open(*resolved);
  if (!file.ok()) return file.status();

  const FileErrors err((model_root / relative_path).lexically_normal().string());
  const std::span<const std::byte> bytes = (*file)->bytes();
  uint64_t data_start = 0;
  absl::StatusOr<std::vector<Entry>> entries = ParseHeader(err, bytes, &data_start);
  if (!entries.ok()) return entries.status();

  WeightSource source;
  SourceProvenance& provenance = source.provenance();
  provenance.format = "safetensors";
  provenance.files.push_back(relative_path);
  provenance.load_mode = LoadMode::kMmapZeroCopy;
  for (Entry& entry : *entries) {
    TensorRecord record;
    record.name = std::move(entry.name);
    record.dtype = entry.dtype;
    record.shape = std::move(entry.shape);
    record.data = bytes.data() + data_start + entry.begin;
    record.byte_size = static_cast<size_t>(entry.end - entry.begin);
    record.origin = relative_path;
    provenance.bytes_read += record.byte_size;
    if (absl::Status status = source.Add(std::move(record)); !status.ok()) return status;
  }
  source.KeepAlive(*std::move(file));
  return source;
}

absl::StatusOr<WeightSource> OpenSafetensorsCheckpoint(const fs::path& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model directory ", model_dir.string(),
                                            " does not exist or is not a directory"));
  }
  absl::StatusOr<WeightSource> source;
  if (PathExists(model_dir / kIndexName)) {
    source = OpenSharded(model_dir);
  } else if (PathExists(model_dir / kSingleName)) {
    source = OpenSafetensorsFile(model_dir, kSingleName);
  } else {
    return absl::NotFoundError(absl::StrCat("model directory ", model_dir.string(), " has neither ",
                                            kIndexName, " nor ", kSingleName));
  }
  if (source.ok()) {
    if (absl::Status status = AddSidecars(model_dir, *source); !status.ok()) return status;
    source->provenance().format = "safetensors";
    source->provenance().load_mode = LoadMode::kMmapZeroCopy;
  }
  return source;
}

}  // namespace kiln
