// The KV cache of one sequence: a block table into the model's KV pool (models/kv_pool.h) and a
// length. Blocks are taken as the sequence grows (Reserve) and given back when it rolls back past
// a block boundary (Truncate), is preempted (Release) or ends (destruction). Forward reads and
// writes the blocks only through the backend's ops (RopeAndAppendKv, Attention); the host sees
// lengths and block ids.
//
// An MTP head's cache can share its sequence's block table (Share), as vLLM keeps draft layers
// in the target's blocks: the head's keys and values sit in its own layer slot of the same
// blocks, at the same positions, so drafting costs no blocks of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "models/kv_pool.h"

namespace kiln {

class KvCache {
 public:
  // An empty cache of `layers` layers (the model's, or 1 for an MTP head) that may grow to
  // `capacity` positions.
  KvCache(std::shared_ptr<KvPool> pool, int64_t layers, int64_t capacity);
  KvCache(KvCache&& other) noexcept = default;
  KvCache& operator=(KvCache&& other) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache();

  // An empty cache of `layers` layers over this cache's block table.
  KvCache Share(int64_t layers, int64_t capacity) const;

  int64_t length() const { return length_; }      // positions filled
  int64_t capacity() const { return capacity_; }  // positions it may hold
  int64_t layers() const { return layers_; }
  const KvPool* pool() const { return table_ ? table_->pool.get() : nullptr; }
  // The block table (what the ops read); covers at least length() positions.
  std::span<const int32_t> blocks() const;
  // Bytes of the blocks its table holds (a shared table's bytes count for each sharer).
  size_t bytes() const;

  // Blocks that backing positions [0, n) would take from the pool beyond those held.
  int64_t BlocksNeeded(int64_t n) const;
  // Backs positions [0, n) with blocks (all or nothing): ResourceExhausted when the pool has too
  // few, OutOfRange past the capacity.
  absl::Status Reserve(int64_t n);
  // Marks positions [0, n) as filled (the forward pass wrote them first).
  void set_length(int64_t n);
  // Drops positions past n (rollback of rejected speculative positions, or reuse); blocks that
  // no sharer needs any more go back to the pool.
  void Truncate(int64_t n);
  // Gives every block back and empties the cache (preemption); sharers keep their own needs.
  void Release();
  // Starts an empty cache with `blocks` (each already held for this cache, e.g. from the prefix
  // cache) as its first blocks, their positions filled.
  void AdoptPrefix(std::span<const int32_t> blocks);

 private:
  struct Table {
    std::shared_ptr<KvPool> pool;
    std::vector<int32_t> blocks;
    std::vector<int64_t> needs;  // positions each sharer needs backed, by slot
    ~Table();
    // Gives back the blocks past what the neediest sharer needs.
    void Fit();
  };
  KvCache(std::shared_ptr<Table> table, size_t slot, int64_t layers, int64_t capacity)
      : table_(std::move(table)), slot_(slot), layers_(layers), capacity_(capacity) {}
  int64_t& need() { return table_->needs[slot_]; }

  std::shared_ptr<Table> table_;
  size_t slot_ = 0;
  int64_t layers_ = 0;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

}  // namespace kiln
