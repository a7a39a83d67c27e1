#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace kiln {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, -1.0f, 0.5f}; }

int32_t SampleOnce(const SamplingParams& params, uint64_t seed, std::vector<float> logits,
                   std::span<const int32_t> prompt = {}) {
  Sampler sampler(params, seed, prompt);
  return sampler.Sample(logits, 0).token_id;
}

TEST(SamplingTest, GreedyTakesArgmax) { EXPECT_EQ(SampleOnce({}, 1, Logits()), 1); }

TEST(SamplingTest, LogprobsDescribeTheModelDistribution) {
  Sampler sampler({}, 1, {});
  std::vector<float> logits = Logits();
  SampledToken token = sampler.Sample(logits, 3);
  double normalizer = 0;
  for (float x : Logits()) normalizer += std::exp(x);
  EXPECT_NEAR(token.logprob, 3.0 - std::log(normalizer), 1e-5);
  ASSERT_EQ(token.top.size(), 3u);
  EXPECT_EQ(token.top[0].token_id, 1);
  EXPECT_EQ(token.top[1].token_id, 2);
  EXPECT_EQ(token.top[2].token_id, 0);
  EXPECT_NEAR(token.top[1].logprob, 2.0 - std::log(normalizer), 1e-5);
}

TEST(SamplingTest, RepetitionPenaltyFollowsHuggingFace) {
  SamplingParams params;
  params.repetition_penalty = 4.0f;
  const int32_t prompt[] = {1};  // logit 3 → 0.75, below token 2's 2.0
  EXPECT_EQ(SampleOnce(params, 1, Logits(), prompt), 2);
}

TEST(SamplingTest, FrequencyAndPresencePenaltiesCountOutputTokens) {
  SamplingParams params;
  params.frequency_penalty = 0.6f;
  Sampler sampler(params, 1, {});
  sampler.Accept(1);
  std::vector<float> logits = Logits();
  EXPECT_EQ(sampler.Sample(logits, 0).token_id, 1);  // 3 − 0.6 = 2.4 > 2
  sampler.Accept(1);
  logits = Logits();
  EXPECT_EQ(sampler.Sample(logits, 0).token_id, 2);  // 3 − 1.2 = 1.8 < 2

  SamplingParams presence;
  presence.presence_penalty = 1.5f;
  Sampler with_presence(presence, 1, {});
  with_presence.Accept(1);
  logits = Logits();
  EXPECT_EQ(with_presence.Sample(logits, 0).token_id, 2);
}

TEST(SamplingTest, SeedMakesSamplingReproducible) {
  SamplingParams params;
  params.temperature = 1.0f;
  std::vector<int32_t> a, b;
  Sampler first(params, 42, {}), second(params, 42, {});
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l1 = Logits(), l2 = Logits();
    a.push_back(first.Sample(l1, 0).token_id);
    b.push_back(second.Sample(l2, 0).token_id);
  }
  EXPECT_EQ(a, b);
}

// Frequencies of many draws match softmax(logits / T) within 5 standard errors.
void ExpectDistribution(const SamplingParams& params, const std::vector<double>& expected) {
  Sampler sampler(params, 7, {});
  const int draws = 40000;
  std::vector<int> counts(expected.size());
  for (int i = 0; i < draws; ++i) {
    std::vector<float> logits = Logits();
    ++counts[static_cast<size_t>(sampler.Sample(logits, 0).token_id)];
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const double p = expected[i];
    const double observed = static_cast<double>(counts[i]) / draws;
    const double sigma = std::sqrt(std::max(p * (1 - p), 1e-12) / draws);
    EXPECT_NEAR(observed, p, 5 * sigma + 1e-9) << "token " << i;
  }
}

std::vector<double> Softmax(std::vector<float> logits, float temperature,
                            const std::vector<bool>& keep) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = keep[i] ? std::exp(logits[i] / temperature) : 0.0;
    total += p[i];
  }
  for (double& x : p) x /= total;
  return p;
}

TEST(SamplingTest, TemperatureSamplingMatchesSoftmax) {
  SamplingParams params;
  params.temperature = 0.7f;
  ExpectDistribution(params, Softmax(Logits(), 0.7f, std::vector<bool>(5, true)));
}

TEST(SamplingTest, TopKTopPAndMinPRestrictTheSupport) {
  SamplingParams top_k;
  top_k.temperature = 1.0f;
  top_k.top_k = 2;
  ExpectDistribution(top_k, Softmax(Logits(), 1.0f, {false, true, true, false, false}));

  // softmax(1,3,2,-1,0.5): token 1 holds 0.63, tokens 1+2 hold 0.86.
  SamplingParams top_p;
  top_p.temperature = 1.0f;
  top_p.top_p = 0.8f;
  ExpectDistribution(top_p, Softmax(Logits(), 1.0f, {false, true, true, false, false}));

  // min_p 0.2: keeps tokens with p ≥ 0.2·p(token 1): exp(x−3) ≥ 0.2 → x ≥ 1.39.
  SamplingParams min_p;
  min_p.temperature = 1.0f;
  min_p.min_p = 0.2f;
  ExpectDistribution(min_p, Softmax(Logits(), 1.0f, {false, true, true, false, false}));
}

// The filters over a vocabulary far larger than the first sorted batch of candidates: what
// Distribution keeps must be what a full sort of every logit keeps, with the same weights.
TEST(SamplingTest, TruncationOverALargeVocabularyMatchesAFullSort) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(20000);
  for (float& x : logits) x = normal(rng);
  auto reference = [&](const SamplingParams& p) {
    std::vector<std::pair<double, int32_t>> order;
    for (size_t i = 0; i < logits.size(); ++i) {
      order.emplace_back(logits[i] / p.temperature, static_cast<int32_t>(i));
    }
    std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.first > b.first; });
    size_t keep = p.top_k > 0 ? std::min<size_t>(order.size(), p.top_k) : order.size();
    std::vector<double> w(keep);
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += (w[i] = std::exp(order[i].first - order[0].first));
    size_t kept = keep;
    if (p.top_p < 1.0f) {
      double mass = 0;
      for (kept = 0; kept < keep;) {
        mass += w[kept++] / total;
        if (mass >= p.top_p) break;
      }
    }
    if (p.min_p > 0.0f) {
      size_t m = 0;
      while (m < kept && w[m] >= p.min_p * w[0]) ++m;
      kept = std::max<size_t>(m, 1);
    }
    std::vector<float> probs(logits.size(), 0.0f);
    double kept_total = 0;
    for (size_t i = 0; i < kept; ++i) kept_total += w[i];
    for (size_t i = 0; i < kept; ++i)
      probs[order[i].second] = static_cast<float>(w[i] / kept_total);
    return probs;
  };
  std::vector<SamplingParams> cases(5);
  cases[0].temperature = 0.7f, cases[0].top_p = 0.9f;    // thousands of candidates
  cases[1].temperature = 0.2f, cases[1].top_p = 0.95f;   // a few
  cases[2].temperature = 1.0f, cases[2].min_p = 0.002f;  // min-p keeps hundreds
  cases[3].temperature = 1.0f, cases[3].top_k = 3000, cases[3].top_p = 0.8f;
  cases[4].temperature = 1.5f, cases[4].top_k = 500;
  for (size_t c = 0; c < cases.size(); ++c) {
    Sampler sampler(cases[c], 1, {});
    std::vector<float> probs;
    sampler.Distribution(logits, &probs);
    const std::vector<float> expected = reference(cases[c]);
    int64_t support = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
      ASSERT_EQ(probs[i] > 0, expected[i] > 0) << "case " << c << ", token " << i;
      ASSERT_NEAR(probs[i], expected[i], 1e-6 + 1e-4 * expected[i]) << "case " << c;
      support += probs[i] > 0;
    }
    EXPECT_GT(support, c == 1 ? 1 : 64) << "case " << c << " should need more than one batch";
  }
}

TEST(SamplingTest, InvalidParamsNameTheField) {
  struct Case {
    SamplingParams params;
    const char* field;
  };
  std::vector<Case> cases(6);
  cases[0].params.temperature = -1, cases[0].field = "temperature";
  cases[1].params.top_k = -2, cases[1].field = "top_k";
  cases[2].params.top_p = 0, cases[2].field = "top_p";
  cases[3].params.min_p = 1.5f, cases[3].field = "min_p";
  cases[4].params.repetition_penalty = 0, cases[4].field = "repetition_penalty";
  cases[5].params.frequency_penalty = 3, cases[5].field = "frequency_penalty";
  for (const Case& c : cases) {
    absl::Status status = ValidateSamplingParams(c.params);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(status.message()).find(c.field), std::string::npos) << status;
  }
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
}

}  // namespace
}  // namespace kiln
