// The BPE model of a Hugging Face tokenizer.json (internal to tokenizer/): vocabulary, merge
// ranks and the merge loop, with the options of the `tokenizers` crate (unk_token, fuse_unk,
// byte_fallback, ignore_merges, continuing_subword_prefix, end_of_word_suffix).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::tokenizer_internal {

struct BpeOptions {
  std::optional<std::string> unk_token;
  // Empty means none (as the crate treats "" and null alike in effect).
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  // A pre-token that is itself in the vocabulary is emitted as is, without merging.
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `vocab` maps tokens to ids (ids >= 0); `merges` lists pairs by rank (first = highest
  // priority). Every merge's parts and their concatenation must be in the vocabulary; a later
  // duplicate of a pair replaces the earlier one, as in the crate.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const std::vector<std::pair<absl::string_view, int32_t>>& vocab,
      const std::vector<std::pair<absl::string_view, absl::string_view>>& merges,
      BpeOptions options);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-token (a no-op for an empty one). Thread-safe. Fails only when a
  // character is unknown and the unk token is missing from the vocabulary (as the crate does).
  absl::Status Tokenize(absl::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // nullptr for an id with no token.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id (0 for an empty vocabulary).
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t vocab_size() const { return vocab_.size(); }
  const BpeOptions& options() const { return options_; }

 private:
  BpeModel() = default;
  // The merge loop on one pre-token (no cache).
  absl::Status MergeWord(absl::string_view word, std::vector<int32_t>& out) const;

  struct MergeValue {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  BpeOptions options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  absl::flat_hash_map<uint64_t, MergeValue> merges_;
  std::array<int32_t, 256> byte_tokens_{};  // "<0xHH>" ids, -1 where absent
  bool all_byte_tokens_ = false;
  std::optional<int32_t> unk_id_;  // set when options_.unk_token is in the vocabulary
  // Ids of the one-character tokens below U+10000 (-1 where none), used when there is no
  // continuing_subword_prefix / end_of_word_suffix.
  std::vector<int32_t> char_ids_;
  // Names this model's entries in the per-thread caches of results (unique per process).
  uint64_t cache_owner_ = 0;
};

}  // namespace kiln::tokenizer_internal
