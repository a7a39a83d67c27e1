// The key/value cache of one sequence: fp32 in the model's backend memory, contiguous per layer
// (KvCacheRef's layout). Forward reads and writes it only through the backend's ops
// (RopeAndAppendKv, Attention); the host sees its length and capacity.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace kiln {

class KvCache {
 public:
  // `capacity` positions of `layers` layers of `kv_dim` keys and values, allocated on `backend`.
  static absl::StatusOr<KvCache> Create(Backend& backend, int64_t layers, int64_t kv_dim,
                                        int64_t capacity);
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  int64_t length() const { return length_; }      // positions filled
  int64_t capacity() const { return capacity_; }  // positions it can hold
  int64_t layers() const { return layers_; }
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const { return storage_.size(); }
  Device device() const { return storage_.device(); }
  // Where the ops find it (step metadata).
  KvCacheRef ref() const {
    return KvCacheRef{reinterpret_cast<float*>(storage_.data()), layers_, capacity_, kv_dim_};
  }

  // Marks positions [0, n) as filled (the forward pass writes them first).
  void set_length(int64_t n) { length_ = n; }
  // Drops positions past n (rollback of rejected speculative positions, or reuse).
  void Truncate(int64_t n) {
    if (n < length_) length_ = n;
  }

 private:
  KvCache(DeviceBuffer storage, int64_t layers, int64_t capacity, int64_t kv_dim)
      : storage_(std::move(storage)), layers_(layers), capacity_(capacity), kv_dim_(kv_dim) {}

  DeviceBuffer storage_;
  int64_t layers_ = 0;
  int64_t capacity_ = 0;
  int64_t kv_dim_ = 0;
  int64_t length_ = 0;
};

}  // namespace kiln
