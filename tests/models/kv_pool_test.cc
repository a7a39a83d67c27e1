// The paged KV pool: block allocation, holders, the prefix cache's hash chain and eviction, the
// block tables of KvCache, and a model's output with any block size.
#include "models/kv_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

#include "clients/synth.h"
#include "loaders/load_model.h"
#include "models/kv_cache.h"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"

namespace kiln {
namespace {

using testing_util::CpuBackend;
using testing_util::ScratchDir;

// A pool of `blocks` blocks of `block_size` positions, one layer of kv_dim 4.
std::shared_ptr<KvPool> Pool(int64_t blocks, int64_t block_size = 4) {
  const uint64_t block_bytes = static_cast<uint64_t>(block_size) * 2 * 4 * sizeof(float);
  absl::StatusOr<std::shared_ptr<KvPool>> pool =
      KvPool::Create(*CpuBackend(), 1, 4, {block_size, blocks * block_bytes});
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *pool;
}

TEST(KvPoolTest, AllocatesAllOrNothingAndTakesBlocksBack) {
  std::shared_ptr<KvPool> pool = Pool(8);
  EXPECT_EQ(pool->num_blocks(), 8);
  EXPECT_EQ(pool->bytes(), 8 * pool->block_bytes());
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool->Allocate(5, a));
  EXPECT_FALSE(pool->Allocate(4, b)) << "only 3 are left";
  EXPECT_TRUE(b.empty());
  ASSERT_TRUE(pool->Allocate(3, b));
  std::set<int32_t> distinct(a.begin(), a.end());
  distinct.insert(b.begin(), b.end());
  EXPECT_EQ(distinct.size(), 8u);
  EXPECT_EQ(pool->available_blocks(), 0);
  EXPECT_EQ(pool->stats().used_blocks, 8);
  pool->Release(a);
  EXPECT_EQ(pool->available_blocks(), 5);
  EXPECT_EQ(pool->stats().used_blocks, 3);
}

TEST(KvPoolTest, ABlockIsFreeOnlyWhenItsLastHolderLetsGo) {
  std::shared_ptr<KvPool> pool = Pool(2);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(1, blocks));
  pool->Retain(blocks[0]);
  pool->Release(blocks[0]);
  EXPECT_EQ(pool->available_blocks(), 1) << "one holder is left";
  pool->Release(blocks[0]);
  EXPECT_EQ(pool->available_blocks(), 2);
}

TEST(KvPoolTest, HashesChainThePrefix) {
  const std::vector<int32_t> x = {1, 2, 3, 4};
  const std::vector<int32_t> y = {5, 6, 7, 8};
  const BlockHash hx = *BlockHash::Of({}, x);
  EXPECT_EQ(*BlockHash::Of({}, x), hx) << "deterministic";
  EXPECT_FALSE(*BlockHash::Of({}, y) == hx);
  // The same tokens after different prefixes are different blocks.
  EXPECT_FALSE(*BlockHash::Of(hx, y) == *BlockHash::Of(*BlockHash::Of({}, y), y));
  EXPECT_FALSE(*BlockHash::Of(hx, y) == *BlockHash::Of({}, y));
  // Token order matters.
  EXPECT_FALSE(*BlockHash::Of({}, std::vector<int32_t>{2, 1, 3, 4}) == hx);
}

TEST(KvPoolTest, CachedBlocksAreSharedAndEvictedLeastRecentlyUsedFirst) {
  std::shared_ptr<KvPool> pool = Pool(3);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(3, blocks));
  const BlockHash h0 = *BlockHash::Of({}, std::vector<int32_t>{0});
  const BlockHash h1 = *BlockHash::Of({}, std::vector<int32_t>{1});
  pool->Cache(blocks[0], h0);
  pool->Cache(blocks[1], h1);
  EXPECT_EQ(pool->stats().cached_blocks, 2);
  // A second sequence shares a cached block while the first still holds it.
  std::optional<int32_t> shared = pool->AcquireCached(h0);
  ASSERT_TRUE(shared.has_value());
  EXPECT_EQ(*shared, blocks[0]);
  pool->Release(*shared);
  EXPECT_FALSE(pool->AcquireCached(*BlockHash::Of({}, std::vector<int32_t>{9})).has_value());

  // Released: cached blocks stay (evictable), block 1 first, then 0; the uncached one is free.
  pool->Release(blocks[1]);
  pool->Release(blocks[0]);
  pool->Release(blocks[2]);
  EXPECT_EQ(pool->available_blocks(), 3);
  EXPECT_EQ(pool->stats().used_blocks, 0);
  EXPECT_EQ(pool->stats().cached_blocks, 2);
  // Free blocks go before cached ones; then the least recently used cached one.
  std::vector<int32_t> fresh;
  ASSERT_TRUE(pool->Allocate(1, fresh));
  EXPECT_EQ(fresh.back(), blocks[2]);
  ASSERT_TRUE(pool->Allocate(1, fresh));
  EXPECT_EQ(fresh.back(), blocks[1]) << "released first, so least recently used";
  EXPECT_FALSE(pool->AcquireCached(h1).has_value()) << "evicted";
  EXPECT_EQ(pool->stats().evictions, 1);
  // A hit makes a block recently used again: h0 survives while it is held.
  std::optional<int32_t> hit = pool->AcquireCached(h0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_FALSE(pool->Allocate(1, fresh)) << "the cached block is held, so nothing is evictable";
  pool->Release(*hit);
  ASSERT_TRUE(pool->Allocate(1, fresh));
  EXPECT_EQ(fresh.back(), blocks[0]);
  EXPECT_EQ(pool->stats().cached_blocks, 0);
}

TEST(KvPoolTest, TheFirstBlockCachedUnderAHashKeepsIt) {
  std::shared_ptr<KvPool> pool = Pool(2);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(pool->Allocate(2, blocks));
  const BlockHash h = *BlockHash::Of({}, std::vector<int32_t>{7});
  pool->Cache(blocks[0], h);
  pool->Cache(blocks[1], h);  // the same content, computed twice
  EXPECT_EQ(pool->stats().cached_blocks, 1);
  std::optional<int32_t> hit = pool->AcquireCached(h);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, blocks[0]);
}

TEST(KvPoolTest, ABudgetWithoutRoomForABlockIsRefused) {
  absl::StatusOr<std::shared_ptr<KvPool>> pool = KvPool::Create(*CpuBackend(), 2, 8, {16, 100});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvPool::Create(*CpuBackend(), 2, 8, {0, 1 << 20}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// bf16 elements: half the bytes a block, so twice the blocks in a budget; f16 is not a pool type.
TEST(KvPoolTest, ABf16PoolHoldsTwiceTheBlocksOfABudget) {
  KvPoolOptions options{16, 1 << 20};
  absl::StatusOr<std::shared_ptr<KvPool>> f32 = KvPool::Create(*CpuBackend(), 2, 8, options);
  options.dtype = DType::kBF16;
  absl::StatusOr<std::shared_ptr<KvPool>> bf16 = KvPool::Create(*CpuBackend(), 2, 8, options);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ((*f32)->block_bytes(), 2u * 2 * 16 * 8 * sizeof(float));
  EXPECT_EQ((*bf16)->block_bytes(), (*f32)->block_bytes() / 2);
  EXPECT_EQ((*bf16)->num_blocks(), 2 * (*f32)->num_blocks());
  EXPECT_EQ((*bf16)->dtype(), DType::kBF16);
  EXPECT_EQ((*bf16)->ref().dtype, DType::kBF16);
  EXPECT_EQ((*f32)->ref().dtype, DType::kF32);
  options.dtype = DType::kF16;
  const absl::Status f16 = KvPool::Create(*CpuBackend(), 2, 8, options).status();
  EXPECT_EQ(f16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f16.message().find("F16"), absl::string_view::npos) << f16.message();
}

TEST(KvPoolTest, KvCacheDTypeNames) {
  EXPECT_EQ(ParseKvCacheDType("").value(), std::nullopt);
  EXPECT_EQ(ParseKvCacheDType("auto").value(), std::nullopt);
  EXPECT_EQ(ParseKvCacheDType("f32").value(), DType::kF32);
  EXPECT_EQ(ParseKvCacheDType("bf16").value(), DType::kBF16);
  EXPECT_EQ(ParseKvCacheDType("bfloat16").value(), DType::kBF16);
  for (const char* bad : {"f16", "int8", "fp8"}) {
    const absl::Status status = ParseKvCacheDType(bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find(bad), absl::string_view::npos) << status.message();
  }
}

TEST(KvCacheTest, BlocksFollowTheLengthAndComeBackOnRollback) {
  std::shared_ptr<KvPool> pool = Pool(8, 4);
  {
    KvCache cache(pool, 1, 20);
    EXPECT_TRUE(cache.blocks().empty());
    EXPECT_EQ(cache.BlocksNeeded(9), 3);
    ASSERT_TRUE(cache.Reserve(9).ok());
    EXPECT_EQ(cache.blocks().size(), 3u);
    cache.set_length(9);
    ASSERT_TRUE(cache.Reserve(12).ok());
    EXPECT_EQ(cache.blocks().size(), 3u) << "12 positions still fit in 3 blocks";
    cache.set_length(12);
    cache.Truncate(8);  // a rejected draft: back past a block boundary
    EXPECT_EQ(cache.blocks().size(), 2u);
    EXPECT_EQ(pool->available_blocks(), 6);
    EXPECT_EQ(cache.Reserve(21).code(), absl::StatusCode::kOutOfRange) << "past the capacity";
    cache.Release();
    EXPECT_EQ(cache.length(), 0);
    EXPECT_EQ(pool->available_blocks(), 8);
    ASSERT_TRUE(cache.Reserve(4).ok());
  }
  EXPECT_EQ(pool->available_blocks(), 8) << "a destroyed cache gives its blocks back";
}

TEST(KvCacheTest, AFullPoolIsResourceExhaustedAndTakesNothing) {
  std::shared_ptr<KvPool> pool = Pool(3, 4);
  KvCache a(pool, 1, 100), b(pool, 1, 100);
  ASSERT_TRUE(a.Reserve(8).ok());
  absl::Status full = b.Reserve(8);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("free blocks"), std::string::npos) << full;
  EXPECT_TRUE(b.blocks().empty());
  EXPECT_EQ(pool->available_blocks(), 1);
}

TEST(KvCacheTest, ASharerUsesTheSameBlocksAndKeepsWhatItNeeds) {
  std::shared_ptr<KvPool> pool = Pool(8, 4);
  KvCache target(pool, 2, 40);
  ASSERT_TRUE(target.Reserve(8).ok());
  target.set_length(8);
  {
    KvCache head = target.Share(1, 40);
    ASSERT_TRUE(head.Reserve(10).ok());  // drafts run ahead of the target
    head.set_length(10);
    EXPECT_EQ(target.blocks().size(), 3u);
    EXPECT_TRUE(std::equal(head.blocks().begin(), head.blocks().end(), target.blocks().begin()));
    target.Truncate(4);
    EXPECT_EQ(target.blocks().size(), 3u) << "the head still needs 10 positions";
    head.Truncate(3);
  }
  EXPECT_EQ(target.blocks().size(), 1u);
  EXPECT_EQ(pool->available_blocks(), 7);
}

TEST(KvCacheTest, AnAdoptedPrefixIsFilledAndReleasedWithTheCache) {
  std::shared_ptr<KvPool> pool = Pool(4, 4);
  std::vector<int32_t> prefix;
  ASSERT_TRUE(pool->Allocate(2, prefix));
  {
    KvCache cache(pool, 1, 16);
    cache.AdoptPrefix(prefix);
    EXPECT_EQ(cache.length(), 8);
    ASSERT_TRUE(cache.Reserve(9).ok());
    EXPECT_EQ(cache.blocks().size(), 3u);
    EXPECT_EQ(cache.blocks()[0], prefix[0]);
  }
  EXPECT_EQ(pool->available_blocks(), 4);
}

// The same greedy tokens and bit-identical logits whatever the block size: attention reads the
// same keys and values in the same order through any block table.
TEST(KvPoolModelTest, GreedyOutputIsTheSameWithBlocksOf1_16And64) {
  ScratchDir dir;
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok());
  config->num_hidden_layers = 2;
  ASSERT_TRUE(WriteSynthCheckpoint(dir.path(), *config, {}).ok());
  std::vector<std::vector<float>> runs;
  for (int64_t block_size : {1, 16, 64}) {
    LoadOptions options;
    options.kv_pool.block_size = block_size;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        LoadModel(dir.path(), CpuBackend(), options);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->kv_pool().block_size(), block_size);
    absl::StatusOr<KvCache> a = (*model)->NewCache(100), b = (*model)->NewCache(100);
    ASSERT_TRUE(a.ok() && b.ok());
    // Two sequences interleaved, so their blocks alternate in the pool.
    std::vector<float> all, logits;
    std::vector<int32_t> pa = {5,  17, 300, 2,  9,  44, 3,  3,  1,  70,
                               71, 72, 11,  12, 13, 14, 15, 16, 99, 98},
                         pb = {400, 1, 2};
    SequenceChunk chunks[] = {{&*a, pa, false}, {&*b, pb, false}};
    ASSERT_TRUE((*model)->Forward(chunks, &logits).ok());
    for (int step = 0; step < 40; ++step) {
      all.insert(all.end(), logits.begin(), logits.end());
      const int64_t vocab = config->vocab_size;
      int32_t next[2];
      for (int s = 0; s < 2; ++s) {
        next[s] = static_cast<int32_t>(
            std::max_element(logits.begin() + s * vocab, logits.begin() + (s + 1) * vocab) -
            (logits.begin() + s * vocab));
      }
      logits.clear();
      SequenceChunk decode[] = {{&*a, {&next[0], 1}, false}, {&*b, {&next[1], 1}, false}};
      ASSERT_TRUE((*model)->Forward(decode, &logits).ok());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

// A bf16 pool rounds every key and value to 8 mantissa bits: the logits of a prefill and of 40
// decode steps (both models fed the same tokens) stay within 1 % of the logits' range of the f32
// pool's, and the greedy token is the same at nearly every step.
TEST(KvPoolModelTest, ABf16PoolFollowsTheF32Pool) {
  ScratchDir dir;
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok());
  config->num_hidden_layers = 2;
  ASSERT_TRUE(WriteSynthCheckpoint(dir.path(), *config, {}).ok());
  std::unique_ptr<PreparedModel> models[2];
  for (int i = 0; i < 2; ++i) {
    LoadOptions options;
    options.kv_pool.dtype = i == 0 ? DType::kF32 : DType::kBF16;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        LoadModel(dir.path(), CpuBackend(), options);
    ASSERT_TRUE(model.ok()) << model.status();
    models[i] = std::move(*model);
  }
  EXPECT_EQ(models[1]->kv_pool().dtype(), DType::kBF16);
  {  // Unset ("auto"): this bf16 checkpoint's model keeps a bf16 cache.
    absl::StatusOr<std::unique_ptr<PreparedModel>> automatic =
        LoadModel(dir.path(), CpuBackend(), LoadOptions());
    ASSERT_TRUE(automatic.ok()) << automatic.status();
    EXPECT_EQ((*automatic)->compute_dtype(), DType::kBF16);
    EXPECT_EQ((*automatic)->kv_pool().dtype(), DType::kBF16);
  }
  absl::StatusOr<KvCache> caches[2] = {models[0]->NewCache(100), models[1]->NewCache(100)};
  ASSERT_TRUE(caches[0].ok() && caches[1].ok());
  std::vector<int32_t> tokens = {5, 17, 300, 2, 9, 44, 3, 3, 1, 70, 71, 72, 11, 12, 13, 14};
  const int64_t vocab = config->vocab_size;
  double worst = 0.0;
  int same_argmax = 0, steps = 0;
  for (int step = 0; step <= 40; ++step) {
    std::vector<float> logits[2];
    for (int i = 0; i < 2; ++i) {
      SequenceChunk chunk{&*caches[i], tokens, false};
      ASSERT_TRUE(models[i]->Forward({&chunk, 1}, &logits[i]).ok());
      ASSERT_EQ(static_cast<int64_t>(logits[i].size()), vocab);
    }
    const auto [low, high] = std::minmax_element(logits[0].begin(), logits[0].end());
    double error = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      error = std::max(error, std::abs(static_cast<double>(logits[1][v]) - logits[0][v]));
    }
    worst = std::max(worst, error / (*high - *low));
    const int32_t next = static_cast<int32_t>(high - logits[0].begin());
    same_argmax += next == std::max_element(logits[1].begin(), logits[1].end()) - logits[1].begin();
    ++steps;
    tokens = {next};
  }
  std::printf(
      "bf16 KV pool: largest logit error %.3g of the logits' range, same greedy token "
      "at %d of %d steps\n",
      worst, same_argmax, steps);
  EXPECT_LT(worst, 0.01);
  EXPECT_GE(same_argmax, steps - 2);
}

TEST(KvPoolModelTest, ForwardOnAFullPoolFailsCleanlyAndLeavesTheCacheAsItWas) {
  ScratchDir dir;
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok());
  config->num_hidden_layers = 2;
  ASSERT_TRUE(WriteSynthCheckpoint(dir.path(), *config, {}).ok());
  LoadOptions options;
  options.kv_pool = {4, 4 * 2 * 2 * config->kv_dim() * sizeof(float) * 3};  // 3 blocks of 4
  options.kv_pool.dtype = DType::kF32;
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      LoadModel(dir.path(), CpuBackend(), options);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->kv_pool().num_blocks(), 3);
  absl::StatusOr<KvCache> a = (*model)->NewCache(64), b = (*model)->NewCache(64);
  std::vector<float> logits;
  const std::vector<int32_t> ten(10, 7);
  SequenceChunk first{&*a, ten, false};
  ASSERT_TRUE((*model)->Forward({&first, 1}, &logits).ok());
  SequenceChunk second{&*b, ten, false};
  absl::Status full = (*model)->Forward({&second, 1}, &logits);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(b->length(), 0);
  // Once a frees its blocks, b runs.
  a->Release();
  ASSERT_TRUE((*model)->Forward({&second, 1}, &logits).ok());
  EXPECT_EQ(b->length(), 10);
}

}  // namespace
}  // namespace kiln
