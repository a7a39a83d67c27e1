#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "base/logging.h"
#include "utf8proc.h"

namespace kiln::tokenizer_internal {
namespace {

// The code point that ends just before `pos` (pos > 0, text valid UTF-8).
char32_t CodePointBefore(absl::string_view text, size_t pos, size_t* start) {
  size_t begin = pos - 1;
  while (begin > 0 && pos - begin < 4 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) {
    --begin;
  }
  utf8proc_int32_t cp = 0;
  utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + begin,
                       static_cast<utf8proc_ssize_t>(pos - begin), &cp);
  *start = begin;
  return n > 0 ? static_cast<char32_t>(cp) : U'\uFFFD';
}

// The code point that starts at `pos` (pos < size) and its byte length.
char32_t CodePointAt(absl::string_view text, size_t pos, size_t* length) {
  utf8proc_int32_t cp = 0;
  utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + pos,
                       static_cast<utf8proc_ssize_t>(text.size() - pos), &cp);
  if (n <= 0) {
    *length = 1;
    return U'\uFFFD';
  }
  *length = static_cast<size_t>(n);
  return static_cast<char32_t>(cp);
}

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// A regex `\w` character as the crate's single_word check sees it: letters, marks, decimal and
// letter numbers, connector punctuation (`_`) and the zero-width joiners.
bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace

int32_t LiteralMatcher::Child(int32_t node, unsigned char byte) const {
  for (const auto& [b, child] : nodes_[node].children) {
    if (b == byte) return child;
  }
  return -1;
}

void LiteralMatcher::Add(absl::string_view pattern) {
  const size_t index = patterns_++;
  if (pattern.empty()) return;
  first_bytes_.set(static_cast<unsigned char>(pattern[0]));
  int32_t node = 0;
  for (char c : pattern) {
    const unsigned char byte = static_cast<unsigned char>(c);
    int32_t next = Child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      nodes_[node].children.emplace_back(byte, next);
    }
    node = next;
  }
  if (nodes_[node].pattern < 0) nodes_[node].pattern = static_cast<int64_t>(index);
}

std::vector<LiteralMatcher::Match> LiteralMatcher::FindAll(absl::string_view text) const {
  std::vector<Match> matches;
  if (nodes_.size() == 1) return matches;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_bytes_.test(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    int32_t node = 0;
    int64_t best = -1;
    size_t best_end = i;
    for (size_t j = i; j < text.size(); ++j) {
      node = Child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[node].pattern >= 0) {
        best = nodes_[node].pattern;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      matches.push_back(Match{i, best_end, static_cast<size_t>(best)});
      i = best_end;
    } else {
      ++i;
    }
  }
  return matches;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    const std::vector<AddedToken>& tokens,
    const std::function<std::optional<int32_t>(absl::string_view)>& model_token_to_id,
    size_t model_vocab_size, const Normalizer* normalizer) {
  auto vocab = std::make_unique<AddedVocabulary>();
  size_t new_ids = 0;
  for (const AddedToken& token : tokens) {
    if (token.content.empty() || vocab->by_content_.contains(token.content)) continue;
    AddedToken added = token;
    if (std::optional<int32_t> id = model_token_to_id(token.content)) {
      added.id = *id;
    } else {
      added.id = static_cast<int32_t>(model_vocab_size + new_ids++);
    }
    if (token.id >= 0 && token.id != added.id) {
      LOG(WARNING) << "added token \"" << token.content << "\" is given id " << token.id
                   << " but gets id " << added.id << " (as the tokenizers crate assigns it)";
    }
    const size_t index = vocab->tokens_.size();
    vocab->by_content_.emplace(added.content, index);
    vocab->by_id_.insert_or_assign(added.id, index);
    vocab->id_limit_ = std::max(vocab->id_limit_, added.id + 1);
    vocab->tokens_.push_back(std::move(added));
  }
  absl::flat_hash_set<std::string> special_contents;
  for (const AddedToken& token : vocab->tokens_) {
    if (token.special) special_contents.insert(token.content);
  }
  for (size_t index = 0; index < vocab->tokens_.size(); ++index) {
    AddedToken& token = vocab->tokens_[index];
    MatchingSet& set = token.normalized ? vocab->normalized_ : vocab->raw_;
    if (token.normalized && normalizer != nullptr) {
      absl::StatusOr<std::string> normalized = normalizer->Normalize(token.content);
      if (!normalized.ok()) return normalized.status();
      token.decoded = *std::move(normalized);
    } else {
      token.decoded = token.content;
    }
    token.skipped_as_special = special_contents.contains(token.decoded);
    set.matcher.Add(token.decoded);
    set.token_index.push_back(index);
  }
  return vocab;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(absl::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

std::vector<AddedVocabulary::Segment> AddedVocabulary::Split(absl::string_view text,
                                                             const MatchingSet& set) const {
  std::vector<Segment> segments;
  size_t done = 0;  // end of the last added-token segment
  for (const LiteralMatcher::Match& match : set.matcher.FindAll(text)) {
    const AddedToken& token = tokens_[set.token_index[match.pattern]];
    size_t start = match.begin;
    size_t stop = match.end;
    if (token.single_word) {
      size_t unused = 0;
      const bool word_before = start > 0 && IsWordChar(CodePointBefore(text, start, &unused));
      const bool word_after = stop < text.size() && IsWordChar(CodePointAt(text, stop, &unused));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      while (start > done) {
        size_t before = 0;
        if (!IsWhitespace(CodePointBefore(text, start, &before))) break;
        start = before;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t length = 0;
        if (!IsWhitespace(CodePointAt(text, stop, &length))) break;
        stop += length;
      }
    }
    // A match inside whitespace an rstrip already took (only a token that starts with
    // whitespace could do this) is dropped.
    if (start < done) continue;
    if (start > done) segments.push_back(Segment{done, start, -1});
    segments.push_back(Segment{start, stop, token.id});
    done = stop;
  }
  if (done < text.size()) segments.push_back(Segment{done, text.size(), -1});
  return segments;
}

}  // namespace kiln::tokenizer_internal
