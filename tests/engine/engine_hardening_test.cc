// Nothing a request, a draft source or a client callback does can stop a model's step loop:
// failing and throwing draft sessions, callbacks that call back into the engine, the MTP
// session near the model's context limit.
#include <atomic>
#include <new>
#include <stdexcept>

#include "clients/synth.h"
#include "engine/engine.h"
#include "engine/mtp_draft_source.h"
#include "gtest/gtest.h"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tests/loaders/test_util.h"

namespace kiln {
namespace {

// How a HostileDraftSource misbehaves.
enum class Fault { kStartFails, kProposeThrowsBadAlloc, kProposeThrowsRuntimeError };

// Fails or throws on prompts whose first token is `trigger`; drafts nothing otherwise.
class HostileDraftSource : public DraftSource {
 public:
  HostileDraftSource(Fault fault, int32_t trigger) : fault_(fault), trigger_(trigger) {}
  absl::string_view name() const override { return "hostile"; }
  absl::StatusOr<std::unique_ptr<DraftSession>> StartSession(
      const DraftSessionStart& start) override {
    const bool triggered = !start.context.empty() && start.context[0] == trigger_;
    if (triggered && fault_ == Fault::kStartFails) {
      return absl::ResourceExhaustedError("hostile draft source: no room for a session");
    }
    return std::unique_ptr<DraftSession>(new Session(triggered ? fault_ : Fault::kStartFails));
  }

 private:
  class Session : public DraftSession {
   public:
    explicit Session(Fault fault) : fault_(fault) {}
    absl::StatusOr<Draft> Propose(int32_t, std::span<const int32_t>, const HiddenStates&) override {
      if (fault_ == Fault::kProposeThrowsBadAlloc) throw std::bad_alloc();
      if (fault_ == Fault::kProposeThrowsRuntimeError) throw std::runtime_error("draft exploded");
      return Draft{};
    }
    void Commit(int32_t) override {}

   private:
    Fault fault_;
  };
  Fault fault_;
  int32_t trigger_;
};

class EngineHardeningTest : public ::testing::Test {
 protected:
  static constexpr int64_t kContext = 64;

  static void SetUpTestSuite() {
    dir_ = new testing_util::ScratchDir();
    absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
    ASSERT_TRUE(config.ok());
    config->num_hidden_layers = 2;
    config->vocab_size = 512;
    config->num_mtp_layers = 1;
    config->max_position_embeddings = kContext;
    SynthOptions options;
    options.dtype = DType::kF32;
    options.write_tokenizer = false;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        testing_util::WriteAndLoad(dir_->path(), *config, options);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ((*model)->num_mtp_heads(), 1);
    model_ = std::shared_ptr<const PreparedModel>(std::move(*model));
  }
  static void TearDownTestSuite() {
    model_.reset();
    delete dir_;
  }

  static std::unique_ptr<Engine> MakeEngine(std::shared_ptr<DraftSource> source) {
    EngineOptions options;
    options.max_context = kContext;
    options.draft_source = std::move(source);
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, nullptr, options);
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

  // A plain request on `engine` completes: the loop is alive.
  static void ExpectServing(Engine& engine) {
    StreamCollector collector;
    ASSERT_TRUE(engine.Submit(Request({3, 4, 5}, 5, 0), collector.Callback()).ok());
    collector.Wait(absl::Seconds(60));
    ASSERT_TRUE(collector.last.has_value());
    EXPECT_TRUE(collector.last->status.ok()) << collector.last->status;
    EXPECT_EQ(collector.tokens.size(), 5u);
  }

  static testing_util::ScratchDir* dir_;
  static std::shared_ptr<const PreparedModel> model_;
};

testing_util::ScratchDir* EngineHardeningTest::dir_ = nullptr;
std::shared_ptr<const PreparedModel> EngineHardeningTest::model_;

TEST_F(EngineHardeningTest, AFailingDraftSessionEndsOnlyItsRequest) {
  auto engine = MakeEngine(std::make_shared<HostileDraftSource>(Fault::kStartFails, 99));
  ASSERT_NE(engine, nullptr);
  StreamCollector failing, beside;
  ASSERT_TRUE(engine->Submit(Request({1, 2, 3}, 20, 0), beside.Callback()).ok());
  ASSERT_TRUE(engine->Submit(Request({99, 2, 3}, 8, 2), failing.Callback()).ok());
  failing.Wait(absl::Seconds(60));  // a deadlock would time out here
  ASSERT_TRUE(failing.last.has_value());
  EXPECT_EQ(failing.last->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(failing.last->status.message().find("draft session"), absl::string_view::npos)
      << failing.last->status;
  beside.Wait(absl::Seconds(60));
  EXPECT_TRUE(beside.last->status.ok()) << beside.last->status;
  EXPECT_EQ(beside.tokens.size(), 20u);
  ExpectServing(*engine);
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
}

TEST_F(EngineHardeningTest, AnExceptionInAStepEndsThatStepsSequencesAndTheLoopGoesOn) {
  for (Fault fault : {Fault::kProposeThrowsBadAlloc, Fault::kProposeThrowsRuntimeError}) {
    auto engine = MakeEngine(std::make_shared<HostileDraftSource>(fault, 77));
    ASSERT_NE(engine, nullptr);
    StreamCollector thrower;
    ASSERT_TRUE(engine->Submit(Request({77, 1, 2}, 8, 2), thrower.Callback()).ok());
    thrower.Wait(absl::Seconds(60));
    ASSERT_TRUE(thrower.last.has_value());
    if (fault == Fault::kProposeThrowsBadAlloc) {
      EXPECT_EQ(thrower.last->status.code(), absl::StatusCode::kResourceExhausted)
          << thrower.last->status;
    } else {
      EXPECT_EQ(thrower.last->status.code(), absl::StatusCode::kInternal) << thrower.last->status;
      EXPECT_NE(thrower.last->status.message().find("draft exploded"), absl::string_view::npos);
    }
    ExpectServing(*engine);
    EXPECT_EQ(engine->stats().running, 0);
    EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
  }
}

TEST_F(EngineHardeningTest, CallbacksMayCallBackIntoTheEngine) {
  auto engine = MakeEngine(nullptr);
  ASSERT_NE(engine, nullptr);
  // Every update of this stream reads the stats, submits and cancels: under the engine's own
  // lock any of these would deadlock its thread.
  std::atomic<int> updates{0};
  StreamCollector collector;
  UpdateCallback inner = collector.Callback();
  Engine* raw = engine.get();
  ASSERT_TRUE(raw->Submit(Request({1, 2, 3}, 6, 0),
                          [&, raw, inner](GenerationUpdate update) {
                            updates++;
                            (void)raw->stats();
                            absl::StatusOr<uint64_t> id =
                                raw->Submit(Request({4, 5}, 1, 0), [](GenerationUpdate) {});
                            if (id.ok()) raw->Cancel(*id);
                            inner(std::move(update));
                          })
                  .ok());
  collector.Wait(absl::Seconds(60));
  EXPECT_TRUE(collector.last->status.ok());
  EXPECT_GE(updates.load(), 2);
  ExpectServing(*engine);
}

TEST_F(EngineHardeningTest, ACallbackThatThrowsDoesNotStopTheLoop) {
  auto engine = MakeEngine(nullptr);
  ASSERT_NE(engine, nullptr);
  std::atomic<int> calls{0};
  ASSERT_TRUE(engine
                  ->Submit(Request({8, 9}, 6, 0),
                           [&](GenerationUpdate) {
                             calls++;
                             throw std::runtime_error("client callback failed");
                           })
                  .ok());
  ExpectServing(*engine);
  EXPECT_GE(calls.load(), 1);
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
}

// MTP sessions used to reserve max_length + 16 positions: a speculative request within 16
// positions of the model's context limit failed there (and the failure deadlocked the engine).
TEST_F(EngineHardeningTest, MtpSpeculationNearTheContextLimitMatchesPlainGreedy) {
  absl::StatusOr<std::shared_ptr<MtpDraftSource>> source = MtpDraftSource::Create(model_);
  ASSERT_TRUE(source.ok()) << source.status();
  auto engine = MakeEngine(*source);
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 29 + 1) % 500);
  // 40 + 23 = 63 positions of a 64-position model: the whole context, minus the last token's.
  StreamCollector plain, speculative;
  ASSERT_TRUE(engine->Submit(Request(prompt, 23, 0), plain.Callback()).ok());
  plain.Wait(absl::Seconds(60));
  ASSERT_TRUE(plain.last->status.ok()) << plain.last->status;
  for (int drafts : {1, 3}) {
    StreamCollector collector;
    ASSERT_TRUE(engine->Submit(Request(prompt, 23, drafts), collector.Callback()).ok());
    collector.Wait(absl::Seconds(60));
    ASSERT_TRUE(collector.last->status.ok()) << collector.last->status;
    EXPECT_EQ(collector.tokens, plain.tokens) << drafts << " drafts";
    EXPECT_GT(collector.last->speculative.drafted, 0);
  }
  ExpectServing(*engine);
  EXPECT_EQ(engine->stats().kv_cache_bytes, 0u);
}

}  // namespace
}  // namespace kiln
