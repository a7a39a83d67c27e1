#include "models/kv_pool.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "kernels/step.h"

namespace kiln {

std::optional<BlockHash> BlockHash::Of(const BlockHash& parent, std::span<const int32_t> tokens) {
  // One buffer, one call: a block is 16 bytes of parent hash and a few hundred of tokens.
  thread_local std::vector<unsigned char> message;
  message.resize(sizeof(parent) + tokens.size_bytes());
  std::memcpy(message.data(), &parent.high, sizeof(parent.high));
  std::memcpy(message.data() + sizeof(parent.high), &parent.low, sizeof(parent.low));
  std::memcpy(message.data() + sizeof(parent), tokens.data(), tokens.size_bytes());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(message.data(), message.size(), digest, &length, EVP_sha256(), nullptr) != 1 ||
      length < 2 * sizeof(uint64_t)) {
    return std::nullopt;  // only without memory: the block is then not cached
  }
  BlockHash hash;
  std::memcpy(&hash.high, digest, sizeof(hash.high));
  std::memcpy(&hash.low, digest + sizeof(hash.high), sizeof(hash.low));
  return hash;
}

absl::StatusOr<std::shared_ptr<KvPool>> KvPool::Create(Backend& backend, int64_t layers,
                                                       int64_t kv_dim,
                                                       const KvPoolOptions& options) {
  if (options.block_size < 1 || options.block_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block size must be in [1, 4096], got ", options.block_size));
  }
  if (layers < 1 || kv_dim < 1) return absl::InvalidArgumentError("a KV pool needs layers");
  const DType dtype = options.dtype.value_or(DType::kF32);
  if (!KvPoolHolds(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV pool holds f32 or bf16, not ", DTypeName(dtype)));
  }
  const size_t block_bytes = static_cast<size_t>(layers) * 2 *
                             static_cast<size_t>(options.block_size) * static_cast<size_t>(kv_dim) *
                             DTypeSize(dtype);
  const uint64_t num_blocks = options.bytes / block_bytes;
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a KV pool of ", options.bytes,
                                                   " bytes holds no block of ", block_bytes,
                                                   " bytes (", options.block_size, " positions)"));
  }
  if (num_blocks > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError("a KV pool of more than 2^30 blocks");
  }
  absl::StatusOr<DeviceBuffer> storage = backend.Allocate(num_blocks * block_bytes);
  if (!storage.ok()) {
    return KilnAnnotate(storage.status(),
                        absl::StrCat("KV pool of ", num_blocks * block_bytes, " bytes"));
  }
  return std::shared_ptr<KvPool>(new KvPool(std::move(*storage), static_cast<int64_t>(num_blocks),
                                            options.block_size, layers, kv_dim, dtype));
}

KvPool::KvPool(DeviceBuffer storage, int64_t num_blocks, int64_t block_size, int64_t layers,
               int64_t kv_dim, DType dtype)
    : storage_(std::move(storage)),
      num_blocks_(num_blocks),
      block_size_(block_size),
      layers_(layers),
      kv_dim_(kv_dim),
      dtype_(dtype),
      block_bytes_(storage_.size() / static_cast<size_t>(num_blocks)),
      blocks_(static_cast<size_t>(num_blocks)) {
  // Lowest ids first, so that a lightly used pool touches little of its memory.
  free_.reserve(static_cast<size_t>(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

KvPoolRef KvPool::ref() const {
  return KvPoolRef{storage_.data(), storage_.device(), num_blocks_, block_size_,
                   layers_,         kv_dim_,           dtype_};
}

KvPoolStats KvPool::stats() const {
  absl::MutexLock lock(&mutex_);
  return KvPoolStats{num_blocks_, used_, static_cast<int64_t>(cache_.size()), evictions_};
}

int64_t KvPool::available_blocks() const {
  absl::MutexLock lock(&mutex_);
  return static_cast<int64_t>(free_.size() + evictable_.size());
}

bool KvPool::Allocate(int64_t count, std::vector<int32_t>& out) {
  absl::MutexLock lock(&mutex_);
  if (count > static_cast<int64_t>(free_.size() + evictable_.size())) return false;
  for (int64_t i = 0; i < count; ++i) {
    int32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = evictable_.front();  // the least recently used cached block gives up its content
      evictable_.pop_front();
      Block& evicted = blocks_[static_cast<size_t>(id)];
      cache_.erase(evicted.hash);
      evicted.cached = false;
      ++evictions_;
    }
    blocks_[static_cast<size_t>(id)].holders = 1;
    ++used_;
    out.push_back(id);
  }
  return true;
}

void KvPool::Retain(int32_t id) {
  absl::MutexLock lock(&mutex_);
  Block& block = blocks_[static_cast<size_t>(id)];
  if (block.holders++ == 0) {
    ++used_;
    if (block.cached) evictable_.erase(block.lru);
  }
}

void KvPool::Release(int32_t id) { Release(std::span<const int32_t>(&id, 1)); }

void KvPool::Release(std::span<const int32_t> ids) {
  absl::MutexLock lock(&mutex_);
  // Last block first, as vLLM does: a sequence's tail blocks (the least shared) are evicted
  // before its head, and the free stack hands the blocks out again in their old order.
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    const int32_t id = *it;
    Block& block = blocks_[static_cast<size_t>(id)];
    if (block.holders <= 0) {
      LOG(DFATAL) << "KV block " << id << " released more often than it was held";
      continue;
    }
    if (--block.holders > 0) continue;
    --used_;
    if (block.cached) {
      block.lru = evictable_.insert(evictable_.end(), id);  // most recently used last
    } else {
      free_.push_back(id);
    }
  }
}

std::optional<int32_t> KvPool::AcquireCached(const BlockHash& hash) {
  absl::MutexLock lock(&mutex_);
  auto it = cache_.find(hash);
  if (it == cache_.end()) return std::nullopt;
  Block& block = blocks_[static_cast<size_t>(it->second)];
  if (block.holders++ == 0) {
    ++used_;
    evictable_.erase(block.lru);
  }
  return it->second;
}

void KvPool::Cache(int32_t id, const BlockHash& hash) {
  absl::MutexLock lock(&mutex_);
  Block& block = blocks_[static_cast<size_t>(id)];
  if (block.cached || block.holders <= 0) return;
  if (!cache_.emplace(hash, id).second) return;  // the same content is cached already
  block.cached = true;
  block.hash = hash;
}

absl::StatusOr<std::optional<DType>> ParseKvCacheDType(absl::string_view name) {
  if (name.empty() || name == "auto") return std::nullopt;
  absl::StatusOr<DType> dtype = ParseDTypeApiName(name);
  if (!dtype.ok() || !KvPoolHolds(*dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_dtype must be \"auto\", \"f32\" or \"bf16\", got \"", name, "\""));
  }
  return *dtype;
}

uint64_t KvPoolDefaultBytes(const Backend& backend, int64_t layers, int64_t kv_dim,
                            int64_t sequences, int64_t context, DType dtype) {
  const uint64_t wanted = static_cast<uint64_t>(std::max<int64_t>(1, sequences)) *
                          static_cast<uint64_t>(std::max<int64_t>(1, context)) *
                          static_cast<uint64_t>(layers) * 2 * static_cast<uint64_t>(kv_dim) *
                          DTypeSize(dtype);
  const uint64_t available = backend.available_memory();
  return available == 0 ? wanted : std::min(wanted, available / 4);
}

}  // namespace kiln
