// The engine on the paged KV pool: greedy output does not depend on the block size, on prefix
// caching or on preemption; seeded sampling gives the same tokens with and without them; many
// requests sharing a long prefix prefill it once.
#include <algorithm>
#include <cstdio>

#include "clients/synth.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

class KvSchedulingTest : public ::testing::Test {
 protected:
  static constexpr int32_t kVocab = 512;

  static void SetUpTestSuite() {
    dir_ = new testing_util::ScratchDir();
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    ASSERT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    config->vocab_size = kVocab;
    SynthOptions options;
    options.dtype = DType::kF32;
    options.seed = 9;
    options.write_tokenizer = false;
    ASSERT_TRUE(WriteSynthCheckpoint(dir_->path(), *config, options).ok());
    reference_ = Load(16, 0);
    ASSERT_NE(reference_, nullptr);
  }
  static void TearDownTestSuite() {
    reference_.reset();
    delete dir_;
  }

  // The test model with a pool of `block_size` positions per block and `blocks` blocks (0: the
  // default budget).
  static std::shared_ptr<const PreparedModel> Load(int64_t block_size, int64_t blocks) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
    EXPECT_TRUE(backend.ok());
    LoadOptions options;
    options.kv_pool.block_size = block_size;
    if (blocks > 0) {
      // Two layers, keys and values, fp32.
      options.kv_pool.bytes = static_cast<uint64_t>(blocks * block_size) * 2 * 2 *
                              static_cast<uint64_t>(reference_->config().kv_dim()) * sizeof(float);
    }
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        LoadModel(dir_->path(), std::shared_ptr<Backend>(std::move(*backend)), options);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    if (blocks > 0) {
      EXPECT_EQ((*model)->kv_pool().num_blocks(), blocks);
    }
    return std::shared_ptr<const PreparedModel>(std::move(*model));
  }

  static std::unique_ptr<Engine> MakeEngine(std::shared_ptr<const PreparedModel> model,
                                            EngineOptions options) {
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(std::move(model), nullptr, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // Greedy continuation by a plain forward loop over a cache of its own.
  static std::vector<int32_t> SerialGreedy(const std::vector<int32_t>& prompt, int n) {
    return testing_util::GreedyByForwardLoop(*reference_, prompt, n);
  }

  static GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest request;
    request.prompt = std::move(prompt);
    request.stopping.max_tokens = max_tokens;
    request.stopping.ignore_eos = true;
    return request;
  }

  // `count` prompts that share their first `shared` tokens, then differ.
  static std::vector<std::vector<int32_t>> SharedPrefixPrompts(int count, int shared, int own_min) {
    std::vector<std::vector<int32_t>> prompts;
    for (int r = 0; r < count; ++r) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < shared; ++i) prompt.push_back((i * 53 + 7) % kVocab);
      for (int i = 0; i < own_min + r % 7; ++i) prompt.push_back((r * 97 + i * 31 + 3) % kVocab);
      prompts.push_back(std::move(prompt));
    }
    return prompts;
  }

  // Submits the first request alone (so that its blocks are cached), then the rest at once.
  static std::vector<std::unique_ptr<StreamCollector>> Run(
      Engine& engine, const std::vector<GenerationRequest>& requests) {
    std::vector<std::unique_ptr<StreamCollector>> results;
    for (size_t r = 0; r < requests.size(); ++r) {
      results.push_back(std::make_unique<StreamCollector>());
      absl::StatusOr<uint64_t> id = engine.Submit(requests[r], results.back()->Callback());
      EXPECT_TRUE(id.ok()) << id.status();
      if (r == 0) results[0]->Wait();
    }
    for (auto& result : results) {
      result->Wait();
      EXPECT_TRUE(result->last->status.ok()) << result->last->status;
    }
    return results;
  }

  static testing_util::ScratchDir* dir_;
  static std::shared_ptr<const PreparedModel> reference_;
};

testing_util::ScratchDir* KvSchedulingTest::dir_ = nullptr;
std::shared_ptr<const PreparedModel> KvSchedulingTest::reference_;

TEST_F(KvSchedulingTest, GreedyOutputIsTheSameForEveryBlockSizeWithAndWithoutPrefixCaching) {
  const std::vector<std::vector<int32_t>> prompts = SharedPrefixPrompts(8, 70, 1);
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const int max_tokens = 9 + static_cast<int>(r % 3);
    requests.push_back(Request(prompts[r], max_tokens));
    expected.push_back(SerialGreedy(prompts[r], max_tokens));
  }
  for (int64_t block_size : {1, 16, 64}) {
    std::shared_ptr<const PreparedModel> model = Load(block_size, 0);
    ASSERT_NE(model, nullptr);
    for (bool prefix_caching : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "block size " << block_size << ", prefix caching " << prefix_caching);
      EngineOptions options;
      options.max_context = 256;
      options.max_running = 4;
      options.max_step_tokens = 24;  // chunked prefill beside decoding sequences
      options.prefix_caching = prefix_caching;
      std::unique_ptr<Engine> engine = MakeEngine(model, options);
      ASSERT_NE(engine, nullptr);
      std::vector<std::unique_ptr<StreamCollector>> results = Run(*engine, requests);
      int64_t cached = 0;
      for (size_t r = 0; r < requests.size(); ++r) {
        EXPECT_EQ(results[r]->tokens, expected[r]) << "request " << r;
        cached += results[r]->last->cached_prompt_tokens;
        // Whole blocks of the shared prefix, never the last prompt token.
        EXPECT_EQ(results[r]->last->cached_prompt_tokens % block_size, 0);
        EXPECT_LT(results[r]->last->cached_prompt_tokens, static_cast<int32_t>(prompts[r].size()));
      }
      const EngineStats stats = engine->stats();
      EXPECT_EQ(static_cast<int64_t>(stats.cached_prompt_tokens), cached);
      if (prefix_caching) {
        // Every request after the first finds the shared prefix's whole blocks (at least).
        EXPECT_GE(cached,
                  static_cast<int64_t>(requests.size() - 1) * (70 / block_size) * block_size);
      } else {
        EXPECT_EQ(cached, 0);
      }
      EXPECT_EQ(stats.kv_cache_bytes, 0u);
    }
  }
}

TEST_F(KvSchedulingTest, APoolTooSmallForTheBatchPreemptsAndResumesWithTheSameOutput) {
  // 8 sequences of up to 20 + 30 positions (13 blocks of 4 each) against a pool of 24 blocks:
  // at most one or two run at a time, and growing ones must preempt the latest admitted.
  std::shared_ptr<const PreparedModel> small = Load(4, 24);
  ASSERT_NE(small, nullptr);
  std::vector<GenerationRequest> greedy, sampled;
  std::vector<std::vector<int32_t>> expected;
  for (int r = 0; r < 8; ++r) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 14 + r % 7; ++i) prompt.push_back((r * 41 + i * 13 + 5) % kVocab);
    greedy.push_back(Request(prompt, 30));
    expected.push_back(SerialGreedy(prompt, 30));
    GenerationRequest request = Request(prompt, 30);
    request.sampling.temperature = 0.9f;
    request.sampling.top_p = 0.95f;
    request.sampling.seed = 1000 + r;
    sampled.push_back(request);
  }
  EngineOptions options;
  options.max_context = 256;  // capped at the pool's 96 positions
  options.max_running = 8;
  options.max_step_tokens = 64;
  for (bool prefix_caching : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "prefix caching " << prefix_caching);
    options.prefix_caching = prefix_caching;
    std::unique_ptr<Engine> engine = MakeEngine(small, options);
    ASSERT_NE(engine, nullptr);
    std::vector<std::unique_ptr<StreamCollector>> results;
    for (const GenerationRequest& request : greedy) {
      results.push_back(std::make_unique<StreamCollector>());
      ASSERT_TRUE(engine->Submit(request, results.back()->Callback()).ok());
    }
    for (size_t r = 0; r < results.size(); ++r) {
      results[r]->Wait();
      ASSERT_TRUE(results[r]->last->status.ok()) << results[r]->last->status;
      EXPECT_EQ(results[r]->tokens, expected[r]) << "request " << r;
      EXPECT_EQ(results[r]->last->finish, FinishReason::kLength);
    }
    EXPECT_GT(engine->stats().preemptions, 0u);
    EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);

    // Seeded sampling: the same tokens as on a pool that never preempts.
    std::unique_ptr<Engine> roomy = MakeEngine(reference_, options);
    ASSERT_NE(roomy, nullptr);
    const uint64_t preemptions_before = engine->stats().preemptions;
    std::vector<std::unique_ptr<StreamCollector>> tight_results, roomy_results;
    for (const GenerationRequest& request : sampled) {
      tight_results.push_back(std::make_unique<StreamCollector>());
      roomy_results.push_back(std::make_unique<StreamCollector>());
      ASSERT_TRUE(engine->Submit(request, tight_results.back()->Callback()).ok());
      ASSERT_TRUE(roomy->Submit(request, roomy_results.back()->Callback()).ok());
    }
    for (size_t r = 0; r < sampled.size(); ++r) {
      tight_results[r]->Wait();
      roomy_results[r]->Wait();
      EXPECT_EQ(tight_results[r]->tokens, roomy_results[r]->tokens) << "request " << r;
    }
    EXPECT_GT(engine->stats().preemptions, preemptions_before);
    EXPECT_EQ(roomy->stats().preemptions, 0u);
  }
}

TEST_F(KvSchedulingTest, SixtyFourConcurrentRequestsSharingALongPrefixMatchSerialGreedy) {
  constexpr int kRequests = 64;
  constexpr int kShared = 192;
  const std::vector<std::vector<int32_t>> prompts = SharedPrefixPrompts(kRequests, kShared, 2);
  std::vector<std::vector<int32_t>> expected;
  for (const std::vector<int32_t>& prompt : prompts) expected.push_back(SerialGreedy(prompt, 6));
  EngineOptions options;
  options.max_context = 512;
  std::unique_ptr<Engine> engine = MakeEngine(reference_, options);
  ASSERT_NE(engine, nullptr);
  std::vector<std::unique_ptr<StreamCollector>> results;
  for (const std::vector<int32_t>& prompt : prompts) {
    results.push_back(std::make_unique<StreamCollector>());
    ASSERT_TRUE(engine->Submit(Request(prompt, 6), results.back()->Callback()).ok());
  }
  for (int r = 0; r < kRequests; ++r) {
    results[r]->Wait();
    ASSERT_TRUE(results[r]->last->status.ok()) << results[r]->last->status;
    EXPECT_EQ(results[r]->tokens, expected[r]) << "request " << r;
  }
  const EngineStats stats = engine->stats();
  const double hit_rate =
      static_cast<double>(stats.cached_prompt_tokens) / static_cast<double>(stats.prompt_tokens);
  std::printf("prefix cache: %llu of %llu prompt tokens served from cache (hit rate %.3f)\n",
              static_cast<unsigned long long>(stats.cached_prompt_tokens),
              static_cast<unsigned long long>(stats.prompt_tokens), hit_rate);
  // All but the requests admitted in the first step (before any block was computed) reuse the
  // whole shared blocks: 192 of ~197 tokens each.
  EXPECT_GT(hit_rate, 0.8);
}

TEST_F(KvSchedulingTest, SeededSamplingIsTheSameWithAndWithoutPrefixCaching) {
  const std::vector<std::vector<int32_t>> prompts = SharedPrefixPrompts(6, 48, 3);
  std::vector<GenerationRequest> requests;
  for (size_t r = 0; r < prompts.size(); ++r) {
    GenerationRequest request = Request(prompts[r], 16);
    request.sampling.temperature = 1.0f;
    request.sampling.top_k = 40;
    request.sampling.seed = 77 + r;
    requests.push_back(request);
  }
  std::vector<std::vector<int32_t>> outputs[2];
  for (bool prefix_caching : {false, true}) {
    EngineOptions options;
    options.max_context = 256;
    options.prefix_caching = prefix_caching;
    std::unique_ptr<Engine> engine = MakeEngine(reference_, options);
    ASSERT_NE(engine, nullptr);
    for (auto& result : Run(*engine, requests)) {
      outputs[prefix_caching].push_back(result->tokens);
    }
    EXPECT_EQ(engine->stats().cached_prompt_tokens > 0, prefix_caching);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST_F(KvSchedulingTest, ARequestThePoolCanNeverHoldFailsWithAClearError) {
  std::shared_ptr<const PreparedModel> small = Load(4, 6);  // 24 positions
  ASSERT_NE(small, nullptr);
  EngineOptions options;
  options.max_context = 256;
  std::unique_ptr<Engine> engine = MakeEngine(small, options);
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> long_prompt(30, 5);
  absl::StatusOr<uint64_t> refused = engine->Submit(Request(long_prompt, 4), [](auto) {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("context"), absl::string_view::npos)
      << refused.status();
  // The model keeps serving requests that fit.
  StreamCollector ok;
  ASSERT_TRUE(engine->Submit(Request({1, 2, 3}, 8), ok.Callback()).ok());
  ok.Wait();
  EXPECT_TRUE(ok.last->status.ok());
  EXPECT_EQ(ok.tokens.size(), 8u);
}

}  // namespace
}  // namespace kiln
