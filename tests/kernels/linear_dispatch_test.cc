// The stream-count choice of the decode kernels (kernels/cpu/linear_dispatch.h): the rule on
// medians, and on rounds whose cost is known (the fastest 20 times cheaper than the others, so
// that a test sharing the machine's cores cannot turn the choice) the clearly fastest count wins
// and a choice is made once per shape and process. Each test uses shapes of its own, as the
// choices are remembered.
#include "kernels/cpu/linear_dispatch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>

namespace kiln::cpu {
namespace {

// Busy for `micros` (sleeping would leave the timing to the scheduler).
void Spin(int micros) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  while (std::chrono::steady_clock::now() < end) {
  }
}

LinearShape Shape(int64_t n) { return LinearShape{4096, n, DType::kBF16, false}; }

class StreamChoiceTest : public testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("KILN_DECODE_STREAMS") != nullptr) {
      GTEST_SKIP() << "KILN_DECODE_STREAMS pins the choice in this environment";
    }
  }
};

TEST_F(StreamChoiceTest, TheClearlyFastestCountIsChosenOnceAndRemembered) {
  std::map<int, int> rounds;
  const std::map<int, int> cost = {{4, 100}, {2, 2500}, {1, 1500}};
  auto round = [&](int streams) {
    ++rounds[streams];
    Spin(cost.at(streams));
  };
  const StreamChoice choice = ChooseStreams(Shape(101), round);
  EXPECT_EQ(choice.streams, 4) << choice.summary;
  EXPECT_NE(choice.summary.find("4 panels side by side"), std::string::npos) << choice.summary;
  EXPECT_EQ(rounds.size(), 3u);
  for (const auto& [streams, count] : rounds) EXPECT_GE(count, 2) << streams << " streams";

  const std::map<int, int> before = rounds;
  EXPECT_EQ(ChooseStreams(Shape(101), round).streams, 4);
  EXPECT_EQ(rounds, before) << "a remembered choice is not measured again";
  StreamChoice known;
  ASSERT_TRUE(KnownStreams(Shape(101), &known));
  EXPECT_EQ(known.streams, 4);
  EXPECT_FALSE(KnownStreams(Shape(102), &known));
}

// The rule on medians (in kStreamCounts' order: 2, 4, 1), without a clock: a tie or a gain
// within 3 % keeps two streams.
TEST(PickStreamsTest, TwoStayUnlessAnotherCountIsClearlyFaster) {
  ASSERT_EQ(kStreamCounts[0], 2);
  ASSERT_EQ(kStreamCounts[1], 4);
  EXPECT_EQ(PickStreams(std::vector<double>{1.0, 1.0, 1.0}), 2);
  EXPECT_EQ(PickStreams(std::vector<double>{1.0, 0.98, 0.99}), 2);
  EXPECT_EQ(PickStreams(std::vector<double>{1.0, 0.9, 0.95}), 4);
  EXPECT_EQ(PickStreams(std::vector<double>{1.0, 0.9, 0.8}), 1);
  EXPECT_EQ(PickStreams(std::vector<double>{1.0, 0.9, 0.89}), 4) << "1 is not 3 % faster than 4";
  EXPECT_EQ(PickStreams(std::vector<double>{1.0, 1.1, 0.9}), 1);
}

TEST_F(StreamChoiceTest, OneStreamWinsWhereItIsFastest) {
  const StreamChoice choice =
      ChooseStreams(Shape(301), [](int streams) { Spin(streams == 1 ? 100 : 2000); });
  EXPECT_EQ(choice.streams, 1) << choice.summary;
  EXPECT_NE(choice.summary.find("1 panel side by side"), std::string::npos) << choice.summary;
}

TEST_F(StreamChoiceTest, AShapeTooLargeToTimeTakesTheChoiceItIsGiven) {
  const LinearShape timed = Shape(401);
  const StreamChoice like =
      ChooseStreams(timed, [](int streams) { Spin(streams == 1 ? 100 : 2000); });
  ASSERT_EQ(like.streams, 1);
  int rounds = 0;
  const LinearShape large{4096, 402, DType::kBF16, false, Quantization::kInt4};
  const StreamChoice choice = ChooseStreams(
      large, [&](int) { ++rounds; }, &timed, &like);
  EXPECT_EQ(choice.streams, 1);
  EXPECT_EQ(rounds, 0);
  EXPECT_NE(choice.summary.find(DescribeShape(timed)), std::string::npos) << choice.summary;
  EXPECT_NE(DescribeShape(large).find("int4"), std::string::npos) << DescribeShape(large);
}

// A model larger than a round: its big shapes are timed, largest first; its small shapes (which
// alone would be timed from cache) and its too-large weights take the largest's choice untimed.
TEST_F(StreamChoiceTest, SmallShapesOfALargeModelTakeTheLargestTimedShapesChoice) {
  std::map<int64_t, int> rounds;  // by N
  auto shape = [&](int64_t n, size_t weight_bytes, size_t total_bytes, int fastest) {
    return StreamShape{Shape(n), weight_bytes, total_bytes, [&rounds, n, fastest](int streams) {
                         ++rounds[n];
                         Spin(streams == fastest ? 100 : 2000);
                       }};
  };
  const size_t mb = size_t{1} << 20;
  const std::vector<StreamShape> shapes = {
      shape(501, 2 * mb, 48 * mb, 2),        // small: 24 weights of 2 MB
      shape(502, 17 * mb, 24 * 17 * mb, 1),  // the most bytes: timed
      shape(503, 9 * mb, 24 * 9 * mb, 4),    // also a round's worth: timed
      shape(504, 272 * mb, 272 * mb, 2),     // one weight too large to time
  };
  const std::vector<int> streams = ChooseStreamsForShapes(shapes);
  EXPECT_EQ(streams, (std::vector<int>{1, 1, 4, 1}));
  EXPECT_EQ(rounds.count(501), 0u);
  EXPECT_EQ(rounds.count(504), 0u);
  EXPECT_GT(rounds[502], 0);
  EXPECT_GT(rounds[503], 0);
}

// A model that fits in the caches: every shape is timed on its own, from cache, as it runs.
TEST_F(StreamChoiceTest, ShapesOfASmallModelAreEachTimed) {
  auto shape = [](int64_t n, int fastest) {
    return StreamShape{Shape(n), size_t{1} << 20, size_t{4} << 20,
                       [fastest](int streams) { Spin(streams == fastest ? 100 : 2000); }};
  };
  EXPECT_EQ(ChooseStreamsForShapes({shape(601, 4), shape(602, 1)}), (std::vector<int>{4, 1}));
}

}  // namespace
}  // namespace kiln::cpu
