// The RoPE table (inverse frequencies) PostLoad places on the backend, against a double reference.
#include "models/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

namespace kiln {
namespace {

// The inverse frequencies in double: theta^(-2i/d), then the Llama-3.1 rule; `bands` counts how
// many fell in each of its three bands (kept, smoothed, scaled).
std::vector<double> ReferenceInvFreq(int64_t head_dim, double theta, const RopeScaling& s,
                                     int bands[3]) {
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double& f = inv[static_cast<size_t>(i)];
    f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (!s.llama3) continue;
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen < s.original_max_position_embeddings / s.high_freq_factor) {
      ++bands[0];
    } else if (wavelen > s.original_max_position_embeddings / s.low_freq_factor) {
      f /= s.factor;
      ++bands[2];
    } else {
      const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
      ++bands[1];
    }
  }
  return inv;
}

RopeScaling Llama31Scaling() {
  RopeScaling s;
  s.llama3 = true;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192.0;
  return s;
}

// Tolerance 2e-6 relative: the table is fp32 (one pow rounding plus a few fp32 ops).
TEST(RopeTableTest, InverseFrequencies) {
  struct Case {
    int64_t head_dim;
    double theta;
    RopeScaling scaling;
  };
  for (const Case& c :
       {Case{64, 1000000.0, {}}, Case{128, 10000.0, {}}, Case{128, 500000.0, Llama31Scaling()},
        Case{64, 500000.0, [] {
               RopeScaling s = Llama31Scaling();
               s.factor = 32.0;  // Llama 3.2 1B/3B
               return s;
             }()}}) {
    SCOPED_TRACE(testing::Message() << "head_dim=" << c.head_dim << " theta=" << c.theta
                                    << " llama3=" << c.scaling.llama3);
    const std::vector<float> table = RopeInverseFrequencies(c.head_dim, c.theta, c.scaling);
    int bands[3] = {0, 0, 0};
    const std::vector<double> expected = ReferenceInvFreq(c.head_dim, c.theta, c.scaling, bands);
    ASSERT_EQ(table.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(table[i], expected[i], 2e-6 * expected[i]) << i;
    }
    if (c.scaling.llama3) {  // the case exercises all three bands of the rule
      EXPECT_GT(bands[0], 0);
      EXPECT_GT(bands[1], 0);
      EXPECT_GT(bands[2], 0);
    }
  }
}

}  // namespace
}  // namespace kiln
