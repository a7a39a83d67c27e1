// The pipeline stages of a Hugging Face tokenizer.json, each built from its JSON spec (internal
// to tokenizer/). Semantics follow the `tokenizers` Rust crate.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace kiln::tokenizer_internal {

// A compiled PCRE2 pattern in UTF + UCP mode (\p{L}, \s etc. are Unicode-aware), RAII, shareable
// across threads (each call uses its own match data). Patterns are those of tokenizer.json files
// (Rust `fancy-regex`/`onig` syntax as used there: lookahead, \p{..}, (?i:...)).
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(absl::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Byte ranges [begin, end) of successive non-overlapping matches (empty matches skipped). A
  // match that PCRE2 cannot complete is an error naming the pattern and PCRE2's reason, never a
  // partial list: ResourceExhausted for its match, heap and depth limits and for lack of memory,
  // Internal for anything else.
  absl::StatusOr<std::vector<std::pair<size_t, size_t>>> FindAll(absl::string_view text) const;

 private:
  Regex() = default;
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

// Testing hooks for Regex::FindAll on the calling thread only: PCRE2's match limit (0 restores
// PCRE2's default; the JIT honours it too) and whether the JIT-compiled code may be used (false:
// the interpreter always, as after a JIT stack overflow).
void SetRegexMatchLimitForTesting(uint32_t limit);
void SetRegexJitForTesting(bool enabled);

// GPT-2's reversible byte ↔ printable-character map used by ByteLevel (e.g. ' ' ↔ "Ġ").
const std::array<std::string, 256>& ByteToUnicode();       // UTF-8 of each byte's char
std::optional<uint8_t> UnicodeToByte(char32_t codepoint);  // inverse
// `text` with every byte replaced by its ByteLevel character.
std::string ByteLevelEncode(absl::string_view text);

// Rewrites text (NFC, NFKC, NFD, NFKD, Lowercase, Prepend, Replace, Strip, Sequence, ...). Fails
// only where a regex does (Replace with a Regex pattern).
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual absl::StatusOr<std::string> Normalize(absl::string_view text) const = 0;
};
// A null spec gives nullptr (no normalizer). An unknown "type" is an error naming it.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& spec);

// Splits pieces into finer pieces, possibly rewriting them (ByteLevel maps bytes to its
// alphabet; Metaspace replaces spaces). Split (String or Regex pattern; behaviors Removed,
// Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern), Metaspace (replacement, prepend_scheme always/first/never,
// split), Digits (individual_digits), Whitespace, WhitespaceSplit, Punctuation, Sequence.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // `first_piece_of_text` tells Metaspace's prepend_scheme "first" whether this is the start of
  // the input (false for text that follows an added token). Fails only where a regex does (Split
  // with a Regex pattern, ByteLevel's use_regex); `pieces` is then unspecified.
  virtual absl::Status PreTokenize(std::vector<std::string>& pieces,
                                   bool first_piece_of_text) const = 0;
};
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& spec);

// Turns the token strings of a decode into text pieces, as the Rust crate's decode_chain:
// ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, WordPiece-free subset, Sequence.
// The result is joined without separators by the caller. ByteLevel may produce
// byte strings that are not valid UTF-8 on their own (the caller decides how to treat them);
// ByteFallback, like the crate, turns an incomplete byte run into one U+FFFD per byte. Fails only
// where a regex does (Replace with a Regex pattern).
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual absl::StatusOr<std::vector<std::string>> Decode(
      std::vector<std::string> tokens) const = 0;
};
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& spec);

// UTF-8 validation: the byte offset of the first invalid sequence, or nullopt if valid.
std::optional<size_t> FindInvalidUtf8(absl::string_view text);
// Hugging Face's lossy conversion: each maximal invalid subsequence becomes U+FFFD.
std::string ToValidUtf8(absl::string_view bytes);

}  // namespace kiln::tokenizer_internal
