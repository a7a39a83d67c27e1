// The BPE model on tiny hand-made vocabularies: merge order, ties, ignore_merges, byte_fallback,
// unk/fuse_unk, continuing_subword_prefix/end_of_word_suffix, bad merges, the per-thread cache.
// Expected ids were checked against the Hugging Face `tokenizers` crate (0.23).
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tokenizer/bpe_model.h"

namespace kiln::tokenizer_internal {
namespace {

using Ids = std::vector<int32_t>;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

struct Spec {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  BpeOptions options;
};

std::unique_ptr<BpeModel> Make(const Spec& spec) {
  std::vector<std::pair<absl::string_view, int32_t>> vocab(spec.vocab.begin(), spec.vocab.end());
  std::vector<std::pair<absl::string_view, absl::string_view>> merges;
  for (const auto& [a, b] : spec.merges) merges.emplace_back(a, b);
  absl::StatusOr<std::unique_ptr<BpeModel>> model = BpeModel::Create(vocab, merges, spec.options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

std::vector<int32_t> Tokenize(const BpeModel& model, absl::string_view piece) {
  std::vector<int32_t> ids;
  absl::Status status = model.Tokenize(piece, ids);
  EXPECT_TRUE(status.ok()) << status;
  return ids;
}

TEST(BpeModelTest, MergesByRankNotByPosition) {
  // "abc": (b, c) has the better rank, so "a" + "bc" and then "abc".
  Spec spec{{{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}},
            {{"b", "c"}, {"a", "b"}, {"a", "bc"}}};
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "abc"), (Ids{5}));
  EXPECT_EQ(Tokenize(*model, "ab"), (Ids{3}));
  EXPECT_EQ(Tokenize(*model, "cab"), (Ids{2, 3}));

  // With (a, b) first, "ab" + "c" has no merge left.
  spec.merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}};
  model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "abc"), (Ids{3, 2}));
}

TEST(BpeModelTest, TiesMergeLeftmostFirst) {
  auto model = Make({{{"a", 0}, {"aa", 1}, {"aaaa", 2}}, {{"a", "a"}, {"aa", "aa"}}});
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "aaa"), (Ids{1, 0}));
  EXPECT_EQ(Tokenize(*model, "aaaa"), (Ids{2}));
  EXPECT_EQ(Tokenize(*model, "aaaaa"), (Ids{2, 0}));
  EXPECT_EQ(Tokenize(*model, "aaaaaa"), (Ids{2, 1}));
}

TEST(BpeModelTest, CharactersAreUnicodeScalars) {
  auto model = Make({{{"é", 0}, {"x", 1}, {"éx", 2}, {"中", 3}}, {{"é", "x"}}});
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "éx中é"), (Ids{2, 3, 0}));
}

TEST(BpeModelTest, IgnoreMergesEmitsWholeVocabularyWords) {
  Spec spec{{{"h", 0}, {"e", 1}, {"l", 2}, {"o", 3}, {"he", 4}, {"ll", 5}, {"hello", 6}},
            {{"h", "e"}, {"l", "l"}}};
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "hello"), (Ids{4, 5, 3}));
  spec.options.ignore_merges = true;
  model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "hello"), (Ids{6}));
  EXPECT_EQ(Tokenize(*model, "hell"), (Ids{4, 5}));
}

TEST(BpeModelTest, ByteFallbackUsesUtf8Bytes) {
  Spec spec{{{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}, {"<0xE4>", 4}}, {}};
  spec.options.unk_token = "<unk>";
  spec.options.byte_fallback = true;
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "aéa"), (Ids{1, 2, 3, 1}));
  // 中 is E4 B8 AD: not every byte has a token, so the whole character is <unk>.
  EXPECT_EQ(Tokenize(*model, "中"), (Ids{0}));
}

TEST(BpeModelTest, PendingUnkIsNotFlushedBeforeByteTokens) {
  // As the crate: "c" waits as <unk> while the bytes of "b" are added, so they come first.
  Spec spec{{{"<unk>", 0}, {"a", 1}, {"<0x62>", 2}}, {}};
  spec.options.unk_token = "<unk>";
  spec.options.byte_fallback = true;
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "cba"), (Ids{2, 0, 1}));
  EXPECT_EQ(Tokenize(*model, "ccbba"), (Ids{0, 2, 2, 0, 1}));
}

TEST(BpeModelTest, UnknownCharactersAndFuseUnk) {
  Spec spec{{{"<unk>", 0}, {"a", 1}, {"b", 2}}, {}};
  spec.options.unk_token = "<unk>";
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "accb"), (Ids{1, 0, 0, 2}));
  spec.options.fuse_unk = true;
  model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "accb"), (Ids{1, 0, 2}));
  EXPECT_EQ(Tokenize(*model, "cc"), (Ids{0}));
  // Without an unk token unknown characters are dropped.
  spec.options.unk_token.reset();
  model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "accb"), (Ids{1, 2}));
  EXPECT_TRUE(Tokenize(*model, "c").empty());
}

TEST(BpeModelTest, UnkTokenMissingFromVocabularyFailsOnUse) {
  Spec spec{{{"a", 0}}, {}};
  spec.options.unk_token = "<unk>";
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  std::vector<int32_t> ids;
  EXPECT_TRUE(model->Tokenize("aaa", ids).ok());
  absl::Status status = model->Tokenize("b", ids);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), "<unk>")) << status.message();
}

TEST(BpeModelTest, ContinuingSubwordPrefixAndEndOfWordSuffix) {
  Spec spec{{{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}, {"abc", 4}},
            {{"a", "##b"}, {"ab", "##c"}}};
  spec.options.continuing_subword_prefix = "##";
  auto model = Make(spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "ab"), (Ids{3}));
  EXPECT_EQ(Tokenize(*model, "abc"), (Ids{4}));

  Spec both{{{"a", 0},
             {"##b", 1},
             {"##c</w>", 2},
             {"a##b", 3},
             {"ab", 4},
             {"abc</w>", 5},
             {"b</w>", 6},
             {"##b</w>", 7},
             {"ab</w>", 8},
             {"a</w>", 9}},
            {{"a", "##b"}, {"ab", "##c</w>"}, {"a", "##b</w>"}}};
  both.options.continuing_subword_prefix = "##";
  both.options.end_of_word_suffix = "</w>";
  model = Make(both);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Tokenize(*model, "abc"), (Ids{5}));
  EXPECT_EQ(Tokenize(*model, "ab"), (Ids{8}));
  EXPECT_EQ(Tokenize(*model, "a"), (Ids{9}));
  EXPECT_EQ(Tokenize(*model, "b"), (Ids{6}));
}

TEST(BpeModelTest, BadMergesAreRefusedNamingTheToken) {
  std::vector<std::pair<absl::string_view, int32_t>> vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  auto create = [&](absl::string_view a, absl::string_view b) {
    std::vector<std::pair<absl::string_view, absl::string_view>> merges = {{a, b}};
    return BpeModel::Create(vocab, merges, BpeOptions{});
  };
  EXPECT_TRUE(create("a", "b").ok());
  absl::StatusOr<std::unique_ptr<BpeModel>> missing = create("a", "zz");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(missing.status().message(), "\"zz\"")) << missing.status().message();
  absl::StatusOr<std::unique_ptr<BpeModel>> no_result = create("b", "a");
  ASSERT_FALSE(no_result.ok());
  EXPECT_TRUE(Contains(no_result.status().message(), "\"ba\"")) << no_result.status().message();
}

TEST(BpeModelTest, LookupsBothWays) {
  auto model = Make({{{"a", 0}, {"b", 5}}, {}});
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->TokenToId("b"), 5);
  EXPECT_EQ(model->TokenToId("c"), std::nullopt);
  ASSERT_NE(model->IdToToken(5), nullptr);
  EXPECT_EQ(*model->IdToToken(5), "b");
  EXPECT_EQ(model->IdToToken(3), nullptr);
  EXPECT_EQ(model->IdToToken(6), nullptr);
  EXPECT_EQ(model->IdToToken(-1), nullptr);
  EXPECT_EQ(model->id_limit(), 6);
}

// Found by fuzz/fuzz_tokenizer_json.cc: one token with id 67108863 made a 150-byte
// tokenizer.json allocate 2 GiB for the id → token table. Ids far past the vocabulary's size are
// refused; a vocabulary with a few holes still loads.
TEST(BpeModelTest, IdsFarPastTheVocabularyAreRefused) {
  std::vector<std::pair<absl::string_view, int32_t>> sparse = {{"a", 0}, {"b", 67108863}};
  absl::StatusOr<std::unique_ptr<BpeModel>> refused = BpeModel::Create(sparse, {}, BpeOptions{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(refused.status().message(), "id 67108863 is far past the 2 tokens"))
      << refused.status().message();

  std::vector<std::pair<absl::string_view, int32_t>> holes = {{"a", 0}, {"b", 65536}};
  absl::StatusOr<std::unique_ptr<BpeModel>> loaded = BpeModel::Create(holes, {}, BpeOptions{});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->id_limit(), 65537);
}

TEST(BpeModelTest, CachedResultsAreStableAcrossThreads) {
  auto model = Make({{{"a", 0}, {"b", 1}, {"ab", 2}, {"abab", 3}}, {{"a", "b"}, {"ab", "ab"}}});
  ASSERT_NE(model, nullptr);
  const std::vector<std::string> words = {"ab", "abab", "ba", "ababab", std::string(300, 'a')};
  std::vector<std::vector<int32_t>> expected;
  for (const std::string& word : words) expected.push_back(Tokenize(*model, word));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        for (size_t w = 0; w < words.size(); ++w) {
          std::vector<int32_t> ids;
          if (!model->Tokenize(words[w], ids).ok() || ids != expected[w]) ++failures[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
  EXPECT_EQ(expected[3], (Ids{3, 2}));
}

}  // namespace
}  // namespace kiln::tokenizer_internal
