// Speculative sampling must leave the output distribution unchanged. Chi-square goodness-of-fit
// tests with fixed seeds compare the first generated tokens with the exact distribution of plain
// sampling; cells with an expected count below 5 are pooled, and a test fails when the statistic
// exceeds the chi-square quantile at p = 1e-5 (so a correct sampler fails about once in 1e5 seeds;
// with the fixed seeds here the outcome is deterministic).
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "absl/synchronization/notification.h"
#include "clients/synth.h"
#include "engine/draft_sources_testing.h"
#include "engine/engine.h"
#include "engine/mtp_draft_source.h"
#include "engine/speculative.h"
#include "gtest/gtest.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tests/loaders/test_util.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

// Upper quantile of chi-square with `dof` degrees of freedom at p = 1e-5 (Wilson–Hilferty; within
// a few percent for dof ≥ 3).
double ChiSquareLimit(int dof) {
  const double z = 4.2649;  // standard normal quantile at 1 − 1e-5
  const double v = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - v + z * std::sqrt(v), 3);
}

struct FitResult {
  double statistic = 0;
  int dof = 0;
  double limit = 0;
  bool passes() const { return statistic <= limit; }
};

// Goodness of fit of `counts` (over `n` samples) to `probs`, cells keyed alike.
FitResult ChiSquare(const std::map<std::vector<int32_t>, double>& probs,
                    const std::map<std::vector<int32_t>, int64_t>& counts, int64_t n) {
  FitResult fit;
  double pooled_expected = 0, pooled_observed = 0;
  int cells = 0;
  double seen_mass = 0;
  for (const auto& [cell, p] : probs) {
    seen_mass += p;
    const double expected = p * static_cast<double>(n);
    const auto it = counts.find(cell);
    const double observed = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += observed;
    } else {
      fit.statistic += (observed - expected) * (observed - expected) / expected;
      ++cells;
    }
  }
  // Samples in cells the exact distribution gives no mass make the fit fail outright.
  int64_t counted = 0;
  for (const auto& [cell, count] : counts) {
    if (probs.contains(cell)) counted += count;
  }
  pooled_observed += static_cast<double>(n - counted);
  pooled_expected += (1.0 - seen_mass) * static_cast<double>(n);
  if (pooled_expected > 0) {
    fit.statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  } else if (pooled_observed > 0) {
    fit.statistic = std::numeric_limits<double>::infinity();
  }
  fit.dof = std::max(cells - 1, 1);
  fit.limit = ChiSquareLimit(fit.dof);
  return fit;
}

// --- Verification alone, against a small synthetic Markov "target" --------------------------

constexpr int kVocab = 6;
constexpr int kTokens = 3;  // the joint distribution of the first three tokens is checked

// logits[t] follow token t (a first-order target); drafts come from q[t].
struct Markov {
  std::vector<std::vector<float>> logits, q;
  explicit Markov(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    for (int t = 0; t < kVocab; ++t) {
      std::vector<float> row(kVocab), draft(kVocab);
      double total = 0;
      for (int j = 0; j < kVocab; ++j) {
        row[j] = normal(rng);
        draft[j] = std::exp(normal(rng));
        total += draft[j];
      }
      for (float& x : draft) x = static_cast<float>(x / total);
      logits.push_back(row);
      q.push_back(draft);
    }
  }
};

// Exact joint distribution of the first `n` tokens of plain sampling after `prompt`, where
// `logits_after(prefix)` is the target's logits row after prompt + prefix.
template <typename LogitsAfter>
std::map<std::vector<int32_t>, double> ExactJoint(const SamplingParams& params,
                                                  const std::vector<int32_t>& prompt, int n,
                                                  LogitsAfter logits_after) {
  std::map<std::vector<int32_t>, double> joint = {{{}, 1.0}};
  for (int step = 0; step < n; ++step) {
    std::map<std::vector<int32_t>, double> next;
    for (const auto& [prefix, mass] : joint) {
      Sampler sampler(params, 0, prompt);
      for (int32_t t : prefix) sampler.Accept(t);
      std::vector<float> p;
      sampler.Distribution(logits_after(prefix), &p);
      for (int32_t t = 0; t < static_cast<int32_t>(p.size()); ++t) {
        if (p[t] <= 0) continue;
        std::vector<int32_t> cell = prefix;
        cell.push_back(t);
        next[cell] += mass * p[t];
      }
    }
    joint = std::move(next);
  }
  return joint;
}

// The same for the Markov target: logits follow the last token.
std::map<std::vector<int32_t>, double> ExactJoint(const Markov& target,
                                                  const SamplingParams& params,
                                                  const std::vector<int32_t>& prompt) {
  return ExactJoint(params, prompt, kTokens, [&](const std::vector<int32_t>& prefix) {
    const int32_t last = prefix.empty() ? prompt.back() : prefix.back();
    return target.logits[static_cast<size_t>(last)];
  });
}

enum class Scheme { kCorrect, kResampleFromP };

// Generates kTokens tokens by repeated draft + verify rounds with k drafts per round.
std::vector<int32_t> SpeculativeRun(const Markov& target, const SamplingParams& params,
                                    const std::vector<int32_t>& prompt, int k, bool greedy_drafts,
                                    uint64_t seed, Scheme scheme) {
  Sampler sampler(params, seed, prompt);
  std::mt19937_64 draft_rng(seed ^ 0xabcdefull);
  std::vector<int32_t> out;
  while (static_cast<int>(out.size()) < kTokens) {
    int32_t last = out.empty() ? prompt.back() : out.back();
    Draft draft;
    std::vector<float> rows(target.logits[static_cast<size_t>(last)]);
    for (int i = 0; i < k; ++i) {
      const std::vector<float>& q = target.q[static_cast<size_t>(last)];
      if (greedy_drafts) {
        last = static_cast<int32_t>(std::max_element(q.begin(), q.end()) - q.begin());
      } else {
        last = std::discrete_distribution<int32_t>(q.begin(), q.end())(draft_rng);
        draft.probs.push_back(q);
      }
      draft.tokens.push_back(last);
      rows.insert(rows.end(), target.logits[static_cast<size_t>(last)].begin(),
                  target.logits[static_cast<size_t>(last)].end());
    }
    std::vector<int32_t> tokens;
    if (scheme == Scheme::kCorrect) {
      for (const SampledToken& t : VerifyDraft(sampler, rows, kVocab, draft, 0).tokens) {
        tokens.push_back(t.token_id);
      }
    } else {
      // A known-wrong scheme: on rejection draw from p instead of max(p − q, 0). The test must
      // be able to tell it apart.
      std::vector<float> p;
      for (int i = 0; i <= k; ++i) {
        sampler.Distribution(std::span<const float>(rows).subspan(i * kVocab, kVocab), &p);
        int32_t token = sampler.Draw(p);
        if (i < k) {
          const int32_t x = draft.tokens[i];
          const float q_x = draft.probs.empty() ? 1.0f : draft.probs[i][x];
          if (sampler.Uniform() < std::min(1.0, double(p[x]) / q_x)) token = x;
        }
        tokens.push_back(token);
        sampler.Accept(token);
        if (i == k || token != draft.tokens[i]) break;
      }
    }
    out.insert(out.end(), tokens.begin(), tokens.end());
  }
  out.resize(kTokens);
  return out;
}

FitResult VerifyFit(const SamplingParams& params, int k, bool greedy_drafts, Scheme scheme,
                    int64_t n) {
  const Markov target(7);
  const std::vector<int32_t> prompt = {2, 0, 2};
  const auto exact = ExactJoint(target, params, prompt);
  std::map<std::vector<int32_t>, int64_t> counts;
  for (int64_t s = 0; s < n; ++s) {
    ++counts[SpeculativeRun(target, params, prompt, k, greedy_drafts, 1000 + s, scheme)];
  }
  return ChiSquare(exact, counts, n);
}

std::vector<std::pair<std::string, SamplingParams>> ParamSets() {
  SamplingParams plain;
  plain.temperature = 1.0f;
  SamplingParams truncated;
  truncated.temperature = 0.8f;
  truncated.top_k = 4;
  truncated.top_p = 0.9f;
  SamplingParams penalized;
  penalized.temperature = 1.2f;
  penalized.min_p = 0.05f;
  penalized.repetition_penalty = 1.5f;
  penalized.presence_penalty = 0.7f;
  penalized.frequency_penalty = 0.4f;
  return {{"plain", plain}, {"top-k/top-p", truncated}, {"min-p+penalties", penalized}};
}

TEST(SpeculativeSamplingTest, DistributionIsWhatSampleDraws) {
  const Markov target(3);
  for (const auto& [name, params] : ParamSets()) {
    SCOPED_TRACE(name);
    const std::vector<int32_t> prompt = {1, 1, 4};
    Sampler reference(params, 0, prompt);
    reference.Accept(4);
    std::vector<float> p;
    reference.Distribution(target.logits[4], &p);
    double total = 0;
    std::map<std::vector<int32_t>, double> probs;
    for (int32_t t = 0; t < kVocab; ++t) {
      total += p[t];
      if (p[t] > 0) probs[{t}] = p[t];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
    constexpr int64_t kSamples = 50000;
    Sampler sampler(params, 42, prompt);
    sampler.Accept(4);
    std::map<std::vector<int32_t>, int64_t> counts;
    for (int64_t s = 0; s < kSamples; ++s) {
      std::vector<float> logits = target.logits[4];
      ++counts[{sampler.Sample(logits, 0).token_id}];
    }
    const FitResult fit = ChiSquare(probs, counts, kSamples);
    EXPECT_TRUE(fit.passes()) << fit.statistic << " > " << fit.limit << " (dof " << fit.dof << ")";
  }
  SamplingParams greedy;
  greedy.repetition_penalty = 2.0f;
  Sampler sampler(greedy, 0, std::vector<int32_t>{0});
  std::vector<float> p;
  sampler.Distribution(target.logits[1], &p);
  EXPECT_EQ(std::count(p.begin(), p.end(), 1.0f), 1);
  EXPECT_EQ(p[static_cast<size_t>(sampler.Argmax(target.logits[1]))], 1.0f);
}

TEST(SpeculativeSamplingTest, VerificationKeepsTheJointDistribution) {
  constexpr int64_t kSamples = 40000;
  for (const auto& [name, params] : ParamSets()) {
    for (int k : {1, 3}) {
      for (bool greedy_drafts : {false, true}) {
        SCOPED_TRACE(name + " k=" + std::to_string(k) + (greedy_drafts ? " greedy" : " sampled") +
                     " drafts");
        const FitResult fit = VerifyFit(params, k, greedy_drafts, Scheme::kCorrect, kSamples);
        EXPECT_TRUE(fit.passes()) << fit.statistic << " > " << fit.limit << " (dof " << fit.dof
                                  << ")";
      }
    }
  }
}

TEST(SpeculativeSamplingTest, TheFitDetectsAWrongResidual) {
  // Power check: the same test rejects resampling from p instead of max(p − q, 0).
  const FitResult fit = VerifyFit(ParamSets()[0].second, 3, false, Scheme::kResampleFromP, 40000);
  EXPECT_FALSE(fit.passes()) << fit.statistic << " ≤ " << fit.limit;
}

// --- The engine, end to end ----------------------------------------------------------------

// Exact joint distribution of the first `n` tokens of plain sampling from `model`.
std::map<std::vector<int32_t>, double> ExactFromModel(const PreparedModel& model,
                                                      const SamplingParams& params,
                                                      const std::vector<int32_t>& prompt, int n) {
  return ExactJoint(params, prompt, n, [&](const std::vector<int32_t>& prefix) {
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), prefix.begin(), prefix.end());
    absl::StatusOr<KvCache> cache = model.NewCache(static_cast<int64_t>(context.size()));
    EXPECT_TRUE(cache.ok());
    std::vector<float> logits;
    SequenceChunk chunk{&*cache, context, false};
    EXPECT_TRUE(model.Forward({&chunk, 1}, &logits).ok());
    return logits;
  });
}

// First `n` tokens of `samples` seeded requests, through an engine with `source` (or none).
std::map<std::vector<int32_t>, int64_t> SampleFromEngine(
    std::shared_ptr<const PreparedModel> model, const SamplingParams& params,
    const std::vector<int32_t>& prompt, int n, int64_t samples, std::shared_ptr<DraftSource> source,
    int drafts, SpeculativeStats* speculative) {
  EngineOptions options;
  options.max_running = 64;
  options.max_queued = static_cast<int32_t>(samples);
  options.draft_source = std::move(source);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::move(model), nullptr, options);
  EXPECT_TRUE(engine.ok());
  std::vector<std::unique_ptr<StreamCollector>> streams;
  for (int64_t s = 0; s < samples; ++s) {
    GenerationRequest request;
    request.prompt = prompt;
    request.sampling = params;
    request.sampling.seed = 5000 + static_cast<uint64_t>(s);
    request.stopping.max_tokens = n + 1;  // so that the n-th token may come from a draft
    request.stopping.ignore_eos = true;
    request.num_draft_tokens = drafts;
    streams.push_back(std::make_unique<StreamCollector>());
    EXPECT_TRUE((*engine)->Submit(std::move(request), streams.back()->Callback()).ok());
  }
  std::map<std::vector<int32_t>, int64_t> counts;
  for (auto& stream : streams) {
    EXPECT_TRUE(stream->done.WaitForNotificationWithTimeout(absl::Seconds(300)));
    EXPECT_EQ(stream->tokens.size(), static_cast<size_t>(n + 1));
    stream->tokens.resize(static_cast<size_t>(n));
    ++counts[stream->tokens];
    speculative->drafted += stream->last->speculative.drafted;
    speculative->accepted += stream->last->speculative.accepted;
  }
  return counts;
}

// Plain engine sampling (a control of the exact computation) and speculative sampling with
// `source` drafting `drafts` tokens per step, each against the exact joint distribution of the
// first `n` tokens.
void ExpectSpeculativeSamplingMatchesPlain(std::shared_ptr<const PreparedModel> model,
                                           const SamplingParams& params,
                                           const std::vector<int32_t>& prompt, int n,
                                           int64_t samples, std::shared_ptr<DraftSource> source,
                                           int drafts) {
  const auto exact = ExactFromModel(*model, params, prompt, n);
  SpeculativeStats none, stats;
  const FitResult plain = ChiSquare(
      exact, SampleFromEngine(model, params, prompt, n, samples, nullptr, 0, &none), samples);
  EXPECT_TRUE(plain.passes()) << "control: " << plain.statistic << " > " << plain.limit;
  const FitResult speculative = ChiSquare(
      exact, SampleFromEngine(model, params, prompt, n, samples, source, drafts, &stats), samples);
  EXPECT_TRUE(speculative.passes())
      << speculative.statistic << " > " << speculative.limit << " (dof " << speculative.dof << ")";
  // Both outcomes of verification were exercised.
  EXPECT_GT(stats.accepted, 0);
  EXPECT_LT(stats.accepted, stats.drafted);
}

// A model with a 16-token vocabulary, so that the exact joint distribution covers every token.
TEST(SpeculativeEngineSamplingTest, SpeculativeSamplingMatchesPlainSampling) {
  constexpr int64_t kModelVocab = 16;
  testing_util::ScratchDir dir;
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok());
  config->hidden_size = 64;
  config->intermediate_size = 128;
  config->num_hidden_layers = 1;
  config->num_attention_heads = 4;
  config->num_key_value_heads = 2;
  config->head_dim = 16;
  config->vocab_size = kModelVocab;
  config->eos_token_ids = {kModelVocab - 1};
  SynthOptions options;
  options.dtype = DType::kF32;
  options.seed = 11;
  options.write_tokenizer = false;
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded =
      testing_util::WriteAndLoad(dir.path(), *config, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::shared_ptr<const PreparedModel> model(std::move(*loaded));
  SamplingParams temperature;  // synth logits are small: a low temperature makes p peaked
  temperature.temperature = 0.08f;
  SamplingParams penalized = temperature;
  penalized.top_k = 8;
  penalized.presence_penalty = 0.1f;
  penalized.frequency_penalty = 0.05f;
  penalized.repetition_penalty = 1.3f;
  for (const auto& [name, params] : std::vector<std::pair<std::string, SamplingParams>>{
           {"temperature", temperature}, {"top-k+penalties", penalized}}) {
    SCOPED_TRACE(name);
    // The first three tokens, noisy sampled drafts, k = 2.
    ExpectSpeculativeSamplingMatchesPlain(model, params, {3, 1, 4, 1, 5}, 3, 6000,
                                          std::make_shared<NoisyDraftSource>(kModelVocab, 21, 1.5f),
                                          2);
  }
}

// The trained default model (checkpoints/kiln-brown) with drafts from its own MTP head. Its
// vocabulary is 4,096 tokens, so the sampling parameters keep few candidates per step (top-k)
// for the exact joint distribution to stay small.
TEST(SpeculativeEngineSamplingTest, TrainedModelWithItsMtpHeadKeepsTheDistribution) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded =
      LoadModel(KILN_DEFAULT_MODEL_DIR, std::shared_ptr<Backend>(std::move(*backend)));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::shared_ptr<const PreparedModel> model(std::move(*loaded));
  absl::StatusOr<std::shared_ptr<MtpDraftSource>> source = MtpDraftSource::Create(model);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromDirectory(KILN_DEFAULT_MODEL_DIR);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<std::vector<int32_t>> prompt =
      (*tokenizer)->Encode("The committee said that the new law would", false);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  SamplingParams top_k;
  top_k.temperature = 1.0f;
  top_k.top_k = 5;
  SamplingParams penalized;
  penalized.temperature = 0.8f;
  penalized.top_k = 8;
  penalized.top_p = 0.9f;
  penalized.repetition_penalty = 1.2f;
  penalized.frequency_penalty = 0.3f;
  for (const auto& [name, params] : std::vector<std::pair<std::string, SamplingParams>>{
           {"top-k", top_k}, {"top-k+top-p+penalties", penalized}}) {
    SCOPED_TRACE(name);
    // The first two tokens (the second one from verification), k = 2.
    ExpectSpeculativeSamplingMatchesPlain(model, params, *prompt, 2, 4000, *source, 2);
  }
}

}  // namespace
}  // namespace kiln
