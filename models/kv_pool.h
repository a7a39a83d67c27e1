// The paged KV pool of one model (docs/backends.md, "KV caches"): fixed-size blocks in the model's
// backend memory, allocated once at load, handed to sequences as they grow and taken back when
// they end, are cancelled or roll back past a block boundary. Full blocks can be cached by
// content (the prefix cache, as vLLM's automatic prefix caching): a block is identified by a
// hash of its tokens chained with the hash of the block before it, so equal hashes mean equal
// prefixes; cached blocks are shared read-only and evicted least recently used, only when no
// sequence holds them.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace kiln {

struct KvPoolOptions {
  int64_t block_size = 16;         // positions per block
  uint64_t bytes = 0;              // the pool's budget; 0 = a default (see KvPoolDefaultBytes) for:
  int64_t default_sequences = 16;  // sequences (the engine's max_running)
  int64_t default_context = 4096;  // of this many positions (capped by the model's context)
  // What the pool stores keys and values as: kF32, or kBF16 for half the memory (twice the
  // positions for a budget) and half the bytes an attention reads, at bf16's 8-bit mantissa.
  // Unset ("auto", as vLLM's): the model's compute dtype, bf16 or f32.
  std::optional<DType> dtype;
};

// The KV element type a configuration names: "" or "auto" (unset), "f32" or "bf16" (also
// spelled as ParseDTypeApiName takes them); InvalidArgument naming the value otherwise.
absl::StatusOr<std::optional<DType>> ParseKvCacheDType(absl::string_view name);

// A block's identity in the prefix cache: SHA-256 of the parent block's hash and the block's
// tokens, truncated to 128 bits.
struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;

  // The hash of a block holding `tokens` after a prefix whose last block hashed to `parent`
  // (BlockHash{} for the first block); nullopt if OpenSSL fails (out of memory), and the block
  // is then simply not cached.
  static std::optional<BlockHash> Of(const BlockHash& parent, std::span<const int32_t> tokens);
  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.high == b.high && a.low == b.low;
  }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& hash) {
    return H::combine(std::move(h), hash.high, hash.low);
  }
};

struct KvPoolStats {
  int64_t blocks = 0;
  int64_t used_blocks = 0;    // held by at least one sequence
  int64_t cached_blocks = 0;  // in the prefix cache (held or evictable)
  int64_t evictions = 0;      // cached blocks reused for new content, over the pool's life
};

class KvPool {
 public:
  // `layers` layer slots per block (the model's layers, then one per MTP head), `kv_dim` values
  // per key or value row. ResourceExhausted when the backend cannot hold the pool;
  // InvalidArgument when the budget holds no block.
  static absl::StatusOr<std::shared_ptr<KvPool>> Create(Backend& backend, int64_t layers,
                                                        int64_t kv_dim,
                                                        const KvPoolOptions& options);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t layers() const { return layers_; }
  DType dtype() const { return dtype_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t bytes() const { return storage_.size(); }
  // Where the ops find it (step metadata).
  KvPoolRef ref() const;
  KvPoolStats stats() const;
  // Blocks a sequence could take now: free ones and evictable cached ones.
  int64_t available_blocks() const;

  // Takes `count` blocks with no content (free ones first, then the least recently used
  // evictable cached ones, which leave the cache) and appends them to `out`, each held once; all
  // or nothing. False when fewer are available.
  bool Allocate(int64_t count, std::vector<int32_t>& out);
  // One more holder of `block`.
  void Retain(int32_t block);
  // One holder fewer; a block nobody holds becomes free, or, if cached, evictable.
  void Release(int32_t block);
  void Release(std::span<const int32_t> blocks);

  // The cached block with this hash, held once more for the caller; nullopt when none.
  std::optional<int32_t> AcquireCached(const BlockHash& hash);
  // `block` (held, full, no longer written) joins the prefix cache under `hash`. A block already
  // cached under the same hash keeps its place; this one stays uncached.
  void Cache(int32_t block, const BlockHash& hash);

 private:
  KvPool(DeviceBuffer storage, int64_t num_blocks, int64_t block_size, int64_t layers,
         int64_t kv_dim, DType dtype);

  struct Block {
    int32_t holders = 0;
    bool cached = false;
    BlockHash hash;
    std::list<int32_t>::iterator lru;  // in evictable_ while cached and held by nobody
  };

  const DeviceBuffer storage_;
  const int64_t num_blocks_;
  const int64_t block_size_;
  const int64_t layers_;
  const int64_t kv_dim_;
  const DType dtype_;
  const size_t block_bytes_;

  mutable absl::Mutex mutex_;
  std::vector<Block> blocks_ ABSL_GUARDED_BY(mutex_);
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mutex_);     // uncached, held by nobody
  std::list<int32_t> evictable_ ABSL_GUARDED_BY(mutex_);  // cached, held by nobody; LRU first
  absl::flat_hash_map<BlockHash, int32_t> cache_ ABSL_GUARDED_BY(mutex_);
  int64_t used_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mutex_) = 0;
};

// The default budget: what `sequences` sequences of `context` positions of `dtype` would need,
// but at most a quarter of the memory the backend reports available.
uint64_t KvPoolDefaultBytes(const Backend& backend, int64_t layers, int64_t kv_dim,
                            int64_t sequences, int64_t context, DType dtype);

}  // namespace kiln
