#include "models/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln {

KvCache::Table::~Table() { pool->Release(blocks); }

void KvCache::Table::Fit() {
  const int64_t needed = needs.empty() ? 0 : *std::max_element(needs.begin(), needs.end());
  const size_t keep = static_cast<size_t>((needed + pool->block_size() - 1) / pool->block_size());
  if (keep >= blocks.size()) return;
  pool->Release(std::span<const int32_t>(blocks).subspan(keep));
  blocks.resize(keep);
}

KvCache::KvCache(std::shared_ptr<KvPool> pool, int64_t layers, int64_t capacity)
    : table_(std::make_shared<Table>()), layers_(layers), capacity_(capacity) {
  table_->pool = std::move(pool);
  table_->needs.push_back(0);
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::move(other.table_);
    slot_ = other.slot_;
    layers_ = other.layers_;
    capacity_ = other.capacity_;
    length_ = other.length_;
  }
  return *this;
}

KvCache::~KvCache() {
  if (table_ == nullptr) return;
  need() = 0;
  table_->Fit();  // the last sharer's Table destructor gives back the rest
}

KvCache KvCache::Share(int64_t layers, int64_t capacity) const {
  table_->needs.push_back(0);
  return KvCache(table_, table_->needs.size() - 1, layers, capacity);
}

std::span<const int32_t> KvCache::blocks() const {
  if (table_ == nullptr) return {};
  return table_->blocks;
}

size_t KvCache::bytes() const {
  return table_ == nullptr ? 0 : table_->blocks.size() * table_->pool->block_bytes();
}

int64_t KvCache::BlocksNeeded(int64_t n) const {
  const int64_t blocks = (n + table_->pool->block_size() - 1) / table_->pool->block_size();
  return std::max<int64_t>(0, blocks - static_cast<int64_t>(table_->blocks.size()));
}

absl::Status KvCache::Reserve(int64_t n) {
  if (n > capacity_) {
    return absl::OutOfRangeError(
        absl::StrCat("sequence of ", n, " tokens exceeds its KV cache capacity of ", capacity_));
  }
  const int64_t missing = BlocksNeeded(n);
  if (missing > 0 && !table_->pool->Allocate(missing, table_->blocks)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the KV pool has ", table_->pool->available_blocks(), " free blocks; ",
                     missing, " more are needed for a sequence of ", n, " positions (",
                     table_->pool->block_size(), " per block)"));
  }
  need() = std::max(need(), n);
  return absl::OkStatus();
}

void KvCache::set_length(int64_t n) {
  length_ = n;
  need() = std::max(need(), n);
}

void KvCache::Truncate(int64_t n) {
  if (n >= length_) return;
  length_ = n;
  need() = n;
  table_->Fit();
}

void KvCache::Release() {
  if (table_ == nullptr) return;
  length_ = 0;
  need() = 0;
  table_->Fit();
}

void KvCache::AdoptPrefix(std::span<const int32_t> blocks) {
  table_->blocks.insert(table_->blocks.begin(), blocks.begin(), blocks.end());
  set_length(static_cast<int64_t>(blocks.size()) * table_->pool->block_size());
}

}  // namespace kiln
