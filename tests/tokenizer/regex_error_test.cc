// PCRE2 match errors (here its match limit, lowered by a testing hook) propagate as a status out
// of Regex::FindAll, the components and Tokenizer::Encode / Decode, naming the pattern, instead
// of giving a partial result. Both the JIT and the interpreter are checked.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using tokenizer_internal::Regex;
using tokenizer_internal::SetRegexJitForTesting;
using tokenizer_internal::SetRegexMatchLimitForTesting;
using Ids = std::vector<int32_t>;

// Backtracks exponentially on a run of a's that does not end the line. Within PCRE2's default
// limits for kInput (some 300k backtracks), far beyond kLowLimit.
constexpr absl::string_view kPattern = "(a|aa)+$";
constexpr uint32_t kLowLimit = 100;
const std::string kInput = std::string(26, 'a') + "b";
constexpr absl::string_view kExpectedError =
    "regex '(a|aa)+$' failed to match: match limit exceeded";

bool Contains(absl::string_view text, absl::string_view part) {
  return text.find(part) != absl::string_view::npos;
}

// The hooks act on this thread's match state: every test restores the defaults.
class RegexErrorTest : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override { SetRegexJitForTesting(GetParam()); }
  void TearDown() override {
    SetRegexMatchLimitForTesting(0);
    SetRegexJitForTesting(true);
  }
};

INSTANTIATE_TEST_SUITE_P(JitAndInterpreter, RegexErrorTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Jit" : "Interpreter";
                         });

void ExpectMatchLimitError(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(Contains(status.message(), kExpectedError)) << status;
}

TEST_P(RegexErrorTest, FindAllReportsTheError) {
  absl::StatusOr<std::shared_ptr<const Regex>> regex = Regex::Compile(kPattern);
  ASSERT_TRUE(regex.ok()) << regex.status();
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> matches = (*regex)->FindAll(kInput);
  ASSERT_TRUE(matches.ok()) << matches.status();
  EXPECT_TRUE(matches->empty());

  SetRegexMatchLimitForTesting(kLowLimit);
  matches = (*regex)->FindAll(kInput);
  ASSERT_FALSE(matches.ok());
  ExpectMatchLimitError(matches.status());
  // An easy match still succeeds under the low limit; after errors the state is reusable.
  matches = (*regex)->FindAll("aa\nb");
  ASSERT_TRUE(matches.ok()) << matches.status();
  EXPECT_EQ(*matches, (std::vector<std::pair<size_t, size_t>>{{0, 2}}));

  SetRegexMatchLimitForTesting(0);  // PCRE2's default again
  matches = (*regex)->FindAll(kInput);
  EXPECT_TRUE(matches.ok()) << matches.status();
}

TEST_P(RegexErrorTest, ComponentsReportTheError) {
  const nlohmann::json pattern = {{"Regex", std::string(kPattern)}};
  auto pre = tokenizer_internal::ParsePreTokenizer(
      {{"type", "Split"}, {"pattern", pattern}, {"behavior", "Isolated"}, {"invert", false}});
  ASSERT_TRUE(pre.ok()) << pre.status();
  auto normalizer = tokenizer_internal::ParseNormalizer(
      {{"type", "Replace"}, {"pattern", pattern}, {"content", "x"}});
  ASSERT_TRUE(normalizer.ok()) << normalizer.status();
  auto decoder = tokenizer_internal::ParseDecoder(
      {{"type", "Replace"}, {"pattern", pattern}, {"content", "x"}});
  ASSERT_TRUE(decoder.ok()) << decoder.status();

  SetRegexMatchLimitForTesting(kLowLimit);
  std::vector<std::string> pieces = {"ok", kInput};
  ExpectMatchLimitError((*pre)->PreTokenize(pieces, true));
  ExpectMatchLimitError((*normalizer)->Normalize(kInput).status());
  ExpectMatchLimitError((*decoder)->Decode({"ok", kInput}).status());
}

// Split by whitespace, then by kPattern (one token per character: no merges).
constexpr absl::string_view kSplitJson = R"json({"version": "1.0", "added_tokens": [],
 "normalizer": null,
 "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
  {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": false}]},
 "post_processor": null, "decoder": null,
 "model": {"type": "BPE", "dropout": null, "unk_token": "?", "fuse_unk": true,
  "byte_fallback": false, "vocab": {"?": 0, "a": 1, "b": 2, "x": 3}, "merges": []}})json";

TEST_P(RegexErrorTest, EncodeFailsInThePreTokenizer) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(kSplitJson);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "ab " + kInput;
  absl::StatusOr<Ids> ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), text.size() - 1);

  SetRegexMatchLimitForTesting(kLowLimit);
  ids = (*tokenizer)->Encode(text);
  ASSERT_FALSE(ids.ok()) << "got " << ids->size() << " ids";
  ExpectMatchLimitError(ids.status());
  // Text the pattern settles quickly still encodes.
  ids = (*tokenizer)->Encode("ab ba");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (Ids{1, 2, 2, 1}));
}

// A Replace normalizer with kPattern, a normalized added token and a Fuse + Replace decoder.
constexpr absl::string_view kReplaceJson = R"json({"version": "1.0",
 "added_tokens": [{"id": 4, "content": "<t>", "single_word": false, "lstrip": false,
   "rstrip": false, "normalized": true, "special": false}],
 "normalizer": {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "x"},
 "pre_tokenizer": null, "post_processor": null,
 "decoder": {"type": "Sequence", "decoders": [{"type": "Fuse"},
  {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "x"}]},
 "model": {"type": "BPE", "dropout": null, "unk_token": "?", "fuse_unk": true,
  "byte_fallback": false, "vocab": {"?": 0, "a": 1, "b": 2, "x": 3}, "merges": []}})json";

TEST_P(RegexErrorTest, EncodeFailsInTheNormalizer) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(kReplaceJson);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<Ids> ids = (*tokenizer)->Encode(kInput);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->size(), kInput.size());
  EXPECT_EQ(*(*tokenizer)->Encode("baa"), (Ids{2, 3}));

  SetRegexMatchLimitForTesting(kLowLimit);
  ids = (*tokenizer)->Encode(kInput);
  ASSERT_FALSE(ids.ok()) << "got " << ids->size() << " ids";
  ExpectMatchLimitError(ids.status());
  // The same with an added token in the text.
  ids = (*tokenizer)->Encode("<t>" + kInput);
  ASSERT_FALSE(ids.ok()) << "got " << ids->size() << " ids";
  ExpectMatchLimitError(ids.status());
}

TEST_P(RegexErrorTest, DecodeFailsInTheDecoder) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(kReplaceJson);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  Ids ids(26, 1);
  ids.push_back(2);
  absl::StatusOr<std::string> text = (*tokenizer)->Decode(ids);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, kInput);

  SetRegexMatchLimitForTesting(kLowLimit);
  text = (*tokenizer)->Decode(ids);
  ASSERT_FALSE(text.ok()) << "got " << *text;
  ExpectMatchLimitError(text.status());
  text = (*tokenizer)->DecodeBytes(ids);
  ASSERT_FALSE(text.ok()) << "got " << *text;
  ExpectMatchLimitError(text.status());
  EXPECT_EQ(*(*tokenizer)->Decode(Ids{2, 1, 1}), "bx");
}

TEST_P(RegexErrorTest, LoadingFailsWhenAnAddedTokenCannotBeNormalized) {
  // A normalized added token's content goes through the normalizer when the file is loaded.
  const std::string json = absl::StrReplaceAll(kReplaceJson, {{"<t>", kInput}});
  SetRegexMatchLimitForTesting(kLowLimit);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromTokenizerJson(json);
  ASSERT_FALSE(tokenizer.ok());
  ExpectMatchLimitError(tokenizer.status());
  EXPECT_TRUE(Contains(tokenizer.status().message(), "added_tokens")) << tokenizer.status();
  SetRegexMatchLimitForTesting(0);
  EXPECT_TRUE(Tokenizer::FromTokenizerJson(json).ok());
}

}  // namespace
}  // namespace kiln
