// Tokenizer: loading tokenizer.json (and refusing bad ones), added tokens (lstrip, rstrip,
// single_word, normalized), post-processors, tokenizer_config.json / generation_config.json,
// the GPT-2 file pair, directories, decode, and a few known ids of the real vocabularies.
// Expected ids on the hand-made files were checked against the Hugging Face `tokenizers` crate.
#include "tokenizer/tokenizer.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

std::unique_ptr<Tokenizer> Load(absl::string_view json, absl::string_view config = "",
                                absl::string_view generation = "") {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromTokenizerJson(json, config, generation);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

Ids Encode(const Tokenizer& tokenizer, absl::string_view text, bool add_special = true) {
  absl::StatusOr<Ids> ids = tokenizer.Encode(text, add_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : Ids{};
}

std::string Decode(const Tokenizer& tokenizer, const Ids& ids, bool skip = false) {
  absl::StatusOr<std::string> text = tokenizer.Decode(ids, skip);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

// A whitespace-split tokenizer with a Lowercase normalizer: <x> lstrip (special), <y> rstrip,
// "CD" normalized, "c" (already a model token) not normalized.
constexpr absl::string_view kStripJson = R"json({"version": "1.0",
 "added_tokens": [
  {"id": 8, "content": "<x>", "single_word": false, "lstrip": true, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 9, "content": "<y>", "single_word": false, "lstrip": false, "rstrip": true,
   "normalized": false, "special": false},
  {"id": 10, "content": "CD", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": true, "special": false},
  {"id": 3, "content": "c", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": false}],
 "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "WhitespaceSplit"},
 "post_processor": null, "decoder": null,
 "model": {"type": "BPE", "dropout": null, "unk_token": "?", "fuse_unk": true,
  "byte_fallback": false,
  "vocab": {"?": 0, "a": 1, "b": 2, "c": 3, "d": 4, "ab": 5, "cd": 6, " ": 7},
  "merges": [["a", "b"], ["c", "d"]]}})json";

// single_word "zz" and "<q>", and "<s>" with both lstrip and rstrip.
constexpr absl::string_view kSingleWordJson = R"json({"version": "1.0",
 "added_tokens": [
  {"id": 8, "content": "zz", "single_word": true, "lstrip": false, "rstrip": false,
   "normalized": false, "special": false},
  {"id": 9, "content": "<q>", "single_word": true, "lstrip": false, "rstrip": false,
   "normalized": false, "special": false},
  {"id": 10, "content": "<s>", "single_word": false, "lstrip": true, "rstrip": true,
   "normalized": false, "special": true}],
 "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
 "decoder": null,
 "model": {"type": "BPE", "dropout": null, "unk_token": "?", "fuse_unk": true,
  "byte_fallback": false,
  "vocab": {"?": 0, "a": 1, "b": 2, "c": 3, "d": 4, "ab": 5, "cd": 6, "z": 7},
  "merges": [["a", "b"], ["c", "d"]]}})json";

// SentencePiece-like: Prepend + Replace normalizers, no pre-tokenizer, a normalized added token.
constexpr absl::string_view kPrependJson = R"json({"version": "1.0",
 "added_tokens": [{"id": 7, "content": "foo", "single_word": false, "lstrip": false,
   "rstrip": false, "normalized": true, "special": false}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
 "pre_tokenizer": null, "post_processor": null, "decoder": null,
 "model": {"type": "BPE", "dropout": null, "unk_token": "?", "fuse_unk": true,
  "byte_fallback": false,
  "vocab": {"?": 0, "a": 1, "▁": 2, "f": 3, "o": 4, "▁a": 5, "x": 6},
  "merges": ["▁ a"]}})json";

// Metaspace (prepend_scheme "first") with a TemplateProcessing that adds <s> ... </s>.
constexpr absl::string_view kTemplateJson = R"json({"version": "1.0",
 "added_tokens": [
  {"id": 6, "content": "<sep>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 7, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 8, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 9, "content": "<mark>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": false}],
 "normalizer": null,
 "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
  "split": true},
 "post_processor": {"type": "TemplateProcessing",
  "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
  "pair": [],
  "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]},
   "</s>": {"id": "</s>", "ids": [8], "tokens": ["</s>"]}}},
 "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
  "split": true},
 "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
  "byte_fallback": false,
  "vocab": {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "▁b": 5},
  "merges": ["▁ a", "▁ b"]}})json";

std::string WithPostProcessor(absl::string_view post_processor) {
  std::string json(kTemplateJson);
  const size_t begin = json.find("\"post_processor\"");
  const size_t end = json.find("\"decoder\"");
  return absl::StrCat(json.substr(0, begin), "\"post_processor\": ", post_processor, ",\n ",
                      json.substr(end));
}

TEST(AddedTokensTest, LstripAndRstripAbsorbWhitespace) {
  auto tokenizer = Load(kStripJson);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(Encode(*tokenizer, "a  <x>  b"), (Ids{1, 8, 2}));
  EXPECT_EQ(Encode(*tokenizer, "a<y>  b"), (Ids{1, 9, 2}));
  EXPECT_EQ(Encode(*tokenizer, "<x><x>"), (Ids{8, 8}));

  auto both = Load(kSingleWordJson);
  ASSERT_NE(both, nullptr);
  // Unicode whitespace counts; a previous rstrip keeps what it took.
  EXPECT_EQ(Encode(*both, "a \t <s> \n b<s>  <s>c"), (Ids{1, 10, 2, 10, 10, 3}));
  EXPECT_EQ(Encode(*both, "zz\u00a0zz\u3000<s>\u3000"), (Ids{8, 8, 10}));
}

TEST(AddedTokensTest, SingleWordNeedsNonWordNeighbours) {
  auto tokenizer = Load(kSingleWordJson);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(Encode(*tokenizer, "zz _zz ézz zz1 1zz zz. .zz zzz"),
            (Ids{8, 0, 7, 7, 0, 7, 7, 7, 7, 0, 0, 7, 7, 8, 0, 0, 8, 7, 7, 7}));
  // Even a token that starts and ends with punctuation refuses a letter next to it.
  EXPECT_EQ(Encode(*tokenizer, "a<q>b <q> a<q> <q>b"), (Ids{1, 0, 2, 9, 1, 0, 0, 2}));
  // Digits of other scripts and combining marks are word characters.
  EXPECT_EQ(Encode(*tokenizer, "\u0663zz \u0301zz"), (Ids{0, 7, 7, 0, 7, 7}));
}

TEST(AddedTokensTest, NormalizedTokensMatchTheNormalizedText) {
  auto tokenizer = Load(kStripJson);
  ASSERT_NE(tokenizer, nullptr);
  // The raw token "c" is found first; "CD" then matches the lowercased text.
  EXPECT_EQ(Encode(*tokenizer, "x CD cd Cd"), (Ids{0, 10, 3, 4, 10}));
  EXPECT_EQ(Encode(*tokenizer, "AB <X>"), (Ids{5, 0}));  // "<x>" is not normalized

  // The content of a normalized token is normalized too ("foo" -> "▁foo").
  auto prepend = Load(kPrependJson);
  ASSERT_NE(prepend, nullptr);
  EXPECT_EQ(Encode(*prepend, "a foo"), (Ids{5, 7}));
  EXPECT_EQ(Encode(*prepend, "foo"), (Ids{7}));
  EXPECT_EQ(Encode(*prepend, "afoo"), (Ids{5, 3, 4, 4}));
  EXPECT_EQ(Encode(*prepend, "a foox"), (Ids{5, 7, 6}));
  // Decoding gives the normalized content, as the crate stores it.
  EXPECT_EQ(tokenizer->IdToToken(10), "cd");
  EXPECT_EQ(tokenizer->TokenToId("CD"), 10);
  EXPECT_EQ(prepend->IdToToken(7), "▁foo");
}

TEST(AddedTokensTest, LookupsAndDecode) {
  auto tokenizer = Load(kStripJson);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 11);
  EXPECT_EQ(tokenizer->TokenToId("<x>"), 8);
  EXPECT_EQ(tokenizer->TokenToId("ab"), 5);
  EXPECT_EQ(tokenizer->TokenToId("zz"), std::nullopt);
  EXPECT_EQ(tokenizer->IdToToken(9), "<y>");
  EXPECT_EQ(tokenizer->IdToToken(11), std::nullopt);
  EXPECT_TRUE(tokenizer->IsSpecial(8));
  EXPECT_FALSE(tokenizer->IsSpecial(9));
  EXPECT_FALSE(tokenizer->IsSpecial(5));
  // Without a decoder tokens are joined with spaces; added tokens are decoded like the others.
  EXPECT_EQ(Decode(*tokenizer, {1, 8, 9, 10, 3, 6}), "a <x> <y> cd c cd");
  EXPECT_EQ(Decode(*tokenizer, {1, 8, 9, 10, 3, 6}, true), "a <y> cd c cd");
}

TEST(AddedTokensTest, IdsFollowTheCrate) {
  // A token the model already has takes the model's id; others count up from the model's size.
  std::string json(kStripJson);
  json = absl::StrReplaceAll(json, {{"\"id\": 8,", "\"id\": 20,"}, {"\"id\": 3,", "\"id\": 4,"}});
  auto tokenizer = Load(json);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->TokenToId("<x>"), 8);
  EXPECT_EQ(tokenizer->TokenToId("c"), 3);
}

TEST(PostProcessorTest, TemplateProcessingAndMetaspaceFirst) {
  auto tokenizer = Load(kTemplateJson);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(Encode(*tokenizer, "a<sep>b"), (Ids{7, 4, 6, 3, 8}));
  EXPECT_EQ(Encode(*tokenizer, "a<sep>b", false), (Ids{4, 6, 3}));
  // Only the text at the start of the input gets the prepended "▁".
  EXPECT_EQ(Encode(*tokenizer, "<sep>a b"), (Ids{7, 6, 2, 5, 8}));
  EXPECT_EQ(Encode(*tokenizer, ""), (Ids{7, 8}));
  EXPECT_EQ(Decode(*tokenizer, {7, 4, 6, 3, 8}), "<s> a<sep>b</s>");
  EXPECT_EQ(Decode(*tokenizer, {7, 4, 6, 3, 8}, true), "ab");
  EXPECT_EQ(Decode(*tokenizer, {7, 4, 9, 5, 8}), "<s> a<mark> b</s>");
  EXPECT_EQ(Decode(*tokenizer, {6, 5, 4}, true), "b a");
}

TEST(PostProcessorTest, OtherProcessors) {
  auto string_template = Load(WithPostProcessor(
      R"({"type": "TemplateProcessing", "single": "<s>:0 $A:0 </s>", "pair": "$A $B",
          "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]},
                             "</s>": {"id": "</s>", "ids": [8], "tokens": ["</s>"]}}})"));
  ASSERT_NE(string_template, nullptr);
  EXPECT_EQ(Encode(*string_template, "a"), (Ids{7, 4, 8}));

  auto bert = Load(
      WithPostProcessor(R"({"type": "BertProcessing", "sep": ["</s>", 8], "cls": ["<s>", 7]})"));
  ASSERT_NE(bert, nullptr);
  EXPECT_EQ(Encode(*bert, "a"), (Ids{7, 4, 8}));
  auto roberta = Load(WithPostProcessor(
      R"({"type": "RobertaProcessing", "sep": ["</s>", 8], "cls": ["<s>", 7],
          "trim_offsets": true, "add_prefix_space": true})"));
  ASSERT_NE(roberta, nullptr);
  EXPECT_EQ(Encode(*roberta, "a"), (Ids{7, 4, 8}));

  // A Sequence applies each processor to what the previous ones produced.
  auto sequence = Load(WithPostProcessor(
      R"({"type": "Sequence", "processors": [
           {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false},
           {"type": "TemplateProcessing", "single": "$A <sep>", "pair": "$A $B",
            "special_tokens": {"<sep>": {"id": "<sep>", "ids": [6], "tokens": ["<sep>"]}}},
           {"type": "BertProcessing", "sep": ["</s>", 8], "cls": ["<s>", 7]}]})"));
  ASSERT_NE(sequence, nullptr);
  EXPECT_EQ(Encode(*sequence, "a"), (Ids{7, 4, 6, 8}));
  EXPECT_EQ(Encode(*sequence, "a", false), (Ids{4}));
}

TEST(TokenizerConfigTest, AddBosOnlyWhenThePostProcessorDoesNot) {
  const std::string no_template = WithPostProcessor("null");
  auto plain = Load(no_template, R"({"bos_token": "<s>", "add_bos_token": true,
      "eos_token": {"content": "</s>", "lstrip": false}, "add_eos_token": true,
      "pad_token": null, "unk_token": "<unk>"})");
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(Encode(*plain, "a"), (Ids{7, 4, 8}));
  EXPECT_EQ(Encode(*plain, "a", false), (Ids{4}));
  const SpecialTokenIds& special = plain->special_tokens();
  EXPECT_EQ(special.bos, 7);
  EXPECT_EQ(special.eos, 8);
  EXPECT_EQ(special.pad, std::nullopt);
  EXPECT_EQ(special.unk, 0);
  EXPECT_TRUE(special.add_bos);
  EXPECT_TRUE(special.add_eos);
  EXPECT_EQ(special.eos_ids, (Ids{8}));

  // The template already adds both: nothing doubles.
  auto templated = Load(kTemplateJson, R"({"bos_token": "<s>", "add_bos_token": true,
      "eos_token": "</s>", "add_eos_token": true})");
  ASSERT_NE(templated, nullptr);
  EXPECT_EQ(Encode(*templated, "a"), (Ids{7, 4, 8}));

  // Without the config nothing is known or added.
  auto bare = Load(no_template);
  ASSERT_NE(bare, nullptr);
  EXPECT_EQ(Encode(*bare, "a"), (Ids{4}));
  EXPECT_EQ(bare->special_tokens().bos, std::nullopt);
  EXPECT_EQ(bare->special_tokens().unk, 0);  // the model's unk_token
  EXPECT_TRUE(bare->special_tokens().eos_ids.empty());
}

TEST(TokenizerConfigTest, GenerationConfigEosIds) {
  auto list = Load(kTemplateJson, R"({"eos_token": "</s>"})", R"({"eos_token_id": [6, 9]})");
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(list->special_tokens().eos_ids, (Ids{6, 9, 8}));
  auto single = Load(kTemplateJson, R"({"eos_token": "</s>"})", R"({"eos_token_id": 8})");
  ASSERT_NE(single, nullptr);
  EXPECT_EQ(single->special_tokens().eos_ids, (Ids{8}));
  auto bad = Tokenizer::FromTokenizerJson(kTemplateJson, "", R"({"eos_token_id": "x"})");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto malformed = Tokenizer::FromTokenizerJson(kTemplateJson, "{", "");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(malformed.status().message(), "tokenizer_config.json"));
}

TEST(TokenizerLoadTest, MergesInBothFormats) {
  std::string pairs(kTemplateJson);
  pairs = absl::StrReplaceAll(
      pairs, {{R"("merges": ["▁ a", "▁ b"])", R"("merges": [["▁", "a"], ["▁", "b"]])"}});
  ASSERT_NE(pairs, kTemplateJson);
  auto a = Load(kTemplateJson);
  auto b = Load(pairs);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(Encode(*a, "a b ab"), Encode(*b, "a b ab"));
  EXPECT_EQ(Encode(*b, "a b ab"), (Ids{7, 4, 5, 4, 3, 8}));
}

TEST(TokenizerLoadTest, BadFilesAreRefusedWithAReason) {
  struct Case {
    std::string json;
    std::string message;
  };
  const std::string base(kTemplateJson);
  auto replace = [&](absl::string_view from, absl::string_view to) {
    std::string json = absl::StrReplaceAll(base, {{from, to}});
    EXPECT_NE(json, base) << from;
    return json;
  };
  const std::vector<Case> cases = {
      {"{\"model\": ", "malformed JSON"},
      {"[1, 2]", "not an object"},
      {"{}", "missing \"model\""},
      {replace("\"type\": \"BPE\"", "\"type\": \"WordPiece\""), "unsupported model type WordPiece"},
      {replace("\"▁ b\"]", "\"▁ q\"]"), "\"q\""},
      {replace("\"▁ b\"]", "\"▁b\"]"), "merge #1"},
      {replace("\"dropout\": null", "\"dropout\": 0.1"), "dropout"},
      {replace("\"normalizer\": null", "\"normalizer\": {\"type\": \"Frobnicate\"}"), "Frobnicate"},
      {replace("\"type\": \"Metaspace\", \"replacement\": \"▁\", \"prepend_scheme\": \"first\",\n"
               "  \"split\": true},\n \"post_processor\"",
               "\"type\": \"Quux\"},\n \"post_processor\""),
       "Quux"},
      {replace("\"decoder\": {\"type\": \"Metaspace\"", "\"decoder\": {\"type\": \"Zorp\""),
       "Zorp"},
      {WithPostProcessor(R"({"type": "Blorb"})"), "unsupported post_processor type Blorb"},
      {WithPostProcessor(R"({"type": "TemplateProcessing", "single": "<t> $A",
                            "special_tokens": {}})"),
       "missing special token \"<t>\""},
      {replace("\"<unk>\": 0", "\"<unk>\": -3"), "no valid id"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(c.json);
    ASSERT_FALSE(tokenizer.ok()) << c.message;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_TRUE(Contains(tokenizer.status().message(), c.message))
        << c.message << " not in: " << tokenizer.status().message();
  }
  // dropout 0 is the same as none.
  EXPECT_NE(Load(replace("\"dropout\": null", "\"dropout\": 0")), nullptr);
}

TEST(TokenizerEncodeTest, InvalidUtf8IsRefusedWithItsOffset) {
  auto tokenizer = Load(kTemplateJson);
  ASSERT_NE(tokenizer, nullptr);
  for (const auto& [text, offset] :
       std::vector<std::pair<std::string, int>>{{"ab\xFF"
                                                 "cd",
                                                 2},
                                                {"\xC3", 0},
                                                {"a\xE4\xBD", 1},
                                                {"ok\xED\xA0\x80", 2}}) {
    absl::StatusOr<Ids> ids = tokenizer->Encode(text);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(ids.status().message(), absl::StrCat("byte offset ", offset)))
        << ids.status().message();
  }
}

TEST(TokenizerDecodeTest, UnknownIdsAreRefused) {
  auto tokenizer = Load(kTemplateJson);
  ASSERT_NE(tokenizer, nullptr);
  for (int32_t id : {10, -1, 1 << 30}) {
    absl::StatusOr<std::string> text = tokenizer->Decode(Ids{4, id});
    ASSERT_FALSE(text.ok());
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(text.status().message(), absl::StrCat("id ", id)));
  }
}

TEST(TokenizerEncodeTest, ConcurrentEncodesAgree) {
  auto tokenizer = Load(kTemplateJson);
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "a b ab ba <sep> aab bba a<mark>b";
  const Ids expected = Encode(*tokenizer, text);
  std::atomic<int> failures = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<Ids> ids = tokenizer->Encode(text);
        if (!ids.ok() || *ids != expected) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
}

constexpr absl::string_view kGpt2Encoder =
    R"({"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "he": 5, "ll": 6, "hell": 7, "hello": 8,
        "Ġh": 9, "<|endoftext|>": 10, "w": 11, "Ġw": 12})";
constexpr absl::string_view kGpt2Merges = "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ h\nĠ w\n";

TEST(Gpt2FilesTest, EncodesAndDecodes) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromGpt2Files(kGpt2Encoder, kGpt2Merges);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(Encode(t, "hello hello<|endoftext|> w"), (Ids{8, 4, 8, 10, 12}));
  EXPECT_EQ(Decode(t, {8, 4, 8, 10, 12}), "hello hello<|endoftext|> w");
  EXPECT_EQ(Decode(t, {8, 4, 8, 10, 12}, true), "hello hello w");
  EXPECT_TRUE(t.IsSpecial(10));
  EXPECT_EQ(t.special_tokens().eos, 10);
  EXPECT_EQ(t.special_tokens().bos, 10);
  EXPECT_EQ(t.special_tokens().eos_ids, (Ids{10}));
  EXPECT_FALSE(t.special_tokens().add_bos);

  absl::StatusOr<std::unique_ptr<Tokenizer>> bad =
      Tokenizer::FromGpt2Files(kGpt2Encoder, "#version: 0.2\nh e\nl l l\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "vocab.bpe line 3")) << bad.status().message();
  bad = Tokenizer::FromGpt2Files(kGpt2Encoder, "#version: 0.2\nh x\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "\"x\"")) << bad.status().message();
  bad = Tokenizer::FromGpt2Files("{\"h\": ", kGpt2Merges);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "encoder.json")) << bad.status().message();
}

class DirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("kiln_tokenizer_dir_test_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, absl::string_view contents) {
    std::ofstream(dir_ / name, std::ios::binary) << contents;
  }
  std::filesystem::path dir_;
};

TEST_F(DirectoryTest, TokenizerJsonWithConfigs) {
  Write("tokenizer.json", WithPostProcessor("null"));
  Write("tokenizer_config.json", R"({"bos_token": "<s>", "add_bos_token": true,
                                     "eos_token": "</s>"})");
  Write("generation_config.json", R"({"eos_token_id": [9, 8]})");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(Encode(**tokenizer, "a"), (Ids{7, 4}));
  EXPECT_EQ((*tokenizer)->special_tokens().eos_ids, (Ids{9, 8}));
}

TEST_F(DirectoryTest, Gpt2Pair) {
  Write("encoder.json", kGpt2Encoder);
  Write("vocab.bpe", kGpt2Merges);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(Encode(**tokenizer, "hello"), (Ids{8}));
}

TEST_F(DirectoryTest, ErrorsNameTheDirectoryOrFile) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> none = Tokenizer::FromDirectory(dir_);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(none.status().message(), dir_.string())) << none.status().message();
  Write("encoder.json", kGpt2Encoder);  // without vocab.bpe
  EXPECT_EQ(Tokenizer::FromDirectory(dir_).status().code(), absl::StatusCode::kNotFound);
  Write("tokenizer.json", "{\"model\": {");
  absl::StatusOr<std::unique_ptr<Tokenizer>> bad = Tokenizer::FromDirectory(dir_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), (dir_ / "tokenizer.json").string()))
      << bad.status().message();
}

// The committed real vocabularies (tests/data/tokenizers); the full corpus is the conformance
// test's. Ids from the Hugging Face `tokenizers` crate.
std::unique_ptr<Tokenizer> LoadReal(absl::string_view name) {
  const std::filesystem::path dir =
      std::filesystem::path(KILN_TEST_DATA_DIR) / "tokenizers" / std::string(name);
  if (!std::filesystem::exists(dir)) return nullptr;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

TEST(RealTokenizerTest, Qwen3) {
  auto tokenizer = LoadReal("qwen3");
  if (tokenizer == nullptr) GTEST_SKIP() << "no qwen3 files";
  EXPECT_EQ(Encode(*tokenizer, "Hello world"), (Ids{9707, 1879}));
  const Ids chat = {151644, 872, 198, 9707, 11, 220, 99489, 0, 90316, 151645, 198};
  EXPECT_EQ(Encode(*tokenizer, "<|im_start|>user\nHello, 世界! 😀<|im_end|>\n"), chat);
  EXPECT_EQ(Decode(*tokenizer, chat), "<|im_start|>user\nHello, 世界! 😀<|im_end|>\n");
  EXPECT_EQ(Decode(*tokenizer, chat, true), "user\nHello, 世界! 😀\n");
  EXPECT_EQ(tokenizer->vocab_size(), 151669);
  const SpecialTokenIds& special = tokenizer->special_tokens();
  EXPECT_EQ(special.eos, 151645);
  EXPECT_EQ(special.pad, 151643);
  EXPECT_EQ(special.bos, std::nullopt);
  EXPECT_FALSE(special.add_bos);
  EXPECT_EQ(special.eos_ids, (Ids{151645}));
}

TEST(RealTokenizerTest, Mistral) {
  auto tokenizer = LoadReal("mistral");
  if (tokenizer == nullptr) GTEST_SKIP() << "no mistral files";
  // add_bos_token is true and the template adds <s>: one <s>.
  EXPECT_EQ(Encode(*tokenizer, "Hello world"), (Ids{1, 22557, 1526}));
  EXPECT_EQ(Encode(*tokenizer, "Hello world</s> 你好 😀"),
            (Ids{1, 22557, 1526, 2, 259, 29383, 29530, 28705, 30575}));
  EXPECT_EQ(Encode(*tokenizer, "été \U000103FF", false), (Ids{7166, 28705, 243, 147, 146, 194}));
  EXPECT_EQ(Decode(*tokenizer, {1, 22557, 1526, 2, 259, 29383}), "<s> Hello world</s>  你");
  EXPECT_EQ(Decode(*tokenizer, {1, 22557, 1526, 2, 259, 29383}, true), "Hello world  你");
  EXPECT_EQ(Decode(*tokenizer, {243, 147}), "\uFFFD\uFFFD");  // an unfinished character
  EXPECT_EQ(tokenizer->special_tokens().bos, 1);
  EXPECT_EQ(tokenizer->special_tokens().eos, 2);
  EXPECT_EQ(tokenizer->special_tokens().unk, 0);
}

TEST(RealTokenizerTest, Gpt2) {
  auto tokenizer = LoadReal("gpt2");
  if (tokenizer == nullptr) GTEST_SKIP() << "no gpt2 files";
  EXPECT_EQ(Encode(*tokenizer, "Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(Encode(*tokenizer, "a<|endoftext|>b"), (Ids{64, 50256, 65}));
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
}

}  // namespace
}  // namespace kiln
