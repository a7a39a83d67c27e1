#include "loaders/tensorizer_reader.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "loaders/mapped_file.h"

namespace kiln::tensorizer {
namespace {

namespace fs = std::filesystem;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string DTypeText(absl::string_view dtype) {
  return absl::StrCat("\"", absl::CHexEscape(dtype), "\"");
}

// Read-only anonymous mapping: reads as zeros and costs no memory until touched (and then only
// the kernel's shared zero page), so meta tensors of any accepted size share one.
class ZeroMapping {
 public:
  static absl::StatusOr<std::unique_ptr<ZeroMapping>> Create(size_t size) {
    void* data =
        ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", size, " bytes of zeros for meta tensors"));
    }
    return std::unique_ptr<ZeroMapping>(new ZeroMapping(static_cast<std::byte*>(data), size));
  }
  ~ZeroMapping() { ::munmap(data_, size_); }
  ZeroMapping(const ZeroMapping&) = delete;
  ZeroMapping& operator=(const ZeroMapping&) = delete;
  const std::byte* data() const { return data_; }

 private:
  ZeroMapping(std::byte* data, size_t size) : data_(data), size_(size) {}
  std::byte* data_;
  size_t size_;
};

// Buffers one ReadAll call hands out; kept by the file's state once the call succeeds.
struct OwnedBuffers {
  std::vector<std::unique_ptr<std::byte[]>> decrypted;
  std::unique_ptr<ZeroMapping> zeros;
};

// One encrypted piece: `size` bytes at `offset` in the record's data.
struct Piece {
  size_t tensor = 0;
  uint64_t index = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

}  // namespace

struct TensorizerFile::State {
  std::shared_ptr<MappedFile> file;
  std::string path_text;
  FileHeader header;
  std::vector<TensorInfo> tensors;
  std::vector<RecordHeader> records;  // parallel to tensors; name/dtype/shape dropped after checks
  absl::flat_hash_map<std::string, size_t> by_name;
  bool any_encrypted = false;
  std::mutex mu;
  std::vector<std::shared_ptr<const void>> owned;  // guarded by mu
};

namespace {

// Reads and checks the record `entry` points at against the entry (§12 step 3).
absl::Status ValidateRecord(std::span<const std::byte> bytes, const IndexEntry& e,
                            const FileHeader& header, uint64_t records_begin, const FileErrors& err,
                            TensorInfo& info, RecordHeader& record) {
  const uint64_t size = bytes.size();
  const std::string what = absl::StrCat("tensor ", QuoteName(e.name));
  const uint64_t ho = e.header_offset;
  if (ho < records_begin) {
    return err.Invalid(what, ": header_offset ", ho,
                       " points into the file header or index (records start at ", records_begin,
                       ")");
  }
  if (ho > size || size - ho < 8) {
    return err.DataLoss(what, ": record header at offset ", ho, " is past the end of the file (",
                        size, " bytes)");
  }
  const uint64_t h = LoadLe<uint64_t>(bytes.data() + ho);
  if (h == 0) {
    return err.Invalid(what, ": the index puts its record at offset ", ho,
                       ", where the file has the end-of-records marker");
  }
  if (h < kMinRecordHeaderSize) {
    return err.Invalid(what, ": record header_size ", h, " at offset ", ho,
                       " is below the minimum ", kMinRecordHeaderSize);
  }
  if (h > size - ho) {
    return err.DataLoss(what, ": record header [", ho, ", ", ho + h,
                        ") runs past the end of the file (", size, " bytes)");
  }
  KILN_ASSIGN_OR_RETURN(
      record, ParseRecordHeader(bytes.subspan(ho, h), header.has_crypt_info(), what, err));
  if (record.name != e.name) {
    return err.Invalid(what, ": the record header at offset ", ho, " names tensor ",
                       QuoteName(record.name));
  }
  if (record.type != e.type) {
    return err.Invalid(what, ": record tensor_type ", static_cast<int>(record.type),
                       " differs from the index's ", static_cast<int>(e.type));
  }
  if (record.dtype != e.dtype) {
    return err.Invalid(what, ": record dtype ", DTypeText(record.dtype),
                       " differs from the index's ", DTypeText(e.dtype));
  }
  if (record.shape != e.shape) {
    return err.Invalid(what, ": record shape ", ShapeString(record.shape),
                       " differs from the index's ", ShapeString(e.shape));
  }
  const uint64_t data_length = static_cast<uint64_t>(record.data_length);
  if (data_length != e.data_length) {
    return err.Invalid(what, ": record data_length ", data_length, " differs from the index's ",
                       e.data_length);
  }
  if (e.data_offset != ho + h) {
    return err.Invalid(what, ": index data_offset ", e.data_offset,
                       " is not header_offset + header_size = ", ho + h);
  }
  if (data_length > size - e.data_offset) {
    return err.DataLoss(what, ": data [", e.data_offset, ", ", e.data_offset + data_length,
                        ") runs past the end of the file (", size, " bytes)");
  }
  absl::StatusOr<ElementType> type = ParseDTypeString(e.dtype);
  if (!type.ok()) return err.Invalid(what, ": ", type.status().message());
  absl::StatusOr<TensorSize> tensor_size = ComputeTensorSize(e.shape, *type);
  if (!tensor_size.ok()) return err.Invalid(what, ": ", tensor_size.status().message());

  info.name = e.name;
  info.type = e.type;
  info.module_idx = record.module_idx;
  info.dtype_string = e.dtype;
  info.element_type = *type;
  info.shape = e.shape;
  info.elements = tensor_size->elements;
  info.header_offset = ho;
  info.data_offset = e.data_offset;
  info.data_length = data_length;
  info.meta = data_length == 0 && tensor_size->bytes > 0;
  info.encrypted = record.cipher.has_value();
  for (const HashField& field : record.hashes) {
    (field.type == HashType::kCrc32 ? info.has_crc32 : info.has_sha256) = true;
  }
  // Writers raise the version for these features (§4), so an older version means corruption.
  if (header.version < 2 && e.dtype.find('\0') != std::string::npos) {
    return err.Invalid(what, ": opaque dtype ", DTypeText(e.dtype), " in a data version ",
                       header.version, " file (it needs version 2 or later)");
  }
  if (info.meta && header.version < 4) {
    return err.Invalid(what, ": meta tensor (data_length 0, shape ", ShapeString(e.shape),
                       ") in a data version ", header.version, " file (it needs version 4)");
  }
  if (info.meta) {
    if (tensor_size->bytes > kMaxMetaBytes) {
      return err.Invalid(what, ": meta tensor of shape ", ShapeString(e.shape), " would read as ",
                         tensor_size->bytes, " zero bytes, over the limit of ", kMaxMetaBytes);
    }
    if (info.encrypted) return err.Invalid(what, ": meta tensor (no data) has a cipher chunk");
  } else if (data_length != tensor_size->bytes) {
    return err.Invalid(what, ": data_length ", data_length, " does not match ",
                       ElementTypeName(*type), " shape ", ShapeString(e.shape), " (",
                       tensor_size->bytes, " bytes)");
  }
  if (info.encrypted && !record.cipher->sequential) {
    const Cipher& c = *record.cipher;
    const uint64_t pieces = data_length / c.chunk_size + (data_length % c.chunk_size != 0);
    if (c.mac_count != pieces) {
      return err.Invalid(what, ": cipher chunk has ", c.mac_count, " MACs, but ", data_length,
                         " bytes in ", c.chunk_size, "-byte pieces need ", pieces);
    }
  }
  // The reader keeps only what reading needs; the cross-checked fields live in `info`.
  record.name.clear();
  record.dtype.clear();
  record.shape.clear();
  return absl::OkStatus();
}

// Records must not overlap, and the end-of-records marker must follow the last one.
absl::Status CheckLayout(std::span<const std::byte> bytes, const std::vector<TensorInfo>& tensors,
                         uint64_t records_begin, const FileErrors& err) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].header_offset < tensors[b].header_offset;
  });
  // Streaming readers start at 73 + M, so the first record must be there.
  if (!order.empty() && tensors[order[0]].header_offset != records_begin) {
    return err.Invalid("the first record is at offset ", tensors[order[0]].header_offset,
                       " (tensor ", QuoteName(tensors[order[0]].name),
                       "), not right after the index at ", records_begin);
  }
  uint64_t end = records_begin;
  for (size_t k = 0; k < order.size(); ++k) {
    const TensorInfo& t = tensors[order[k]];
    if (k > 0 && t.header_offset < end) {
      const TensorInfo& prev = tensors[order[k - 1]];
      return err.Invalid("tensor ", QuoteName(t.name), ": record at offset ", t.header_offset,
                         " overlaps the record of tensor ", QuoteName(prev.name), " [",
                         prev.header_offset, ", ", end, ")");
    }
    end = t.data_offset + t.data_length;
  }
  const uint64_t size = bytes.size();
  if (size - end < 8) {
    return err.DataLoss("the file is ", size,
                        " bytes and ends without the 8-byte end-of-records marker after the last "
                        "record (which ends at ",
                        end, "): truncated?");
  }
  if (LoadLe<uint64_t>(bytes.data() + end) != 0) {
    return err.Invalid("the 8 bytes after the last record (offset ", end,
                       ") are not the end-of-records marker");
  }
  return absl::OkStatus();
}

}  // namespace

TensorizerFile::TensorizerFile(std::shared_ptr<State> state) : state_(std::move(state)) {}
TensorizerFile::~TensorizerFile() = default;
TensorizerFile::TensorizerFile(TensorizerFile&&) noexcept = default;
TensorizerFile& TensorizerFile::operator=(TensorizerFile&&) noexcept = default;

absl::StatusOr<TensorizerFile> TensorizerFile::Open(const fs::path& path) {
  auto state = std::make_shared<State>();
  state->path_text = path.string();
  const FileErrors err(state->path_text);
  KILN_ASSIGN_OR_RETURN(state->file, MappedFile::Open(path, /*keep_descriptor=*/true));
  const std::span<const std::byte> bytes = state->file->bytes();
  KILN_ASSIGN_OR_RETURN(state->header, ParseFileHeader(bytes, err));
  const FileHeader& header = state->header;
  if (header.index_size > bytes.size() - kFileHeaderSize) {
    return err.DataLoss("index length ", header.index_size, " runs past the end of the file (",
                        bytes.size(), " bytes)");
  }
  KILN_ASSIGN_OR_RETURN(
      std::vector<IndexEntry> entries,
      ParseIndex(bytes.subspan(kFileHeaderSize, header.index_size), header.tensor_count, err));
  const uint64_t records_begin = kFileHeaderSize + header.index_size;
  state->tensors.resize(entries.size());
  state->records.resize(entries.size());
  state->by_name.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    KILN_RETURN_IF_ERROR(ValidateRecord(bytes, entries[i], header, records_begin, err,
                                        state->tensors[i], state->records[i]));
    state->any_encrypted |= state->tensors[i].encrypted;
    state->by_name.emplace(state->tensors[i].name, i);
  }
  KILN_RETURN_IF_ERROR(CheckLayout(bytes, state->tensors, records_begin, err));
  return TensorizerFile(std::move(state));
}

const fs::path& TensorizerFile::path() const { return state_->file->path(); }
uint32_t TensorizerFile::version() const { return state_->header.version; }
bool TensorizerFile::has_crypt_info() const { return state_->header.has_crypt_info(); }
bool TensorizerFile::any_encrypted() const { return state_->any_encrypted; }
uint64_t TensorizerFile::file_size() const { return state_->file->bytes().size(); }
const MappedFile& TensorizerFile::mapping() const { return *state_->file; }
const std::vector<TensorInfo>& TensorizerFile::tensors() const { return state_->tensors; }
std::shared_ptr<const void> TensorizerFile::keep_alive() const { return state_; }

const TensorInfo* TensorizerFile::Find(absl::string_view name) const {
  auto it = state_->by_name.find(name);
  return it == state_->by_name.end() ? nullptr : &state_->tensors[it->second];
}

absl::StatusOr<std::vector<TensorBytes>> TensorizerFile::ReadAll(const ReadOptions& options) const {
  State& s = *state_;
  const FileErrors err(s.path_text);
  const std::byte* base = s.file->bytes().data();
  const size_t n = s.tensors.size();
  auto owned = std::make_shared<OwnedBuffers>();

  // Keys: a raw key opens every encrypted record; a passphrase is derived per parameter set.
  std::vector<const SecretKey*> keys(n, nullptr);
  std::optional<SecretKey> raw_key;
  KeyCache derived;
  if (s.any_encrypted) {
    size_t first = 0;
    while (!s.tensors[first].encrypted) ++first;
    const std::string first_what = absl::StrCat("tensor ", QuoteName(s.tensors[first].name));
    if (!options.key.has_value()) {
      return err.Make(absl::StatusCode::kFailedPrecondition,
                      "the file has encrypted tensors (the first is ", first_what,
                      ") and no decryption key was given");
    }
    KILN_RETURN_IF_ERROR(EnsureSodium());
    const std::span<const uint8_t> secret = options.key->secret();
    if (!options.key->is_passphrase()) {
      if (secret.size() != kKeyBytes) {
        return err.Invalid("the raw decryption key is ", secret.size(), " bytes; it must be ",
                           kKeyBytes);
      }
      raw_key.emplace(secret.first<kKeyBytes>());
    }
    for (size_t i = 0; i < n; ++i) {
      if (!s.tensors[i].encrypted) continue;
      if (raw_key) {
        keys[i] = &*raw_key;
        continue;
      }
      const std::string what = absl::StrCat("tensor ", QuoteName(s.tensors[i].name));
      if (!s.records[i].key_derivation) {
        return err.Make(absl::StatusCode::kFailedPrecondition, what,
                        " was encrypted with a raw key, not a passphrase: pass the raw key");
      }
      absl::StatusOr<const SecretKey*> key = derived.Get(secret, *s.records[i].key_derivation);
      if (!key.ok()) return err.Make(key.status().code(), what, ": ", key.status().message());
      keys[i] = *key;
    }
  }

  // Pieces to decrypt, and one buffer per encrypted tensor (records do not overlap, so these
  // together are smaller than the file).
  std::vector<Piece> pieces;
  std::vector<std::byte*> plain(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const TensorInfo& t = s.tensors[i];
    if (!t.encrypted) continue;
    const Cipher& c = *s.records[i].cipher;
    owned->decrypted.push_back(std::make_unique_for_overwrite<std::byte[]>(t.data_length));
    plain[i] = owned->decrypted.back().get();
    const uint64_t step = c.sequential ? std::max<uint64_t>(t.data_length, 1) : c.chunk_size;
    for (uint64_t k = 0; k < c.mac_count; ++k) {
      pieces.push_back({i, k, k * step, std::min(step, t.data_length - k * step)});
    }
  }
  auto decrypt = [&](const Piece& p, std::byte* out) -> bool {
    const TensorInfo& t = s.tensors[p.tensor];
    const RecordHeader& r = s.records[p.tensor];
    uint8_t mac[kMacBytes];
    std::memcpy(mac, base + t.header_offset + r.cipher->macs_offset + p.index * kMacBytes,
                kMacBytes);
    return OpenDetached(out, base + t.data_offset + p.offset, p.size, mac,
                        ChunkNonce(r.cipher->nonce, p.index), *keys[p.tensor]);
  };
  auto piece_text = [&](const Piece& p) {
    return absl::StrCat("tensor ", QuoteName(s.tensors[p.tensor].name), ": encrypted piece ",
                        p.index, " of ", s.records[p.tensor].cipher->mac_count, " (data bytes [",
                        p.offset, ", ", p.offset + p.size, "))");
  };
  // A wrong key and corrupted data both fail the MAC. Trying each key on its smallest piece first
  // tells them apart: if that fails the key is taken to be wrong, otherwise later failures are
  // corruption.
  std::vector<const SecretKey*> probed;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const SecretKey* key = keys[pieces[k].tensor];
    if (std::find(probed.begin(), probed.end(), key) != probed.end()) continue;
    probed.push_back(key);
    size_t best = k;
    for (size_t j = k; j < pieces.size(); ++j) {
      if (keys[pieces[j].tensor] == key && pieces[j].size < pieces[best].size) best = j;
    }
    std::vector<std::byte> scratch(pieces[best].size);
    if (!decrypt(pieces[best], scratch.data())) {
      return err.Make(absl::StatusCode::kPermissionDenied, piece_text(pieces[best]),
                      " fails MAC authentication: the decryption ",
                      options.key->is_passphrase() ? "passphrase" : "key",
                      " is wrong (or this piece is corrupted)");
    }
  }
  KILN_RETURN_IF_ERROR(ParallelFor(pieces.size(), options.threads, [&](size_t k) -> absl::Status {
    const Piece& p = pieces[k];
    if (decrypt(p, plain[p.tensor] + p.offset)) return absl::OkStatus();
    return err.DataLoss(piece_text(p), " fails MAC authentication: the data is corrupted");
  }));

  uint64_t max_meta = 0;
  for (const TensorInfo& t : s.tensors) {
    if (t.meta) max_meta = std::max(max_meta, t.byte_size());
  }
  if (max_meta > 0) {
    absl::StatusOr<std::unique_ptr<ZeroMapping>> zeros = ZeroMapping::Create(max_meta);
    if (!zeros.ok()) return err.Make(zeros.status().code(), zeros.status().message());
    owned->zeros = *std::move(zeros);
  }
  std::vector<TensorBytes> out(n);
  for (size_t i = 0; i < n; ++i) {
    const TensorInfo& t = s.tensors[i];
    if (t.meta) {
      out[i] = {owned->zeros->data(), static_cast<size_t>(t.byte_size()), false};
    } else if (t.encrypted) {
      out[i] = {plain[i], static_cast<size_t>(t.data_length), false};
    } else {
      out[i] = {base + t.data_offset, static_cast<size_t>(t.data_length), true};
    }
  }

  if (options.hash_check != HashCheck::kNone) {
    std::vector<RecordToVerify> records(n);
    for (size_t i = 0; i < n; ++i) {
      const TensorInfo& t = s.tensors[i];
      const RecordHeader& r = s.records[i];
      RecordToVerify& v = records[i];
      v.name = t.name;
      v.header = std::span<const std::byte>(base + t.header_offset, r.header_size);
      v.hashes = r.hashes;
      v.crypt_begin = r.crypt_begin;
      v.crypt_end = r.crypt_end;
      // A meta tensor's hashes cover its header only.
      if (!t.meta) {
        v.data = out[i].data;
        v.size = out[i].size;
        v.in_file = !t.encrypted;
        v.file_offset = t.data_offset;
      }
      v.authenticated = t.encrypted;
    }
    KILN_RETURN_IF_ERROR(VerifyRecordHashes(
        records, {options.hash_check, options.threads, s.file->descriptor()}, err));
  }

  if (!owned->decrypted.empty() || owned->zeros != nullptr) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.owned.push_back(std::move(owned));
  }
  return out;
}

}  // namespace kiln::tensorizer
