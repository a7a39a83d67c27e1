// Reader for CoreWeave Tensorizer `.tensors` files, data versions 1-4 (format:
// shared/docs/tensorizer-format.md). The file is memory-mapped; Open validates the header, the
// index and every record header without touching tensor data, and ReadAll hands out each tensor's
// plaintext: zero-copy views into the mapping where possible, owned buffers for decrypted and
// meta tensors, with decryption in parallel over pieces and the stored CRC32/SHA-256 checked on
// every thread (tensorizer_verify.h).
//
// Error codes:
//   NotFound / PermissionDenied / ...  the file cannot be opened or mapped (from MappedFile)
//   InvalidArgument     malformed or unsupported content: magic, version, flags, index or record
//                       header fields, a record that disagrees with its index entry, an unknown
//                       dtype; also a raw key that is not 32 bytes
//   DataLoss            something lies past the end of the file (truncation), or a hash or MAC
//                       check fails once the key is known to be right
//   FailedPrecondition  encrypted tensors and no key, or a passphrase for a raw-key file
//   PermissionDenied    the key (or passphrase) is wrong: the first encrypted piece read with it
//                       does not authenticate
//   ResourceExhausted   key derivation or the zero mapping for meta tensors ran out of memory
// Every message names the file and, where one is at fault, the tensor and the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loaders/mapped_file.h"
#include "loaders/tensorizer_crypto.h"
#include "loaders/tensorizer_format.h"
#include "loaders/tensorizer_verify.h"

namespace kiln::tensorizer {

// One validated tensor: its index entry, cross-checked with its record header.
struct TensorInfo {
  std::string name;  // raw name bytes (may start with '.' or 0x1E for a JSON path)
  TensorType type = TensorType::kStateDict;
  uint16_t module_idx = 0;
  std::string dtype_string;  // raw, may contain '\0'
  ElementType element_type = ElementType::kF32;
  std::vector<int64_t> shape;  // empty for 0-d
  int64_t elements = 0;        // product of shape (1 for 0-d)
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_length = 0;
  bool meta = false;       // data_length == 0 && elements > 0: reads as zeros
  bool encrypted = false;  // the record has a cipher chunk
  bool has_crc32 = false;
  bool has_sha256 = false;
  uint64_t byte_size() const { return static_cast<uint64_t>(elements) * ElementSize(element_type); }
};

struct ReadOptions {
  HashCheck hash_check = HashCheck::kAll;
  std::optional<DecryptionKey> key;  // required iff the file has encrypted records
  int threads = 0;                   // 0 = hardware concurrency
};

// Plaintext bytes of one tensor.
struct TensorBytes {
  const std::byte* data = nullptr;  // may be UNALIGNED (into the mapping when zero_copy)
  size_t size = 0;
  bool zero_copy = false;  // true: a view into the mapping; false: an owned buffer (decrypted, or
                           // zeros for a meta tensor)
};

class TensorizerFile {
 public:
  // Maps `path` and validates the file header, the index and every record header (no tensor data
  // is read). A moved-from TensorizerFile must not be used.
  static absl::StatusOr<TensorizerFile> Open(const std::filesystem::path& path);

  ~TensorizerFile();
  TensorizerFile(TensorizerFile&&) noexcept;
  TensorizerFile& operator=(TensorizerFile&&) noexcept;
  TensorizerFile(const TensorizerFile&) = delete;
  TensorizerFile& operator=(const TensorizerFile&) = delete;

  const std::filesystem::path& path() const;
  uint32_t version() const;
  bool has_crypt_info() const;
  bool any_encrypted() const;
  uint64_t file_size() const;
  // The file's mapping (plain records' views point into it).
  const MappedFile& mapping() const;
  // In index order.
  const std::vector<TensorInfo>& tensors() const;
  // nullptr when absent. `name` is the raw name (JSON-path names include their 0x1E byte).
  const TensorInfo* Find(absl::string_view name) const;

  // The plaintext of every tensor, in index order: zero-copy views for plain records, owned
  // buffers for decrypted records and the shared zero mapping for meta tensors. Checks the
  // stored hashes options.hash_check selects (header with hash values zeroed and crypt info left
  // out, then the plaintext). Decryption and hashing run on options.threads threads. The views
  // stay valid while this object or any keep_alive() handle lives; the owned buffers of every
  // successful call are kept until then. Thread-safe.
  absl::StatusOr<std::vector<TensorBytes>> ReadAll(const ReadOptions& options) const;

  // Keeps the mapping and every owned buffer (of past and future ReadAll calls) alive.
  std::shared_ptr<const void> keep_alive() const;

 private:
  struct State;
  explicit TensorizerFile(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace kiln::tensorizer
