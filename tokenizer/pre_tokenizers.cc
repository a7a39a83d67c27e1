// Pre-tokenizers of tokenizer.json, as the crate's pre_tokenizers/*.rs and
// NormalizedString::split (tokenizer/normalizer.rs).

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"
#include "tokenizer/spec_util.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

using nlohmann::json;

constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr size_t kNone = absl::string_view::npos;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A part of a piece, and whether the pattern matched it (the crate's (Offsets, bool)).
struct Segment {
  size_t begin;
  size_t end;
  bool flag;
};

// Segments covering [0, size) from sorted, non-overlapping, non-empty matches.
void CoverMatches(size_t size, const std::vector<std::pair<size_t, size_t>>& matches,
                  std::vector<Segment>& segments) {
  segments.clear();
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    if (prev != begin) segments.push_back({prev, begin, false});
    segments.push_back({begin, end, true});
    prev = end;
  }
  if (prev != size) segments.push_back({prev, size, false});
}

// Segments covering text where every character satisfying pred is a match of its own.
template <typename Pred>
void CoverChars(absl::string_view text, Pred pred, std::vector<Segment>& segments) {
  segments.clear();
  size_t last = 0;
  size_t i = 0;
  const char* end = text.data() + text.size();
  while (i < text.size()) {
    char32_t cp;
    const size_t len = DecodeUtf8(text.data() + i, end, &cp);
    if (pred(cp)) {
      if (last < i) segments.push_back({last, i, false});
      segments.push_back({i, i + len, true});
      last = i + len;
    }
    i += len;
  }
  if (last < text.size()) segments.push_back({last, text.size(), false});
}

// The crate's NormalizedString::split: applies invert and the behavior to the segments, appends
// the resulting non-empty pieces of text to out, and returns the offset of the first one (kNone
// when everything was removed).
size_t SplitSegments(absl::string_view text, std::vector<Segment>& segments, Behavior behavior,
                     bool invert, std::vector<std::string>& out) {
  if (invert) {
    for (Segment& s : segments) s.flag = !s.flag;
  }
  // After this, flag means "remove".
  std::vector<Segment> merged;
  switch (behavior) {
    case Behavior::kRemoved:
      break;
    case Behavior::kIsolated:
      for (Segment& s : segments) s.flag = false;
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Segment& s : segments) {
        if (s.flag == previous && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.begin, s.end, false});
        }
        previous = s.flag;
      }
      segments.swap(merged);
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Segment& s : segments) {
        if (s.flag && !previous && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.begin, s.end, false});
        }
        previous = s.flag;
      }
      segments.swap(merged);
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->flag && !previous && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back({it->begin, it->end, false});
        }
        previous = it->flag;
      }
      segments.assign(merged.rbegin(), merged.rend());
      break;
    }
  }
  size_t first = kNone;
  for (const Segment& s : segments) {
    if (s.flag || s.end <= s.begin) continue;
    if (first == kNone) first = s.begin;
    out.emplace_back(text.substr(s.begin, s.end - s.begin));
  }
  return first;
}

// The pre-tokenizers' common base. `at_start` tells whether pieces[0] begins at the very start
// of the text (the crate's offsets_original().0 == 0, which Metaspace's "first" scheme reads); a
// step that removes the beginning of pieces[0] clears it.
class PreTokenizerImpl : public PreTokenizer {
 public:
  absl::Status PreTokenize(std::vector<std::string>& pieces, bool first_piece_of_text) const final {
    bool at_start = first_piece_of_text;
    return Apply(pieces, at_start);
  }
  virtual absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const = 0;
};

// Replaces every piece by the pieces fn(piece, out) appends; fn returns the offset of its first
// output piece within the input (kNone if it appended none), as a size_t or, where it can fail,
// an absl::StatusOr<size_t> (whose error is returned, pieces then unspecified).
template <typename Fn>
absl::Status SplitEach(std::vector<std::string>& pieces, bool& at_start, Fn fn) {
  std::vector<std::string> out;
  out.reserve(pieces.size() + 8);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].empty()) continue;
    size_t first;
    if constexpr (std::is_same_v<decltype(fn(pieces[i], out)), absl::StatusOr<size_t>>) {
      absl::StatusOr<size_t> result = fn(pieces[i], out);
      if (!result.ok()) return result.status();
      first = *result;
    } else {
      first = fn(pieces[i], out);
    }
    if (i == 0 && first != 0) at_start = false;
  }
  pieces.swap(out);
  return absl::OkStatus();
}

class SplitPreTokenizer final : public PreTokenizerImpl {
 public:
  SplitPreTokenizer(SpecPattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<Segment> segments;
    return SplitEach(
        pieces, at_start,
        [&](const std::string& piece, std::vector<std::string>& out) -> absl::StatusOr<size_t> {
          if (absl::Status status = pattern_.FindAll(piece, matches); !status.ok()) {
            return status;
          }
          CoverMatches(piece.size(), matches, segments);
          return SplitSegments(piece, segments, behavior_, invert_, out);
        });
  }

 private:
  SpecPattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Splits on characters of a class (Digits, Punctuation, WhitespaceSplit, CharDelimiterSplit).
template <typename Pred>
class CharSplitPreTokenizer final : public PreTokenizerImpl {
 public:
  CharSplitPreTokenizer(Pred pred, Behavior behavior) : pred_(pred), behavior_(behavior) {}
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    std::vector<Segment> segments;
    return SplitEach(pieces, at_start,
                     [&](const std::string& piece, std::vector<std::string>& out) {
                       CoverChars(piece, pred_, segments);
                       return SplitSegments(piece, segments, behavior_, false, out);
                     });
  }

 private:
  Pred pred_;
  Behavior behavior_;
};

template <typename Pred>
std::unique_ptr<PreTokenizerImpl> MakeCharSplit(Pred pred, Behavior behavior) {
  return std::make_unique<CharSplitPreTokenizer<Pred>>(pred, behavior);
}

// Whitespace: the matches of \w+|[^\w\s]+ (Rust regex classes), whitespace removed.
class WhitespacePreTokenizer final : public PreTokenizerImpl {
 public:
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    return SplitEach(pieces, at_start, [](const std::string& piece, std::vector<std::string>& out) {
      size_t first = kNone;
      size_t run_begin = 0;
      int run_kind = 0;  // 0 none, 1 word characters, 2 other non-space characters
      const char* end = piece.data() + piece.size();
      size_t i = 0;
      while (true) {
        int kind = 0;
        size_t len = 0;
        if (i < piece.size()) {
          char32_t cp;
          len = DecodeUtf8(piece.data() + i, end, &cp);
          kind = IsWordChar(cp) ? 1 : IsWhitespace(cp) ? 0 : 2;
        }
        if (kind != run_kind || i >= piece.size()) {
          if (run_kind != 0) {
            if (first == kNone) first = run_begin;
            out.emplace_back(piece, run_begin, i - run_begin);
          }
          run_kind = kind;
          run_begin = i;
        }
        if (i >= piece.size()) break;
        i += len;
      }
      return first;
    });
  }
};

// BertPreTokenizer: whitespace removed, then every punctuation character isolated.
class BertPreTokenizer final : public PreTokenizerImpl {
 public:
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    std::vector<Segment> segments;
    absl::Status status =
        SplitEach(pieces, at_start, [&](const std::string& piece, std::vector<std::string>& out) {
          CoverChars(piece, IsWhitespace, segments);
          return SplitSegments(piece, segments, Behavior::kRemoved, false, out);
        });
    if (!status.ok()) return status;
    return SplitEach(pieces, at_start,
                     [&](const std::string& piece, std::vector<std::string>& out) {
                       CoverChars(piece, IsPunctuation, segments);
                       return SplitSegments(piece, segments, Behavior::kIsolated, false, out);
                     });
  }
};

class ByteLevelPreTokenizer final : public PreTokenizerImpl {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::shared_ptr<const Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    std::vector<Segment> segments;
    for (std::string& piece : pieces) {
      if (piece.empty()) continue;
      // The crate adds the space to every piece it is given, not only the first of the text.
      if (add_prefix_space_ && piece[0] != ' ') piece.insert(piece.begin(), ' ');
      if (regex_ == nullptr) {
        out.push_back(ByteLevelEncode(piece));
        continue;
      }
      const absl::StatusOr<std::vector<std::pair<size_t, size_t>>> matches = regex_->FindAll(piece);
      if (!matches.ok()) return matches.status();
      CoverMatches(piece.size(), *matches, segments);  // Isolated: every segment is a piece
      for (const Segment& s : segments) {
        out.push_back(ByteLevelEncode(absl::string_view(piece).substr(s.begin, s.end - s.begin)));
      }
    }
    pieces.swap(out);
    (void)at_start;  // prepending keeps the start; Isolated never removes
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::shared_ptr<const Regex> regex_;  // GPT-2's pattern, or null for use_regex: false
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizerImpl {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        replacement_cp_(FirstCodePoint(replacement_)),
        scheme_(scheme),
        split_(split) {}
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    std::vector<Segment> segments;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].empty()) continue;
      std::string text = absl::StrReplaceAll(pieces[i], {{" ", replacement_}});
      bool prepend = false;
      if (scheme_ != PrependScheme::kNever && !absl::StartsWith(text, replacement_)) {
        prepend = scheme_ == PrependScheme::kAlways || (i == 0 && at_start);
      }
      if (prepend) text.insert(0, replacement_);
      if (!split_) {
        out.push_back(std::move(text));
        continue;
      }
      const char32_t rep = replacement_cp_;
      CoverChars(
          text, [rep](char32_t c) { return c == rep; }, segments);
      SplitSegments(text, segments, Behavior::kMergedWithNext, false, out);
    }
    pieces.swap(out);
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  char32_t replacement_cp_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizerImpl {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizerImpl>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Apply(std::vector<std::string>& pieces, bool& at_start) const override {
    for (const auto& step : steps_) {
      if (absl::Status status = step->Apply(pieces, at_start); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizerImpl>> steps_;
};

absl::StatusOr<Behavior> ParseBehavior(const json& spec, std::optional<std::string> fallback,
                                       absl::string_view context) {
  absl::StatusOr<std::string> name = SpecString(spec, "behavior", std::move(fallback), context);
  if (!name.ok()) return name.status();
  if (*name == "Removed") return Behavior::kRemoved;
  if (*name == "Isolated") return Behavior::kIsolated;
  if (*name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (*name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (*name == "Contiguous") return Behavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat(context, ": unknown behavior ", *name));
}

absl::StatusOr<std::shared_ptr<const Regex>> Gpt2Regex() {
  static const absl::StatusOr<std::shared_ptr<const Regex>>* const regex =
      new absl::StatusOr<std::shared_ptr<const Regex>>(Regex::Compile(kGpt2Pattern));
  return *regex;
}

absl::StatusOr<std::unique_ptr<PreTokenizerImpl>> ParseImpl(const json& spec);

absl::StatusOr<std::unique_ptr<PreTokenizerImpl>> ParseOne(const json& spec,
                                                           const std::string& type) {
  const std::string context = absl::StrCat(type, " pre-tokenizer");
  if (type == "Split") {
    absl::StatusOr<SpecPattern> pattern = SpecPattern::Parse(spec, "pattern", context);
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<Behavior> behavior = ParseBehavior(spec, std::nullopt, context);
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<bool> invert = SpecBool(spec, "invert", false, context);
    if (!invert.ok()) return invert.status();
    return std::make_unique<SplitPreTokenizer>(*std::move(pattern), *behavior, *invert);
  }
  if (type == "ByteLevel") {
    absl::StatusOr<bool> add_prefix_space = SpecBool(spec, "add_prefix_space", true, context);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    absl::StatusOr<bool> use_regex = SpecBool(spec, "use_regex", true, context);
    if (!use_regex.ok()) return use_regex.status();
    std::shared_ptr<const Regex> regex;
    if (*use_regex) {
      absl::StatusOr<std::shared_ptr<const Regex>> gpt2 = Gpt2Regex();
      if (!gpt2.ok()) return gpt2.status();
      regex = *gpt2;
    }
    return std::make_unique<ByteLevelPreTokenizer>(*add_prefix_space, std::move(regex));
  }
  if (type == "Metaspace") {
    absl::StatusOr<std::string> replacement = SpecChar(spec, "replacement", "\u2581", context);
    if (!replacement.ok()) return replacement.status();
    absl::StatusOr<bool> split = SpecBool(spec, "split", true, context);
    if (!split.ok()) return split.status();
    absl::StatusOr<std::string> scheme_name = SpecString(spec, "prepend_scheme", "", context);
    if (!scheme_name.ok()) return scheme_name.status();
    absl::StatusOr<bool> add_prefix_space = SpecBool(spec, "add_prefix_space", true, context);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    PrependScheme scheme = PrependScheme::kAlways;
    if (*scheme_name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (*scheme_name == "never") {
      scheme = PrependScheme::kNever;
    } else if (!scheme_name->empty() && *scheme_name != "always") {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": unknown prepend_scheme ", *scheme_name));
    }
    // Legacy add_prefix_space: false means "never" (contradicting an explicit scheme is an error).
    if (!*add_prefix_space) {
      if (!scheme_name->empty() && scheme != PrependScheme::kNever) {
        return absl::InvalidArgumentError(
            absl::StrCat(context, ": add_prefix_space does not match declared prepend_scheme"));
      }
      scheme = PrependScheme::kNever;
    }
    return std::make_unique<MetaspacePreTokenizer>(*std::move(replacement), scheme, *split);
  }
  if (type == "Digits") {
    absl::StatusOr<bool> individual = SpecBool(spec, "individual_digits", false, context);
    if (!individual.ok()) return individual.status();
    return MakeCharSplit(IsNumeric, *individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Punctuation") {
    absl::StatusOr<Behavior> behavior = ParseBehavior(spec, "Isolated", context);
    if (!behavior.ok()) return behavior.status();
    return MakeCharSplit(IsPunctuation, *behavior);
  }
  if (type == "WhitespaceSplit") return MakeCharSplit(IsWhitespace, Behavior::kRemoved);
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "CharDelimiterSplit") {
    absl::StatusOr<std::string> delimiter = SpecChar(spec, "delimiter", std::nullopt, context);
    if (!delimiter.ok()) return delimiter.status();
    const char32_t cp = FirstCodePoint(*delimiter);
    return MakeCharSplit([cp](char32_t c) { return c == cp; }, Behavior::kRemoved);
  }
  if (type == "Sequence") {
    absl::StatusOr<const json*> list = SpecArray(spec, "pretokenizers", context);
    if (!list.ok()) return list.status();
    std::vector<std::unique_ptr<PreTokenizerImpl>> steps;
    for (const json& item : **list) {
      absl::StatusOr<std::unique_ptr<PreTokenizerImpl>> step = ParseImpl(item);
      if (!step.ok()) return step.status();
      if (*step != nullptr) steps.push_back(*std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported pre-tokenizer type ", type));
}

absl::StatusOr<std::unique_ptr<PreTokenizerImpl>> ParseImpl(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizerImpl>();
  absl::StatusOr<std::string> type = SpecType(spec, "pre-tokenizer");
  if (!type.ok()) return type.status();
  return ParseOne(spec, *type);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& spec) {
  absl::StatusOr<std::unique_ptr<PreTokenizerImpl>> impl = ParseImpl(spec);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<PreTokenizer>(*std::move(impl));
}

}  // namespace kiln::tokenizer_internal
