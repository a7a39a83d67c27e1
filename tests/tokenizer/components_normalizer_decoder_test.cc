// Normalizers and decoders of tokenizer/components.h. Expected values are those of the Hugging
// Face `tokenizers` crate (its own unit tests where there are some).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"

namespace kiln::tokenizer_internal {
namespace {

using Tokens = std::vector<std::string>;
const std::string kFffd = "\xEF\xBF\xBD";

std::string Normalize(absl::string_view spec, absl::string_view text) {
  auto parsed = ParseNormalizer(nlohmann::json::parse(spec));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok() || *parsed == nullptr) return "<parse failed>";
  absl::StatusOr<std::string> normalized = (*parsed)->Normalize(text);
  EXPECT_TRUE(normalized.ok()) << normalized.status();
  return normalized.ok() ? *std::move(normalized) : "<normalize failed>";
}

Tokens Decode(absl::string_view spec, Tokens tokens) {
  auto parsed = ParseDecoder(nlohmann::json::parse(spec));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok() || *parsed == nullptr) return {"<parse failed>"};
  absl::StatusOr<Tokens> decoded = (*parsed)->Decode(std::move(tokens));
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  return decoded.ok() ? *std::move(decoded) : Tokens{"<decode failed>"};
}

TEST(NormalizerTest, UnicodeForms) {
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "e\u0301t\u00e9"), "\u00e9t\u00e9");
  EXPECT_EQ(Normalize(R"({"type":"NFD"})", "\u00e9"), "e\u0301");
  EXPECT_EQ(Normalize(R"({"type":"NFKC"})", "\ufb01 \u2460 \uff21"), "fi 1 A");
  EXPECT_EQ(Normalize(R"({"type":"NFKD"})", "\u00e9\ufb01"), "e\u0301fi");
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "plain ascii"), "plain ascii");
  EXPECT_EQ(Normalize(R"({"type":"NFKC"})", ""), "");
  // Hangul composes and decomposes.
  EXPECT_EQ(Normalize(R"({"type":"NFD"})", "\ud55c"), "\u1112\u1161\u11ab");
  EXPECT_EQ(Normalize(R"({"type":"NFC"})", "\u1112\u1161\u11ab"), "\ud55c");
}

TEST(NormalizerTest, Lowercase) {
  EXPECT_EQ(Normalize(R"({"type":"Lowercase"})", "HeLLo \u00c0\u00c9 \u0391\u03a3"),
            "hello \u00e0\u00e9 \u03b1\u03c3");
  // Rust's char::to_lowercase: İ has a two-character lowercase, no final-sigma rule.
  EXPECT_EQ(Normalize(R"({"type":"Lowercase"})", "\u0130"), "i\u0307");
  EXPECT_EQ(Normalize(R"({"type":"Lowercase"})", "\u039f\u03a3"), "\u03bf\u03c3");
  EXPECT_EQ(Normalize(R"({"type":"Lowercase"})", "\U00010400"), "\U00010428");  // Deseret
  EXPECT_EQ(Normalize(R"({"type":"Lowercase"})", "你好 123"), "你好 123");
}

TEST(NormalizerTest, PrependReplaceStrip) {
  EXPECT_EQ(Normalize(R"({"type":"Prepend","prepend":"▁"})", "Hello"), "▁Hello");
  EXPECT_EQ(Normalize(R"({"type":"Prepend","prepend":"▁"})", ""), "");
  EXPECT_EQ(Normalize(R"({"type":"Replace","pattern":{"String":"''"},"content":"\""})",
                      "This is a ''test''"),
            "This is a \"test\"");
  EXPECT_EQ(Normalize(R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "})",
                      "This     is   a         test"),
            "This is a test");
  // A String pattern is literal, regex metacharacters included.
  EXPECT_EQ(
      Normalize(R"({"type":"Replace","pattern":{"String":"a.b"},"content":"X"})", "a.b axb a.b"),
      "X axb X");
  EXPECT_EQ(Normalize(R"({"type":"Replace","pattern":{"String":" "},"content":"▁"})", " a  b"),
            "▁a▁▁b");
  const char* both = R"({"type":"Strip","strip_left":true,"strip_right":true})";
  EXPECT_EQ(Normalize(both, " \t hi there \n\u3000"), "hi there");
  EXPECT_EQ(Normalize(R"({"type":"Strip","strip_left":true,"strip_right":false})", "  hi  "),
            "hi  ");
  EXPECT_EQ(Normalize(R"({"type":"Strip","strip_left":false,"strip_right":true})", "  hi  "),
            "  hi");
  EXPECT_EQ(Normalize(both, " \u00a0 "), "");
  EXPECT_EQ(Normalize(both, "\u200bx\u200b"), "\u200bx\u200b");  // ZWSP is not White_Space
}

TEST(NormalizerTest, StripAccentsCrateCases) {
  const char* nfkd_strip_lower = R"({"type":"Sequence","normalizers":[
      {"type":"NFKD"},{"type":"StripAccents"},{"type":"Lowercase"}]})";
  EXPECT_EQ(Normalize(R"({"type":"Sequence","normalizers":[{"type":"NFKD"},
                          {"type":"StripAccents"}]})",
                      "Me llam\u00f3"),
            "Me llamo");
  EXPECT_EQ(Normalize(R"({"type":"StripAccents"})", "e\u0304\u0304\u0304o"), "eo");
  EXPECT_EQ(Normalize(nfkd_strip_lower, "\u1ead\u2026"), "a...");
  EXPECT_EQ(Normalize(nfkd_strip_lower, "\u0e33\u0e19\u0e49\u0e333\u0e25\u0e33"),
            "\u0e32\u0e19\u0e323\u0e25\u0e32");
  EXPECT_EQ(Normalize(nfkd_strip_lower, "这很简单"), "这很简单");
}

TEST(NormalizerTest, SequenceAsLlama2) {
  const char* spec = R"({"type":"Sequence","normalizers":[
      {"type":"Prepend","prepend":"▁"},
      {"type":"Replace","pattern":{"String":" "},"content":"▁"}]})";
  EXPECT_EQ(Normalize(spec, "Hello world"), "▁Hello▁world");
  EXPECT_EQ(Normalize(spec, ""), "");
}

TEST(NormalizerTest, NmtAndBert) {
  EXPECT_EQ(Normalize(R"({"type":"Nmt"})",
                      "a\x01"
                      "b\tc\u200bd\ufeff"),
            "ab c d ");
  EXPECT_EQ(Normalize(R"({"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,
                          "strip_accents":null,"lowercase":true})",
                      "H\u00e9llo\tWORLD \u4f60\u597d\x01"),
            "hello world  \u4f60  \u597d ");
  EXPECT_EQ(Normalize(R"({"type":"BertNormalizer","clean_text":false,
                          "handle_chinese_chars":false,"strip_accents":false,
                          "lowercase":true})",
                      "H\u00e9llo"),
            "h\u00e9llo");
}

TEST(NormalizerTest, NullAndErrors) {
  auto none = ParseNormalizer(nlohmann::json());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto unknown = ParseNormalizer(nlohmann::json::parse(R"({"type":"Precompiled"})"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unsupported normalizer type Precompiled"),
            absl::string_view::npos)
      << unknown.status();
  auto nested = ParseNormalizer(nlohmann::json::parse(
      R"({"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Mystery"}]})"));
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("Mystery"), absl::string_view::npos);
  auto bad_regex = ParseNormalizer(
      nlohmann::json::parse(R"({"type":"Replace","pattern":{"Regex":"[unclosed"},"content":""})"));
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("[unclosed"), absl::string_view::npos);
  EXPECT_FALSE(ParseNormalizer(nlohmann::json::parse(R"({"type":"Prepend"})")).ok());
  EXPECT_FALSE(ParseNormalizer(nlohmann::json::parse(R"({"type":"Strip","strip_left":1})")).ok());
  EXPECT_FALSE(ParseNormalizer(nlohmann::json::parse(
                                   R"({"type":"Replace","pattern":{"Glob":"*"},"content":""})"))
                   .ok());
  EXPECT_FALSE(ParseNormalizer(nlohmann::json::parse(R"({"type":"Sequence"})")).ok());
  EXPECT_FALSE(ParseNormalizer(nlohmann::json::parse(R"("NFC")")).ok());
}

TEST(DecoderTest, ByteLevel) {
  const char* spec = R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,
                         "use_regex":true})";
  EXPECT_EQ(
      Decode(spec, {"Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "Ġis", "Ġyour", "Ġday", "Ġgoing", "?"}),
      (Tokens{"Hello my friend, how is your day going?"}));
  EXPECT_EQ(Decode(spec, {"ä½łå¥½", "ĠðŁĳĭ", "ĊĊ"}), (Tokens{"你好 👋\n\n"}));
  // A token outside the alphabet (an added token) keeps its own bytes.
  EXPECT_EQ(Decode(spec, {"<|im_end|>", "▁x", "Ġa"}), (Tokens{"<|im_end|>▁x a"}));
  // Bytes that are not valid UTF-8 on their own come back raw (the caller decides).
  EXPECT_EQ(Decode(spec, {"ä½", "Ġ"}), (Tokens{"\xE4\xBD "}));
  EXPECT_EQ(Decode(spec, {}), (Tokens{""}));
}

TEST(DecoderTest, ByteFallbackCrateCases) {
  const char* spec = R"({"type":"ByteFallback"})";
  EXPECT_EQ(Decode(spec, {"Hey", "friend!"}), (Tokens{"Hey", "friend!"}));
  EXPECT_EQ(Decode(spec, {"<0x61>"}), (Tokens{"a"}));
  EXPECT_EQ(Decode(spec, {"<0xE5>"}), (Tokens{kFffd}));
  EXPECT_EQ(Decode(spec, {"<0xE5>", "<0x8f>"}), (Tokens{kFffd, kFffd}));
  EXPECT_EQ(Decode(spec, {"<0xE5>", "<0x8f>", "<0xab>"}), (Tokens{"叫"}));
  EXPECT_EQ(Decode(spec, {"<0xE5>", "<0x8f>", "<0xab>", "a"}), (Tokens{"叫", "a"}));
  EXPECT_EQ(Decode(spec, {"<0xE5>", "<0x8f>", "a"}), (Tokens{kFffd, kFffd, "a"}));
  // An invalid run is replaced byte for byte, its valid bytes included.
  EXPECT_EQ(Decode(spec, {"<0x61>", "<0xFF>", "b", "<0x62>"}), (Tokens{kFffd, kFffd, "b", "b"}));
  // Not byte tokens: wrong length, bad digits.
  EXPECT_EQ(Decode(spec, {"<0x6>", "<0x6G>", "<0x610>", "0x61"}),
            (Tokens{"<0x6>", "<0x6G>", "<0x610>", "0x61"}));
  // u8::from_str_radix takes a leading '+'.
  EXPECT_EQ(Decode(spec, {"<0x+A>"}), (Tokens{"\n"}));
}

TEST(DecoderTest, MetaspaceFuseStripReplace) {
  EXPECT_EQ(Decode(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})",
                   {"▁Hey", "▁friend!"}),
            (Tokens{"Hey", " friend!"}));
  EXPECT_EQ(Decode(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never"})",
                   {"▁Hey", "▁friend!"}),
            (Tokens{" Hey", " friend!"}));
  EXPECT_EQ(
      Decode(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first"})", {"▁▁a▁b", "▁c"}),
      (Tokens{"ab", " c"}));
  EXPECT_EQ(Decode(R"({"type":"Metaspace","replacement":"▁","add_prefix_space":true})", {"▁Hey"}),
            (Tokens{"Hey"}));
  EXPECT_EQ(Decode(R"({"type":"Metaspace","replacement":"▁","add_prefix_space":false})", {"▁Hey"}),
            (Tokens{" Hey"}));
  EXPECT_EQ(Decode(R"({"type":"Fuse"})", {"a", "b", "c"}), (Tokens{"abc"}));
  EXPECT_EQ(Decode(R"({"type":"Fuse"})", {}), (Tokens{""}));
  EXPECT_EQ(
      Decode(R"({"type":"Strip","content":"H","start":1,"stop":0})", {"Hey", " friend!", "HHH"}),
      (Tokens{"ey", " friend!", "HH"}));
  EXPECT_EQ(Decode(R"({"type":"Strip","content":"y","start":0,"stop":1})", {"Hey", " friend!"}),
            (Tokens{"He", " friend!"}));
  EXPECT_EQ(Decode(R"({"type":"Strip","content":"▁","start":2,"stop":2})", {"▁▁▁a▁▁▁", "▁", ""}),
            (Tokens{"▁a▁", "", ""}));
  EXPECT_EQ(Decode(R"({"type":"Replace","pattern":{"String":"▁"},"content":" "})",
                   {"▁Hey", "▁friend", "!"}),
            (Tokens{" Hey", " friend", "!"}));
  EXPECT_EQ(
      Decode(R"({"type":"Replace","pattern":{"Regex":"\\d+"},"content":"#"})", {"a12b3", "x"}),
      (Tokens{"a#b#", "x"}));
}

TEST(DecoderTest, Llama2Sequence) {
  const char* spec = R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"▁"},"content":" "},
      {"type":"ByteFallback"},{"type":"Fuse"},
      {"type":"Strip","content":" ","start":1,"stop":0}]})";
  EXPECT_EQ(Decode(spec, {"▁Hello", "<0xE5>", "<0x8F>", "<0xAB>", "▁world"}),
            (Tokens{"Hello叫 world"}));
  EXPECT_EQ(Decode(spec, {"▁▁x", "<0xE5>"}), (Tokens{" x" + kFffd}));
}

TEST(DecoderTest, NullAndErrors) {
  auto none = ParseDecoder(nlohmann::json());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto unknown = ParseDecoder(nlohmann::json::parse(R"({"type":"WordPiece","prefix":"##"})"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unsupported decoder type WordPiece"),
            absl::string_view::npos);
  auto nested = ParseDecoder(
      nlohmann::json::parse(R"({"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"CTC"}]})"));
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("CTC"), absl::string_view::npos);
  EXPECT_FALSE(ParseDecoder(nlohmann::json::parse(R"({"type":"Strip","content":"ab"})")).ok());
  EXPECT_FALSE(
      ParseDecoder(nlohmann::json::parse(R"({"type":"Strip","content":" ","start":-1})")).ok());
  EXPECT_FALSE(ParseDecoder(nlohmann::json::parse(
                                R"({"type":"Replace","pattern":{"Regex":"("},"content":""})"))
                   .ok());
  EXPECT_FALSE(ParseDecoder(nlohmann::json::parse(R"({"type":"Metaspace","replacement":"▁",
                                                      "prepend_scheme":"first",
                                                      "add_prefix_space":false})"))
                   .ok());
}

}  // namespace
}  // namespace kiln::tokenizer_internal
