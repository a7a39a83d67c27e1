// Host memory for the CPU backend: 64-byte aligned, and backed by 2 MiB pages when large.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "kernels/buffer.h"
#include "kernels/packed_image.h"

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

// A linear's packed weight bytes: memory of its own, or a packed image's bytes used where they lie
// and kept alive by the image's backing. Not copyable.
class WeightBytes {
 public:
  WeightBytes() = default;
  explicit WeightBytes(HostBytes owned)
      : data_(owned.get()), writable_(owned.get()), owned_(std::move(owned)) {}
  WeightBytes(const std::byte* data, std::shared_ptr<const void> backing)
      : data_(data), backing_(std::move(backing)) {}
  // A piece of a chunk that other linears' weights share (AllocateWeights), this object's to
  // write; the chunk lives while any of its pieces does.
  static WeightBytes Piece(std::byte* data, std::shared_ptr<const void> chunk) {
    WeightBytes piece(data, std::move(chunk));
    piece.writable_ = data;
    return piece;
  }

  const std::byte* data() const { return data_; }
  // Null for a packed image's bytes used where they lie.
  std::byte* mutable_data() { return writable_; }
  // Whether these are a packed image's bytes, used where they lie.
  bool in_place() const { return backing_ != nullptr && writable_ == nullptr; }

 private:
  const std::byte* data_ = nullptr;
  std::byte* writable_ = nullptr;
  HostBytes owned_;
  std::shared_ptr<const void> backing_;
};

// Memory for a linear's packed weights, which decode streams every step: in 2 MiB pages whatever
// its size. A weight of two such pages or more is a mapping of its own (AllocateHost); a smaller
// one is a piece of a 32 MiB chunk shared with the weights allocated after it, the chunk unmapped
// with its last piece. (From AllocateHost, a 0.5B int4 model's qkv, o and down projections came
// from malloc's 4 KiB heap pages and streamed at 0.45-0.6 of the read probe, the larger shapes at
// 0.8-1.0.) Throws std::bad_alloc.
WeightBytes AllocateWeights(size_t bytes);

// Whether a packed image's bytes can be used where they lie: kept alive by its backing, mapped in
// 2 MiB pages (streaming them from a mapped file's 4 KiB page-cache pages is markedly slower:
// docs/design.md, "Prepacked native files"), every part aligned for the kernels' 64-byte loads.
bool UsableWhereTheyLie(const PackedImage& image);

// `part` of `image` for a linear to keep: where it lies when UsableWhereTheyLie(image), else a
// copy (AllocateWeights) made on up to `threads` threads. Throws std::bad_alloc.
WeightBytes AdoptPart(const PackedImage& image, const PackedImage::Part& part, int threads);

// The MemoryResource behind the CPU backend's DeviceBuffers.
std::shared_ptr<MemoryResource> HostMemory();

}  // namespace kiln::cpu
