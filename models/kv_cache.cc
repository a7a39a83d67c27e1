#include "models/kv_cache.h"

#include <new>

#include "absl/strings/str_cat.h"

namespace kiln {

KvCache::KvCache(int64_t layers, int64_t capacity, int64_t kv_dim)
    : layers_(layers), capacity_(capacity), kv_dim_(kv_dim) {}

absl::StatusOr<KvCache> KvCache::Create(const ModelConfig& config, int64_t capacity) {
  if (capacity <= 0) return absl::InvalidArgumentError("KV cache capacity must be positive");
  KvCache cache(config.num_hidden_layers, capacity, config.kv_dim());
  const size_t floats = static_cast<size_t>(config.num_hidden_layers) * 2 *
                        static_cast<size_t>(capacity) * static_cast<size_t>(config.kv_dim());
  cache.storage_.reset(new (std::nothrow) float[floats]);
  if (cache.storage_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a KV cache of ", floats * sizeof(float), " bytes"));
  }
  return cache;
}

size_t KvCache::bytes() const {
  return static_cast<size_t>(layers_) * 2 * static_cast<size_t>(capacity_) *
         static_cast<size_t>(kv_dim_) * sizeof(float);
}

}  // namespace kiln
