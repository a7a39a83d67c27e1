// The added tokens of a tokenizer.json (internal to tokenizer/): matched in the input before the
// normal pipeline, as the `tokenizers` crate's AddedVocabulary does — leftmost-longest literal
// matches, non-normalized tokens on the raw text first, then normalized tokens (their content
// normalized too) on the normalized text between them; lstrip/rstrip absorb the whitespace next
// to a match and single_word refuses a match that touches a word character.
#pragma once

#include <bitset>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/components.h"

namespace kiln::tokenizer_internal {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
  // Filled in by AddedVocabulary::Create. What decoding (and IdToToken) gives for the id: the
  // content, normalized for a normalized token (as the crate stores it), and whether a decode
  // that skips special tokens leaves it out (that normalized text is some special content).
  std::string decoded;
  bool skipped_as_special = false;
};

// Finds non-overlapping occurrences of a set of byte strings: at each position the leftmost
// match wins, and the longest one there (Aho-Corasick's LeftmostLongest).
class LiteralMatcher {
 public:
  struct Match {
    size_t begin;
    size_t end;
    size_t pattern;  // index into the patterns given to Add order
  };
  // Empty patterns never match. A repeated pattern keeps its first index.
  void Add(absl::string_view pattern);
  std::vector<Match> FindAll(absl::string_view text) const;
  bool empty() const { return patterns_ == 0; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int64_t pattern = -1;
  };
  int32_t Child(int32_t node, unsigned char byte) const;
  std::vector<Node> nodes_{Node{}};
  std::bitset<256> first_bytes_;
  size_t patterns_ = 0;
};

class AddedVocabulary {
 public:
  // Ids follow the crate: a token whose content the model already has takes the model's id;
  // any other gets the next id after `model_vocab_size` (entries, not the largest id). Tokens
  // with empty content and repeated contents are skipped. `normalizer` may be null; its error
  // (normalizing a token's content) is returned.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Create(
      const std::vector<AddedToken>& tokens,
      const std::function<std::optional<int32_t>(absl::string_view)>& model_token_to_id,
      size_t model_vocab_size, const Normalizer* normalizer);

  // A piece of the input: an added token (id >= 0) or text to tokenize (id == -1).
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;
  };
  // Splits by the non-normalized tokens (for the raw input) or by the normalized ones (for
  // normalized text). The segments cover `text` in order; empty text segments are left out.
  std::vector<Segment> SplitRaw(absl::string_view text) const { return Split(text, raw_); }
  std::vector<Segment> SplitNormalized(absl::string_view text) const {
    return Split(text, normalized_);
  }
  bool has_raw() const { return !raw_.matcher.empty(); }
  bool has_normalized() const { return !normalized_.matcher.empty(); }

  const AddedToken* FindById(int32_t id) const;
  // By the content as given (not normalized).
  std::optional<int32_t> FindByContent(absl::string_view content) const;
  // One past the largest id (0 when there are none).
  int32_t id_limit() const { return id_limit_; }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct MatchingSet {
    LiteralMatcher matcher;
    std::vector<size_t> token_index;  // pattern index -> index into tokens_
  };
  std::vector<Segment> Split(absl::string_view text, const MatchingSet& set) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  MatchingSet raw_;
  MatchingSet normalized_;
  int32_t id_limit_ = 0;
};

}  // namespace kiln::tokenizer_internal
