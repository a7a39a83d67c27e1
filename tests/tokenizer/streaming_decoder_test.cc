// StreamingDecoder: the text of every Push plus Finish equals a whole Decode, characters split
// over several tokens (byte-level, byte fallback) come out whole, and SentencePiece leading
// spaces come out as a whole decode has them.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using Ids = std::vector<int32_t>;

// Byte-level BPE: "😀" is four tokens (ð Ł ĺ Ģ), one per byte.
constexpr absl::string_view kByteLevelJson = R"json({"version": "1.0",
 "added_tokens": [{"id": 9, "content": "<|end|>", "single_word": false, "lstrip": false,
   "rstrip": false, "normalized": false, "special": true}],
 "normalizer": null,
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
  "use_regex": true},
 "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
  "use_regex": true},
 "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
  "use_regex": true},
 "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
  "byte_fallback": false,
  "vocab": {"h": 0, "i": 1, "Ġ": 2, "ð": 3, "Ł": 4, "ĺ": 5, "Ģ": 6, "hi": 7, "Ġh": 8},
  "merges": ["h i", "Ġ h"]}})json";

// SentencePiece-style (as Mistral's): byte fallback for "é" (C3 A9) and "中" (E4 B8 AD).
constexpr absl::string_view kByteFallbackJson = R"json({"version": "1.0",
 "added_tokens": [
  {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true},
  {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
 "pre_tokenizer": null,
 "post_processor": {"type": "TemplateProcessing",
  "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}],
  "pair": [],
  "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
 "decoder": {"type": "Sequence", "decoders": [
   {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
   {"type": "ByteFallback"}, {"type": "Fuse"},
   {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
 "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
  "byte_fallback": true,
  "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xC3>": 3, "<0xA9>": 4, "<0xE4>": 5,
   "<0xB8>": 6, "<0xAD>": 7, "▁": 8, "a": 9, "b": 10, "▁a": 11, "▁b": 12},
  "merges": ["▁ a", "▁ b"]}})json";

std::unique_ptr<Tokenizer> Load(absl::string_view json) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

// Streams `ids` and returns every piece (the last one from Finish).
std::vector<std::string> Stream(const Tokenizer& tokenizer, const Ids& ids, bool skip) {
  StreamingDecoder decoder(tokenizer, skip);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    absl::StatusOr<std::string> piece = decoder.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    pieces.push_back(piece.ok() ? *piece : "<error>");
  }
  pieces.push_back(decoder.Finish());
  return pieces;
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string text;
  for (const std::string& piece : pieces) text += piece;
  return text;
}

// The property: for both skip settings the pieces add up to Decode; no piece but the last
// holds a replacement character unless the whole decode has one there too.
void ExpectStreamMatchesDecode(const Tokenizer& tokenizer, const Ids& ids) {
  for (bool skip : {false, true}) {
    const std::vector<std::string> pieces = Stream(tokenizer, ids, skip);
    absl::StatusOr<std::string> whole = tokenizer.Decode(ids, skip);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(Join(pieces), *whole) << "skip_special_tokens=" << skip;
    if (!absl::StrContains(*whole, "\uFFFD")) {
      for (const std::string& piece : pieces) EXPECT_FALSE(absl::StrContains(piece, "\uFFFD"));
    }
  }
}

TEST(StreamingDecoderTest, ByteLevelEmojiComesOutWhole) {
  auto tokenizer = Load(kByteLevelJson);
  ASSERT_NE(tokenizer, nullptr);
  absl::StatusOr<Ids> ids = tokenizer->Encode("hi 😀<|end|>hi");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(*ids, (Ids{7, 2, 3, 4, 5, 6, 9, 7}));
  EXPECT_EQ(Stream(*tokenizer, *ids, false),
            (std::vector<std::string>{"hi", " ", "", "", "", "😀", "<|end|>", "hi", ""}));
  EXPECT_EQ(Stream(*tokenizer, *ids, true),
            (std::vector<std::string>{"hi", " ", "", "", "", "😀", "", "hi", ""}));
  ExpectStreamMatchesDecode(*tokenizer, *ids);
}

TEST(StreamingDecoderTest, ByteFallbackCharactersComeOutWhole) {
  auto tokenizer = Load(kByteFallbackJson);
  ASSERT_NE(tokenizer, nullptr);
  absl::StatusOr<Ids> ids = tokenizer->Encode("a é中b");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(*ids, (Ids{1, 11, 8, 3, 4, 5, 6, 7, 10}));
  EXPECT_EQ(Stream(*tokenizer, *ids, true),
            (std::vector<std::string>{"", "a", " ", "", "é", "", "", "中", "b", ""}));
  ExpectStreamMatchesDecode(*tokenizer, *ids);
}

TEST(StreamingDecoderTest, LeadingSpacesAsAWholeDecode) {
  auto tokenizer = Load(kByteFallbackJson);
  ASSERT_NE(tokenizer, nullptr);
  // The decoder strips the first space of the text only.
  const Ids ids = {11, 12, 11, 2, 12, 1, 11};
  EXPECT_EQ(Stream(*tokenizer, ids, true),
            (std::vector<std::string>{"a", " b", " a", "", " b", "", " a", ""}));
  EXPECT_EQ(Stream(*tokenizer, ids, false),
            (std::vector<std::string>{"a", " b", " a", "</s>", " b", "<s>", " a", ""}));
  ExpectStreamMatchesDecode(*tokenizer, ids);
  // Skipped special tokens at the start leave the first word's space stripped.
  ExpectStreamMatchesDecode(*tokenizer, {1, 2, 12, 11});
  EXPECT_EQ(Stream(*tokenizer, {1, 2, 12, 11}, true),
            (std::vector<std::string>{"", "", "b", " a", ""}));
}

TEST(StreamingDecoderTest, FinishFlushesAnUnfinishedCharacter) {
  auto byte_level = Load(kByteLevelJson);
  ASSERT_NE(byte_level, nullptr);
  EXPECT_EQ(Stream(*byte_level, {7, 3, 4}, false),
            (std::vector<std::string>{"hi", "", "", "\uFFFD"}));
  ExpectStreamMatchesDecode(*byte_level, {7, 3, 4});
  ExpectStreamMatchesDecode(*byte_level, {3, 4, 7, 6, 6, 2});  // invalid bytes mid-stream

  auto byte_fallback = Load(kByteFallbackJson);
  ASSERT_NE(byte_fallback, nullptr);
  ExpectStreamMatchesDecode(*byte_fallback, {11, 5, 6});
  ExpectStreamMatchesDecode(*byte_fallback, {11, 5, 6, 12});
}

TEST(StreamingDecoderTest, UnknownIdIsRefusedAndChangesNothing) {
  auto tokenizer = Load(kByteLevelJson);
  ASSERT_NE(tokenizer, nullptr);
  StreamingDecoder decoder(*tokenizer);
  EXPECT_EQ(*decoder.Push(7), "hi");
  absl::StatusOr<std::string> bad = decoder.Push(10);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "10"));
  EXPECT_EQ(*decoder.Push(8), " h");
  EXPECT_EQ(decoder.Finish(), "");
}

TEST(StreamingDecoderTest, LongStreamsMatch) {
  auto tokenizer = Load(kByteLevelJson);
  ASSERT_NE(tokenizer, nullptr);
  Ids ids;
  for (int i = 0; i < 500; ++i) {
    for (int32_t id : {7, 2, 3, 4, 5, 6, 9, 8}) ids.push_back(id);
  }
  ExpectStreamMatchesDecode(*tokenizer, ids);
}

std::unique_ptr<Tokenizer> LoadReal(absl::string_view name) {
  const std::filesystem::path dir =
      std::filesystem::path(KILN_TEST_DATA_DIR) / "tokenizers" / std::string(name);
  if (!std::filesystem::exists(dir)) return nullptr;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

constexpr absl::string_view kMixedText =
    "Hello, world! 你好，世界。 Привет "
    "😀👍🏽👨‍👩‍👧 🇺🇸 e\u0301 \U000103FF"
    "\tcode: x = f(y);\n"
    "  indented  line</s> <s>[INST] done [/INST]<|im_end|> end";

TEST(StreamingDecoderTest, RealVocabularies) {
  for (absl::string_view name : {"qwen3", "mistral", "gpt2"}) {
    auto tokenizer = LoadReal(name);
    if (tokenizer == nullptr) continue;
    absl::StatusOr<Ids> ids = tokenizer->Encode(kMixedText);
    ASSERT_TRUE(ids.ok()) << ids.status();
    SCOPED_TRACE(name);
    ExpectStreamMatchesDecode(*tokenizer, *ids);
  }
}

}  // namespace
}  // namespace kiln
