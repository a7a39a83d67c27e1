// CoreWeave Tensorizer `.tensors` files (data versions 1-4): element types, the binary layout of
// the file header, metadata index and tensor record headers, and the record hashes. Shared by
// tensorizer_reader and tensorizer_writer; the format is described in
// shared/docs/tensorizer-format.md (section numbers below refer to it).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kiln::tensorizer {

// Element types a tensorizer file can hold. Data is raw little-endian elements, row-major.
enum class ElementType {
  kF32,
  kF64,
  kF16,
  kBF16,
  kC32,  // 2 x float16
  kC64,
  kC128,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool,  // one byte, 0 or 1
  kF8E4M3FN,
  kF8E5M2,
  kF8E4M3FNUZ,
  kF8E5M2FNUZ,
  kF8E8M0FNU,
};

size_t ElementSize(ElementType t);
// The torch spelling without "torch.": "float32", "bfloat16", "float8_e4m3fn", ...
absl::string_view ElementTypeName(ElementType t);
// Parses a raw dtype field (§7): a numpy code ("<f4", "|b1", "<u2", ...) or an opaque code with a
// torch name after a NUL ("<V2\0torch.bfloat16", "|V1\0torch.float8_e4m3fn"). The opaque code's
// size must match the torch type. Big-endian codes and quantized types are refused.
absl::StatusOr<ElementType> ParseDTypeString(absl::string_view dtype);
// The dtype field tensorizer writes for `t` (opaque with a torch name for types numpy lacks;
// uint16/32/64 in the numpy spelling newer torch versions produce).
std::string DTypeString(ElementType t);

// Which writer API produced a tensor (§8); informational for a loader.
enum class TensorType : uint8_t { kParam = 0, kBuffer = 1, kStateDict = 2 };

// Record hash types (§6).
enum class HashType : uint8_t { kCrc32 = 0, kSha256 = 1 };

inline constexpr char kMagic[] = "|TZR|";  // 5 bytes, without the terminating NUL
inline constexpr uint64_t kMagicSize = 5;
// Magic, version, flags, tensor_bytes, reserved, tensor_count and the u64 index length M.
inline constexpr uint64_t kFileHeaderSize = 73;
// The index size every tensorizer writer reserves (and its hard limit).
inline constexpr uint64_t kStandardIndexSize = 256 * 1024;
// An index entry with an empty name and dtype and no dims.
inline constexpr uint64_t kMinIndexEntrySize = 2 + 1 + 1 + 1 + 24;
// A record header with empty name and dtype, no dims and an empty hash section (no crypt info).
inline constexpr uint64_t kMinRecordHeaderSize = 8 + 2 + 1 + 2 + 1 + 1 + 2 + 1 + 8;
inline constexpr size_t kKeyBytes = 32;
inline constexpr size_t kNonceBytes = 24;
inline constexpr size_t kMacBytes = 16;
// Meta tensors read as zeros of their shape's size; a header claiming more than this is refused
// rather than mapped (1 TiB of address space).
inline constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 40;

// Builds error statuses whose messages start with the file they concern.
class FileErrors {
 public:
  explicit FileErrors(std::string file) : prefix_(absl::StrCat("tensorizer file ", file, ": ")) {}
  template <typename... Args>
  absl::Status Invalid(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, args...));
  }
  template <typename... Args>
  absl::Status DataLoss(const Args&... args) const {
    return absl::DataLossError(absl::StrCat(prefix_, args...));
  }
  template <typename... Args>
  absl::Status Make(absl::StatusCode code, const Args&... args) const {
    return absl::Status(code, absl::StrCat(prefix_, args...));
  }

 private:
  std::string prefix_;
};

// `name` quoted for an error message; control bytes (0x1E JSON-path names) are escaped, UTF-8 kept.
std::string QuoteName(absl::string_view name);

// Bytes [0, 73) of a file, validated (§3, §4).
struct FileHeader {
  uint32_t version = 0;
  bool encrypted_flag = false;  // flags bit 0; only meaningful (and only set) for version >= 4
  uint64_t tensor_bytes = 0;    // informational sum of data lengths
  uint64_t tensor_count = 0;
  uint64_t index_size = 0;  // M
  // Whether every record header carries a crypt-info block (§4).
  bool has_crypt_info() const { return version == 3 || (version >= 4 && encrypted_flag); }
};
// Parses the first kFileHeaderSize bytes of `file` (which must hold at least that many). Checks
// the magic, the version (1-4) and, for version 4, that no unknown flag bit is set; the flags of
// versions 1-3 were an unused reserved slot and are ignored.
absl::StatusOr<FileHeader> ParseFileHeader(std::span<const std::byte> file, const FileErrors& err);
// The 73 bytes a writer emits.
std::string SerializeFileHeader(const FileHeader& header);

// One metadata index entry (§5).
struct IndexEntry {
  std::string name;
  TensorType type = TensorType::kStateDict;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_length = 0;
};
// Parses `count` entries from the index region; every length is bounded by the region and the
// count by the region's size, so no allocation exceeds it. Refuses duplicate names.
absl::StatusOr<std::vector<IndexEntry>> ParseIndex(std::span<const std::byte> region,
                                                   uint64_t count, const FileErrors& err);
// Appends the serialized entry to `out`.
void SerializeIndexEntry(const IndexEntry& entry, std::string& out);

// Location of one hash value inside a record header.
struct HashField {
  HashType type = HashType::kCrc32;
  uint32_t value_offset = 0;  // from the start of the header
  uint8_t length = 0;
};
// Key derivation chunk (type 1, method 1 = crypto_pwhash).
struct KeyDerivation {
  uint64_t opslimit = 0;
  uint64_t memlimit = 0;
  int32_t alg = 0;
  std::string salt;
};
// Cipher chunk: type 2 ("parallel", one MAC per chunk_size piece) or type 3 (one secretbox).
struct Cipher {
  bool sequential = false;
  uint64_t chunk_size = 0;  // parallel only
  std::array<uint8_t, kNonceBytes> nonce{};
  uint64_t mac_count = 0;
  uint64_t macs_offset = 0;  // of the first 16-byte MAC, from the start of the header
};
// A parsed tensor record header (§6, §9).
struct RecordHeader {
  uint64_t header_size = 0;
  uint16_t module_idx = 0;
  TensorType type = TensorType::kStateDict;
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<HashField> hashes;
  // [crypt_begin, crypt_end): the u64 C and its C bytes, left out of the hashes; empty if absent.
  uint64_t crypt_begin = 0;
  uint64_t crypt_end = 0;
  std::optional<KeyDerivation> key_derivation;
  std::optional<Cipher> cipher;
  int64_t data_length = 0;
};
// Parses one record header; `header` is exactly its header_size bytes. Every field must end
// exactly where data_length (the last 8 bytes) begins. `what` names the tensor in errors.
absl::StatusOr<RecordHeader> ParseRecordHeader(std::span<const std::byte> header,
                                               bool has_crypt_info, absl::string_view what,
                                               const FileErrors& err);

// The header bytes §6.1 hashes: `header` with every hash value replaced by zeros and
// [crypt_begin, crypt_end) left out (an empty or out-of-range region is kept).
std::string HashedHeaderBytes(std::span<const std::byte> header, std::span<const HashField> hashes,
                              uint64_t crypt_begin, uint64_t crypt_end);

// The two digests §6.1 defines over one record.
struct Digests {
  uint32_t crc32 = 0;
  std::array<uint8_t, 32> sha256{};
};
// Hashes the header with every hash value replaced by zeros and [crypt_begin, crypt_end) left
// out, then `plaintext`. Computes only what is asked for.
absl::StatusOr<Digests> ComputeDigests(std::span<const std::byte> header,
                                       std::span<const HashField> hashes, uint64_t crypt_begin,
                                       uint64_t crypt_end, std::span<const std::byte> plaintext,
                                       bool want_crc32, bool want_sha256);

// zlib's crc32(crc, data): the IEEE CRC-32 (reflected 0xEDB88320, pre- and post-inverted),
// continuing from `crc` (0 to start), computed by ISA-L.
uint32_t Crc32(uint32_t crc, std::span<const std::byte> data);
// The CRC32 of A followed by B from crc_a = Crc32(0, A), crc_b = Crc32(0, B) and B's length
// (zlib's crc32_combine), so pieces of one stream can be hashed apart and in parallel.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// Product of `shape` (1 for 0-d) and that times the element size, or an error when a dimension
// is negative or either overflows int64.
struct TensorSize {
  int64_t elements = 0;
  uint64_t bytes = 0;
};
absl::StatusOr<TensorSize> ComputeTensorSize(std::span<const int64_t> shape, ElementType type);

// Runs fn(i) for every i in [0, n) on up to `threads` threads (0: hardware concurrency). Once a
// call fails, calls not yet started are skipped; returns the error of the lowest failing i.
absl::Status ParallelFor(size_t n, int threads, const std::function<absl::Status(size_t)>& fn);

// Little-endian integers at unaligned addresses, through memcpy only (the host is little-endian).
static_assert(std::endian::native == std::endian::little, "tensorizer I/O assumes little-endian");
template <typename T>
T LoadLe(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}
template <typename T>
void AppendLe(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

}  // namespace kiln::tensorizer
