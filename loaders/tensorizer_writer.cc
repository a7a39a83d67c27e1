#include "loaders/tensorizer_writer.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "loaders/loader_util.h"

namespace kiln::tensorizer {
namespace {

// Hash section of an unencrypted record: count, then CRC32 and SHA-256 with their type and length.
constexpr uint16_t kHashSectionLen = 1 + (2 + 4) + (2 + 32);

struct PreparedRecord {
  std::string header;
  std::string dtype;
  HashField hashes[2];
  uint64_t data_length = 0;
};

absl::StatusOr<PreparedRecord> Prepare(const WriteTensor& t) {
  if (t.name.size() > std::numeric_limits<uint16_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("name is ", t.name.size(), " bytes (max 65535)"));
  }
  if (static_cast<uint8_t>(t.type) > 2) return absl::InvalidArgumentError("unknown tensor type");
  PreparedRecord r;
  r.dtype = t.dtype_string.empty() ? DTypeString(t.element_type) : t.dtype_string;
  absl::StatusOr<ElementType> parsed = ParseDTypeString(r.dtype);
  if (!parsed.ok()) return parsed.status();
  if (*parsed != t.element_type) {
    return absl::InvalidArgumentError(absl::StrCat("dtype string names ", ElementTypeName(*parsed),
                                                   ", not ", ElementTypeName(t.element_type)));
  }
  if (r.dtype.size() > 255) return absl::InvalidArgumentError("dtype string is over 255 bytes");
  if (t.shape.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(t.shape.size(), " dimensions (max 255)"));
  }
  for (int64_t d : t.shape) {
    if (d < 0 || d > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " is outside [0, 2^32)"));
    }
  }
  absl::StatusOr<TensorSize> size = ComputeTensorSize(t.shape, t.element_type);
  if (!size.ok()) return size.status();
  if (t.meta) {
    if (t.size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("meta tensor is given ", t.size, " bytes of data; it is written without"));
    }
  } else if (t.size != size->bytes) {
    return absl::InvalidArgumentError(absl::StrCat("has ", t.size, " bytes of data but ",
                                                   ElementTypeName(t.element_type), " shape needs ",
                                                   size->bytes));
  } else if (t.size > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError("data is null");
  }
  r.data_length = t.meta ? 0 : t.size;

  const uint64_t header_size = RecordHeaderSize(t);
  std::string& h = r.header;
  h.reserve(header_size);
  AppendLe<uint64_t>(h, header_size);
  AppendLe<uint16_t>(h, t.module_idx);
  AppendLe<uint8_t>(h, static_cast<uint8_t>(t.type));
  AppendLe<uint16_t>(h, static_cast<uint16_t>(t.name.size()));
  h += t.name;
  AppendLe<uint8_t>(h, static_cast<uint8_t>(r.dtype.size()));
  h += r.dtype;
  AppendLe<uint8_t>(h, static_cast<uint8_t>(t.shape.size()));
  for (int64_t d : t.shape) AppendLe<uint32_t>(h, static_cast<uint32_t>(d));
  AppendLe<uint16_t>(h, kHashSectionLen);
  AppendLe<uint8_t>(h, 2);
  AppendLe<uint8_t>(h, static_cast<uint8_t>(HashType::kCrc32));
  AppendLe<uint8_t>(h, 4);
  r.hashes[0] = {HashType::kCrc32, static_cast<uint32_t>(h.size()), 4};
  h.append(4, '\0');
  AppendLe<uint8_t>(h, static_cast<uint8_t>(HashType::kSha256));
  AppendLe<uint8_t>(h, 32);
  r.hashes[1] = {HashType::kSha256, static_cast<uint32_t>(h.size()), 32};
  h.append(32, '\0');
  AppendLe<int64_t>(h, static_cast<int64_t>(r.data_length));
  return r;
}

}  // namespace

uint64_t RecordHeaderSize(const WriteTensor& t) {
  const size_t dtype_size =
      t.dtype_string.empty() ? DTypeString(t.element_type).size() : t.dtype_string.size();
  return 8 + 2 + 1 + 2 + t.name.size() + 1 + dtype_size + 1 + 4 * t.shape.size() + 2 +
         kHashSectionLen + 8;
}

absl::Status WriteTensorizerFile(const std::filesystem::path& path,
                                 std::span<const WriteTensor> tensors) {
  const std::string prefix = absl::StrCat("cannot write tensorizer file ", path.string(), ": ");
  std::vector<PreparedRecord> records(tensors.size());
  absl::flat_hash_set<absl::string_view> names;
  FileHeader header;
  header.version = 1;
  header.tensor_count = tensors.size();
  header.index_size = kStandardIndexSize;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WriteTensor& t = tensors[i];
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tensor ", QuoteName(t.name), " is given more than once"));
    }
    absl::StatusOr<PreparedRecord> record = Prepare(t);
    if (!record.ok()) {
      return absl::Status(record.status().code(), absl::StrCat(prefix, "tensor ", QuoteName(t.name),
                                                               ": ", record.status().message()));
    }
    records[i] = *std::move(record);
    // The version tensorizer settles on: the highest any tensor needs.
    if (records[i].dtype.find('\0') != std::string::npos) {
      header.version = std::max<uint32_t>(header.version, 2);
    }
    if (t.meta) header.version = 4;
    header.tensor_bytes += records[i].data_length;
  }

  std::string index;
  uint64_t offset = kFileHeaderSize + kStandardIndexSize;
  for (size_t i = 0; i < tensors.size(); ++i) {
    IndexEntry entry;
    entry.name = tensors[i].name;
    entry.type = tensors[i].type;
    entry.dtype = records[i].dtype;
    entry.shape = tensors[i].shape;
    entry.header_offset = offset;
    entry.data_offset = offset + records[i].header.size();
    entry.data_length = records[i].data_length;
    SerializeIndexEntry(entry, index);
    if (index.size() > kStandardIndexSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "metadata overflow: the index entries up to tensor ", QuoteName(entry.name),
          " need ", index.size(), " bytes, more than the ", kStandardIndexSize, "-byte index"));
    }
    offset = entry.data_offset + entry.data_length;
  }

  KILN_RETURN_IF_ERROR(ParallelFor(tensors.size(), 0, [&](size_t i) -> absl::Status {
    PreparedRecord& r = records[i];
    const auto* h = reinterpret_cast<const std::byte*>(r.header.data());
    const std::span<const std::byte> data(tensors[i].data, r.data_length);
    KILN_ASSIGN_OR_RETURN(Digests digests,
                          ComputeDigests({h, r.header.size()}, r.hashes, 0, 0, data, true, true));
    std::memcpy(r.header.data() + r.hashes[0].value_offset, &digests.crc32, 4);
    std::memcpy(r.header.data() + r.hashes[1].value_offset, digests.sha256.data(), 32);
    return absl::OkStatus();
  }));

  std::string prologue = SerializeFileHeader(header);
  prologue += index;
  prologue.resize(kFileHeaderSize + kStandardIndexSize, '\0');
  static constexpr std::byte kTerminator[8] = {};
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(2 * tensors.size() + 2);
  auto as_bytes = [](const std::string& s) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
  };
  pieces.push_back(as_bytes(prologue));
  for (size_t i = 0; i < tensors.size(); ++i) {
    pieces.push_back(as_bytes(records[i].header));
    if (records[i].data_length > 0) pieces.emplace_back(tensors[i].data, records[i].data_length);
  }
  pieces.emplace_back(kTerminator, sizeof(kTerminator));
  return loader_internal::WriteFileAtomically(path, pieces);
}

}  // namespace kiln::tensorizer
