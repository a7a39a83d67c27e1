// Unicode helpers shared by the tokenizer components (internal to tokenizer/): UTF-8 decoding,
// character classes with the Rust standard library's definitions, and utf8proc normalization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln::tokenizer_internal {

// Decodes the character at p (p < end). Returns its length in bytes (>= 1, never past end); an
// invalid or truncated sequence decodes as U+FFFD with length 1.
size_t DecodeUtf8Slow(const char* p, const char* end, char32_t* cp);
inline size_t DecodeUtf8(const char* p, const char* end, char32_t* cp) {
  const auto b = static_cast<uint8_t>(*p);
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  return DecodeUtf8Slow(p, end, cp);
}

// Length of the character whose lead byte is at p (1 for a stray byte), never past end.
inline size_t Utf8CharLength(const char* p, const char* end) {
  const auto b = static_cast<uint8_t>(*p);
  size_t len = b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  const auto left = static_cast<size_t>(end - p);
  return len < left ? len : left;
}

// Appends the UTF-8 encoding of cp (U+FFFD for a value that is not a scalar value).
void AppendUtf8(char32_t cp, std::string& out);

// The first code point of text (U+FFFD if text is empty or starts with an invalid byte).
char32_t FirstCodePoint(absl::string_view text);
// The number of code points in text.
size_t CountCodePoints(absl::string_view text);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsWhitespace(char32_t c);
// Rust's char::is_numeric (general categories Nd, Nl, No).
bool IsNumeric(char32_t c);
// The crate's punctuation test: ASCII punctuation or a general category P*.
bool IsPunctuation(char32_t c);
// General category M* (unicode-normalization's is_combining_mark).
bool IsCombiningMark(char32_t c);
// General category Mn.
bool IsNonspacingMark(char32_t c);
// General category C* (Cc, Cf, Cs, Co, Cn).
bool IsOther(char32_t c);
// A character of the Rust regex crate's Unicode \w (Alphabetic, M, Nd, Pc, Join_Control).
bool IsWordChar(char32_t c);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Unicode normalization via utf8proc (text must be valid UTF-8; invalid text is returned as is).
std::string NormalizeUnicode(absl::string_view text, NormalForm form);
// Rust's char::to_lowercase applied to every character (full lowercase mapping, no context).
std::string LowercaseUnicode(absl::string_view text);

}  // namespace kiln::tokenizer_internal
