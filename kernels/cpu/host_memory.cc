#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/populate.h"

namespace kiln::cpu {
namespace {

constexpr size_t kAlignment = 256;  // kTensorAlignment; also a multiple of every vector width
constexpr size_t kHugePage = size_t{2} << 20;

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

// Large blocks are mapped for themselves rather than taken from malloc: glibc serves blocks below
// its (moving) mmap threshold from its heap, whose pages a freed block touched at 4 KiB stay 4 KiB
// when reused, madvise or not (120 MB of a 0.5B model's 1.1 GB of packed weights were, measured
// in /proc/PID/smaps). Fresh anonymous pages, advised before first touch, come as 2 MiB pages.
// The sizes of live mappings, for FreeHost; blocks are few and large, so a locked map is cheap.
ABSL_CONST_INIT absl::Mutex mappings_mutex(absl::kConstInit);
absl::flat_hash_map<void*, size_t>& Mappings() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mappings_mutex) {
  static auto* mappings = new absl::flat_hash_map<void*, size_t>();
  return *mappings;
}

// `size` bytes (a multiple of kHugePage) at a kHugePage-aligned address, or null.
void* MapHugePageAligned(size_t size) {
  const size_t length = size + kHugePage;  // room to slide to an aligned start
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(base);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(base, aligned - start);
  const uintptr_t end = aligned + size;
  if (start + length > end) ::munmap(reinterpret_cast<void*>(end), start + length - end);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, size, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return p;
}

}  // namespace

void* AllocateHost(size_t bytes) {
  if (bytes >= 2 * kHugePage) {
    const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = MapHugePageAligned(size);
    if (p == nullptr) return nullptr;
    absl::MutexLock lock(&mappings_mutex);
    Mappings().emplace(p, size);
    return p;
  }
  const size_t size = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  return std::aligned_alloc(kAlignment, size);
}

void FreeHost(void* data) {
  if (data == nullptr) return;
  size_t mapped = 0;
  {
    absl::MutexLock lock(&mappings_mutex);
    auto it = Mappings().find(data);
    if (it != Mappings().end()) {
      mapped = it->second;
      Mappings().erase(it);
    }
  }
  if (mapped > 0) {
    ::munmap(data, mapped);
  } else {
    std::free(data);
  }
}

HostBytes CopyToHost(const std::byte* data, size_t bytes, int threads) {
  HostBytes copy(static_cast<std::byte*>(AllocateHost(std::max<size_t>(bytes, 1))));
  if (copy == nullptr) return copy;
  PopulateForRead(data, bytes);  // the source is usually a mapped file
  // Chunks of whole huge pages, so that each thread first-touches its own pages.
  const int64_t chunks = static_cast<int64_t>((bytes + kHugePage - 1) / kHugePage);
#pragma omp parallel for schedule(static) num_threads(std::max(threads, 1))
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t at = static_cast<size_t>(c) * kHugePage;
    std::memcpy(copy.get() + at, data + at, std::min(kHugePage, bytes - at));
  }
  return copy;
}

bool UsableWhereTheyLie(const PackedImage& image) {
  if (image.backing == nullptr || !image.in_huge_pages) return false;
  for (const PackedImage::Part& part : image.parts) {
    if (reinterpret_cast<uintptr_t>(part.data) % 64 != 0) return false;
  }
  return true;
}

WeightBytes AdoptPart(const PackedImage& image, const PackedImage::Part& part, int threads) {
  if (UsableWhereTheyLie(image)) return WeightBytes(part.data, image.backing);
  HostBytes copy = CopyToHost(part.data, part.bytes, threads);
  if (copy == nullptr) throw std::bad_alloc();
  return WeightBytes(std::move(copy));
}

std::shared_ptr<MemoryResource> HostMemory() {
  static const std::shared_ptr<MemoryResource> resource = std::make_shared<HostMemoryResource>();
  return resource;
}

}  // namespace kiln::cpu
