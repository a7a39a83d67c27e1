// The engine with a tokenizer: streamed text, stop strings held back and cut, EOS.
#include <algorithm>

#include "absl/synchronization/notification.h"
#include "clients/synth.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

class EngineTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    ASSERT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    SynthOptions options;
    options.dtype = DType::kF32;
    options.seed = 3;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        testing_util::WriteAndLoad(dir_.path(), *config, options);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir_.path());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
    EngineOptions engine_options;
    engine_options.max_context = 512;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(model_, tokenizer_, engine_options);
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
  }

  std::unique_ptr<StreamCollector> Run(const std::string& prompt, int max_tokens,
                                       std::vector<std::string> stop = {}) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(prompt);
    EXPECT_TRUE(ids.ok());
    GenerationRequest request;
    request.prompt = *ids;
    request.stopping.max_tokens = max_tokens;
    request.stopping.stop = std::move(stop);
    request.stopping.ignore_eos = true;
    auto stream = std::make_unique<StreamCollector>();
    EXPECT_TRUE(engine_->Submit(std::move(request), stream->Callback()).ok());
    EXPECT_TRUE(stream->done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    return stream;
  }

  testing_util::ScratchDir dir_;
  std::shared_ptr<const PreparedModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTextTest, StreamedTextEqualsDecodingAllTokens) {
  auto stream = Run("Hello world, the kiln is hot.", 40);
  EXPECT_EQ(stream->last->finish, FinishReason::kLength);
  absl::StatusOr<std::string> whole = tokenizer_->Decode(stream->tokens, true);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(stream->text, *whole);
}

TEST_F(EngineTextTest, StopStringCutsTheTextAndEndsTheStream) {
  auto free_run = Run("The quick brown fox", 40);
  ASSERT_GE(free_run->text.size(), 12u);
  // A stop string taken from the middle of what greedy decoding writes.
  const std::string stop = free_run->text.substr(free_run->text.size() / 2, 3);
  const size_t first = free_run->text.find(stop);
  auto stopped = Run("The quick brown fox", 40, {stop, "never-produced-stop"});
  EXPECT_EQ(stopped->last->finish, FinishReason::kStop);
  EXPECT_EQ(stopped->text, free_run->text.substr(0, first));
  EXPECT_LE(stopped->tokens.size(), free_run->tokens.size());
}

// A token the tokenizer cannot decode (the model's vocabulary is larger than the tokenizer's)
// ends that request with a clear error instead of being dropped; the engine goes on serving.
TEST_F(EngineTextTest, ATokenTheTokenizerCannotDecodeEndsTheRequestWithAnError) {
  testing_util::ScratchDir small_dir;
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  ASSERT_TRUE(config.ok());
  config->num_hidden_layers = 1;
  config->vocab_size = 300;
  ASSERT_TRUE(WriteSynthCheckpoint(small_dir.path(), *config, SynthOptions{}).ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> small = Tokenizer::FromDirectory(small_dir.path());
  ASSERT_TRUE(small.ok()) << small.status();
  const int32_t known = (*small)->vocab_size();
  ASSERT_LT(known, model_->config().vocab_size);
  EngineOptions options;
  options.max_context = 512;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(model_, std::shared_ptr<const Tokenizer>(std::move(*small)), options);
  ASSERT_TRUE(engine.ok()) << engine.status();

  // The full-vocabulary engine shows where greedy decoding first leaves the small vocabulary.
  auto reference = Run("Hello world, the kiln is hot.", 60);
  const auto beyond = std::find_if(reference->tokens.begin(), reference->tokens.end(),
                                   [&](int32_t id) { return id >= known; });
  ASSERT_NE(beyond, reference->tokens.end()) << "greedy output stays inside the small vocabulary";
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode("Hello world, the kiln is hot.");
  ASSERT_TRUE(ids.ok());
  GenerationRequest request;
  request.prompt = *ids;
  request.stopping.max_tokens = 60;
  request.stopping.ignore_eos = true;
  StreamCollector stream;
  ASSERT_TRUE((*engine)->Submit(request, stream.Callback()).ok());
  stream.Wait(absl::Seconds(60));
  ASSERT_TRUE(stream.last.has_value());
  EXPECT_EQ(stream.last->status.code(), absl::StatusCode::kInternal) << stream.last->status;
  EXPECT_NE(stream.last->status.message().find("cannot decode"), absl::string_view::npos)
      << stream.last->status;
  // Tokens up to (and including) the undecodable one were streamed.
  EXPECT_EQ(stream.tokens, std::vector<int32_t>(reference->tokens.begin(), std::next(beyond)));
  // The engine serves the next request.
  request.prompt = {1, 2, 3};
  request.stopping.max_tokens = 2;
  StreamCollector next;
  ASSERT_TRUE((*engine)->Submit(request, next.Callback()).ok());
  next.Wait(absl::Seconds(60));
  EXPECT_TRUE(next.last->status.ok() || next.last->status.code() == absl::StatusCode::kInternal);
  EXPECT_EQ((*engine)->stats().kv_cache_bytes, 0u);
}

}  // namespace
}  // namespace kiln
