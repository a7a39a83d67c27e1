// The key/value cache of one sequence: fp32, contiguous per layer.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "models/model_config.h"

namespace kiln {

class KvCache {
 public:
  static absl::StatusOr<KvCache> Create(const ModelConfig& config, int64_t capacity);
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  int64_t length() const { return length_; }      // positions filled
  int64_t capacity() const { return capacity_; }  // positions it can hold
  int64_t kv_dim() const { return kv_dim_; }
  size_t bytes() const;

  // Row of `position` in `layer` (kv_dim floats).
  float* keys(int64_t layer, int64_t position = 0) { return Row(layer, 0, position); }
  float* values(int64_t layer, int64_t position = 0) { return Row(layer, 1, position); }

  // Marks positions [0, n) as filled (the forward pass writes them first).
  void set_length(int64_t n) { length_ = n; }
  // Drops positions past n (rollback of rejected speculative positions, or reuse).
  void Truncate(int64_t n) {
    if (n < length_) length_ = n;
  }

 private:
  KvCache(int64_t layers, int64_t capacity, int64_t kv_dim);
  float* Row(int64_t layer, int which, int64_t position) {
    return storage_.get() + ((layer * 2 + which) * capacity_ + position) * kv_dim_;
  }

  int64_t layers_ = 0;
  int64_t capacity_ = 0;
  int64_t kv_dim_ = 0;
  int64_t length_ = 0;
  std::unique_ptr<float[]> storage_;
};

}  // namespace kiln
