// oneDNN plumbing shared by the CPU backend's dense linears (onednn_linear.cc): matmul primitives
// created once per (K, N, M, dtype, bias) and cached for every layer, per-thread streams and
// scratch buffers, and the conversion of weights and activations into the compute dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/cpu/host_memory.h"

namespace kiln::cpu::onednn {

// Throws std::bad_alloc (packing and forward turn it into ResourceExhausted).
HostBytes AllocAligned(size_t bytes);

// A per-thread buffer that only grows.
class GrowBuffer {
 public:
  std::byte* Get(size_t bytes);

 private:
  HostBytes data_;
  size_t capacity_ = 0;
};

// Per-thread state: a oneDNN scratchpad must not be shared by threads running at once, and the
// bf16 copy of the activations is per call. The stream is kept per thread for its engine.
struct ThreadState {
  GrowBuffer scratchpad;
  GrowBuffer src_bf16;
  dnnl::engine engine;  // declared before stream: the stream is destroyed first
  dnnl::stream stream;
};
ThreadState& ThisThreadState();
dnnl::stream& ThreadStream(const dnnl::engine& engine);

// Same rounding as F32ToBF16 (nearest even, NaN stays NaN), branch-free so it vectorizes.
// `src` may be unaligned.
void F32BytesToBF16(const std::byte* src, int64_t n, uint16_t* dst);
// Writes `block` (rows × cols values) as compute-dtype values at `dst`.
void ConvertBlock(const WeightView& block, DType compute, std::byte* dst);
dnnl::memory::data_type ToDnnl(DType dtype);

struct PrimKey {
  int64_t k = 0;
  int64_t n = 0;
  int64_t m = 0;
  DType dtype = DType::kF32;
  bool bias = false;

  friend bool operator==(const PrimKey& a, const PrimKey& b) {
    return a.k == b.k && a.n == b.n && a.m == b.m && a.dtype == b.dtype && a.bias == b.bias;
  }
  template <typename H>
  friend H AbslHashValue(H h, const PrimKey& key) {
    return H::combine(std::move(h), key.k, key.n, key.m, key.dtype, key.bias);
  }
};

struct PrimEntry {
  int64_t m = 0;
  dnnl::matmul primitive;
  dnnl::memory::desc src_md;
  dnnl::memory::desc dst_md;
  dnnl::memory::desc weights_md;  // the layout this primitive wants
  dnnl::memory::desc scratch_md;
  size_t scratch_bytes = 0;
  std::string impl;
};

// Matmul primitives of one engine, shared by all layers of a backend. Thread-safe.
class PrimitiveCache {
 public:
  explicit PrimitiveCache(dnnl::engine engine) : engine_(std::move(engine)) {}

  // Throws dnnl::error when oneDNN has no implementation.
  std::shared_ptr<const PrimEntry> Get(const PrimKey& key);

 private:
  std::shared_ptr<const PrimEntry> Create(const PrimKey& key) const;

  const dnnl::engine engine_;
  absl::Mutex mu_;
  absl::flat_hash_map<PrimKey, std::shared_ptr<const PrimEntry>> map_;
};

}  // namespace kiln::cpu::onednn
