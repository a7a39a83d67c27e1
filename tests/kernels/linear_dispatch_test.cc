// The stream-count choice of the decode kernels (kernels/cpu/linear_dispatch.h) on rounds whose
// cost is known: the clearly fastest count wins, a tie keeps the default, and a choice is made
// once per shape and process. Each test uses shapes of its own, as the choices are remembered.
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
  const std::map<int, int> cost = {{4, 900}, {2, 300}, {1, 600}};
  auto round = [&](int streams) {
    ++rounds[streams];
    Spin(cost.at(streams));
  };
  const StreamChoice choice = ChooseStreams(Shape(101), round);
  EXPECT_EQ(choice.streams, 2) << choice.summary;
  EXPECT_NE(choice.summary.find("2 panels side by side"), std::string::npos) << choice.summary;
  EXPECT_EQ(rounds.size(), 3u);
  for (const auto& [streams, count] : rounds) EXPECT_GE(count, 2) << streams << " streams";

  const std::map<int, int> before = rounds;
  EXPECT_EQ(ChooseStreams(Shape(101), round).streams, 2);
  EXPECT_EQ(rounds, before) << "a remembered choice is not measured again";
  StreamChoice known;
  ASSERT_TRUE(KnownStreams(Shape(101), &known));
  EXPECT_EQ(known.streams, 2);
  EXPECT_FALSE(KnownStreams(Shape(102), &known));
}

TEST_F(StreamChoiceTest, ATieKeepsFourStreams) {
  const StreamChoice choice = ChooseStreams(Shape(201), [](int) { Spin(400); });
  EXPECT_EQ(choice.streams, 4) << choice.summary;
}

TEST_F(StreamChoiceTest, OneStreamWinsWhereItIsFastest) {
  const StreamChoice choice =
      ChooseStreams(Shape(301), [](int streams) { Spin(streams == 1 ? 200 : 700); });
  EXPECT_EQ(choice.streams, 1) << choice.summary;
  EXPECT_NE(choice.summary.find("1 panel side by side"), std::string::npos) << choice.summary;
}

TEST_F(StreamChoiceTest, AShapeTooLargeToTimeTakesTheChoiceItIsGiven) {
  const LinearShape timed = Shape(401);
  const StreamChoice like =
      ChooseStreams(timed, [](int streams) { Spin(streams == 1 ? 200 : 700); });
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

}  // namespace
}  // namespace kiln::cpu
