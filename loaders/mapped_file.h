// Read-only memory mapping of a whole file (RAII; not copyable), optionally with its descriptor
// kept open for reads that should not go through the mapping. A file of 2 MiB or more is mapped
// at a 2 MiB-aligned address with MADV_HUGEPAGE, so that where the filesystem keeps large folios
// in the page cache (ext4 and tmpfs on recent kernels) the kernel maps it in 2 MiB pages: kernels
// can then stream weights where they lie as fast as from memory of their own.
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

  // Reads `range` (a part of bytes()) into the page cache, from storage where it is not there,
  // and maps it, so that touching it later costs no page faults. Advisory: where the kernel lacks
  // MADV_POPULATE_READ (before Linux 5.14) it does nothing.
  void Populate(std::span<const std::byte> range) const;
  // The share of this mapping's resident bytes that the kernel maps in 2 MiB pages (from
  // /proc/self/smaps), in [0, 1]; 0 when nothing is resident or the kernel does not say.
  double ResidentShareInHugePages() const;

 private:
  MappedFile(std::filesystem::path path, const std::byte* data, size_t size, int fd)
      : path_(std::move(path)), data_(data), size_(size), fd_(fd) {}
  static absl::StatusOr<const std::byte*> Map(int fd, size_t size,
                                              const std::filesystem::path& path);
  std::filesystem::path path_;
  const std::byte* data_;
  size_t size_;
  int fd_;
};

}  // namespace kiln
