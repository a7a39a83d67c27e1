// Pre-tokenizers of tokenizer/components.h. Expected pieces are those of the Hugging Face
// `tokenizers` crate (its own unit tests where there are some).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"

namespace kiln::tokenizer_internal {
namespace {

using Pieces = std::vector<std::string>;

std::unique_ptr<PreTokenizer> Make(absl::string_view spec) {
  auto parsed = ParsePreTokenizer(nlohmann::json::parse(spec));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *std::move(parsed) : nullptr;
}

Pieces PreTok(const PreTokenizer& pre, Pieces pieces, bool first = true) {
  const absl::Status status = pre.PreTokenize(pieces, first);
  EXPECT_TRUE(status.ok()) << status;
  if (!status.ok()) return {"<pre-tokenize failed>"};
  return pieces;
}
Pieces PreTok(absl::string_view spec, absl::string_view text, bool first = true) {
  auto pre = Make(spec);
  if (pre == nullptr) return {"<parse failed>"};
  return PreTok(*pre, Pieces{std::string(text)}, first);
}

std::string SplitSpec(absl::string_view pattern_kind, absl::string_view pattern,
                      absl::string_view behavior, bool invert) {
  nlohmann::json spec = {{"type", "Split"},
                         {"pattern", {{std::string(pattern_kind), std::string(pattern)}}},
                         {"behavior", std::string(behavior)},
                         {"invert", invert}};
  return spec.dump();
}

TEST(SplitPreTokenizerTest, BehaviorsWithInvertedRegex) {
  // The crate's split.rs test: a regex for words and punctuation, inverted.
  const char* text = "How are you doing?";
  EXPECT_EQ(PreTok(SplitSpec("Regex", R"(\w+|[^\w\s]+)", "Removed", true), text),
            (Pieces{"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(PreTok(SplitSpec("Regex", R"(\w+|[^\w\s]+)", "Isolated", true), text),
            (Pieces{"How", " ", "are", " ", "you", " ", "doing", "?"}));
  EXPECT_EQ(PreTok(SplitSpec("Regex", R"(\w+|[^\w\s]+)", "MergedWithPrevious", true), text),
            (Pieces{"How ", "are ", "you ", "doing", "?"}));
  EXPECT_EQ(PreTok(SplitSpec("Regex", R"(\w+|[^\w\s]+)", "MergedWithNext", true), text),
            (Pieces{"How", " are", " you", " doing", "?"}));
  EXPECT_EQ(PreTok(SplitSpec("Regex", R"(\w+|[^\w\s]+)", "Contiguous", true), text),
            (Pieces{"How", " ", "are", " ", "you", " ", "doing?"}));
}

TEST(SplitPreTokenizerTest, BehaviorsWithStringPattern) {
  // normalizer.rs's documented example: "-" in "the-final--countdown".
  const char* text = "the-final--countdown";
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "Removed", false), text),
            (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "Isolated", false), text),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "MergedWithPrevious", false), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "MergedWithNext", false), text),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "Contiguous", false), text),
            (Pieces{"the", "-", "final", "--", "countdown"}));
  // Inverted: the non-matching parts are the delimiters.
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "Removed", true), text), (Pieces{"-", "-", "-"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "MergedWithNext", true), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "-", "MergedWithPrevious", true), text),
            (Pieces{"the", "-final", "-", "-countdown"}));
}

TEST(SplitPreTokenizerTest, StringPatternIsLiteral) {
  EXPECT_EQ(PreTok(SplitSpec("String", ".*", "Isolated", false), "a.*b.c"),
            (Pieces{"a", ".*", "b.c"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "Hello", "Removed", true), "Hello Hello Hello"),
            PreTok(SplitSpec("String", " ", "Removed", false), "Hello Hello Hello"));
  EXPECT_EQ(PreTok(SplitSpec("Regex", R"(\s+)", "Removed", false), "Hey,   man!"),
            (Pieces{"Hey,", "man!"}));
  EXPECT_EQ(PreTok(SplitSpec("String", "", "Isolated", false), "abc"), (Pieces{"abc"}));
}

TEST(SplitPreTokenizerTest, Qwen2Pattern) {
  const std::string spec = SplitSpec(
      "Regex",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      "Isolated", false);
  EXPECT_EQ(PreTok(spec, "Hello, world! It's 2024.\n\n  Bye"),
            (Pieces{"Hello", ",", " world", "!", " It", "'s", " ", "2", "0", "2", "4", ".\n\n", " ",
                    " Bye"}));
}

TEST(SplitPreTokenizerTest, SplitsEveryPiece) {
  auto pre = Make(SplitSpec("String", " ", "Removed", false));
  ASSERT_NE(pre, nullptr);
  EXPECT_EQ(PreTok(*pre, Pieces{"a b", "", "c d"}), (Pieces{"a", "b", "c", "d"}));
}

TEST(ByteLevelPreTokenizerTest, CrateCases) {
  const char* text = "Hello my friend, how is your day going?";
  EXPECT_EQ(
      PreTok(R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true})", text),
      (Pieces{"Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "Ġis", "Ġyour", "Ġday", "Ġgoing", "?"}));
  const Pieces with_prefix{"ĠHello", "Ġmy",   "Ġfriend", ",",      "Ġhow",
                           "Ġis",    "Ġyour", "Ġday",    "Ġgoing", "?"};
  EXPECT_EQ(PreTok(R"({"type":"ByteLevel","add_prefix_space":true})", text), with_prefix);
  EXPECT_EQ(PreTok(R"({"type":"ByteLevel","add_prefix_space":true})", std::string(" ") + text),
            with_prefix);
  EXPECT_EQ(PreTok(R"({"type":"ByteLevel","use_regex":false})", text),
            (Pieces{"ĠHelloĠmyĠfriend,ĠhowĠisĠyourĠdayĠgoing?"}));
  EXPECT_EQ(PreTok(R"({"type":"ByteLevel","add_prefix_space":false})", "Hello there\nHello there"),
            (Pieces{"Hello", "Ġthere", "Ċ", "Hello", "Ġthere"}));
  EXPECT_EQ(PreTok(R"({"type":"ByteLevel","add_prefix_space":false})", "Hello there       dear"),
            (Pieces{"Hello", "Ġthere", "ĠĠĠĠĠĠ", "Ġdear"}));
  EXPECT_EQ(PreTok(R"({"type":"ByteLevel","add_prefix_space":false})", "i⭢j"),
            (Pieces{"i", "âŃ¢", "j"}));
}

TEST(ByteLevelPreTokenizerTest, PrefixSpaceOnEveryPiece) {
  // As the crate: every piece handed over gets the space, first of the text or not.
  auto pre = Make(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":false})");
  ASSERT_NE(pre, nullptr);
  EXPECT_EQ(PreTok(*pre, Pieces{"a", " b", "c"}, false), (Pieces{"Ġa", "Ġb", "Ġc"}));
}

TEST(ByteLevelPreTokenizerTest, QwenSequence) {
  // Qwen2 / Llama-3: Split (Isolated) then ByteLevel without its own regex.
  const std::string spec = R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       "behavior":"Isolated","invert":false},
      {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}]})";
  EXPECT_EQ(PreTok(spec, "Hi  there\n\n你好 👋"),
            (Pieces{"Hi", "Ġ", "Ġthere", "ĊĊ", "ä½łå¥½", "ĠðŁĳĭ"}));
}

TEST(MetaspacePreTokenizerTest, CrateCases) {
  const char* always = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})";
  EXPECT_EQ(PreTok(always, "Hey friend!"), (Pieces{"▁Hey", "▁friend!"}));
  EXPECT_EQ(PreTok(always, "Hey   friend!"), (Pieces{"▁Hey", "▁", "▁", "▁friend!"}));
  EXPECT_EQ(PreTok(always, " Hey"), (Pieces{"▁Hey"}));
  // Legacy add_prefix_space: true is "always"; false is "never".
  EXPECT_EQ(PreTok(R"({"type":"Metaspace","replacement":"▁","add_prefix_space":true})", "Hey you"),
            (Pieces{"▁Hey", "▁you"}));
  EXPECT_EQ(PreTok(R"({"type":"Metaspace","replacement":"▁","add_prefix_space":false})", "Hey you"),
            (Pieces{"Hey", "▁you"}));
  EXPECT_EQ(PreTok(R"({"type":"Metaspace","replacement":"_","prepend_scheme":"never"})", "a b"),
            (Pieces{"a", "_b"}));
}

TEST(MetaspacePreTokenizerTest, FirstSchemeWithAddedTokenSplits) {
  // The crate's non_legacy_meta_space test: text already split around "<s>".
  auto first = Make(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first",
                        "split":false})");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(PreTok(*first, Pieces{"Hey my friend ", "<s>", "how▁are you"}),
            (Pieces{"▁Hey▁my▁friend▁", "<s>", "how▁are▁you"}));
  EXPECT_EQ(PreTok(*first, Pieces{" Hey ", "<s>", "how"}), (Pieces{"▁Hey▁", "<s>", "how"}));
  EXPECT_EQ(PreTok(*first, Pieces{" Hey ", "<s>", "how ", "<s>", "are ", "<s>", " you"}),
            (Pieces{"▁Hey▁", "<s>", "how▁", "<s>", "are▁", "<s>", "▁you"}));
  // Text that follows an added token is not the first of the text.
  EXPECT_EQ(PreTok(*first, Pieces{"how are"}, /*first=*/false), (Pieces{"how▁are"}));
  auto always = Make(R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always",
                         "split":true})");
  ASSERT_NE(always, nullptr);
  EXPECT_EQ(PreTok(*always, Pieces{"▁Hey▁my▁friend▁", "<s>", "how▁are▁you"}),
            (Pieces{"▁Hey", "▁my", "▁friend", "▁", "▁<s>", "▁how", "▁are", "▁you"}));
  EXPECT_EQ(PreTok(*always, Pieces{"how are"}, /*first=*/false), (Pieces{"▁how", "▁are"}));
}

TEST(MetaspacePreTokenizerTest, FirstSchemeAfterRemovedStart) {
  // WhitespaceSplit drops the leading spaces, so the first word no longer starts the text
  // (the crate: offsets_original().0 != 0) and gets no prefix.
  const char* spec = R"({"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},
      {"type":"Metaspace","replacement":"▁","prepend_scheme":"first"}]})";
  EXPECT_EQ(PreTok(spec, "  hello world"), (Pieces{"hello", "world"}));
  EXPECT_EQ(PreTok(spec, "hello world"), (Pieces{"▁hello", "world"}));
}

TEST(MetaspacePreTokenizerTest, RejectsBadSpecs) {
  EXPECT_FALSE(
      ParsePreTokenizer(nlohmann::json::parse(
                            R"({"type":"Metaspace","replacement":"▁","add_prefix_space":false,
                       "prepend_scheme":"always"})"))
          .ok());
  EXPECT_FALSE(
      ParsePreTokenizer(nlohmann::json::parse(R"({"type":"Metaspace","replacement":"ab"})")).ok());
  EXPECT_FALSE(ParsePreTokenizer(
                   nlohmann::json::parse(
                       R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"sometimes"})"))
                   .ok());
}

TEST(DigitsPreTokenizerTest, CrateCases) {
  EXPECT_EQ(PreTok(R"({"type":"Digits","individual_digits":false})", "Hey 123 friend!"),
            (Pieces{"Hey ", "123", " friend!"}));
  EXPECT_EQ(PreTok(R"({"type":"Digits","individual_digits":true})", "Hey 123 friend!"),
            (Pieces{"Hey ", "1", "2", "3", " friend!"}));
  // char::is_numeric covers other numerals too (Arabic-Indic, Roman numeral, superscript).
  EXPECT_EQ(PreTok(R"({"type":"Digits","individual_digits":false})", "x٣Ⅻ²y"),
            (Pieces{"x", "٣Ⅻ²", "y"}));
}

TEST(PunctuationPreTokenizerTest, CrateCases) {
  EXPECT_EQ(PreTok(R"({"type":"Punctuation"})", "Hey friend!     How are you?!?"),
            (Pieces{"Hey friend", "!", "     How are you", "?", "!", "?"}));
  EXPECT_EQ(PreTok(R"({"type":"Punctuation","behavior":"Contiguous"})", "Hey!?! you«»"),
            (Pieces{"Hey", "!?!", " you", "«»"}));
  // ASCII symbols count (is_ascii_punctuation); non-ASCII symbols (Sm, So) do not.
  EXPECT_EQ(PreTok(R"({"type":"Punctuation"})", "a+b×c"), (Pieces{"a", "+", "b×c"}));
}

TEST(WhitespacePreTokenizerTest, CrateCases) {
  EXPECT_EQ(PreTok(R"({"type":"Whitespace"})", "Hey man!"), (Pieces{"Hey", "man", "!"}));
  EXPECT_EQ(PreTok(R"({"type":"Whitespace"})", "How are you doing?"),
            (Pieces{"How", "are", "you", "doing", "?"}));
  EXPECT_EQ(PreTok(R"({"type":"Whitespace"})", "\n"), (Pieces{}));
  EXPECT_EQ(PreTok(R"({"type":"Whitespace"})", "e\u0301t\u00e9... ok"),
            (Pieces{"e\u0301t\u00e9", "...", "ok"}));
  EXPECT_EQ(PreTok(R"({"type":"WhitespaceSplit"})", "Hey man!"), (Pieces{"Hey", "man!"}));
  EXPECT_EQ(PreTok(R"({"type":"WhitespaceSplit"})", "Hey, man, Good?"),
            (Pieces{"Hey,", "man,", "Good?"}));
  EXPECT_EQ(PreTok(R"({"type":"WhitespaceSplit"})", "\u3000a\u00a0b "), (Pieces{"a", "b"}));
}

TEST(OtherPreTokenizerTest, BertAndCharDelimiter) {
  EXPECT_EQ(PreTok(R"({"type":"BertPreTokenizer"})", "Hey friend!     How are you?!?"),
            (Pieces{"Hey", "friend", "!", "How", "are", "you", "?", "!", "?"}));
  EXPECT_EQ(PreTok(R"({"type":"CharDelimiterSplit","delimiter":"x"})", "axbxxc"),
            (Pieces{"a", "b", "c"}));
}

TEST(PreTokenizerParseTest, NullAndErrors) {
  auto none = ParsePreTokenizer(nlohmann::json());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto unknown = ParsePreTokenizer(nlohmann::json::parse(R"({"type":"UnicodeScripts"})"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unsupported pre-tokenizer type UnicodeScripts"),
            absl::string_view::npos);
  auto nested = ParsePreTokenizer(nlohmann::json::parse(
      R"({"type":"Sequence","pretokenizers":[{"type":"Digits"},{"type":"Nope"}]})"));
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("Nope"), absl::string_view::npos);
  auto bad_regex = ParsePreTokenizer(nlohmann::json::parse(
      R"({"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated","invert":false})"));
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("(a"), absl::string_view::npos);
  EXPECT_FALSE(
      ParsePreTokenizer(nlohmann::json::parse(
                            R"({"type":"Split","pattern":{"Regex":"a"},"behavior":"Sideways"})"))
          .ok());
  EXPECT_FALSE(
      ParsePreTokenizer(nlohmann::json::parse(R"({"type":"Split","behavior":"Removed"})")).ok());
  EXPECT_FALSE(ParsePreTokenizer(nlohmann::json::parse(R"({"type":"ByteLevel",
                                                          "add_prefix_space":"yes"})"))
                   .ok());
  EXPECT_FALSE(ParsePreTokenizer(nlohmann::json::parse(R"({"kind":"ByteLevel"})")).ok());
  EXPECT_FALSE(ParsePreTokenizer(nlohmann::json::parse(R"([1,2])")).ok());
}

}  // namespace
}  // namespace kiln::tokenizer_internal
