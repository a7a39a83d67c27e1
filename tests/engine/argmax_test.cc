// ArgmaxFirst and MaxValue against std::max_element: random rows of every length around the
// vector widths, ties (the first index wins), infinities, signed zeros and NaNs anywhere.
#include "engine/argmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kiln {
namespace {

int32_t Reference(const std::vector<float>& row) {
  if (row.empty()) return 0;
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

void ExpectSameAsMaxElement(const std::vector<float>& row, const char* what) {
  EXPECT_EQ(ArgmaxFirst(row), Reference(row)) << what << ", " << row.size() << " values";
  if (!row.empty()) {
    const float want = *std::max_element(row.begin(), row.end());
    const float got = MaxValue(row);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << what;
    } else {
      EXPECT_EQ(got, want) << what << ", " << row.size() << " values";
    }
  }
}

TEST(ArgmaxTest, MatchesMaxElementOnRandomRowsTiesAndSpecialValues) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{63}, size_t{64},
                   size_t{65}, size_t{1000}, size_t{151936}}) {
    std::vector<float> row(n);
    for (float& x : row) x = normal(rng);
    ExpectSameAsMaxElement(row, "random");
    if (n == 0) continue;
    // Ties: the largest value at several places, the first of them anywhere.
    std::vector<float> tied = row;
    const float top = *std::max_element(tied.begin(), tied.end()) + 1.0f;
    for (int k = 0; k < 4; ++k) tied[rng() % n] = top;
    ExpectSameAsMaxElement(tied, "ties");
    // Rounded to few values: many ties of the maximum.
    std::vector<float> coarse = row;
    for (float& x : coarse) x = std::round(x / 8.0f);
    ExpectSameAsMaxElement(coarse, "coarse");
    ExpectSameAsMaxElement(std::vector<float>(n, -inf), "all -inf");
    std::vector<float> zeros(n, -0.0f);
    zeros[rng() % n] = 0.0f;
    ExpectSameAsMaxElement(zeros, "signed zeros");
    std::vector<float> with_inf = row;
    with_inf[rng() % n] = inf;
    ExpectSameAsMaxElement(with_inf, "+inf");
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      std::vector<float> with_nan = row;
      with_nan[at] = nan;
      ExpectSameAsMaxElement(with_nan, "NaN");
    }
  }
}

}  // namespace
}  // namespace kiln
