// Helpers shared by the libFuzzer targets: a scratch directory on a RAM-backed file system for
// parsers that only take paths, the test data the targets load once, and reads that make
// AddressSanitizer check every byte a parser hands out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kiln::fuzz {

// A directory private to this process, under /dev/shm when it is writable (else the system temp
// directory): one per process, reused by every input so that a run does not create files.
const std::filesystem::path& ScratchDir();

// Replaces `path`'s contents with `bytes` (one open and write; no temporary file).
void WriteFileOrDie(const std::filesystem::path& path, absl::string_view bytes);

// Removes every entry of `dir` but the directory itself.
void ClearDir(const std::filesystem::path& dir);

// A file of the source tree (tests/data, checkpoints) the target needs as fixed input; aborts
// with the path when it cannot be read, since the target is useless without it.
std::string ReadSourceFileOrDie(const std::string& relative_path);
std::filesystem::path SourcePath(const std::string& relative_path);

// Splits `data` at every occurrence of `separator` (the parts of a multi-file input).
std::vector<absl::string_view> SplitParts(absl::string_view data, absl::string_view separator);

// Reads every byte of `bytes` so that a view past its allocation or mapping is reported here,
// where the parser handed it out, rather than never.
void TouchBytes(std::span<const std::byte> bytes);

inline absl::string_view AsStringView(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace kiln::fuzz
