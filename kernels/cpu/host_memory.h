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

// The MemoryResource behind the CPU backend's DeviceBuffers.
std::shared_ptr<MemoryResource> HostMemory();

}  // namespace kiln::cpu
