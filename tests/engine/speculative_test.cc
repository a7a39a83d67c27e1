// Speculative decoding in the engine: greedy output identical to plain decoding whatever the
// drafts, fewer target steps when drafts are right, stops inside drafts, rollback, refusals.
#include <algorithm>
#include <cmath>

#include "absl/synchronization/notification.h"
#include "clients/synth.h"
#include "engine/draft_sources_testing.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

class SpeculativeTest : public ::testing::Test {
 protected:
  static constexpr int64_t kVocab = 512;

  static void SetUpTestSuite() {
    dir_ = new testing_util::ScratchDir();
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    ASSERT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    SynthOptions options;
    options.dtype = DType::kF32;
    options.seed = 5;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        testing_util::WriteAndLoad(dir_->path(), *config, options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::shared_ptr<const PreparedModel>(std::move(*model));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir_->path());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }
  static void TearDownTestSuite() {
    model_.reset();
    tokenizer_.reset();
    delete dir_;
  }

  static std::unique_ptr<Engine> MakeEngine(std::shared_ptr<DraftSource> source,
                                            EngineOptions options = {}) {
    if (options.max_context == EngineOptions{}.max_context) options.max_context = 256;
    options.draft_source = std::move(source);
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, tokenizer_, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  static GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens, int drafts) {
    GenerationRequest request;
    request.prompt = std::move(prompt);
    request.stopping.max_tokens = max_tokens;
    request.stopping.ignore_eos = true;
    request.num_draft_tokens = drafts;
    return request;
  }

  // Runs the requests concurrently on `engine` and returns their results in order.
  static std::vector<std::unique_ptr<StreamCollector>> RunAll(
      Engine& engine, const std::vector<GenerationRequest>& requests) {
    std::vector<std::unique_ptr<StreamCollector>> results;
    for (const GenerationRequest& request : requests) {
      results.push_back(std::make_unique<StreamCollector>());
      absl::StatusOr<uint64_t> id = engine.Submit(request, results.back()->Callback());
      EXPECT_TRUE(id.ok()) << id.status();
    }
    for (auto& result : results) result->Wait();
    return results;
  }

  static std::vector<int32_t> Prompt(int seed, int length) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < length; ++i) prompt.push_back((seed * 131 + i * 37 + 11) % 500);
    return prompt;
  }

  // Plain greedy outputs, and scripts built from them for the scripted draft source.
  static std::vector<std::unique_ptr<StreamCollector>> Plain(
      const std::vector<GenerationRequest>& requests,
      std::vector<ScriptedDraftSource::Script>* scripts) {
    auto engine = MakeEngine(nullptr);
    std::vector<GenerationRequest> plain = requests;
    for (GenerationRequest& request : plain) request.num_draft_tokens = 0;
    auto results = RunAll(*engine, plain);
    if (scripts != nullptr) {
      for (size_t i = 0; i < requests.size(); ++i) {
        scripts->push_back({requests[i].prompt, results[i]->tokens});
      }
    }
    return results;
  }

  static testing_util::ScratchDir* dir_;
  static std::shared_ptr<const PreparedModel> model_;
  static std::shared_ptr<const Tokenizer> tokenizer_;
};

testing_util::ScratchDir* SpeculativeTest::dir_ = nullptr;
std::shared_ptr<const PreparedModel> SpeculativeTest::model_;
std::shared_ptr<const Tokenizer> SpeculativeTest::tokenizer_;

// Greedy output must not depend on the drafts: fully right, partly right (each draft token right
// with probability 0.6), always wrong, or drafted by the model itself; for k = 1..4 and
// batched with prefilling and non-speculating sequences.
TEST_F(SpeculativeTest, GreedyOutputEqualsPlainDecodingWhateverTheDrafts) {
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 6; ++r) {
    requests.push_back(Request(Prompt(r, 3 + 7 * r), 10 + 3 * r, 1 + r % 4));
    requests.back().logprobs = r % 2 == 0 ? 3 : 0;
  }
  requests[5].num_draft_tokens = 0;  // a plain sequence in the same batch
  std::vector<ScriptedDraftSource::Script> scripts;
  auto expected = Plain(requests, &scripts);

  std::vector<std::pair<std::string, std::shared_ptr<DraftSource>>> sources = {
      {"replay", std::make_shared<ScriptedDraftSource>(scripts, kVocab, 1.0, 1)},
      {"partial", std::make_shared<ScriptedDraftSource>(scripts, kVocab, 0.6, 2)},
      {"adversarial", std::make_shared<ScriptedDraftSource>(scripts, kVocab, 0.0, 3)},
      {"noisy", std::make_shared<NoisyDraftSource>(kVocab, 4, 1.0f, /*greedy=*/true)},
      {"self", std::make_shared<SelfDraftSource>(model_, SelfDraftSource::Options{})},
  };
  for (const auto& [name, source] : sources) {
    for (int k = 1; k <= 4; ++k) {
      EngineOptions options;
      options.max_running = 4;       // 6 requests: some wait, then join a speculating batch
      options.max_step_tokens = 24;  // chunked prefill beside verification
      auto engine = MakeEngine(source, options);
      std::vector<GenerationRequest> run = requests;
      for (size_t r = 0; r + 1 < run.size(); ++r) run[r].num_draft_tokens = k;
      auto results = RunAll(*engine, run);
      int64_t drafted = 0, accepted = 0;
      for (size_t r = 0; r < run.size(); ++r) {
        SCOPED_TRACE(name + " k=" + std::to_string(k) + " request " + std::to_string(r));
        ASSERT_TRUE(results[r]->last->status.ok()) << results[r]->last->status;
        EXPECT_EQ(results[r]->tokens, expected[r]->tokens);
        EXPECT_EQ(results[r]->text, expected[r]->text);
        EXPECT_EQ(results[r]->last->finish, FinishReason::kLength);
        ASSERT_EQ(results[r]->logprobs.size(), expected[r]->logprobs.size());
        for (size_t t = 0; t < results[r]->logprobs.size(); ++t) {
          EXPECT_NEAR(results[r]->logprobs[t].logprob, expected[r]->logprobs[t].logprob, 1e-4);
          ASSERT_EQ(results[r]->logprobs[t].top.size(), 3u);
          EXPECT_EQ(results[r]->logprobs[t].top[0].token_id,
                    expected[r]->logprobs[t].top[0].token_id);
        }
        drafted += results[r]->last->speculative.drafted;
        accepted += results[r]->last->speculative.accepted;
      }
      EXPECT_EQ(results.back()->last->speculative.drafted, 0);  // the plain one
      EXPECT_GT(drafted, 0);
      const EngineStats stats = engine->stats();
      EXPECT_EQ(stats.speculative.drafted, drafted);
      EXPECT_EQ(stats.speculative.accepted, accepted);
      EXPECT_EQ(stats.kv_cache_bytes, 0u);
      if (name == "replay") {
        EXPECT_EQ(accepted, drafted);
      } else if (name == "adversarial") {
        EXPECT_EQ(accepted, 0);
      } else if (name == "partial") {
        EXPECT_GT(accepted, 0);
        EXPECT_LT(accepted, drafted);
      }
    }
  }
}

TEST_F(SpeculativeTest, ReplayedDraftsAreAllAcceptedInFewerTargetSteps) {
  const std::vector<GenerationRequest> requests = {Request(Prompt(1, 9), 21, 4)};
  std::vector<ScriptedDraftSource::Script> scripts;
  auto expected = Plain(requests, &scripts);

  auto plain = MakeEngine(nullptr);
  GenerationRequest plain_request = requests[0];
  plain_request.num_draft_tokens = 0;
  RunAll(*plain, {plain_request});
  EXPECT_EQ(plain->stats().steps, 21u);  // one prefill step, then one step per token

  auto engine = MakeEngine(std::make_shared<ScriptedDraftSource>(scripts, kVocab, 1.0));
  auto results = RunAll(*engine, requests);
  EXPECT_EQ(results[0]->tokens, expected[0]->tokens);
  // The prefill step gives token 1; each later step 4 drafts + 1 bonus: 6, 11, 16, 21.
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.steps, 5u);
  EXPECT_EQ(stats.generated_tokens, 21u);
  EXPECT_EQ(stats.speculative.drafted, 16);
  EXPECT_EQ(stats.speculative.accepted, 16);
  EXPECT_EQ(results[0]->last->speculative.drafted, 16);
  EXPECT_EQ(results[0]->last->speculative.accepted, 16);
  EXPECT_EQ(results[0]->last->completion_tokens, 21);
}

TEST_F(SpeculativeTest, AdversarialDraftsAreAllRejectedAndCostNoExtraSteps) {
  const std::vector<GenerationRequest> requests = {Request(Prompt(2, 6), 15, 3)};
  std::vector<ScriptedDraftSource::Script> scripts;
  auto expected = Plain(requests, &scripts);
  auto engine = MakeEngine(std::make_shared<ScriptedDraftSource>(scripts, kVocab, 0.0));
  auto results = RunAll(*engine, requests);
  EXPECT_EQ(results[0]->tokens, expected[0]->tokens);
  const EngineStats stats = engine->stats();
  EXPECT_EQ(stats.steps, 15u);
  EXPECT_GT(stats.speculative.drafted, 0);
  EXPECT_EQ(stats.speculative.accepted, 0);
}

// Stop ids, stop strings and max_tokens that fall inside a fully accepted draft end the stream
// exactly where plain decoding ends it.
TEST_F(SpeculativeTest, StopsInsideADraftEndTheStreamThere) {
  GenerationRequest base = Request(Prompt(3, 5), 40, 4);
  std::vector<ScriptedDraftSource::Script> scripts;
  auto free_run = Plain({base}, &scripts);
  ASSERT_EQ(free_run[0]->tokens.size(), 40u);
  auto source = std::make_shared<ScriptedDraftSource>(scripts, kVocab, 1.0);

  std::vector<GenerationRequest> requests;
  // A stop id that first appears at some output index i ≥ 2 (mid-draft for most i).
  GenerationRequest stop_id = base;
  const std::vector<int32_t>& out = free_run[0]->tokens;
  for (size_t i = 2; i < out.size(); ++i) {
    if (std::find(out.begin(), out.begin() + static_cast<long>(i), out[i]) ==
        out.begin() + static_cast<long>(i)) {
      stop_id.stopping.stop_token_ids = {out[i]};
      break;
    }
  }
  ASSERT_FALSE(stop_id.stopping.stop_token_ids.empty());
  requests.push_back(stop_id);
  // A stop string from the middle of the text.
  ASSERT_GE(free_run[0]->text.size(), 12u);
  GenerationRequest stop_string = base;
  stop_string.stopping.stop = {free_run[0]->text.substr(free_run[0]->text.size() / 2, 3),
                               "never-produced"};
  requests.push_back(stop_string);
  // max_tokens not a multiple of k + 1.
  GenerationRequest length = base;
  length.stopping.max_tokens = 8;
  requests.push_back(length);

  auto expected = Plain(requests, nullptr);
  for (int k : {1, 2, 4}) {
    auto engine = MakeEngine(source);
    std::vector<GenerationRequest> run = requests;
    for (GenerationRequest& request : run) request.num_draft_tokens = k;
    auto results = RunAll(*engine, run);
    for (size_t r = 0; r < run.size(); ++r) {
      SCOPED_TRACE("k=" + std::to_string(k) + " request " + std::to_string(r));
      EXPECT_EQ(results[r]->tokens, expected[r]->tokens);
      EXPECT_EQ(results[r]->text, expected[r]->text);
      EXPECT_EQ(results[r]->last->finish, expected[r]->last->finish);
      EXPECT_EQ(results[r]->last->completion_tokens, expected[r]->last->completion_tokens);
    }
    EXPECT_EQ(expected[0]->last->finish, FinishReason::kStop);
    EXPECT_EQ(expected[1]->last->finish, FinishReason::kStop);
    EXPECT_LT(expected[0]->tokens.size(), 40u);
    EXPECT_LT(expected[1]->text.size(), free_run[0]->text.size());
    EXPECT_EQ(results[2]->tokens.size(), 8u);
  }
}

// The same weights with an EOS id the greedy output reaches mid-draft.
TEST_F(SpeculativeTest, EosInsideADraftEndsTheStreamUnlessIgnored) {
  GenerationRequest base = Request(Prompt(6, 5), 30, 4);
  std::vector<ScriptedDraftSource::Script> scripts;
  auto free_run = Plain({base}, &scripts);
  const std::vector<int32_t>& out = free_run[0]->tokens;
  size_t eos_at = 0;
  for (size_t i = 3; i < out.size() && eos_at == 0; ++i) {
    if (std::find(out.begin(), out.begin() + static_cast<long>(i), out[i]) ==
        out.begin() + static_cast<long>(i)) {
      eos_at = i;
    }
  }
  ASSERT_GT(eos_at, 0u);
  testing_util::ScratchDir dir;
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok());
  config->num_hidden_layers = 2;
  config->eos_token_ids = {out[eos_at]};
  SynthOptions options;
  options.dtype = DType::kF32;
  options.seed = 5;
  options.write_tokenizer = false;
  absl::StatusOr<std::unique_ptr<PreparedModel>> model =
      testing_util::WriteAndLoad(dir.path(), *config, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions engine_options;
  engine_options.max_context = 256;
  engine_options.draft_source = std::make_shared<ScriptedDraftSource>(scripts, kVocab, 1.0);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(
      std::shared_ptr<const PreparedModel>(std::move(*model)), nullptr, engine_options);
  ASSERT_TRUE(engine.ok());
  GenerationRequest eos = base;
  eos.stopping.ignore_eos = false;
  auto results = RunAll(**engine, {eos, base});
  EXPECT_EQ(results[0]->last->finish, FinishReason::kEos);
  EXPECT_EQ(results[0]->tokens, std::vector<int32_t>(out.begin(), out.begin() + eos_at + 1));
  EXPECT_EQ(results[1]->last->finish, FinishReason::kLength);
  EXPECT_EQ(results[1]->tokens, out);
}

// A cache sized exactly for prompt + max_tokens only holds out if every rejected position is
// rolled back; and the hidden states the target hands over must match what the same model
// computes alone at every kept position, which fails if a stale key/value stays in the cache.
TEST_F(SpeculativeTest, RollbackKeepsTheCacheExact) {
  SelfDraftSource::Options draft;
  draft.greedy = false;
  draft.temperature = 1.5f;
  draft.uniform_mix = 0.2f;
  draft.check_hidden = true;
  draft.seed = 9;
  auto source = std::make_shared<SelfDraftSource>(model_, draft);
  EngineOptions options;
  options.max_context = 5 + 60;
  auto engine = MakeEngine(source, options);
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 3; ++r) {
    requests.push_back(Request(Prompt(r, 5), 60, 4));
    requests.back().sampling.temperature = 1.0f;
    requests.back().sampling.seed = 100 + r;
  }
  auto results = RunAll(*engine, requests);
  int64_t drafted = 0, accepted = 0;
  for (auto& result : results) {
    ASSERT_TRUE(result->last->status.ok()) << result->last->status;
    EXPECT_EQ(result->last->finish, FinishReason::kLength);
    EXPECT_EQ(result->tokens.size(), 60u);
    drafted += result->last->speculative.drafted;
    accepted += result->last->speculative.accepted;
  }
  // Both outcomes occur, so there were rollbacks of several lengths.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  const SelfDraftSource::HiddenCheck check = source->hidden_check();
  EXPECT_EQ(check.contract_violations, 0);
  // Every kept position before the last proposal: at least prompt + 50 per request.
  EXPECT_GE(check.rows_compared, 3 * 55);
  EXPECT_LT(check.max_abs_diff, 1e-3f) << "target hidden states disagree with a plain forward";
}

// The Forward seam for MTP heads: hidden rows for every new token, logits unchanged by asking.
TEST_F(SpeculativeTest, ForwardReturnsFinalNormHiddenStatesForEveryToken) {
  const std::vector<int32_t> tokens = {5, 17, 300, 42, 9};
  const int64_t hidden_size = model_->config().hidden_size;
  absl::StatusOr<KvCache> a = model_->NewCache(8), b = model_->NewCache(8);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> logits_plain, logits_with, hidden;
  SequenceChunk chunk{&*a, tokens, true};
  ASSERT_TRUE(model_->Forward({&chunk, 1}, &logits_plain).ok());
  chunk.cache = &*b;
  ASSERT_TRUE(model_->Forward({&chunk, 1}, &logits_with, &hidden).ok());
  EXPECT_EQ(logits_plain, logits_with);
  ASSERT_EQ(hidden.size(), tokens.size() * static_cast<size_t>(hidden_size));
  // Token by token with rollback in between: same rows. Row 2 again after a rejected detour.
  absl::StatusOr<KvCache> c = model_->NewCache(8);
  ASSERT_TRUE(c.ok());
  float max_diff = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (t == 3) {  // feed two wrong tokens, then roll them back
      const std::vector<int32_t> wrong = {1, 2};
      std::vector<float> ignored;
      SequenceChunk detour{&*c, wrong, true};
      ASSERT_TRUE(model_->Forward({&detour, 1}, &ignored).ok());
      c->Truncate(3);
    }
    std::vector<float> logits, row;
    SequenceChunk one{&*c, std::span<const int32_t>(tokens).subspan(t, 1), false};
    ASSERT_TRUE(model_->Forward({&one, 1}, &logits, &row).ok());
    ASSERT_EQ(row.size(), static_cast<size_t>(hidden_size));
    for (int64_t j = 0; j < hidden_size; ++j) {
      max_diff = std::max(max_diff, std::abs(row[j] - hidden[t * hidden_size + j]));
    }
  }
  EXPECT_EQ(c->length(), 5);
  EXPECT_LT(max_diff, 1e-4f);
  // After the final norm the rows have RMS ≈ the norm weights' (≈ 1 for synth weights).
  double sum_sq = 0;
  for (int64_t j = 0; j < hidden_size; ++j) sum_sq += double(hidden[j]) * hidden[j];
  EXPECT_NEAR(std::sqrt(sum_sq / hidden_size), 1.0, 0.1);
}

TEST_F(SpeculativeTest, DraftTokensNeedADraftSource) {
  auto engine = MakeEngine(nullptr);
  absl::Status status = engine->Submit(Request({1, 2}, 4, 2), [](GenerationUpdate) {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("draft source"), std::string::npos) << status;
  EXPECT_TRUE(engine->Submit(Request({1, 2}, 4, 0), [](GenerationUpdate) {}).ok());

  auto source = std::make_shared<NoisyDraftSource>(kVocab, 1);
  auto with_source = MakeEngine(source);
  EXPECT_EQ(with_source->Submit(Request({1}, 4, -1), [](GenerationUpdate) {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(with_source->Submit(Request({1}, 4, kMaxDraftTokens + 1), [](GenerationUpdate) {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  EngineOptions options;
  options.default_num_draft_tokens = 3;
  EXPECT_EQ(Engine::Create(model_, tokenizer_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SpeculativeTest, TheEngineDefaultAppliesOnlyWhenTheRequestIsSilent) {
  EngineOptions options;
  options.default_num_draft_tokens = 3;
  auto engine = MakeEngine(std::make_shared<NoisyDraftSource>(kVocab, 1, 1.0f, true), options);
  GenerationRequest silent = Request(Prompt(4, 4), 6, 0);
  silent.num_draft_tokens.reset();
  GenerationRequest off = Request(Prompt(4, 4), 6, 0);
  auto results = RunAll(*engine, {silent, off});
  EXPECT_GT(results[0]->last->speculative.drafted, 0);
  EXPECT_EQ(results[1]->last->speculative.drafted, 0);
  EXPECT_EQ(results[0]->tokens, results[1]->tokens);
}

TEST_F(SpeculativeTest, CancelWhileSpeculatingFreesEverything) {
  auto engine = MakeEngine(std::make_shared<SelfDraftSource>(model_, SelfDraftSource::Options{}));
  StreamCollector result;
  absl::StatusOr<uint64_t> id = engine->Submit(Request(Prompt(5, 4), 200, 4), result.Callback());
  ASSERT_TRUE(id.ok());
  while (engine->stats().generated_tokens < 3) absl::SleepFor(absl::Milliseconds(1));
  engine->Cancel(*id);
  result.Wait();
  EXPECT_EQ(result.last->finish, FinishReason::kCancelled);
  EXPECT_LT(result.tokens.size(), 200u);
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
  EXPECT_EQ(engine->stats().running, 0);
}

// A draft source that breaks the contract fails only its own request, with a clear status.
TEST_F(SpeculativeTest, InvalidDraftsFailTheRequest) {
  class Bad : public DraftSource {
   public:
    absl::string_view name() const override { return "bad"; }
    absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(const DraftSessionStart&) override {
      class Session : public DraftSession {
        absl::StatusOr<Draft> Propose(int32_t, std::span<const int32_t>,
                                      const HiddenStates&) override {
          return Draft{{int32_t{kVocab}}, {}};
        }
        void Commit(int32_t) override {}
      };
      return std::make_unique<Session>();
    }
  };
  auto engine = MakeEngine(std::make_shared<Bad>());
  auto results = RunAll(*engine, {Request({1, 2, 3}, 5, 2), Request({1, 2, 3}, 5, 0)});
  EXPECT_EQ(results[0]->last->status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(results[0]->last->status.message()).find("vocabulary"), std::string::npos);
  EXPECT_EQ(results[0]->tokens.size(), 1u);  // the token sampled after prefill
  EXPECT_TRUE(results[1]->last->status.ok());
  EXPECT_EQ(results[1]->tokens.size(), 5u);
}

}  // namespace
}  // namespace kiln
