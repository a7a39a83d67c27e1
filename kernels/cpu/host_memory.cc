#include "kernels/cpu/host_memory.h"

#include <sanitizer/asan_interface.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
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
// Blocks (and weights) of this size or more are mappings of their own; smaller ones are not worth
// a mapping rounded up to whole huge pages.
constexpr size_t kOwnMappingBytes = 2 * kHugePage;

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
  if (bytes >= kOwnMappingBytes) {
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

namespace {

// A mapping of 2 MiB pages that small weights are cut from, front to back; unmapped when the last
// piece (and the allocator's weak reference) lets go of it. Under AddressSanitizer all but the
// pieces' own bytes stay poisoned, so a kernel reading past its weight is still caught.
class WeightChunk {
 public:
  static std::shared_ptr<WeightChunk> Map(size_t size) {
    void* base = MapHugePageAligned(size);
    if (base == nullptr) return nullptr;
    ASAN_POISON_MEMORY_REGION(base, size);
    return std::shared_ptr<WeightChunk>(new WeightChunk(static_cast<std::byte*>(base), size));
  }
  ~WeightChunk() {
    ASAN_UNPOISON_MEMORY_REGION(base_, size_);  // the addresses may be mapped again
    ::munmap(base_, size_);
  }
  WeightChunk(const WeightChunk&) = delete;
  WeightChunk& operator=(const WeightChunk&) = delete;

  // `bytes` from the free end, which moves on by `size` (bytes rounded up to kAlignment), or null
  // when they do not fit.
  std::byte* Take(size_t bytes, size_t size) {
    if (size_ - used_ < size) return nullptr;
    std::byte* p = base_ + used_;
    used_ += size;
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    return p;
  }

 private:
  WeightChunk(std::byte* base, size_t size) : base_(base), size_(size) {}
  std::byte* const base_;
  const size_t size_;
  size_t used_ = 0;
};

constexpr size_t kWeightChunkBytes = size_t{32} << 20;

ABSL_CONST_INIT absl::Mutex weight_chunk_mutex(absl::kConstInit);
// The chunk new pieces come from; weak, so that a chunk whose weights are all gone is unmapped.
std::weak_ptr<WeightChunk>& CurrentWeightChunk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(weight_chunk_mutex) {
  static auto* current = new std::weak_ptr<WeightChunk>();
  return *current;
}

// Copies [data, data + bytes) to `to` on up to `threads` OpenMP threads, in runs of whole huge
// pages so that each thread first-touches its own pages.
void CopyInParallel(const std::byte* data, size_t bytes, std::byte* to, int threads) {
  PopulateForRead(data, bytes);  // the source is usually a mapped file
  const int64_t runs = static_cast<int64_t>((bytes + kHugePage - 1) / kHugePage);
#pragma omp parallel for schedule(static) num_threads(std::max(threads, 1))
  for (int64_t c = 0; c < runs; ++c) {
    const size_t at = static_cast<size_t>(c) * kHugePage;
    std::memcpy(to + at, data + at, std::min(kHugePage, bytes - at));
  }
}

}  // namespace

WeightBytes AllocateWeights(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes >= kOwnMappingBytes) {
    HostBytes own(static_cast<std::byte*>(AllocateHost(bytes)));
    if (own == nullptr) throw std::bad_alloc();
    return WeightBytes(std::move(own));
  }
  const size_t size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  absl::MutexLock lock(&weight_chunk_mutex);
  std::shared_ptr<WeightChunk> chunk = CurrentWeightChunk().lock();
  std::byte* piece = chunk != nullptr ? chunk->Take(bytes, size) : nullptr;
  if (piece == nullptr) {
    chunk = WeightChunk::Map(kWeightChunkBytes);
    if (chunk == nullptr) throw std::bad_alloc();
    CurrentWeightChunk() = chunk;
    piece = chunk->Take(bytes, size);
  }
  return WeightBytes::Piece(piece, std::move(chunk));
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
  WeightBytes copy = AllocateWeights(part.bytes);
  CopyInParallel(part.data, part.bytes, copy.mutable_data(), threads);
  return copy;
}

std::shared_ptr<MemoryResource> HostMemory() {
  static const std::shared_ptr<MemoryResource> resource = std::make_shared<HostMemoryResource>();
  return resource;
}

}  // namespace kiln::cpu
