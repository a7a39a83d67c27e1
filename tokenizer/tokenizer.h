// Hugging Face tokenizers in C++: tokenizer.json (BPE, byte-level or SentencePiece-style with
// byte fallback), the legacy GPT-2 encoder.json + vocab.bpe pair, and streaming detokenization.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Special tokens a server needs (from tokenizer.json, tokenizer_config.json and
// generation_config.json).
struct SpecialTokenIds {
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  std::optional<int32_t> pad;
  std::optional<int32_t> unk;
  // Every id that ends generation: generation_config.json's eos_token_id (int or list) plus eos.
  std::vector<int32_t> eos_ids;
  // tokenizer_config.json add_bos_token / add_eos_token, applied by Encode(add_special_tokens)
  // only when the post-processor does not already add them.
  bool add_bos = false;
  bool add_eos = false;
};

class TokenizerImpl;

class Tokenizer {
 public:
  // A model directory: tokenizer.json (+ tokenizer_config.json and generation_config.json when
  // present), else encoder.json + vocab.bpe (GPT-2). Errors name the file and the component.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::filesystem::path& dir);
  // The same from the files' texts by file name (a checkpoint's side files); `where` names their
  // origin in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFiles(
      const std::map<std::string, std::string>& files, absl::string_view where);
  // tokenizer.json text; the two configs may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTokenizerJson(
      absl::string_view tokenizer_json, absl::string_view tokenizer_config_json = "",
      absl::string_view generation_config_json = "");
  // The legacy GPT-2 pair: byte-level BPE with GPT-2's split regex; <|endoftext|> is special.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGpt2Files(absl::string_view encoder_json,
                                                                  absl::string_view vocab_bpe);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text to ids. Added/special tokens are matched first; the post-processor (and add_bos) run
  // when add_special_tokens. Text that is not valid UTF-8 is refused with InvalidArgument naming
  // the byte offset (never guessed at).
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = true) const;
  // Ids to text, as Hugging Face's decode: byte sequences that are not valid UTF-8 become U+FFFD.
  // An id outside the vocabulary is InvalidArgument.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;
  // Like Decode, but bytes are returned as they are, valid UTF-8 or not (the streaming decoder
  // uses it to hold back incomplete characters).
  absl::StatusOr<std::string> DecodeBytes(std::span<const int32_t> ids,
                                          bool skip_special_tokens = false) const;

  // Number of ids: one past the largest id of the model or the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  const SpecialTokenIds& special_tokens() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Detokenizes generated ids one at a time. Text is emitted only once it is complete UTF-8, and
// leading spaces come out as a whole decode would produce them: the concatenation of every Push
// and the final Finish equals Decode(all ids).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  // Text that became final with this id (may be empty).
  absl::StatusOr<std::string> Push(int32_t id);
  // Whatever is still held back (an incomplete character becomes U+FFFD).
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // ids before this are never re-decoded
  size_t read_offset_ = 0;    // text of ids [prefix_offset_, read_offset_) was already emitted
};

}  // namespace kiln
