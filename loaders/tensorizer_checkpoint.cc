#include "loaders/tensorizer_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <system_error>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "loaders/tensorizer_reader.h"
#include "loaders/tensorizer_writer.h"
#include "models/engine_layout.h"
#include "models/prepack.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using tensorizer::ElementType;
using tensorizer::TensorInfo;

// Names kiln gives its metadata inside native files. The leading dot marks root-owned tensors in
// Tensorizer's write_module naming, so they cannot collide with a parameter name.
constexpr absl::string_view kNativeMarker = ".kiln_tensorized_marker";
constexpr absl::string_view kNativeConfig = ".kiln_model_config";
constexpr absl::string_view kNativeFilePrefix = ".kiln_file/";
// Version 2: linears may be stored packed (`.kiln_packed_manifest` and `.kiln_packed/`); a file
// without packed linears is still written as version 1, which older readers take.
constexpr int64_t kNativeFormatVersion = 1;
constexpr int64_t kNativePackedFormatVersion = 2;
constexpr absl::string_view kNativePackedManifest = ".kiln_packed_manifest";
constexpr absl::string_view kNativePackedPrefix = ".kiln_packed/";
// Bounds a hostile manifest cannot pass.
constexpr size_t kMaxPackedParts = 8;
constexpr absl::string_view kNativePadPrefix = ".kiln_pad/";
// Weight data in native files starts at multiples of this, so the packer can read it in place.
constexpr uint64_t kNativeDataAlignment = 64;
constexpr absl::string_view kVllmMarker = ".vllm_tensorized_marker";

// Files a native file carries so that it loads on its own.

std::optional<DType> WeightDType(ElementType type) {
  switch (type) {
    case ElementType::kF32:
      return DType::kF32;
    case ElementType::kF16:
      return DType::kF16;
    case ElementType::kBF16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<ElementType> ElementTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ElementType::kF32;
    case DType::kF16:
      return ElementType::kF16;
    case DType::kBF16:
      return ElementType::kBF16;
  }
  return absl::InternalError("unknown dtype");
}

bool IsRopeCache(absl::string_view name) {
  return absl::EndsWith(name, ".rotary_emb.cos_sin_cache") ||
         absl::EndsWith(name, ".rotary_emb.inv_freq");
}

std::string Printable(absl::string_view name) {
  // JSON-path names start with the control byte 0x1E; show it escaped.
  std::string out;
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The one place the load mode is chosen: decryption and dtype conversion need memory of their
// own; everything else is a view into the mapping (unaligned views are fine, see TensorRecord).
LoadMode ChooseLoadMode(const tensorizer::TensorizerFile& file) {
  if (file.any_encrypted()) return LoadMode::kRead;
  for (const TensorInfo& info : file.tensors()) {
    if (info.element_type == ElementType::kF64) return LoadMode::kReadConvert;
  }
  return LoadMode::kMmapZeroCopy;
}

TensorizerKind DetectKind(const tensorizer::TensorizerFile& file) {
  if (file.Find(kNativeMarker) != nullptr) return TensorizerKind::kNative;
  if (file.Find(kVllmMarker) != nullptr) return TensorizerKind::kVllm;
  return TensorizerKind::kRaw;
}

absl::Status CheckVllmMarker(const TensorInfo& info, const std::string& file) {
  if (info.element_type != ElementType::kI64 || info.elements != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": ", kVllmMarker, " should be an int64 tensor of shape [1] but is ",
        tensorizer::ElementTypeName(info.element_type), " with ", info.elements, " elements"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> NativeMarkerVersion(const TensorInfo& info,
                                            const tensorizer::TensorBytes& bytes,
                                            const std::string& file) {
  if (info.element_type != ElementType::kI64 || info.elements != 1 || bytes.size != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", kNativeMarker, " should be one int64 (the format version)"));
  }
  int64_t version;
  std::memcpy(&version, bytes.data, sizeof(version));
  return version;
}

// Where a backend finds the packed linears' bytes after the load (PackedImage::backing).
struct PackedPlacement {
  std::shared_ptr<const void> backing;
  bool in_huge_pages = false;
};

// The one place a native file's packed bytes are placed: read into the page cache and mapped now,
// so that neither the first forward nor a cold file pays for it later; and kept where they lie
// when the kernel maps them in 2 MiB pages (a filesystem with large folios, MappedFile), where
// streaming them is as fast as from the backend's own memory and nothing needs copying. Otherwise
// (4 KiB pages, or decrypted copies) the backend copies them into memory of its own.
PackedPlacement PlacePackedBytes(
    const tensorizer::TensorizerFile& tz, LoadMode mode,
    const absl::flat_hash_map<std::string, tensorizer::TensorBytes>& parts,
    const std::string& file) {
  PackedPlacement placement;
  placement.backing = tz.keep_alive();
  if (mode != LoadMode::kMmapZeroCopy || parts.empty()) return placement;
  const std::byte* first = nullptr;
  const std::byte* end = nullptr;
  uint64_t bytes = 0;
  for (const auto& [name, part] : parts) {
    if (first == nullptr || part.data < first) first = part.data;
    if (end == nullptr || part.data + part.size > end) end = part.data + part.size;
    bytes += part.size;
  }
  tz.mapping().Populate({first, static_cast<size_t>(end - first)});
  const double share = tz.mapping().ResidentShareInHugePages();
  constexpr double kEnoughInHugePages = 0.9;
  placement.in_huge_pages = share >= kEnoughInHugePages;
  LOG(INFO) << file << ": " << bytes << " bytes of packed linears; " << std::lround(100 * share)
            << "% of the mapped file is in 2 MiB pages: "
            << (placement.in_huge_pages ? "used where they lie"
                                        : "copied into the backend's memory");
  return placement;
}

// A native file's packed linears: the manifest's entries, each a record whose image points at its
// `.kiln_packed/<name>/<part>` tensors. Every packed tensor must be listed and every listed part
// present; the logical shape must be 2-D. Errors name the file and the entry.
absl::Status AddPackedRecords(absl::string_view manifest_text,
                              absl::flat_hash_map<std::string, tensorizer::TensorBytes> parts,
                              const PackedPlacement& placement, const std::string& file,
                              const std::string& file_name, WeightSource& source) {
  using Json = nlohmann::json;
  auto bad = [&](auto&&... what) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", kNativePackedManifest, ": ", what...));
  };
  const Json manifest = Json::parse(manifest_text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("tensors") ||
      !manifest["tensors"].is_array()) {
    return bad("not a JSON object with a \"tensors\" array");
  }
  for (const Json& entry : manifest["tensors"]) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) {
      return bad("an entry without a \"name\" string");
    }
    const std::string name = entry["name"].get<std::string>();
    auto field = [&](const char* key, Json::value_t type) -> const Json* {
      auto it = entry.find(key);
      if (it == entry.end() || it->type() != type) return nullptr;
      return &*it;
    };
    const Json* layout = field("layout", Json::value_t::string);
    const Json* dtype = field("dtype", Json::value_t::string);
    const Json* quantization = field("quantization", Json::value_t::string);
    const Json* shape = field("shape", Json::value_t::array);
    const Json* part_names = field("parts", Json::value_t::array);
    if (layout == nullptr || dtype == nullptr || quantization == nullptr || shape == nullptr ||
        part_names == nullptr) {
      return bad(name, ": needs string layout, dtype and quantization, and arrays shape and parts");
    }
    auto image = std::make_shared<PackedImage>();
    image->layout = layout->get<std::string>();
    image->backing = placement.backing;
    image->in_huge_pages = placement.in_huge_pages;
    absl::StatusOr<DType> parsed_dtype = ParseDTypeApiName(dtype->get<std::string>());
    absl::StatusOr<Quantization> parsed_quantization =
        ParseQuantization(quantization->get<std::string>());
    if (!parsed_dtype.ok() || !parsed_quantization.ok()) {
      return bad(name, ": unknown dtype or quantization");
    }
    image->dtype = *parsed_dtype;
    image->quantization = *parsed_quantization;
    if (shape->size() != 2 || !(*shape)[0].is_number_unsigned() ||
        !(*shape)[1].is_number_unsigned() || (*shape)[0].get<uint64_t>() == 0 ||
        (*shape)[1].get<uint64_t>() == 0 || (*shape)[0].get<uint64_t>() > (uint64_t{1} << 40) ||
        (*shape)[1].get<uint64_t>() > (uint64_t{1} << 40)) {
      return bad(name, ": shape must be two positive integers");
    }
    image->rows = static_cast<int64_t>((*shape)[0].get<uint64_t>());
    image->cols = static_cast<int64_t>((*shape)[1].get<uint64_t>());
    if (part_names->empty() || part_names->size() > kMaxPackedParts) {
      return bad(name, ": 1 to ", kMaxPackedParts, " parts");
    }
    for (const Json& part : *part_names) {
      if (!part.is_string()) return bad(name, ": part names are strings");
      const std::string part_name = part.get<std::string>();
      auto it = parts.find(absl::StrCat(kNativePackedPrefix, name, "/", part_name));
      if (it == parts.end()) return bad(name, ": part ", part_name, " is not in the file");
      if (image->Find(part_name) != nullptr) return bad(name, ": part ", part_name, " twice");
      image->parts.push_back({part_name, it->second.data, it->second.size});
      parts.erase(it);
    }
    TensorRecord record;
    record.name = name;
    record.dtype = image->dtype;
    record.shape = {image->rows, image->cols};
    record.data = image->parts.front().data;
    record.byte_size = image->bytes();
    record.origin = file_name;
    record.packed = std::move(image);
    source.provenance().bytes_read += record.byte_size;
    KILN_RETURN_IF_ERROR(source.Add(std::move(record)));
  }
  if (!parts.empty()) {
    return bad("packed tensor ", Printable(parts.begin()->first), " is not listed");
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view TensorizerKindName(TensorizerKind kind) {
  switch (kind) {
    case TensorizerKind::kRaw:
      return "raw";
    case TensorizerKind::kVllm:
      return "vLLM";
    case TensorizerKind::kNative:
      return "native";
  }
  return "?";
}

bool HasTensorizerMagic(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[5] = {};
  return in.read(magic, sizeof(magic)) && std::memcmp(magic, "|TZR|", 5) == 0;
}

absl::StatusOr<TensorizerCheckpoint> OpenTensorizerCheckpoint(
    const fs::path& file, const TensorizerCheckpointOptions& options) {
  const std::string file_name = file.filename().string();
  KILN_ASSIGN_OR_RETURN(tensorizer::TensorizerFile tz, tensorizer::TensorizerFile::Open(file));
  TensorizerCheckpoint checkpoint;
  checkpoint.kind = DetectKind(tz);

  tensorizer::ReadOptions read_options;
  read_options.hash_check = options.hash_check;
  if (!options.encryption_key.empty() && !options.encryption_passphrase.empty()) {
    return absl::InvalidArgumentError("give an encryption key or a passphrase, not both");
  }
  if (!options.encryption_key.empty()) {
    if (options.encryption_key.size() != 32) {
      return absl::InvalidArgumentError(
          absl::StrCat("an encryption key is 32 bytes, got ", options.encryption_key.size()));
    }
    read_options.key = tensorizer::DecryptionKey::FromRawKey(options.encryption_key);
  } else if (!options.encryption_passphrase.empty()) {
    read_options.key = tensorizer::DecryptionKey::FromPassphrase(options.encryption_passphrase);
  }
  if (tz.any_encrypted() && !read_options.key.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.string(),
                     " is encrypted: supply its 32-byte key or passphrase (tensorizer options "
                     "encryption_key or encryption_passphrase, or their *_file forms)"));
  }

  const LoadMode mode = ChooseLoadMode(tz);
  KILN_ASSIGN_OR_RETURN(std::vector<tensorizer::TensorBytes> bytes, tz.ReadAll(read_options));
  const std::vector<TensorInfo>& infos = tz.tensors();

  // The architecture: inside a native file, else a config.json.
  if (checkpoint.kind == TensorizerKind::kNative) {
    const TensorInfo* marker = tz.Find(kNativeMarker);
    const size_t marker_index = static_cast<size_t>(marker - infos.data());
    KILN_ASSIGN_OR_RETURN(int64_t version,
                          NativeMarkerVersion(*marker, bytes[marker_index], file.string()));
    if (version != kNativeFormatVersion && version != kNativePackedFormatVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), " is a native tensorized file of format version ", version,
                       "; this kiln reads versions ", kNativeFormatVersion, " and ",
                       kNativePackedFormatVersion));
    }
    const TensorInfo* config = tz.Find(kNativeConfig);
    if (config == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), " is marked native but has no ", kNativeConfig));
    }
    const tensorizer::TensorBytes& text = bytes[static_cast<size_t>(config - infos.data())];
    absl::StatusOr<ModelConfig> parsed =
        ParseModelConfig(absl::string_view(reinterpret_cast<const char*>(text.data), text.size));
    if (!parsed.ok())
      return KilnAnnotate(parsed.status(), absl::StrCat(file.string(), " ", kNativeConfig));
    checkpoint.config = *std::move(parsed);
  } else {
    const fs::path config_path = options.config_path.value_or(file.parent_path() / "config.json");
    std::error_code ec;
    if (!fs::exists(config_path, ec)) {
      return absl::NotFoundError(absl::StrCat(
          file.string(), " is a ", TensorizerKindName(checkpoint.kind),
          " Tensorizer file, which carries no model config: put config.json beside it or name "
          "one (tensorizer.config_path); ",
          config_path.string(), " does not exist"));
    }
    KILN_ASSIGN_OR_RETURN(checkpoint.config, ReadModelConfig(config_path.string()));
  }
  const ModelConfig& config = checkpoint.config;

  WeightSource& source = checkpoint.source;
  SourceProvenance& provenance = source.provenance();
  provenance.format = "tensorizer";
  provenance.format_version =
      absl::StrCat("data version ", tz.version(), ", ", TensorizerKindName(checkpoint.kind));
  provenance.files.push_back(file_name);
  provenance.load_mode = mode;
  provenance.hash_check = std::string(tensorizer::HashCheckName(options.hash_check));
  provenance.encrypted = tz.any_encrypted();
  provenance.layout =
      checkpoint.kind == TensorizerKind::kRaw ? WeightLayout::kHuggingFace : WeightLayout::kEngine;
  source.KeepAlive(tz.keep_alive());
  auto drop = [&](const TensorInfo& info, std::string reason) {
    provenance.dropped.push_back(
        {Printable(info.name), info.byte_size(), file_name, std::move(reason)});
  };

  int pad_records = 0;
  uint64_t pad_bytes = 0;
  std::optional<absl::string_view> packed_manifest;
  absl::flat_hash_map<std::string, tensorizer::TensorBytes> packed_parts;
  for (size_t i = 0; i < infos.size(); ++i) {
    const TensorInfo& info = infos[i];
    const tensorizer::TensorBytes& data = bytes[i];
    if (checkpoint.kind == TensorizerKind::kNative) {
      if (info.name == kNativeMarker || info.name == kNativeConfig) {
        drop(info, "kiln native file metadata");
        continue;
      }
      if (absl::StartsWith(info.name, kNativePadPrefix)) {
        ++pad_records;
        pad_bytes += info.byte_size();
        continue;
      }
      if (info.name == kNativePackedManifest) {
        packed_manifest = absl::string_view(reinterpret_cast<const char*>(data.data), data.size);
        drop(info, "kiln native file metadata (the packed linears' manifest)");
        continue;
      }
      if (absl::StartsWith(info.name, kNativePackedPrefix)) {
        if (info.element_type != ElementType::kU8) {
          return absl::InvalidArgumentError(absl::StrCat(file.string(), ": packed tensor ",
                                                         Printable(info.name), " must be uint8"));
        }
        packed_parts.emplace(info.name, data);
        continue;
      }
      if (absl::StartsWith(info.name, kNativeFilePrefix)) {
        checkpoint.embedded_files[info.name.substr(kNativeFilePrefix.size())] =
            std::string(reinterpret_cast<const char*>(data.data), data.size);
        drop(info, "file embedded in the native file");
        continue;
      }
    }
    if (checkpoint.kind == TensorizerKind::kVllm && info.name == kVllmMarker) {
      KILN_RETURN_IF_ERROR(CheckVllmMarker(info, file.string()));
      drop(info, "vLLM's tensorized marker");
      continue;
    }
    if (IsRopeCache(info.name)) {
      drop(info, "RoPE cache buffer; kiln computes its own from the config");
      continue;
    }

    TensorRecord record;
    record.name = info.name;
    record.shape = info.shape;
    record.origin = file_name;
    const std::optional<DType> dtype = WeightDType(info.element_type);
    if (dtype.has_value()) {
      record.dtype = *dtype;
      record.data = data.data;
      record.byte_size = data.size;
    } else if (info.element_type == ElementType::kF64) {
      // No float64 kernels: converted to float32 once here (read+convert).
      auto converted = std::make_shared<std::vector<float>>(static_cast<size_t>(info.elements));
      for (int64_t e = 0; e < info.elements; ++e) {
        double value;
        std::memcpy(&value, data.data + e * 8, sizeof(value));
        (*converted)[static_cast<size_t>(e)] = static_cast<float>(value);
      }
      record.dtype = DType::kF32;
      record.data = reinterpret_cast<const std::byte*>(converted->data());
      record.byte_size = converted->size() * sizeof(float);
      source.KeepAlive(std::move(converted));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), ": tensor ", Printable(info.name), " has dtype ",
                       tensorizer::ElementTypeName(info.element_type),
                       "; model weights must be float32, float16, bfloat16 or float64"));
    }

    // vLLM pads the vocabulary to a multiple of 64: keep the real rows (a row-major prefix).
    if (checkpoint.kind == TensorizerKind::kVllm &&
        (record.name == "model.embed_tokens.weight" || record.name == "lm_head.weight") &&
        record.shape.size() == 2 && record.shape[0] > config.vocab_size) {
      const int64_t padding_rows = record.shape[0] - config.vocab_size;
      const uint64_t kept =
          static_cast<uint64_t>(config.vocab_size * record.shape[1]) * DTypeSize(record.dtype);
      provenance.dropped.push_back(
          {absl::StrCat(record.name, " rows [", config.vocab_size, ", ", record.shape[0], ")"),
           record.byte_size - kept, file_name,
           absl::StrCat("vLLM vocabulary padding (", padding_rows, " rows)")});
      record.shape[0] = config.vocab_size;
      record.byte_size = kept;
    }
    provenance.bytes_read += record.byte_size;
    KILN_RETURN_IF_ERROR(source.Add(std::move(record)));
  }
  if (packed_manifest.has_value() || !packed_parts.empty()) {
    if (!packed_manifest.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), " has packed tensors but no ", kNativePackedManifest));
    }
    const PackedPlacement placement = PlacePackedBytes(tz, mode, packed_parts, file.string());
    KILN_RETURN_IF_ERROR(AddPackedRecords(*packed_manifest, std::move(packed_parts), placement,
                                          file.string(), file_name, source));
  }
  if (pad_records > 0) {
    provenance.dropped.push_back({absl::StrCat(kNativePadPrefix, "*"), pad_bytes, file_name,
                                  absl::StrCat("alignment padding (", pad_records, " records)")});
  }
  LOG(INFO) << "tensorizer " << TensorizerKindName(checkpoint.kind) << " file " << file.string()
            << ": data version " << tz.version() << ", " << infos.size() << " tensors"
            << (provenance.encrypted ? ", encrypted" : "") << ", hash check "
            << tensorizer::HashCheckName(options.hash_check) << ", load mode "
            << LoadModeName(mode);
  return checkpoint;
}

absl::StatusOr<NativeTensorizeResult> WriteNativeTensorized(const fs::path& file,
                                                            const WeightSource& source,
                                                            const ModelConfig& config,
                                                            const NativeTensorizeOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::vector<LayoutTensor> layout,
                        ToEngineLayout(source, config, options.dtype));
  const int64_t marker_value =
      options.packed.empty() ? kNativeFormatVersion : kNativePackedFormatVersion;
  const std::string config_json = ModelConfigToJson(config);

  // Packed linears replace their layout tensor (or, a tied LM head, join the embedding).
  nlohmann::json packed_entries = nlohmann::json::array();
  for (const auto& [name, image] : options.packed) {
    const std::string& wanted = name;  // a structured binding cannot be captured (C++17)
    const auto it = std::find_if(layout.begin(), layout.end(),
                                 [&](const LayoutTensor& t) { return t.name == wanted; });
    if (it != layout.end() && it->shape != std::vector<int64_t>{image.rows, image.cols}) {
      return absl::InvalidArgumentError(absl::StrCat("packed ", name, " is [", image.rows, ", ",
                                                     image.cols, "] but the tensor is [",
                                                     absl::StrJoin(it->shape, ", "), "]"));
    }
    if (it != layout.end()) layout.erase(it);
    nlohmann::json entry;
    entry["name"] = name;
    entry["layout"] = image.layout;
    entry["dtype"] = std::string(DTypeApiName(image.dtype));
    entry["quantization"] = std::string(QuantizationName(image.quantization));
    entry["shape"] = {image.rows, image.cols};
    entry["parts"] = nlohmann::json::array();
    for (const PackedImage::Part& part : image.parts) entry["parts"].push_back(part.name);
    packed_entries.push_back(std::move(entry));
  }
  const std::string packed_manifest =
      options.packed.empty() ? "" : nlohmann::json{{"tensors", packed_entries}}.dump();

  std::vector<tensorizer::WriteTensor> tensors;
  auto add_bytes = [&](std::string name, const void* data, size_t size) {
    tensorizer::WriteTensor t;
    t.name = std::move(name);
    t.element_type = ElementType::kU8;
    t.shape = {static_cast<int64_t>(size)};
    t.data = static_cast<const std::byte*>(data);
    t.size = size;
    tensors.push_back(std::move(t));
  };
  {
    tensorizer::WriteTensor marker;
    marker.name = std::string(kNativeMarker);
    marker.element_type = ElementType::kI64;
    marker.shape = {1};
    marker.data = reinterpret_cast<const std::byte*>(&marker_value);
    marker.size = sizeof(marker_value);
    tensors.push_back(std::move(marker));
  }
  add_bytes(std::string(kNativeConfig), config_json.data(), config_json.size());
  if (!packed_manifest.empty()) {
    add_bytes(std::string(kNativePackedManifest), packed_manifest.data(), packed_manifest.size());
  }
  for (const auto& [name, text] : options.embedded_files) {
    add_bytes(absl::StrCat(kNativeFilePrefix, name), text.data(), text.size());
  }
  // Records follow each other with nothing between: a small u8 padding tensor before a weight
  // moves its data to the next multiple of kNativeDataAlignment.
  uint64_t offset = tensorizer::kFirstRecordOffset;
  for (const tensorizer::WriteTensor& t : tensors) {
    offset += tensorizer::RecordHeaderSize(t) + t.size;
  }
  static const std::byte kZeros[kNativeDataAlignment] = {};
  int pads = 0;
  std::vector<tensorizer::WriteTensor> data_tensors;
  for (const LayoutTensor& tensor : layout) {
    tensorizer::WriteTensor t;
    t.name = tensor.name;
    KILN_ASSIGN_OR_RETURN(t.element_type, ElementTypeOf(tensor.dtype));
    t.shape = tensor.shape;
    t.data = tensor.data;
    t.size = tensor.size;
    data_tensors.push_back(std::move(t));
  }
  for (const auto& [name, image] : options.packed) {
    for (const PackedImage::Part& part : image.parts) {
      tensorizer::WriteTensor t;
      t.name = absl::StrCat(kNativePackedPrefix, name, "/", part.name);
      t.element_type = ElementType::kU8;
      t.shape = {static_cast<int64_t>(part.bytes)};
      t.data = part.data;
      t.size = part.bytes;
      data_tensors.push_back(std::move(t));
    }
  }
  for (tensorizer::WriteTensor& t : data_tensors) {
    const uint64_t header = tensorizer::RecordHeaderSize(t);
    if ((offset + header) % kNativeDataAlignment != 0) {
      tensorizer::WriteTensor pad;
      pad.name = absl::StrCat(kNativePadPrefix, pads++);
      pad.element_type = ElementType::kU8;
      pad.shape = {0};
      const uint64_t pad_header = tensorizer::RecordHeaderSize(pad);
      const uint64_t size =
          (kNativeDataAlignment - (offset + pad_header + header) % kNativeDataAlignment) %
          kNativeDataAlignment;
      pad.shape = {static_cast<int64_t>(size)};
      pad.data = kZeros;
      pad.size = size;
      offset += pad_header + size;
      tensors.push_back(std::move(pad));
    }
    offset += header + t.size;
    tensors.push_back(std::move(t));
  }
  KILN_RETURN_IF_ERROR(tensorizer::WriteTensorizerFile(file, tensors));
  std::error_code ec;
  NativeTensorizeResult result;
  result.bytes = fs::file_size(file, ec);
  result.tensors = static_cast<int>(layout.size() + options.packed.size());
  result.packed = static_cast<int>(options.packed.size());
  LOG(INFO) << "wrote native tensorized file " << file.string() << ": " << result.tensors
            << " tensors (" << result.packed << " packed), " << result.bytes << " bytes";
  return result;
}

absl::StatusOr<NativeTensorizeResult> WritePrepackedNativeTensorized(
    const fs::path& file, const WeightSource& source, const ModelConfig& config,
    std::shared_ptr<Backend> backend, const PostLoadOptions& post_load,
    NativeTensorizeOptions options) {
  KILN_ASSIGN_OR_RETURN(
      PrepackedCheckpoint prepacked,
      PrepackCheckpoint(source, config, options.dtype, std::move(backend), post_load));
  options.dtype.reset();                         // converted already
  options.packed = std::move(prepacked.packed);  // images in prepacked.model, alive until return
  return WriteNativeTensorized(file, prepacked.model->source(), config, options);
}

}  // namespace kiln
