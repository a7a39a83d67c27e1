// Mapping a range of memory (usually part of a mapped file) in one call, ahead of reading it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace kiln {

// Reads [data, data + bytes) into the page cache where it is a file's, and maps it, with one
// MADV_POPULATE_READ: several times cheaper than a page fault per page while reading it, and the
// reads from storage happen now rather than on first touch. Advisory: does nothing before Linux
// 5.14.
inline void PopulateForRead(const std::byte* data, size_t bytes) {
#ifdef MADV_POPULATE_READ
  if (bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data) / page * page;
  ::madvise(reinterpret_cast<void*>(first), reinterpret_cast<uintptr_t>(data) + bytes - first,
            MADV_POPULATE_READ);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace kiln
