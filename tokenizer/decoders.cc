// Decoders of tokenizer.json, as the crate's decode_chain (decoders/*.rs, byte_level.rs,
// metaspace.rs).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"
#include "tokenizer/spec_util.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

using nlohmann::json;

constexpr absl::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Maps every character of every token back to its byte and concatenates them. A token with a
// character outside the ByteLevel alphabet (an added token, say) contributes its own UTF-8. The
// result is raw bytes: the caller applies the lossy UTF-8 conversion (the crate's
// from_utf8_lossy over the concatenation) or keeps the bytes for streaming.
class ByteLevelDecoder final : public Decoder {
 public:
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    std::string bytes;
    size_t total = 0;
    for (const std::string& token : tokens) total += token.size();
    bytes.reserve(total);
    for (const std::string& token : tokens) {
      const size_t mark = bytes.size();
      const char* p = token.data();
      const char* end = p + token.size();
      bool mapped = true;
      while (p < end) {
        char32_t cp;
        const size_t len = DecodeUtf8(p, end, &cp);
        const std::optional<uint8_t> byte =
            (cp == 0xFFFD && len == 1) ? std::nullopt : UnicodeToByte(cp);
        if (!byte.has_value()) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(*byte));
        p += len;
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes.append(token);
      }
    }
    std::vector<std::string> out;
    out.push_back(std::move(bytes));
    return out;
  }
};

// Replacement character -> ' '; in the first token the replacement characters are dropped
// instead, unless prepend_scheme is "never".
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& token = tokens[i];
      if (token.find(replacement_) == std::string::npos) continue;
      std::string out;
      out.reserve(token.size());
      size_t prev = 0;
      for (size_t at = token.find(replacement_); at != std::string::npos;
           at = token.find(replacement_, prev)) {
        out.append(token, prev, at - prev);
        if (i != 0 || !strip_first_) out.push_back(' ');
        prev = at + replacement_.size();
      }
      out.append(token, prev, std::string::npos);
      token = std::move(out);
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte of a "<0xHH>" token, parsed as the crate does (u8::from_str_radix, which also takes
// a leading '+').
std::optional<uint8_t> ByteToken(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return std::nullopt;
  if (token[3] == '+') {
    const int v = HexValue(token[4]);
    if (v < 0) return std::nullopt;
    return static_cast<uint8_t>(v);
  }
  const int hi = HexValue(token[3]);
  const int lo = HexValue(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Runs of "<0xHH>" tokens become their bytes when those form valid UTF-8, else one U+FFFD per
// byte token; other tokens pass through.
class ByteFallbackDecoder final : public Decoder {
 public:
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    const auto flush = [&] {
      if (run.empty()) return;
      if (!FindInvalidUtf8(run).has_value()) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& token : tokens) {
      if (const std::optional<uint8_t> byte = ByteToken(token); byte.has_value()) {
        run.push_back(static_cast<char>(*byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    return out;
  }
};

class FuseDecoder final : public Decoder {
 public:
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    out.push_back(absl::StrJoin(tokens, ""));
    return out;
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of every token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    const absl::string_view c = content_;
    for (std::string& token : tokens) {
      absl::string_view rest = token;
      size_t begin = 0;
      for (size_t i = 0; i < start_ && rest.substr(begin, c.size()) == c; ++i) begin += c.size();
      size_t end = token.size();
      for (size_t i = 0;
           i < stop_ && end >= begin + c.size() && rest.substr(end - c.size(), c.size()) == c;
           ++i) {
        end -= c.size();
      }
      token = std::string(rest.substr(begin, end - begin));
    }
    return tokens;
  }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(SpecPattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) {
      absl::StatusOr<std::string> replaced = pattern_.ReplaceAll(token, content_);
      if (!replaced.ok()) return replaced.status();
      token = *std::move(replaced);
    }
    return tokens;
  }

 private:
  SpecPattern pattern_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> decoders)
      : decoders_(std::move(decoders)) {}
  absl::StatusOr<std::vector<std::string>> Decode(std::vector<std::string> tokens) const override {
    for (const auto& decoder : decoders_) {
      absl::StatusOr<std::vector<std::string>> next = decoder->Decode(std::move(tokens));
      if (!next.ok()) return next.status();
      tokens = *std::move(next);
    }
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> decoders_;
};

absl::StatusOr<std::unique_ptr<Decoder>> ParseOne(const json& spec, const std::string& type) {
  const std::string context = absl::StrCat(type, " decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Metaspace") {
    absl::StatusOr<std::string> replacement = SpecChar(spec, "replacement", "\u2581", context);
    if (!replacement.ok()) return replacement.status();
    absl::StatusOr<std::string> scheme = SpecString(spec, "prepend_scheme", "", context);
    if (!scheme.ok()) return scheme.status();
    absl::StatusOr<bool> add_prefix_space = SpecBool(spec, "add_prefix_space", true, context);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    if (!scheme->empty() && *scheme != "always" && *scheme != "first" && *scheme != "never") {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": unknown prepend_scheme ", *scheme));
    }
    if (!*add_prefix_space && !scheme->empty() && *scheme != "never") {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": add_prefix_space does not match declared prepend_scheme"));
    }
    const bool never = *scheme == "never" || !*add_prefix_space;
    return std::make_unique<MetaspaceDecoder>(*std::move(replacement), !never);
  }
  if (type == "Strip") {
    absl::StatusOr<std::string> content = SpecChar(spec, "content", std::nullopt, context);
    if (!content.ok()) return content.status();
    absl::StatusOr<uint64_t> start = SpecUint(spec, "start", 0, context);
    if (!start.ok()) return start.status();
    absl::StatusOr<uint64_t> stop = SpecUint(spec, "stop", 0, context);
    if (!stop.ok()) return stop.status();
    return std::make_unique<StripDecoder>(*std::move(content), static_cast<size_t>(*start),
                                          static_cast<size_t>(*stop));
  }
  if (type == "Replace") {
    absl::StatusOr<SpecPattern> pattern = SpecPattern::Parse(spec, "pattern", context);
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> content = SpecString(spec, "content", std::nullopt, context);
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceDecoder>(*std::move(pattern), *std::move(content));
  }
  if (type == "Sequence") {
    absl::StatusOr<const json*> list = SpecArray(spec, "decoders", context);
    if (!list.ok()) return list.status();
    std::vector<std::unique_ptr<Decoder>> decoders;
    for (const json& item : **list) {
      absl::StatusOr<std::unique_ptr<Decoder>> decoder = ParseDecoder(item);
      if (!decoder.ok()) return decoder.status();
      if (*decoder != nullptr) decoders.push_back(*std::move(decoder));
    }
    return std::make_unique<SequenceDecoder>(std::move(decoders));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported decoder type ", type));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<Decoder>();
  absl::StatusOr<std::string> type = SpecType(spec, "decoder");
  if (!type.ok()) return type.status();
  return ParseOne(spec, *type);
}

}  // namespace kiln::tokenizer_internal
