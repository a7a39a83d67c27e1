// StreamingDecoder: the prefix/read offset technique of TGI and vLLM. Each Push decodes two short
// windows that start at prefix_offset_ — the ids already emitted from there ([prefix, read)) and
// all ids from there ([prefix, end)) — and emits the difference once it is longer and does not
// end inside a UTF-8 character. Decoding a window rather than single ids keeps what depends on
// neighbours (a SentencePiece leading space, bytes of one character spread over several
// byte-fallback or byte-level tokens) as a whole decode has it.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/components.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

constexpr absl::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Whether `bytes` ends with the start of a UTF-8 sequence that more bytes could complete (a
// valid prefix of a character, not an invalid byte).
bool EndsInIncompleteUtf8(absl::string_view bytes) {
  const size_t size = bytes.size();
  for (size_t back = 1; back <= 4 && back <= size; ++back) {
    const unsigned char byte = static_cast<unsigned char>(bytes[size - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t need = 0;
    if (byte >= 0xC2 && byte <= 0xDF) {
      need = 2;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      need = 3;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      need = 4;
    } else {
      return false;  // ASCII or a byte that never starts a character
    }
    if (back >= need) return false;  // complete (or over-long: invalid, not incomplete)
    if (back >= 2) {
      const unsigned char second = static_cast<unsigned char>(bytes[size - back + 1]);
      unsigned char low = 0x80, high = 0xBF;
      if (byte == 0xE0) low = 0xA0;
      if (byte == 0xED) high = 0x9F;
      if (byte == 0xF0) low = 0x90;
      if (byte == 0xF4) high = 0x8F;
      if (second < low || second > high) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::string> StreamingDecoder::Push(int32_t id) {
  if (!tokenizer_.IdToToken(id).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is not in the vocabulary (size ", tokenizer_.vocab_size(), ")"));
  }
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  absl::StatusOr<std::string> prefix_text = tokenizer_.DecodeBytes(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  if (!prefix_text.ok()) return prefix_text.status();
  absl::StatusOr<std::string> new_text =
      tokenizer_.DecodeBytes(all.subspan(prefix_offset_), skip_special_tokens_);
  if (!new_text.ok()) return new_text.status();
  // Hold back an unfinished character: raw bytes that more bytes could complete (byte-level
  // decoders) or a trailing U+FFFD (the ByteFallback decoder replaces the bytes of an incomplete
  // character, as the crate's DecodeStream expects).
  if (new_text->size() <= prefix_text->size() || EndsInIncompleteUtf8(*new_text) ||
      absl::EndsWith(*new_text, kReplacementCharacter)) {
    return "";
  }
  // The prefix's text is a byte prefix of the longer decode for the decoders of byte-level and
  // SentencePiece tokenizers; a decoder that rewrites earlier text still gets the new tail.
  std::string delta = new_text->substr(prefix_text->size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return tokenizer_internal::ToValidUtf8(delta);
}

std::string StreamingDecoder::Finish() {
  if (read_offset_ >= ids_.size()) return "";
  const std::span<const int32_t> all(ids_);
  absl::StatusOr<std::string> prefix_text = tokenizer_.DecodeBytes(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  absl::StatusOr<std::string> new_text =
      tokenizer_.DecodeBytes(all.subspan(prefix_offset_), skip_special_tokens_);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (!prefix_text.ok() || !new_text.ok() || new_text->size() <= prefix_text->size()) return "";
  return tokenizer_internal::ToValidUtf8(absl::string_view(*new_text).substr(prefix_text->size()));
}

}  // namespace kiln
