#include "loaders/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/populate.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

absl::Status ErrnoError(int err, const std::filesystem::path& path, absl::string_view action) {
  std::string message = absl::StrCat("cannot ", action, " ", path.string(), ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Closes the descriptor on every path out of Open unless released to the MappedFile.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

absl::StatusOr<const std::byte*> MappedFile::Map(int fd, size_t size,
                                                 const std::filesystem::path& path) {
  if (size < kHugePage) {
    void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) return ErrnoError(errno, path, "mmap");
    return static_cast<const std::byte*>(mapped);
  }
  // A 2 MiB-aligned address, so that file offsets and addresses agree modulo 2 MiB (the kernel
  // maps a large folio with one page-table entry only then): reserve 2 MiB more, map the file
  // over the aligned start, give back the rest.
  const size_t reserved = size + kHugePage;
  void* reservation =
      ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reservation == MAP_FAILED) return ErrnoError(errno, path, "reserve addresses to map");
  const uintptr_t begin = reinterpret_cast<uintptr_t>(reservation);
  const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
  void* mapped =
      ::mmap(reinterpret_cast<void*>(aligned), size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  if (mapped == MAP_FAILED) {
    const int err = errno;
    ::munmap(reservation, reserved);
    return ErrnoError(err, path, "mmap");
  }
  if (aligned > begin) ::munmap(reservation, aligned - begin);
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t end = aligned + (size + page - 1) / page * page;
  if (begin + reserved > end) ::munmap(reinterpret_cast<void*>(end), begin + reserved - end);
  ::madvise(mapped, size, MADV_HUGEPAGE);  // advisory: without it, 4 KiB pages
  return static_cast<const std::byte*>(mapped);
}

void MappedFile::Populate(std::span<const std::byte> range) const {
  PopulateForRead(range.data(), range.size());
}

double MappedFile::ResidentShareInHugePages() const {
  if (data_ == nullptr) return 0;
  // smaps lists each mapping as "start-end perms ..." followed by "Key: value kB" lines.
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t start = reinterpret_cast<uintptr_t>(data_);
  std::string line;
  bool ours = false;
  uint64_t rss_kb = 0, huge_kb = 0;
  while (std::getline(smaps, line)) {
    const size_t colon = line.find(':');
    const size_t dash = line.find('-');
    if (dash != std::string::npos && (colon == std::string::npos || dash < colon)) {
      if (ours) break;  // the next mapping's header
      uint64_t begin = 0;
      ours = absl::SimpleHexAtoi(line.substr(0, dash), &begin) && begin == start;
      continue;
    }
    if (!ours || colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    uint64_t kb = 0;
    const std::vector<std::string> fields =
        absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
    if (fields.empty() || !absl::SimpleAtoi(fields[0], &kb)) continue;
    if (key == "Rss") rss_kb = kb;
    if (key == "FilePmdMapped") huge_kb = kb;
  }
  return rss_kb == 0 ? 0.0 : std::min(1.0, static_cast<double>(huge_kb) / rss_kb);
}

absl::StatusOr<std::shared_ptr<MappedFile>> MappedFile::Open(const std::filesystem::path& path,
                                                             bool keep_descriptor) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, path, "open");
  FdCloser closer(fd);

  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, path, "stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", path.string(), ": not a regular file"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map ", path.string(), ": size ", st.st_size, " is out of range"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  // mmap of length 0 is an error (EINVAL); an empty file is an empty span without a mapping.
  const std::byte* data = nullptr;
  if (size != 0) {
    KILN_ASSIGN_OR_RETURN(data, Map(fd, size, path));
  }
  return std::shared_ptr<MappedFile>(
      new MappedFile(path, data, size, keep_descriptor ? closer.Release() : -1));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_ != 0) {
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kiln
