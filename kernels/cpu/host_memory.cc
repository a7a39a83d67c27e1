#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kiln::cpu {
namespace {

constexpr size_t kAlignment = 256;  // kTensorAlignment; also a multiple of every vector width
constexpr size_t kHugePage = size_t{2} << 20;
// Blocks from here up to two huge pages share slabs of 2 MiB pages (a layer's smaller projections:
// on 4 KiB pages their TLB misses cost decode a fifth of the stream rate in a VM, and a page run
// of their own would waste up to half of each).
constexpr size_t kSlabMinBlock = size_t{256} << 10;
constexpr size_t kSlabBytes = size_t{32} << 20;

void* AllocateHugePages(size_t bytes) {
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, size);
  if (p != nullptr) ::madvise(p, size, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return p;
}

// Bump allocation from huge-page slabs; a slab is returned once its last block is freed.
class SlabArena {
 public:
  void* Allocate(size_t bytes) {
    bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    absl::MutexLock lock(&mu_);
    Slab* slab = current_ == 0 ? nullptr : &slabs_.at(current_);
    if (slab == nullptr || slab->used + bytes > kSlabBytes) {
      void* base = AllocateHugePages(kSlabBytes);
      if (base == nullptr) return nullptr;
      current_ = reinterpret_cast<uintptr_t>(base);
      slab = &slabs_[current_];
    }
    void* p = reinterpret_cast<uint8_t*>(current_) + slab->used;
    slab->used += bytes;
    ++slab->live;
    return p;
  }

  // False when `data` is not in a slab.
  bool Free(void* data) {
    const auto at = reinterpret_cast<uintptr_t>(data);
    absl::MutexLock lock(&mu_);
    auto it = slabs_.upper_bound(at);
    if (it == slabs_.begin()) return false;
    --it;
    if (at >= it->first + kSlabBytes) return false;
    if (--it->second.live == 0) {
      if (it->first == current_) current_ = 0;
      std::free(reinterpret_cast<void*>(it->first));
      slabs_.erase(it);
    }
    return true;
  }

 private:
  struct Slab {
    size_t used = 0;
    int64_t live = 0;
  };
  absl::Mutex mu_;
  std::map<uintptr_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);  // by base address
  uintptr_t current_ ABSL_GUARDED_BY(mu_) = 0;            // the slab being filled, or 0
};

SlabArena& Slabs() {
  static SlabArena* const arena = new SlabArena();  // never destroyed: blocks outlive statics
  return *arena;
}

class HostMemoryResource final : public MemoryResource {
 public:
  Device device() const override { return Device{}; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* data = AllocateHost(bytes);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory allocating ", bytes, " bytes"));
    }
    return data;
  }
  void Deallocate(void* data, size_t /*bytes*/) noexcept override { FreeHost(data); }
};

}  // namespace

void* AllocateHost(size_t bytes) {
  if (bytes >= 2 * kHugePage) return AllocateHugePages(bytes);
  if (bytes >= kSlabMinBlock) return Slabs().Allocate(bytes);
  const size_t size = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  return std::aligned_alloc(kAlignment, size);
}

void FreeHost(void* data) {
  if (data == nullptr || Slabs().Free(data)) return;
  std::free(data);
}

std::shared_ptr<MemoryResource> HostMemory() {
  static const std::shared_ptr<MemoryResource> resource = std::make_shared<HostMemoryResource>();
  return resource;
}

}  // namespace kiln::cpu
