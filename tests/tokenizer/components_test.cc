// Regex, ByteLevel tables and UTF-8 helpers of tokenizer/components.h. Expected values follow the
// Hugging Face `tokenizers` crate (Oniguruma regex semantics, bytes_char(), from_utf8_lossy).

#include "tokenizer/components.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::tokenizer_internal {
namespace {

constexpr absl::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr absl::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::shared_ptr<const Regex> MustCompile(absl::string_view pattern) {
  auto regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  return regex.ok() ? *regex : nullptr;
}

using Ranges = std::vector<std::pair<size_t, size_t>>;

// regex->FindAll(text), expected to succeed.
Ranges Find(const std::shared_ptr<const Regex>& regex, absl::string_view text) {
  if (regex == nullptr) return {};
  absl::StatusOr<Ranges> matches = regex->FindAll(text);
  EXPECT_TRUE(matches.ok()) << matches.status();
  return matches.ok() ? *std::move(matches) : Ranges{};
}

// The matched substrings; also checks that the matches tile the text (true of these patterns).
std::vector<std::string> Split(absl::string_view pattern, absl::string_view text) {
  auto regex = MustCompile(pattern);
  if (regex == nullptr) return {};
  std::vector<std::string> out;
  size_t prev = 0;
  for (const auto& [begin, end] : Find(regex, text)) {
    EXPECT_EQ(begin, prev) << "gap before a match in: " << text;
    out.emplace_back(text.substr(begin, end - begin));
    prev = end;
  }
  EXPECT_EQ(prev, text.size()) << "unmatched tail in: " << text;
  return out;
}

using Pieces = std::vector<std::string>;

TEST(RegexTest, Gpt2Splits) {
  EXPECT_EQ(
      Split(kGpt2, "Hello my friend, how is your day going?"),
      (Pieces{"Hello", " my", " friend", ",", " how", " is", " your", " day", " going", "?"}));
  EXPECT_EQ(Split(kGpt2, "Hello there       dear"), (Pieces{"Hello", " there", "      ", " dear"}));
  EXPECT_EQ(Split(kGpt2, "Hello there\nHello there"),
            (Pieces{"Hello", " there", "\n", "Hello", " there"}));
  EXPECT_EQ(Split(kGpt2, "I'm sure you'll see"),
            (Pieces{"I", "'m", " sure", " you", "'ll", " see"}));
  // Contractions are case-sensitive in GPT-2's pattern.
  EXPECT_EQ(Split(kGpt2, "IT'S"), (Pieces{"IT", "'", "S"}));
  EXPECT_EQ(Split(kGpt2, "$100.50"), (Pieces{"$", "100", ".", "50"}));
  EXPECT_EQ(Split(kGpt2, "end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(Split(kGpt2, "a\n\n b"), (Pieces{"a", "\n\n", " b"}));
}

TEST(RegexTest, Qwen2Splits) {
  EXPECT_EQ(Split(kQwen2, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Split(kQwen2, "I'M don't"), (Pieces{"I", "'M", " don", "'t"}));
  EXPECT_EQ(Split(kQwen2, "IT'S"), (Pieces{"IT", "'S"}));
  // Digits one at a time.
  EXPECT_EQ(Split(kQwen2, "123456"), (Pieces{"1", "2", "3", "4", "5", "6"}));
  EXPECT_EQ(Split(kQwen2, "$100.50"), (Pieces{"$", "1", "0", "0", ".", "5", "0"}));
  // Spaces before a word: all but the last stay apart.
  EXPECT_EQ(Split(kQwen2, "a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(Split(kQwen2, "   leading"), (Pieces{"  ", " leading"}));
  EXPECT_EQ(Split(kQwen2, "end   "), (Pieces{"end", "   "}));
  // Newline runs, with spaces before them, and \r\n.
  EXPECT_EQ(Split(kQwen2, "a\n\nb"), (Pieces{"a", "\n\n", "b"}));
  EXPECT_EQ(Split(kQwen2, "a  \nb"), (Pieces{"a", "  \n", "b"}));
  EXPECT_EQ(Split(kQwen2, "a\n b"), (Pieces{"a", "\n", " b"}));
  EXPECT_EQ(Split(kQwen2, "x\r\ny"), (Pieces{"x", "\r\n", "y"}));
  // Punctuation takes the newlines after it.
  EXPECT_EQ(Split(kQwen2, "Hi!\n\nYo"), (Pieces{"Hi", "!\n\n", "Yo"}));
  // A tab (or any non-letter, non-digit but \r\n) may lead a word.
  EXPECT_EQ(Split(kQwen2, "a\tb"), (Pieces{"a", "\tb"}));
  // Emoji (with a skin tone modifier) and CJK.
  EXPECT_EQ(Split(kQwen2, "hi \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD there"),
            (Pieces{"hi", " \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD", " there"}));
  EXPECT_EQ(Split(kQwen2, "你好世界"), (Pieces{"你好世界"}));
  EXPECT_EQ(Split(kQwen2, "中文，English"), (Pieces{"中文", "，English"}));
}

TEST(RegexTest, Llama3DigitGroups) {
  EXPECT_EQ(Split(kLlama3, "1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(Split(kLlama3, "pi is 3.14159"), (Pieces{"pi", " is", " ", "3", ".", "141", "59"}));
  EXPECT_EQ(Split(kLlama3, "We've 2 cats"), (Pieces{"We", "'ve", " ", "2", " cats"}));
}

TEST(RegexTest, CompileErrorNamesPattern) {
  auto regex = Regex::Compile("(unclosed");
  ASSERT_FALSE(regex.ok());
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(regex.status().message().find("(unclosed"), absl::string_view::npos) << regex.status();
  EXPECT_FALSE(Regex::Compile("[a-").ok());
  EXPECT_FALSE(Regex::Compile("\\p{NoSuchProperty}").ok());
}

TEST(RegexTest, EmptyMatchesAreSkipped) {
  auto regex = MustCompile("a*");
  ASSERT_NE(regex, nullptr);
  EXPECT_EQ(Find(regex, "baab"), (std::vector<std::pair<size_t, size_t>>{{1, 3}}));
  EXPECT_TRUE(Find(regex, "").empty());
  EXPECT_TRUE(Find(regex, "bbb").empty());
  // After an empty match the search moves one whole character on (no split inside "é").
  auto lookahead = MustCompile("(?=x)|é");
  ASSERT_NE(lookahead, nullptr);
  EXPECT_EQ(Find(lookahead, "éxé"), (std::vector<std::pair<size_t, size_t>>{{0, 2}, {3, 5}}));
  // As with Oniguruma's iterator, a preferred empty match hides a longer one at the same place.
  EXPECT_TRUE(Find(MustCompile("(?=a)|ab"), "abab").empty());
}

TEST(RegexTest, OnigurumaClasses) {
  // \s is White_Space: not U+180E (PCRE2's \s alone would take it); U+3000 and U+0085 are.
  EXPECT_TRUE(Find(MustCompile("\\s"), "\xE1\xA0\x8E").empty());
  EXPECT_EQ(Find(MustCompile("\\s+"), "a\xE3\x80\x80\xC2\x85z").size(), 1u);
  EXPECT_EQ(Find(MustCompile("[^\\s]+"), "ab c"),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {3, 4}}));
  EXPECT_EQ(Find(MustCompile("\\S+"), "ab\xE1\xA0\x8E c"),
            (std::vector<std::pair<size_t, size_t>>{{0, 5}, {6, 7}}));
  // \w takes combining marks (e + U+0301 is one word).
  EXPECT_EQ(Find(MustCompile("\\w+"), "e\xCC\x81t\xC3\xA9!"),
            (std::vector<std::pair<size_t, size_t>>{{0, 6}}));
  // \h is a hex digit; \uHHHH is a code point.
  EXPECT_EQ(Find(MustCompile("\\h+"), "0xBEEFy"),
            (std::vector<std::pair<size_t, size_t>>{{0, 1}, {2, 6}}));
  EXPECT_EQ(Find(MustCompile("[\\u4e00-\\u9fa5]+"), "ab中文c"),
            (std::vector<std::pair<size_t, size_t>>{{2, 8}}));
  // Escapes and \Q..\E are left alone.
  EXPECT_EQ(Find(MustCompile("\\\\s"), "a\\sb"), (std::vector<std::pair<size_t, size_t>>{{1, 3}}));
  EXPECT_EQ(Find(MustCompile("\\Q\\s+\\E"), "x\\s+y"),
            (std::vector<std::pair<size_t, size_t>>{{1, 4}}));
  EXPECT_EQ(Find(MustCompile("[]\\s]+"), "a] b"), (std::vector<std::pair<size_t, size_t>>{{1, 3}}));
  EXPECT_EQ(Find(MustCompile("[[:alpha:]\\s]+"), "ab c1"),
            (std::vector<std::pair<size_t, size_t>>{{0, 4}}));
}

TEST(RegexTest, OnigurumaRubyOptions) {
  // ^ and $ are line anchors; (?m) lets the dot match a newline.
  EXPECT_EQ(Find(MustCompile("^a|b$"), "a\nab\nb"),
            (std::vector<std::pair<size_t, size_t>>{{0, 1}, {2, 3}, {3, 4}, {5, 6}}));
  EXPECT_EQ(Find(MustCompile("\\Aa"), "a\na"), (std::vector<std::pair<size_t, size_t>>{{0, 1}}));
  EXPECT_TRUE(Find(MustCompile("a.b"), "a\nb").empty());
  EXPECT_EQ(Find(MustCompile("(?m:a.b)"), "a\nb"),
            (std::vector<std::pair<size_t, size_t>>{{0, 3}}));
  EXPECT_EQ(Find(MustCompile("(?im)A.B"), "a\nb"),
            (std::vector<std::pair<size_t, size_t>>{{0, 3}}));
  EXPECT_EQ(Find(MustCompile("(?i:'s)"), "'S"), (std::vector<std::pair<size_t, size_t>>{{0, 2}}));
  // A lone \r is not a line end.
  EXPECT_TRUE(Find(MustCompile("a$"), "a\rb").empty());
}

TEST(RegexTest, InvalidUtf8IsSkipped) {
  // Components are given valid UTF-8; anything else is matched around, never read past.
  auto regex = MustCompile(".");
  ASSERT_NE(regex, nullptr);
  EXPECT_EQ(Find(regex, "ab\xE2\x82"), (std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}}));
  EXPECT_EQ(Find(regex,
                 "\xFF"
                 "a\xC3\xA9\x80\xF0"),
            (std::vector<std::pair<size_t, size_t>>{{1, 2}, {2, 4}}));
  EXPECT_EQ(Find(MustCompile("\\w+"),
                 "ab\xFF"
                 "cd"),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {3, 5}}));
}

TEST(RegexTest, SharedAcrossThreads) {
  auto regex = MustCompile(kQwen2);
  ASSERT_NE(regex, nullptr);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "The quick brown fox's 123 jumps!\n\n  over 你好 ";
  const auto expected = Find(regex, text);
  std::vector<std::thread> threads;
  std::vector<bool> same(4, false);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int i = 0; i < 20; ++i) ok = ok && Find(regex, text) == expected;
      same[t] = ok;
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(same[t]) << "thread " << t;
}

TEST(RegexTest, LongInputs) {
  // Long runs that backtrack (\s+(?!\S)) and long single matches stay correct.
  const std::string spaces(100000, ' ');
  EXPECT_EQ(Split(kQwen2, spaces + "x"), (Pieces{std::string(99999, ' '), " x"}));
  const std::string letters(200000, 'a');
  EXPECT_EQ(Split(kGpt2, letters), (Pieces{letters}));
}

TEST(ByteLevelTest, Table) {
  const auto& table = ByteToUnicode();
  EXPECT_EQ(table[' '], "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(table['\n'], "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(table[0], "\xC4\x80");     // Ā U+0100
  EXPECT_EQ(table[0x7F], "\xC4\xA1");  // ġ U+0121
  EXPECT_EQ(table[0xAD], "\xC5\x83");  // Ń U+0143
  EXPECT_EQ(table['!'], "!");
  EXPECT_EQ(table['~'], "~");
  EXPECT_EQ(table[0xA1], "\xC2\xA1");  // ¡ keeps its code point
  EXPECT_EQ(table[0xFF], "\xC3\xBF");  // ÿ
  std::set<std::string> distinct(table.begin(), table.end());
  EXPECT_EQ(distinct.size(), 256u);
  for (int b = 0; b < 256; ++b) {
    const std::string& s = table[b];
    char32_t cp = static_cast<uint8_t>(s[0]);
    if (s.size() == 2) cp = (cp & 0x1F) << 6 | (static_cast<uint8_t>(s[1]) & 0x3F);
    ASSERT_TRUE(UnicodeToByte(cp).has_value()) << b;
    EXPECT_EQ(*UnicodeToByte(cp), b);
  }
  EXPECT_FALSE(UnicodeToByte(0x144).has_value());
  EXPECT_FALSE(UnicodeToByte(0x80).has_value());
  EXPECT_FALSE(UnicodeToByte(' ').has_value());
  EXPECT_FALSE(UnicodeToByte(0x2581).has_value());
}

TEST(ByteLevelTest, Encode) {
  EXPECT_EQ(ByteLevelEncode(""), "");
  EXPECT_EQ(ByteLevelEncode(" Hello\n"), "\xC4\xA0Hello\xC4\x8A");
  EXPECT_EQ(ByteLevelEncode("⭢"), "\xC3\xA2\xC5\x83\xC2\xA2");  // âŃ¢
  EXPECT_EQ(ByteLevelEncode(absl::string_view("\0\xFF", 2)), "\xC4\x80\xC3\xBF");
}

TEST(Utf8Test, FindInvalid) {
  EXPECT_EQ(FindInvalidUtf8(""), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("plain ascii text, long enough for the fast path"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80"), std::nullopt);
  EXPECT_EQ(FindInvalidUtf8(absl::string_view("a\0b", 3)), std::nullopt);
  // Boundaries that are valid.
  EXPECT_EQ(FindInvalidUtf8("\xC2\x80"), std::nullopt);          // U+0080
  EXPECT_EQ(FindInvalidUtf8("\xE0\xA0\x80"), std::nullopt);      // U+0800
  EXPECT_EQ(FindInvalidUtf8("\xED\x9F\xBF"), std::nullopt);      // U+D7FF
  EXPECT_EQ(FindInvalidUtf8("\xEE\x80\x80"), std::nullopt);      // U+E000
  EXPECT_EQ(FindInvalidUtf8("\xF0\x90\x80\x80"), std::nullopt);  // U+10000
  EXPECT_EQ(FindInvalidUtf8("\xF4\x8F\xBF\xBF"), std::nullopt);  // U+10FFFF
  // Overlongs.
  EXPECT_EQ(FindInvalidUtf8("\xC0\x80"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\xC1\xBF"), 0u);
  EXPECT_EQ(FindInvalidUtf8("ab\xE0\x80\x80"), 2u);
  EXPECT_EQ(FindInvalidUtf8("\xE0\x9F\xBF"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\xF0\x8F\xBF\xBF"), 0u);
  // Surrogates.
  EXPECT_EQ(FindInvalidUtf8("x\xED\xA0\x80"), 1u);
  EXPECT_EQ(FindInvalidUtf8("\xED\xBF\xBF"), 0u);
  // Above U+10FFFF.
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\xF5\x80\x80\x80"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\xFF"), 0u);
  // Truncated and stray bytes.
  EXPECT_EQ(FindInvalidUtf8("ab\xE2\x82"), 2u);
  EXPECT_EQ(FindInvalidUtf8("\xF0\x9F\x98"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\xC3"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\x80"), 0u);
  EXPECT_EQ(FindInvalidUtf8("\xE2\x82\x41"), 0u);
  EXPECT_EQ(FindInvalidUtf8("0123456789abcdef\xC3\xA9\xC3"), 18u);
  EXPECT_EQ(FindInvalidUtf8("0123456789abcdefg\x80"), 17u);
}

TEST(Utf8Test, ToValidUtf8LikeFromUtf8Lossy) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(ToValidUtf8(""), "");
  EXPECT_EQ(ToValidUtf8("h\xC3\xA9llo"), "h\xC3\xA9llo");
  EXPECT_EQ(ToValidUtf8("a\xE2\x82"
                        "b"),
            "a" + r + "b");  // one maximal subpart
  EXPECT_EQ(ToValidUtf8("\xF0\x90\x80"), r);
  EXPECT_EQ(ToValidUtf8("\xF0\x90\x80"
                        "\xF0\x90\x80\x80"),
            r + "\xF0\x90\x80\x80");
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), r + r + r);  // surrogate: every byte
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), r + r);
  EXPECT_EQ(ToValidUtf8("\xE0\x80"), r + r);
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(ToValidUtf8("\xFF\xFE"
                        "a"),
            r + r + "a");
  EXPECT_EQ(ToValidUtf8("\xE2\x82\xAC\xE2"), "\xE2\x82\xAC" + r);
  EXPECT_EQ(ToValidUtf8("\xF1\x80\x80\xE1\x80\xC2"), r + r + r);
}

}  // namespace
}  // namespace kiln::tokenizer_internal
