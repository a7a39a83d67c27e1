// Checking the CRC32 and SHA-256 that Tensorizer stores with every record (format §6.1), with
// every core busy to the end: one SHA-256 pass per record (SHA-256 cannot be split), largest
// first, and CRC32s that are not on the way of a SHA-256 pass split into pieces whose CRCs are
// combined. Plain records are read through the file descriptor into a small per-thread buffer
// rather than through the mapping: a first touch of each mapped page costs more than copying it
// (page-table faults, dear under virtualization), and the buffer stays in cache for both hashes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loaders/tensorizer_format.h"

namespace kiln::tensorizer {

// Which stored hashes a read checks.
enum class HashCheck {
  kNone,   // nothing
  kCrc32,  // CRC32s only: a fast check against damage, not against tampering. A record that
           // carries no CRC32 has its SHA-256 checked instead, unless it was decrypted (its MACs
           // already authenticated it).
  kAll,    // every stored CRC32 and SHA-256
};
// "none", "crc32" or "all".
absl::string_view HashCheckName(HashCheck check);
// One of the names above, in any case; InvalidArgument listing them for anything else.
absl::StatusOr<HashCheck> ParseHashCheck(absl::string_view name);

// One record whose stored hashes are checked.
struct RecordToVerify {
  absl::string_view name;             // the raw tensor name, for messages
  std::span<const std::byte> header;  // the record header as stored
  std::span<const HashField> hashes;  // where its hash values are in `header`
  uint64_t crypt_begin = 0;           // the crypt-info region, left out of the hashes
  uint64_t crypt_end = 0;
  // The plaintext: `size` bytes at `data`; when `in_file`, also the `size` bytes at
  // `file_offset` of the file, and read from there when a descriptor is given.
  const std::byte* data = nullptr;
  uint64_t size = 0;
  bool in_file = false;
  uint64_t file_offset = 0;
  bool authenticated = false;  // decrypted: its MACs already vouched for this plaintext
};

struct VerifyOptions {
  HashCheck check = HashCheck::kAll;
  int threads = 0;      // 0 = hardware concurrency
  int descriptor = -1;  // the file the records are in, open for pread(2); -1: read `data`
};

// Checks the hashes `options.check` selects. DataLoss naming the first record (in the given
// order) with a mismatch, its hashes compared in stored order; DataLoss too when the file cannot
// be read. Thread-safe; the records are only read.
absl::Status VerifyRecordHashes(std::span<const RecordToVerify> records,
                                const VerifyOptions& options, const FileErrors& err);

}  // namespace kiln::tensorizer
