#include "engine/engine.h"

#include <algorithm>

#include "absl/synchronization/notification.h"
#include "clients/synth.h"
#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

// Collects the stream of one request.
class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing_util::ScratchDir();
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    ASSERT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    config->vocab_size = 512;
    SynthOptions options;
    options.dtype = DType::kF32;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        testing_util::WriteAndLoad(dir_->path(), *config, options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::shared_ptr<const PreparedModel>(std::move(*model));
  }
  static void TearDownTestSuite() {
    model_.reset();
    delete dir_;
  }

  std::unique_ptr<Engine> MakeEngine(EngineOptions options = {}) {
    options.max_context = 256;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, nullptr, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(*engine);
  }

  // Greedy generation with a plain forward loop, for comparison.
  static std::vector<int32_t> ManualGreedy(const std::vector<int32_t>& prompt, int n) {
    return testing_util::GreedyByForwardLoop(*model_, prompt, n);
  }

  static GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest request;
    request.prompt = std::move(prompt);
    request.stopping.max_tokens = max_tokens;
    return request;
  }

  static testing_util::ScratchDir* dir_;
  static std::shared_ptr<const PreparedModel> model_;
};

testing_util::ScratchDir* EngineTest::dir_ = nullptr;
std::shared_ptr<const PreparedModel> EngineTest::model_;

TEST_F(EngineTest, GreedyMatchesAPlainForwardLoop) {
  auto engine = MakeEngine();
  StreamCollector collector;
  ASSERT_TRUE(engine->Submit(Request({1, 2, 3, 4, 5}, 12), collector.Callback()).ok());
  collector.Wait();
  EXPECT_EQ(collector.tokens, ManualGreedy({1, 2, 3, 4, 5}, 12));
  EXPECT_EQ(collector.last->finish, FinishReason::kLength);
  EXPECT_EQ(collector.last->prompt_tokens, 5);
  EXPECT_EQ(collector.last->completion_tokens, 12);
  EXPECT_GT(collector.last->total_seconds, 0);
  EXPECT_LE(collector.last->time_to_first_token_seconds, collector.last->total_seconds);
}

TEST_F(EngineTest, ConcurrentRequestsMatchSerialRuns) {
  EngineOptions options;
  options.max_running = 5;
  options.max_step_tokens = 16;  // forces chunked prefill beside decoding sequences
  auto engine = MakeEngine(options);
  constexpr int kRequests = 12;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<StreamCollector>> collectors;
  for (int r = 0; r < kRequests; ++r) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 3 + 4 * r; ++i) prompt.push_back((r * 31 + i * 7) % 512);
    prompts.push_back(prompt);
    collectors.push_back(std::make_unique<StreamCollector>());
    ASSERT_TRUE(engine->Submit(Request(prompt, 6 + r % 4), collectors.back()->Callback()).ok());
  }
  for (int r = 0; r < kRequests; ++r) {
    collectors[r]->Wait();
    EXPECT_EQ(collectors[r]->tokens, ManualGreedy(prompts[r], 6 + r % 4)) << "request " << r;
  }
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
}

TEST_F(EngineTest, StopTokenIdsEndTheStream) {
  const std::vector<int32_t> expected = ManualGreedy({7, 8, 9}, 10);
  auto engine = MakeEngine();
  GenerationRequest request = Request({7, 8, 9}, 10);
  request.stopping.stop_token_ids = {expected[3]};
  StreamCollector collector;
  ASSERT_TRUE(engine->Submit(std::move(request), collector.Callback()).ok());
  collector.Wait();
  const auto first = std::find(expected.begin(), expected.end(), expected[3]);
  EXPECT_EQ(collector.tokens, std::vector<int32_t>(expected.begin(), first + 1));
  EXPECT_EQ(collector.last->finish, FinishReason::kStop);
}

TEST_F(EngineTest, CancelEndsTheStreamAndFreesTheCache) {
  auto engine = MakeEngine();
  StreamCollector collector;
  absl::StatusOr<uint64_t> id = engine->Submit(Request({1, 2, 3}, 200), collector.Callback());
  ASSERT_TRUE(id.ok());
  engine->Cancel(*id);
  collector.Wait();
  EXPECT_EQ(collector.last->finish, FinishReason::kCancelled);
  EXPECT_LT(collector.tokens.size(), 200u);
  // Unknown and finished ids are ignored.
  engine->Cancel(*id);
  engine->Cancel(987654);
  StreamCollector next;
  ASSERT_TRUE(engine->Submit(Request({1, 2, 3}, 3), next.Callback()).ok());
  next.Wait();
  EXPECT_EQ(next.tokens.size(), 3u);
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
  EXPECT_EQ(engine->stats().running, 0);
}

TEST_F(EngineTest, FullQueueIsRefused) {
  EngineOptions options;
  options.max_running = 1;
  options.max_queued = 2;
  auto engine = MakeEngine(options);
  std::vector<std::unique_ptr<StreamCollector>> collectors;
  int refused = 0;
  for (int i = 0; i < 8; ++i) {
    collectors.push_back(std::make_unique<StreamCollector>());
    absl::StatusOr<uint64_t> id =
        engine->Submit(Request({1, 2}, 100), collectors.back()->Callback());
    if (!id.ok()) {
      EXPECT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_NE(std::string(id.status().message()).find("queue"), std::string::npos);
      ++refused;
      collectors.pop_back();
    }
  }
  EXPECT_GE(refused, 4);
  engine->Shutdown(/*drain=*/false);
  for (auto& collector : collectors) {
    collector->Wait();
    EXPECT_EQ(collector->last->finish, FinishReason::kCancelled);
  }
}

TEST_F(EngineTest, BadRequestsNameTheField) {
  auto engine = MakeEngine();
  auto submit = [&](GenerationRequest request) {
    return engine->Submit(std::move(request), [](GenerationUpdate) {}).status();
  };
  EXPECT_EQ(submit(Request({}, 4)).code(), absl::StatusCode::kInvalidArgument);
  absl::Status status = submit(Request({1, 600}, 4));
  EXPECT_NE(std::string(status.message()).find("600"), std::string::npos);
  GenerationRequest bad_top_p = Request({1}, 4);
  bad_top_p.sampling.top_p = 2;
  EXPECT_NE(std::string(submit(bad_top_p).message()).find("top_p"), std::string::npos);
  EXPECT_NE(std::string(submit(Request({1}, 0)).message()).find("max_tokens"), std::string::npos);
  GenerationRequest stops = Request({1}, 4);
  stops.stopping.stop = {"\n"};
  EXPECT_NE(std::string(submit(stops).message()).find("tokenizer"), std::string::npos);
  EXPECT_EQ(submit(Request(std::vector<int32_t>(300, 1), 4)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleAndDrainFinishesWork) {
  auto run = [&](uint64_t seed) {
    auto engine = MakeEngine();
    GenerationRequest request = Request({4, 5, 6}, 16);
    request.sampling.temperature = 1.0f;
    request.sampling.seed = seed;
    StreamCollector collector;
    EXPECT_TRUE(engine->Submit(std::move(request), collector.Callback()).ok());
    engine->Shutdown(/*drain=*/true);  // returns after the request finished
    EXPECT_TRUE(collector.done.HasBeenNotified());
    EXPECT_EQ(collector.last->finish, FinishReason::kLength);
    EXPECT_EQ(engine->Submit(Request({1}, 1), [](GenerationUpdate) {}).status().code(),
              absl::StatusCode::kUnavailable);
    return collector.tokens;
  };
  const std::vector<int32_t> first = run(11);
  EXPECT_EQ(first, run(11));
  EXPECT_EQ(first.size(), 16u);
}

}  // namespace
}  // namespace kiln
