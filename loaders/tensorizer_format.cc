#include "loaders/tensorizer_format.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"

namespace kiln::tensorizer {
namespace {

struct TypeInfo {
  ElementType type;
  absl::string_view torch_name;
  size_t size;
  // The numpy code tensorizer writes; for opaque types the part before the NUL.
  absl::string_view numpy_code;
  bool opaque;
};

constexpr TypeInfo kTypes[] = {
    {ElementType::kF32, "float32", 4, "<f4", false},
    {ElementType::kF64, "float64", 8, "<f8", false},
    {ElementType::kF16, "float16", 2, "<f2", false},
    {ElementType::kBF16, "bfloat16", 2, "<V2", true},
    {ElementType::kC32, "complex32", 4, "<V4", true},
    {ElementType::kC64, "complex64", 8, "<c8", false},
    {ElementType::kC128, "complex128", 16, "<c16", false},
    {ElementType::kI8, "int8", 1, "|i1", false},
    {ElementType::kU8, "uint8", 1, "|u1", false},
    {ElementType::kI16, "int16", 2, "<i2", false},
    {ElementType::kU16, "uint16", 2, "<u2", false},
    {ElementType::kI32, "int32", 4, "<i4", false},
    {ElementType::kU32, "uint32", 4, "<u4", false},
    {ElementType::kI64, "int64", 8, "<i8", false},
    {ElementType::kU64, "uint64", 8, "<u8", false},
    {ElementType::kBool, "bool", 1, "|b1", false},
    {ElementType::kF8E4M3FN, "float8_e4m3fn", 1, "|V1", true},
    {ElementType::kF8E5M2, "float8_e5m2", 1, "|V1", true},
    {ElementType::kF8E4M3FNUZ, "float8_e4m3fnuz", 1, "|V1", true},
    {ElementType::kF8E5M2FNUZ, "float8_e5m2fnuz", 1, "|V1", true},
    {ElementType::kF8E8M0FNU, "float8_e8m0fnu", 1, "|V1", true},
};

const TypeInfo& Info(ElementType t) {
  for (const TypeInfo& info : kTypes) {
    if (info.type == t) return info;
  }
  return kTypes[0];  // unreachable for valid enum values
}

// Bounds-checked reads from a byte span; every read fails rather than running past the end.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> data) : data_(data) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  template <typename T>
  bool Read(T& value) {
    if (remaining() < sizeof(T)) return false;
    value = LoadLe<T>(data_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool ReadString(size_t n, std::string& out) {
    if (remaining() < n) return false;
    out.assign(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool Skip(uint64_t n) {
    if (remaining() < n) return false;
    pos_ += static_cast<size_t>(n);
    return true;
  }

 private:
  std::span<const std::byte> data_;
  size_t pos_ = 0;
};

bool ReadShape(Cursor& c, std::vector<int64_t>& shape) {
  uint8_t ndim = 0;
  if (!c.Read(ndim) || c.remaining() < size_t{4} * ndim) return false;
  shape.resize(ndim);
  for (int64_t& d : shape) {
    uint32_t dim = 0;
    c.Read(dim);
    d = dim;
  }
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? "," : "", shape[i]);
  return out + "]";
}

// Parses the crypt-info block's C bytes (§9) into `header`. Offsets are absolute in the header.
absl::Status ParseCryptInfo(std::span<const std::byte> block, uint64_t block_offset,
                            RecordHeader& header, absl::string_view what, const FileErrors& err) {
  Cursor c(block);
  uint16_t chunk_count = 0;
  if (!c.Read(chunk_count)) return err.Invalid(what, ": crypt info shorter than its chunk count");
  for (uint16_t i = 0; i < chunk_count; ++i) {
    uint64_t chunk_len = 0;
    if (!c.Read(chunk_len) || chunk_len < 2 || chunk_len > c.remaining()) {
      return err.Invalid(what, ": crypt info chunk ", i, " has length ", chunk_len,
                         " outside the crypt info block");
    }
    const uint64_t chunk_offset = block_offset + c.pos();  // in the header
    Cursor chunk(block.subspan(c.pos(), chunk_len));
    c.Skip(chunk_len);
    uint16_t type = 0;
    chunk.Read(type);
    if (type == 1) {
      if (header.key_derivation) return err.Invalid(what, ": two key derivation chunks");
      uint16_t method = 0;
      KeyDerivation kd;
      uint16_t salt_len = 0;
      if (!chunk.Read(method)) return err.Invalid(what, ": key derivation chunk is truncated");
      if (method != 1) {
        return err.Invalid(what, ": unsupported key derivation method ", method,
                           " (only 1, libsodium crypto_pwhash, is known)");
      }
      if (!chunk.Read(kd.opslimit) || !chunk.Read(kd.memlimit) || !chunk.Read(kd.alg) ||
          !chunk.Read(salt_len) || !chunk.ReadString(salt_len, kd.salt) || chunk.remaining() != 0) {
        return err.Invalid(what, ": key derivation chunk length ", chunk_len,
                           " does not match its fields");
      }
      header.key_derivation = std::move(kd);
    } else if (type == 2 || type == 3) {
      if (header.cipher) return err.Invalid(what, ": two cipher chunks");
      Cipher cipher;
      cipher.sequential = type == 3;
      if (!cipher.sequential && !chunk.Read(cipher.chunk_size)) {
        return err.Invalid(what, ": cipher chunk is truncated");
      }
      for (uint8_t& b : cipher.nonce) {
        if (!chunk.Read(b)) return err.Invalid(what, ": cipher chunk is truncated");
      }
      if (cipher.sequential) {
        cipher.mac_count = 1;
      } else if (!chunk.Read(cipher.mac_count)) {
        return err.Invalid(what, ": cipher chunk is truncated");
      }
      if (cipher.mac_count > chunk.remaining() / kMacBytes ||
          chunk.remaining() != cipher.mac_count * kMacBytes) {
        return err.Invalid(what, ": cipher chunk of ", chunk_len, " bytes does not hold exactly ",
                           cipher.mac_count, " MACs");
      }
      cipher.macs_offset = chunk_offset + chunk.pos();
      if (!cipher.sequential && (cipher.chunk_size < 1024 || cipher.chunk_size % 64 != 0)) {
        return err.Invalid(what, ": cipher chunk_size ", cipher.chunk_size,
                           " is not a multiple of 64 of at least 1024");
      }
      header.cipher = cipher;
    }
    // Unknown chunk types are skipped by length; an encrypted record still needs type 2 or 3.
  }
  if (c.remaining() != 0) {
    return err.Invalid(what, ": crypt info has ", c.remaining(), " bytes after its ", chunk_count,
                       " chunks");
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t Crc32(uint32_t crc, std::span<const std::byte> data) {
  // ISA-L's gzip CRC is zlib's crc32 (same polynomial, reflection and inversions) computed with
  // carry-less multiplication: about 5x zlib's table-driven speed, so CRC32 costs less than the
  // SHA-256 it is verified alongside.
  return crc32_gzip_refl(crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

size_t ElementSize(ElementType t) { return Info(t).size; }

absl::string_view ElementTypeName(ElementType t) { return Info(t).torch_name; }

absl::StatusOr<ElementType> ParseDTypeString(absl::string_view dtype) {
  const size_t nul = dtype.find('\0');
  if (nul == absl::string_view::npos) {
    for (const TypeInfo& info : kTypes) {
      if (!info.opaque && info.numpy_code == dtype) return info.type;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype \"", absl::CHexEscape(dtype), "\""));
  }
  // Opaque: "<V{n}" or "|V{n}", NUL, "torch.<name>"; the torch name decides the type.
  const absl::string_view code = dtype.substr(0, nul);
  const absl::string_view torch = dtype.substr(nul + 1);
  constexpr absl::string_view kTorch = "torch.";
  if (torch.substr(0, kTorch.size()) != kTorch) {
    return absl::InvalidArgumentError(absl::StrCat("opaque dtype \"", absl::CHexEscape(dtype),
                                                   "\" lacks a \"torch.<name>\" after the NUL"));
  }
  const absl::string_view name = torch.substr(kTorch.size());
  for (const TypeInfo& info : kTypes) {
    if (info.torch_name != name) continue;
    const std::string expected = absl::StrCat("V", info.size);
    if (code.size() < 2 || (code[0] != '<' && code[0] != '|') || code.substr(1) != expected ||
        (code[0] == '|' && info.size != 1)) {
      return absl::InvalidArgumentError(absl::StrCat("opaque dtype \"", absl::CHexEscape(dtype),
                                                     "\" does not have the code <", expected,
                                                     " its torch type needs"));
    }
    return info.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported torch dtype \"", absl::CHexEscape(torch), "\""));
}

std::string DTypeString(ElementType t) {
  const TypeInfo& info = Info(t);
  if (!info.opaque) return std::string(info.numpy_code);
  std::string out(info.numpy_code);
  out.push_back('\0');
  return absl::StrCat(out, "torch.", info.torch_name);
}

std::string QuoteName(absl::string_view name) {
  return absl::StrCat("\"", absl::Utf8SafeCHexEscape(name), "\"");
}

absl::StatusOr<FileHeader> ParseFileHeader(std::span<const std::byte> file, const FileErrors& err) {
  if (file.size() < kFileHeaderSize) {
    return err.DataLoss("the file is ", file.size(), " bytes, shorter than the ", kFileHeaderSize,
                        "-byte file header");
  }
  if (std::memcmp(file.data(), kMagic, kMagicSize) != 0) {
    return err.Invalid(
        "bad magic \"",
        absl::CHexEscape(absl::string_view(reinterpret_cast<const char*>(file.data()), kMagicSize)),
        "\" (expected \"|TZR|\")");
  }
  FileHeader header;
  header.version = LoadLe<uint32_t>(file.data() + 5);
  if (header.version < 1 || header.version > 4) {
    return err.Invalid("unsupported data version ", header.version, " (kiln reads 1 to 4)");
  }
  if (header.version >= 4) {
    // 256-bit little-endian flags; only bit 0 (encrypted) is defined.
    const std::byte* flags = file.data() + 9;
    for (int i = 0; i < 32; ++i) {
      const uint8_t byte = static_cast<uint8_t>(flags[i]);
      if ((i == 0 ? byte & ~1u : byte) != 0) {
        return err.Invalid("unknown feature flag bits set in byte ", i, " of the flags (0x",
                           absl::Hex(byte, absl::kZeroPad2), ")");
      }
    }
    header.encrypted_flag = (static_cast<uint8_t>(flags[0]) & 1) != 0;
  }
  header.tensor_bytes = LoadLe<uint64_t>(file.data() + 41);
  header.tensor_count = LoadLe<uint64_t>(file.data() + 57);
  header.index_size = LoadLe<uint64_t>(file.data() + 65);
  return header;
}

std::string SerializeFileHeader(const FileHeader& header) {
  std::string out(kMagic, kMagicSize);
  AppendLe<uint32_t>(out, header.version);
  std::string flags(32, '\0');
  if (header.version >= 4 && header.encrypted_flag) flags[0] = 1;
  out += flags;
  AppendLe<uint64_t>(out, header.tensor_bytes);
  AppendLe<uint64_t>(out, 0);
  AppendLe<uint64_t>(out, header.tensor_count);
  AppendLe<uint64_t>(out, header.index_size);
  return out;
}

absl::StatusOr<std::vector<IndexEntry>> ParseIndex(std::span<const std::byte> region,
                                                   uint64_t count, const FileErrors& err) {
  if (count > region.size() / kMinIndexEntrySize) {
    return err.Invalid("tensor_count ", count, " cannot fit in the ", region.size(),
                       "-byte index (an entry takes at least ", kMinIndexEntrySize, " bytes)");
  }
  std::vector<IndexEntry> entries(static_cast<size_t>(count));
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(entries.size());
  Cursor c(region);
  for (size_t i = 0; i < entries.size(); ++i) {
    IndexEntry& e = entries[i];
    const std::string where = absl::StrCat("index entry ", i);
    uint16_t name_len = 0;
    if (!c.Read(name_len) || !c.ReadString(name_len, e.name)) {
      return err.Invalid(where, ": name runs past the end of the ", region.size(), "-byte index");
    }
    const std::string what = absl::StrCat(where, " (tensor ", QuoteName(e.name), ")");
    uint8_t type = 0;
    uint8_t dtype_len = 0;
    if (!c.Read(type) || !c.Read(dtype_len) || !c.ReadString(dtype_len, e.dtype) ||
        !ReadShape(c, e.shape) || !c.Read(e.header_offset) || !c.Read(e.data_offset) ||
        !c.Read(e.data_length)) {
      return err.Invalid(what, ": runs past the end of the ", region.size(), "-byte index");
    }
    if (type > 2) return err.Invalid(what, ": unknown tensor_type ", static_cast<int>(type));
    e.type = static_cast<TensorType>(type);
    if (e.data_length > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return err.Invalid(what, ": data_length ", static_cast<int64_t>(e.data_length),
                         " is negative");
    }
    if (!names.insert(e.name).second) {
      return err.Invalid(what, ": duplicate tensor name ", QuoteName(e.name));
    }
  }
  return entries;
}

void SerializeIndexEntry(const IndexEntry& entry, std::string& out) {
  AppendLe<uint16_t>(out, static_cast<uint16_t>(entry.name.size()));
  out += entry.name;
  AppendLe<uint8_t>(out, static_cast<uint8_t>(entry.type));
  AppendLe<uint8_t>(out, static_cast<uint8_t>(entry.dtype.size()));
  out += entry.dtype;
  AppendLe<uint8_t>(out, static_cast<uint8_t>(entry.shape.size()));
  for (int64_t d : entry.shape) AppendLe<uint32_t>(out, static_cast<uint32_t>(d));
  AppendLe<uint64_t>(out, entry.header_offset);
  AppendLe<uint64_t>(out, entry.data_offset);
  AppendLe<uint64_t>(out, entry.data_length);
}

absl::StatusOr<RecordHeader> ParseRecordHeader(std::span<const std::byte> header,
                                               bool has_crypt_info, absl::string_view what,
                                               const FileErrors& err) {
  RecordHeader h;
  Cursor c(header);
  uint8_t type = 0;
  uint16_t name_len = 0;
  uint8_t dtype_len = 0;
  if (!c.Read(h.header_size) || !c.Read(h.module_idx) || !c.Read(type) || !c.Read(name_len) ||
      !c.ReadString(name_len, h.name) || !c.Read(dtype_len) || !c.ReadString(dtype_len, h.dtype) ||
      !ReadShape(c, h.shape)) {
    return err.Invalid(what, ": record header fields run past its header_size ", header.size());
  }
  if (type > 2) return err.Invalid(what, ": record header has unknown tensor_type ", int{type});
  h.type = static_cast<TensorType>(type);

  uint16_t hash_section_len = 0;
  uint8_t hash_count = 0;
  if (!c.Read(hash_section_len) || hash_section_len < 1 || c.remaining() < hash_section_len) {
    return err.Invalid(what, ": hash section of ", hash_section_len,
                       " bytes runs past the record header");
  }
  const size_t hash_end = c.pos() + hash_section_len;
  c.Read(hash_count);
  for (uint8_t i = 0; i < hash_count; ++i) {
    uint8_t hash_type = 0;
    uint8_t hash_len = 0;
    if (c.pos() + 2 > hash_end || !c.Read(hash_type) || !c.Read(hash_len) ||
        c.pos() + hash_len > hash_end) {
      return err.Invalid(what, ": hash ", int{i}, " of ", int{hash_count},
                         " runs past the hash section");
    }
    const uint8_t expected_len = hash_type == 0 ? 4 : hash_type == 1 ? 32 : 0;
    if (expected_len == 0) return err.Invalid(what, ": unknown hash type ", int{hash_type});
    if (hash_len != expected_len) {
      return err.Invalid(what, ": ", hash_type == 0 ? "CRC32" : "SHA-256", " hash has length ",
                         int{hash_len}, ", expected ", int{expected_len});
    }
    h.hashes.push_back(
        {static_cast<HashType>(hash_type), static_cast<uint32_t>(c.pos()), hash_len});
    c.Skip(hash_len);
  }
  if (c.pos() != hash_end) {
    return err.Invalid(what, ": hash section length ", hash_section_len, " does not match its ",
                       int{hash_count}, " hashes");
  }

  if (has_crypt_info) {
    h.crypt_begin = c.pos();
    uint64_t crypt_len = 0;
    if (!c.Read(crypt_len) || c.remaining() < 8 || crypt_len > c.remaining() - 8) {
      return err.Invalid(what, ": crypt info of ", crypt_len, " bytes runs past the record header");
    }
    const size_t block_offset = c.pos();
    c.Skip(crypt_len);
    h.crypt_end = c.pos();
    absl::Status status =
        ParseCryptInfo(header.subspan(block_offset, crypt_len), block_offset, h, what, err);
    if (!status.ok()) return status;
  }
  if (c.remaining() != 8) {
    return err.Invalid(what, ": record header_size ", header.size(), " leaves ", c.remaining(),
                       " bytes for the 8-byte data_length");
  }
  c.Read(h.data_length);
  if (h.data_length < 0) {
    return err.Invalid(what, ": record data_length ", h.data_length,
                       " is negative (compressed records are not supported)");
  }
  return h;
}

std::string HashedHeaderBytes(std::span<const std::byte> header, std::span<const HashField> hashes,
                              uint64_t crypt_begin, uint64_t crypt_end) {
  std::string zeroed(reinterpret_cast<const char*>(header.data()), header.size());
  for (const HashField& field : hashes) {
    if (field.value_offset + field.length <= zeroed.size()) {
      std::memset(zeroed.data() + field.value_offset, 0, field.length);
    }
  }
  if (crypt_end > crypt_begin && crypt_end <= zeroed.size()) {
    zeroed.erase(crypt_begin, crypt_end - crypt_begin);
  }
  return zeroed;
}

absl::StatusOr<Digests> ComputeDigests(std::span<const std::byte> header,
                                       std::span<const HashField> hashes, uint64_t crypt_begin,
                                       uint64_t crypt_end, std::span<const std::byte> plaintext,
                                       bool want_crc32, bool want_sha256) {
  const std::string hashed_header = HashedHeaderBytes(header, hashes, crypt_begin, crypt_end);
  const std::span<const std::byte> parts[] = {
      {reinterpret_cast<const std::byte*>(hashed_header.data()), hashed_header.size()}, plaintext};

  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(nullptr, &EVP_MD_CTX_free);
  if (want_sha256) {
    ctx.reset(EVP_MD_CTX_new());
    if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
      return absl::InternalError("cannot initialize OpenSSL SHA-256");
    }
  }
  uint32_t crc = 0;
  // Both hashes walk the same block while it is in cache, so the data is read from memory once.
  constexpr size_t kBlock = 256 * 1024;
  for (std::span<const std::byte> part : parts) {
    for (size_t offset = 0; offset < part.size(); offset += kBlock) {
      const size_t n = std::min(kBlock, part.size() - offset);
      const auto* p = reinterpret_cast<const unsigned char*>(part.data() + offset);
      if (want_crc32) crc = Crc32(crc, part.subspan(offset, n));
      if (want_sha256 && EVP_DigestUpdate(ctx.get(), p, n) != 1) {
        return absl::InternalError("OpenSSL SHA-256 update failed");
      }
    }
  }
  Digests digests;
  digests.crc32 = crc;
  if (want_sha256) {
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(ctx.get(), digests.sha256.data(), &length) != 1 || length != 32) {
      return absl::InternalError("OpenSSL SHA-256 final failed");
    }
  }
  return digests;
}

absl::StatusOr<TensorSize> ComputeTensorSize(std::span<const int64_t> shape, ElementType type) {
  int64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (__builtin_mul_overflow(elements, d, &elements)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString({shape.begin(), shape.end()}), " overflows int64"));
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<int64_t>(ElementSize(type)), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString({shape.begin(), shape.end()}), " has more bytes than int64 holds"));
  }
  return TensorSize{elements, static_cast<uint64_t>(bytes)};
}

absl::Status ParallelFor(size_t n, int threads, const std::function<absl::Status(size_t)>& fn) {
  if (n == 0) return absl::OkStatus();
  size_t workers = threads > 0 ? static_cast<size_t>(threads)
                               : std::max<size_t>(1, std::thread::hardware_concurrency());
  workers = std::min(workers, n);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t first_failure = n;
  absl::Status first_status;
  auto work = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      absl::Status status = fn(i);
      if (!status.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_failure) {
          first_failure = i;
          first_status = std::move(status);
        }
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t w = 1; w < workers; ++w) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads than asked for still finish the work
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  return first_status;
}

}  // namespace kiln::tensorizer
