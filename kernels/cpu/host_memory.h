// Host memory for the CPU backend: 64-byte aligned, and backed by 2 MiB pages when large.
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/buffer.h"

namespace kiln::cpu {

// Null when out of memory. Large blocks are 2 MiB aligned and advised for huge pages: packed
// weights of a real model are hundreds of MB, and 2 MiB pages make first touch ~500× fewer page
// faults and cut TLB misses when decode streams them (transparent_hugepage "madvise" mode, the
// default, backs only ranges that ask).
void* AllocateHost(size_t bytes);
void FreeHost(void* data);

struct HostFree {
  void operator()(std::byte* p) const { FreeHost(p); }
};
using HostBytes = std::unique_ptr<std::byte, HostFree>;

// A copy of [data, data + bytes) in memory from AllocateHost, copied on up to `threads` OpenMP
// threads; null when out of memory. Adopted packed images are copied rather than read in place:
// the kernels stream weights from 2 MiB pages markedly faster than from a mapped file's 4 KiB
// page-cache pages (docs/design.md, "Prepacked native files").
HostBytes CopyToHost(const std::byte* data, size_t bytes, int threads);

// The MemoryResource behind the CPU backend's DeviceBuffers.
std::shared_ptr<MemoryResource> HostMemory();

}  // namespace kiln::cpu
