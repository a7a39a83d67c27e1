// Normalizers of tokenizer.json, as the crate's normalizers/*.rs (text only: no offset tracking).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"
#include "tokenizer/spec_util.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

using nlohmann::json;

// Rewrites each character: fn(code point, out) appends its replacement (possibly nothing).
template <typename Fn>
std::string MapChars(absl::string_view text, Fn fn) {
  std::string out;
  out.reserve(text.size());
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    char32_t cp;
    const size_t len = DecodeUtf8(p, end, &cp);
    fn(cp, absl::string_view(p, len), out);
    p += len;
  }
  return out;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    return NormalizeUnicode(text, form_);
  }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    return LowercaseUnicode(text);
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    if (text.empty()) return std::string();  // the crate prepends only to non-empty text
    return absl::StrCat(prepend_, text);
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(SpecPattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    return pattern_.ReplaceAll(text, content_);
  }

 private:
  SpecPattern pattern_;
  std::string content_;
};

// Removes leading and/or trailing whitespace (Rust's char::is_whitespace).
class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    const char* begin = text.data();
    const char* end = begin + text.size();
    if (left_) {
      while (begin < end) {
        char32_t cp;
        const size_t len = DecodeUtf8(begin, end, &cp);
        if (!IsWhitespace(cp)) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        const char* start = end - 1;  // back up to the lead byte of the last character
        while (start > begin && (static_cast<uint8_t>(*start) & 0xC0) == 0x80) --start;
        char32_t cp;
        DecodeUtf8(start, end, &cp);
        if (!IsWhitespace(cp)) break;
        end = start;
      }
    }
    return std::string(begin, static_cast<size_t>(end - begin));
  }

 private:
  bool left_;
  bool right_;
};

// Removes combining marks (general category M).
class StripAccentsNormalizer final : public Normalizer {
 public:
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    return MapChars(text, [](char32_t cp, absl::string_view bytes, std::string& out) {
      if (!IsCombiningMark(cp)) out.append(bytes.data(), bytes.size());
    });
  }
};

// The crate's Nmt: drops some control characters and maps others to a space.
class NmtNormalizer final : public Normalizer {
 public:
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    return MapChars(text, [](char32_t c, absl::string_view bytes, std::string& out) {
      if ((c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F ||
          c == 0x8F || c == 0x9F) {
        return;
      }
      if (c == 0x09 || c == 0x0A || c == 0x0C || c == 0x0D || c == 0x1680 ||
          (c >= 0x200B && c <= 0x200F) || c == 0x2028 || c == 0x2029 || c == 0x2581 ||
          c == 0xFEFF || c == 0xFFFD) {
        out.push_back(' ');
        return;
      }
      out.append(bytes.data(), bytes.size());
    });
  }
};

bool IsChineseChar(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        handle_chinese_chars_(handle_chinese_chars),
        strip_accents_(strip_accents),
        lowercase_(lowercase) {}

  absl::StatusOr<std::string> Normalize(absl::string_view input) const override {
    std::string text(input);
    if (clean_text_) {
      text = MapChars(text, [](char32_t c, absl::string_view bytes, std::string& out) {
        const bool tab_or_newline = c == '\t' || c == '\n' || c == '\r';
        if (c == 0 || c == 0xFFFD || (!tab_or_newline && IsOther(c))) return;
        if (tab_or_newline || IsWhitespace(c)) {
          out.push_back(' ');
        } else {
          out.append(bytes.data(), bytes.size());
        }
      });
    }
    if (handle_chinese_chars_) {
      text = MapChars(text, [](char32_t c, absl::string_view bytes, std::string& out) {
        if (IsChineseChar(c)) {
          absl::StrAppend(&out, " ", bytes, " ");
        } else {
          out.append(bytes.data(), bytes.size());
        }
      });
    }
    if (strip_accents_) {
      text = MapChars(NormalizeUnicode(text, NormalForm::kNfd),
                      [](char32_t c, absl::string_view bytes, std::string& out) {
                        if (!IsNonspacingMark(c)) out.append(bytes.data(), bytes.size());
                      });
    }
    if (lowercase_) text = LowercaseUnicode(text);
    return text;
  }

 private:
  bool clean_text_;
  bool handle_chinese_chars_;
  bool strip_accents_;
  bool lowercase_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> normalizers)
      : normalizers_(std::move(normalizers)) {}
  absl::StatusOr<std::string> Normalize(absl::string_view text) const override {
    std::string result(text);
    for (const auto& normalizer : normalizers_) {
      absl::StatusOr<std::string> next = normalizer->Normalize(result);
      if (!next.ok()) return next.status();
      result = *std::move(next);
    }
    return result;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> normalizers_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> ParseOne(const json& spec, const std::string& type) {
  const std::string context = absl::StrCat(type, " normalizer");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Nmt") return std::make_unique<NmtNormalizer>();
  if (type == "Prepend") {
    absl::StatusOr<std::string> prepend = SpecString(spec, "prepend", std::nullopt, context);
    if (!prepend.ok()) return prepend.status();
    return std::make_unique<PrependNormalizer>(*std::move(prepend));
  }
  if (type == "Replace") {
    absl::StatusOr<SpecPattern> pattern = SpecPattern::Parse(spec, "pattern", context);
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> content = SpecString(spec, "content", std::nullopt, context);
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceNormalizer>(*std::move(pattern), *std::move(content));
  }
  if (type == "Strip") {
    absl::StatusOr<bool> left = SpecBool(spec, "strip_left", false, context);
    if (!left.ok()) return left.status();
    absl::StatusOr<bool> right = SpecBool(spec, "strip_right", false, context);
    if (!right.ok()) return right.status();
    return std::make_unique<StripNormalizer>(*left, *right);
  }
  if (type == "BertNormalizer") {
    absl::StatusOr<bool> clean_text = SpecBool(spec, "clean_text", true, context);
    if (!clean_text.ok()) return clean_text.status();
    absl::StatusOr<bool> chinese = SpecBool(spec, "handle_chinese_chars", true, context);
    if (!chinese.ok()) return chinese.status();
    absl::StatusOr<bool> lowercase = SpecBool(spec, "lowercase", true, context);
    if (!lowercase.ok()) return lowercase.status();
    // strip_accents: null (the default) follows lowercase.
    absl::StatusOr<bool> strip_accents = SpecBool(spec, "strip_accents", *lowercase, context);
    if (!strip_accents.ok()) return strip_accents.status();
    return std::make_unique<BertNormalizer>(*clean_text, *chinese, *strip_accents, *lowercase);
  }
  if (type == "Sequence") {
    absl::StatusOr<const json*> list = SpecArray(spec, "normalizers", context);
    if (!list.ok()) return list.status();
    std::vector<std::unique_ptr<Normalizer>> normalizers;
    for (const json& item : **list) {
      absl::StatusOr<std::unique_ptr<Normalizer>> normalizer = ParseNormalizer(item);
      if (!normalizer.ok()) return normalizer.status();
      if (*normalizer != nullptr) normalizers.push_back(*std::move(normalizer));
    }
    return std::make_unique<SequenceNormalizer>(std::move(normalizers));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported normalizer type ", type));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  absl::StatusOr<std::string> type = SpecType(spec, "normalizer");
  if (!type.ok()) return type.status();
  return ParseOne(spec, *type);
}

}  // namespace kiln::tokenizer_internal
