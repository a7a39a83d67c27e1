// The engine on the trained default model (checkpoints/kiln-brown) with drafts from its own MTP
// head: greedy output with 1, 2 and 3 draft tokens per step equals greedy output without
// speculation (and a plain forward loop), on held-out Brown Corpus prompts, and the head's
// drafts are accepted at a rate only a trained head reaches.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/mtp_draft_source.h"
#include "gtest/gtest.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "nlohmann/json.hpp"
#include "tests/engine/stream_collector.h"
#include "tests/engine/synth_model.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class DefaultModelEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok()) << backend.status();
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        LoadModel(KILN_DEFAULT_MODEL_DIR, std::shared_ptr<Backend>(std::move(*backend)));
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = new std::shared_ptr<const PreparedModel>(std::move(*model));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
        Tokenizer::FromDirectory(KILN_DEFAULT_MODEL_DIR);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = new std::shared_ptr<const Tokenizer>(std::move(*tokenizer));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokenizer_;
  }

  // Openings of held-out text: `count` prompts of `length` tokens, from windows far apart.
  static std::vector<std::vector<int32_t>> HeldOutPrompts(int count, int length) {
    std::ifstream in(fs::path(KILN_TEST_DATA_DIR) / "kiln-brown" / "heldout_reference.json");
    const nlohmann::json json = nlohmann::json::parse(in);
    const std::vector<int32_t> ids = json.at("ids").get<std::vector<int32_t>>();
    std::vector<std::vector<int32_t>> prompts;
    const size_t stride = ids.size() / static_cast<size_t>(count);
    for (int i = 0; i < count; ++i) {
      auto begin = ids.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * stride);
      prompts.emplace_back(begin, begin + length);
    }
    return prompts;
  }

  // Greedy outputs of all prompts, run concurrently, with `drafts` tokens per step.
  static std::vector<std::vector<int32_t>> Generate(
      const std::vector<std::vector<int32_t>>& prompts, int max_tokens, int drafts,
      SpeculativeStats* stats) {
    EngineOptions options;
    options.max_context = 512;
    if (drafts > 0) {
      absl::StatusOr<std::shared_ptr<MtpDraftSource>> source = MtpDraftSource::Create(*model_);
      EXPECT_TRUE(source.ok()) << source.status();
      options.draft_source = *source;
    }
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*model_, *tokenizer_, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<std::unique_ptr<StreamCollector>> streams;
    for (const std::vector<int32_t>& prompt : prompts) {
      GenerationRequest request;
      request.prompt = prompt;
      request.stopping.max_tokens = max_tokens;
      request.stopping.ignore_eos = true;
      request.num_draft_tokens = drafts;
      streams.push_back(std::make_unique<StreamCollector>());
      EXPECT_TRUE((*engine)->Submit(request, streams.back()->Callback()).ok());
    }
    std::vector<std::vector<int32_t>> outputs;
    for (auto& stream : streams) {
      stream->Wait();
      EXPECT_TRUE(stream->last->status.ok()) << stream->last->status;
      outputs.push_back(stream->tokens);
      if (stats != nullptr) {
        stats->drafted += stream->last->speculative.drafted;
        stats->accepted += stream->last->speculative.accepted;
      }
    }
    return outputs;
  }

  static std::shared_ptr<const PreparedModel>* model_;
  static std::shared_ptr<const Tokenizer>* tokenizer_;
};

std::shared_ptr<const PreparedModel>* DefaultModelEngineTest::model_ = nullptr;
std::shared_ptr<const Tokenizer>* DefaultModelEngineTest::tokenizer_ = nullptr;

TEST_F(DefaultModelEngineTest, GreedySpeculationEqualsPlainGreedyAtDepthsOneToThree) {
  constexpr int kTokens = 48;
  const std::vector<std::vector<int32_t>> prompts = HeldOutPrompts(4, 40);
  const std::vector<std::vector<int32_t>> plain = Generate(prompts, kTokens, 0, nullptr);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(plain[i], testing_util::GreedyByForwardLoop(**model_, prompts[i], kTokens));
  }
  for (int drafts = 1; drafts <= 3; ++drafts) {
    SCOPED_TRACE("draft tokens: " + std::to_string(drafts));
    SpeculativeStats stats;
    EXPECT_EQ(Generate(prompts, kTokens, drafts, &stats), plain);
    ASSERT_GT(stats.drafted, 0);
    const double acceptance =
        static_cast<double>(stats.accepted) / static_cast<double>(stats.drafted);
    // A head with random weights is accepted about once in the vocabulary size (4,096); the
    // trained head's first draft token is accepted about half the time on this text.
    EXPECT_GT(acceptance, drafts == 1 ? 0.3 : 0.15) << stats.accepted << " of " << stats.drafted;
  }
}

// Requests that name no draft depth get the MTP source's: 2 for greedy ones, none at
// temperature 0.8, and only while they run alone; an explicit depth drafts whatever runs.
TEST_F(DefaultModelEngineTest, DefaultDraftsFollowTheSamplingAndPauseInCrowdedSteps) {
  absl::StatusOr<std::shared_ptr<MtpDraftSource>> source = MtpDraftSource::Create(*model_);
  ASSERT_TRUE(source.ok()) << source.status();
  SamplingParams greedy, hot;
  hot.temperature = 0.8f;
  EXPECT_EQ((*source)->default_num_draft_tokens(greedy), 2);
  EXPECT_EQ((*source)->default_num_draft_tokens(hot), 0);
  EngineOptions options;
  options.max_context = 512;
  options.draft_source = *source;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*model_, *tokenizer_, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->default_num_draft_tokens(), 2);
  const std::vector<std::vector<int32_t>> prompts = HeldOutPrompts(3, 24);
  auto request = [&](size_t prompt, int max_tokens, SamplingParams sampling,
                     std::optional<int32_t> drafts) {
    GenerationRequest r;
    r.prompt = prompts[prompt];
    r.sampling = sampling;
    r.sampling.seed = 3;
    r.stopping.max_tokens = max_tokens;
    r.stopping.ignore_eos = true;
    r.num_draft_tokens = drafts;
    return r;
  };
  auto run = [&](const std::vector<GenerationRequest>& requests) {
    std::vector<std::unique_ptr<StreamCollector>> streams;
    for (const GenerationRequest& r : requests) {
      streams.push_back(std::make_unique<StreamCollector>());
      EXPECT_TRUE((*engine)->Submit(r, streams.back()->Callback()).ok());
    }
    for (auto& stream : streams) stream->Wait();
    return streams;
  };
  // Alone: greedy drafts two tokens per step; sampled at 0.8 does not speculate.
  auto alone = run({request(0, 32, greedy, std::nullopt)});
  EXPECT_GT(alone[0]->last->speculative.drafted, 0);
  EXPECT_EQ(alone[0]->tokens, testing_util::GreedyByForwardLoop(**model_, prompts[0], 32));
  auto sampled = run({request(0, 32, hot, std::nullopt)});
  EXPECT_EQ(sampled[0]->last->speculative.drafted, 0);
  // Two together: neither drafts while both run; the longer one drafts once alone. An explicit
  // depth drafts in a crowd too.
  auto crowd = run({request(1, 48, greedy, std::nullopt), request(2, 8, greedy, std::nullopt),
                    request(0, 16, greedy, 2)});
  EXPECT_GT(crowd[0]->last->speculative.drafted, 0);
  EXPECT_EQ(crowd[1]->last->speculative.drafted, 0);
  EXPECT_GT(crowd[2]->last->speculative.drafted, 0);
  for (size_t i = 0; i < crowd.size(); ++i) {
    const int n = i == 0 ? 48 : i == 1 ? 8 : 16;
    EXPECT_EQ(crowd[i]->tokens, testing_util::GreedyByForwardLoop(**model_,
                                                                  prompts[i == 0   ? 1
                                                                          : i == 1 ? 2
                                                                                   : 0],
                                                                  n))
        << "request " << i;
  }
}

TEST_F(DefaultModelEngineTest, GreedyTextReadsAsEnglish) {
  absl::StatusOr<std::vector<int32_t>> prompt =
      (*tokenizer_)->Encode("The jury said it would", /*add_special_tokens=*/false);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::vector<int32_t> output = Generate({*prompt}, 32, 0, nullptr)[0];
  absl::StatusOr<std::string> text = (*tokenizer_)->Decode(output, /*skip_special_tokens=*/true);
  ASSERT_TRUE(text.ok()) << text.status();
  // Plain words and punctuation with spaces between them: at least 15 words, most of them
  // lower-case words a random model would not string together.
  int words = 0, common = 0;
  const std::vector<std::string> function_words = {"the", "of", "and", "to",  "a",  "in",   "that",
                                                   "was", "he", "is",  "for", "it", "with", "as",
                                                   "his", "on", "be",  "at",  "by", "had"};
  std::string word;
  for (char c : *text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      continue;
    }
    if (word.empty()) continue;
    ++words;
    if (std::find(function_words.begin(), function_words.end(), word) != function_words.end()) {
      ++common;
    }
    word.clear();
  }
  EXPECT_GE(words, 15) << *text;
  EXPECT_GE(common, 3) << *text;
}

}  // namespace
}  // namespace kiln
