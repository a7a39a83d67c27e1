#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

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

}  // namespace

void* AllocateHost(size_t bytes) {
  if (bytes >= 2 * kHugePage) {
    const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, size);
    if (p != nullptr) ::madvise(p, size, MADV_HUGEPAGE);  // advisory: failure only costs speed
    return p;
  }
  const size_t size = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  return std::aligned_alloc(kAlignment, size);
}

void FreeHost(void* data) { std::free(data); }

std::shared_ptr<MemoryResource> HostMemory() {
  static const std::shared_ptr<MemoryResource> resource = std::make_shared<HostMemoryResource>();
  return resource;
}

}  // namespace kiln::cpu
