// The CPU backend's host allocator: alignment, no overlap between live blocks of every size class
// (small, huge-page runs), and freeing in any order.
#include "kernels/cpu/host_memory.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
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

// The /proc/self/smaps entry of the mapping that holds `p`: its first line and its VmFlags.
struct MappingInfo {
  std::string header;
  std::string flags;
};
MappingInfo MappingOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  MappingInfo found;
  bool inside = false;
  const auto address = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &start, &end) == 2) {
      inside = start <= address && address < end;
      if (inside) found.header = line;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) found.flags = line;
  }
  return found;
}

// A large block is a mapping of its own, advised for huge pages before anything touched it, even
// after malloc has churned through blocks of its size (whose reused heap pages would stay 4 KiB).
TEST(HostMemoryTest, LargeBlocksAreFreshMappingsAdvisedForHugePages) {
  // Freeing a 24 MiB mapped block raises glibc's mmap threshold above 9 MiB; a 9 MiB block then
  // comes from the heap, and its touched pages stay there once it is freed.
  void* big = std::malloc(size_t{24} << 20);
  ASSERT_NE(big, nullptr);
  std::free(big);
  for (int i = 0; i < 4; ++i) {
    void* churn = std::malloc(size_t{9} << 20);
    ASSERT_NE(churn, nullptr);
    std::memset(churn, 1, size_t{9} << 20);
    std::free(churn);
  }
  const size_t bytes = size_t{9} << 20;
  Block block = Allocate(bytes, 3);
  const MappingInfo mapping = MappingOf(block.data);
  ASSERT_FALSE(mapping.header.empty()) << "no mapping holds the block";
  EXPECT_EQ(mapping.header.find("[heap]"), std::string::npos) << mapping.header;
  EXPECT_NE(mapping.flags.find(" hg"), std::string::npos) << mapping.flags;
  FreeHost(block.data);
  EXPECT_TRUE(MappingOf(block.data).header.empty()) << "the mapping outlived FreeHost";
}

// Small weights are pieces of shared chunks of 2 MiB pages, not malloc's 4 KiB heap pages: aligned,
// disjoint, writable, and a chunk is unmapped with its last piece. Large ones are mappings of their
// own, as AllocateHost makes them.
TEST(HostMemoryTest, WeightsComeInHugePagesWhateverTheirSize) {
  constexpr size_t kPiece = (3 << 20) + 100;  // ten fit a 32 MiB chunk, the eleventh does not
  std::vector<WeightBytes> pieces;
  pieces.push_back(AllocateWeights(kPiece));
  const MappingInfo first = MappingOf(pieces[0].data());
  // Allocate until a piece starts a chunk of its own, which only the pieces after it share.
  size_t fresh = 0;
  for (int i = 1; i < 24 && fresh == 0; ++i) {
    pieces.push_back(AllocateWeights(kPiece));
    if (MappingOf(pieces.back().data()).header != first.header) fresh = pieces.size() - 1;
  }
  ASSERT_GT(fresh, 0u) << "24 pieces of 3 MiB fit one mapping";
  for (int i = 0; i < 3; ++i) pieces.push_back(AllocateWeights(kPiece));
  for (size_t i = 0; i < pieces.size(); ++i) {
    WeightBytes& piece = pieces[i];
    ASSERT_NE(piece.mutable_data(), nullptr);
    EXPECT_FALSE(piece.in_place());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(piece.data()) % 256, 0u);
    std::memset(piece.mutable_data(), static_cast<int>(i + 1), kPiece);
    const MappingInfo mapping = MappingOf(piece.data());
    EXPECT_EQ(mapping.header.find("[heap]"), std::string::npos) << mapping.header;
    EXPECT_NE(mapping.flags.find(" hg"), std::string::npos) << mapping.flags;
  }
  std::vector<const std::byte*> starts;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].data()[0], static_cast<std::byte>(i + 1)) << "another piece wrote here";
    EXPECT_EQ(pieces[i].data()[kPiece - 1], static_cast<std::byte>(i + 1));
    starts.push_back(pieces[i].data());
  }
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i) EXPECT_GE(starts[i], starts[i - 1] + kPiece);

  const std::byte* fresh_start = pieces[fresh].data();
  pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(fresh), pieces.end());
  EXPECT_TRUE(MappingOf(fresh_start).header.empty()) << "the chunk outlived its last piece";

  WeightBytes large = AllocateWeights(size_t{5} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % (2 << 20), 0u);
  EXPECT_NE(MappingOf(large.data()).flags.find(" hg"), std::string::npos);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// A piece of a shared chunk is as guarded as a malloc'd block: under AddressSanitizer a read one
// byte past its end (into the chunk's free rest or the next piece's padding) is reported.
TEST(HostMemoryDeathTest, ReadingPastAWeightPieceIsCaught) {
  if (!kAddressSanitizer) GTEST_SKIP() << "needs AddressSanitizer (the asan preset)";
  WeightBytes piece = AllocateWeights(1000);
  std::memset(piece.mutable_data(), 7, 1000);
  EXPECT_DEATH(
      {
        volatile const std::byte* p = piece.data();
        std::printf("%d\n", static_cast<int>(p[1000]));
      },
      "AddressSanitizer");
}

}  // namespace
}  // namespace kiln::cpu
