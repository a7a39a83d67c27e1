// Read-only memory mapping of a whole file (RAII; not copyable), optionally with its descriptor
// kept open for reads that should not go through the mapping.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>

#include "absl/status/statusor.h"

namespace kiln {

class MappedFile {
 public:
  // With `keep_descriptor`, the file stays open for pread(2) until this object is destroyed: a
  // pass over the whole file (hashing it) is cheaper through read calls than through first
  // touches of the mapping, each of which faults in page-table entries.
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::filesystem::path& path,
                                                          bool keep_descriptor = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }
  // The open file (the same one that is mapped), or -1 unless opened with keep_descriptor.
  int descriptor() const { return fd_; }

 private:
  MappedFile(std::filesystem::path path, const std::byte* data, size_t size, int fd)
      : path_(std::move(path)), data_(data), size_(size), fd_(fd) {}
  std::filesystem::path path_;
  const std::byte* data_;
  size_t size_;
  int fd_;
};

}  // namespace kiln
