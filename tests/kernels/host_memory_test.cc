// The CPU backend's host allocator: alignment, no overlap between live blocks of every size class
// (small, huge-page runs), and freeing in any order.
#include "kernels/cpu/host_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kiln::cpu {
namespace {

struct Block {
  uint8_t* data;
  size_t bytes;
};

Block Allocate(size_t bytes, uint8_t fill) {
  auto* data = static_cast<uint8_t*>(AllocateHost(bytes));
  EXPECT_NE(data, nullptr) << bytes;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 256, 0u) << bytes;
  if (bytes >= (size_t{4} << 20)) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % (2 << 20), 0u) << bytes;
  }
  std::memset(data, fill, bytes);
  return {data, bytes};
}

TEST(HostMemoryTest, BlocksOfEverySizeAreAlignedDisjointAndKeepTheirBytes) {
  const std::vector<size_t> sizes = {1,         100,           4096,    (256 << 10) - 1,
                                     256 << 10, 300 << 10,     1 << 20, (2 << 20) + 7,
                                     3 << 20,   (4 << 20) - 1, 4 << 20, 9 << 20};
  std::vector<Block> blocks;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      blocks.push_back(Allocate(sizes[i], static_cast<uint8_t>(blocks.size() + 1)));
    }
  }
  std::vector<Block> sorted = blocks;
  std::sort(sorted.begin(), sorted.end(),
            [](const Block& a, const Block& b) { return a.data < b.data; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    EXPECT_GE(sorted[i].data, sorted[i - 1].data + sorted[i - 1].bytes) << "blocks overlap";
  }
  // Every block still holds its own fill: nothing else wrote into it.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto fill = static_cast<uint8_t>(i + 1);
    EXPECT_EQ(blocks[i].data[0], fill);
    EXPECT_EQ(blocks[i].data[blocks[i].bytes - 1], fill);
  }
  std::mt19937 rng(7);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const Block& block : blocks) FreeHost(block.data);
  FreeHost(nullptr);
}

TEST(HostMemoryTest, BlocksFreedAndReallocatedManyTimesStayUsable) {
  // Mid-size blocks freed in random order while others are live: the survivors keep their bytes.
  std::mt19937 rng(11);
  std::uniform_int_distribution<size_t> size(256 << 10, (4 << 20) - 1);
  std::vector<std::pair<Block, uint8_t>> live;
  for (int step = 0; step < 400; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t victim = rng() % live.size();
      const auto [block, fill] = live[victim];
      ASSERT_EQ(block.data[0], fill);
      ASSERT_EQ(block.data[block.bytes / 2], fill);
      ASSERT_EQ(block.data[block.bytes - 1], fill);
      FreeHost(block.data);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    } else {
      const auto fill = static_cast<uint8_t>(step % 251 + 1);
      live.emplace_back(Allocate(size(rng), fill), fill);
    }
    if (live.size() > 40) {
      for (const auto& [block, fill] : live) FreeHost(block.data);
      live.clear();
    }
  }
  for (const auto& [block, fill] : live) {
    EXPECT_EQ(block.data[block.bytes - 1], fill);
    FreeHost(block.data);
  }
}

}  // namespace
}  // namespace kiln::cpu
