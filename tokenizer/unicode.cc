// UTF-8 validation and lossy conversion, character classes and utf8proc normalization.

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "tokenizer/components.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";  // U+FFFD

// Examines the multi-byte sequence at s[0..n) (n >= 1, s[0] >= 0x80). Returns the length of the
// well-formed character there, or 0 with *bad set to the length of its maximal invalid subpart
// (the bytes that started a well-formed sequence before it broke off; at least 1). This is the
// Unicode "maximal subpart" rule that Rust's String::from_utf8_lossy follows.
size_t CheckSequence(const uint8_t* s, size_t n, size_t* bad) {
  const uint8_t b0 = s[0];
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  if (n < 2 || s[1] < lo || s[1] > hi) {
    *bad = 1;
    return 0;
  }
  for (size_t i = 2; i < need; ++i) {
    if (i >= n || (s[i] & 0xC0) != 0x80) {
      *bad = i;
      return 0;
    }
  }
  return need;
}

// Index of the first non-ASCII byte at or after i.
size_t SkipAscii(const uint8_t* s, size_t n, size_t i) {
  while (i + 8 <= n) {
    uint64_t word;
    std::memcpy(&word, s + i, 8);
    if (word & 0x8080808080808080ULL) break;
    i += 8;
  }
  while (i < n && s[i] < 0x80) ++i;
  return i;
}

utf8proc_category_t Category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

}  // namespace

size_t DecodeUtf8Slow(const char* p, const char* end, char32_t* cp) {
  const auto* s = reinterpret_cast<const uint8_t*>(p);
  size_t bad = 0;
  const size_t len = CheckSequence(s, static_cast<size_t>(end - p), &bad);
  switch (len) {
    case 2:
      *cp = (char32_t{s[0]} & 0x1F) << 6 | (s[1] & 0x3F);
      return 2;
    case 3:
      *cp = (char32_t{s[0]} & 0x0F) << 12 | (char32_t{s[1]} & 0x3F) << 6 | (s[2] & 0x3F);
      return 3;
    case 4:
      *cp = (char32_t{s[0]} & 0x07) << 18 | (char32_t{s[1]} & 0x3F) << 12 |
            (char32_t{s[2]} & 0x3F) << 6 | (s[3] & 0x3F);
      return 4;
    default:
      *cp = 0xFFFD;
      return 1;
  }
}

void AppendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      out.append(kReplacementUtf8);
      return;
    }
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0x10FFFF) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.append(kReplacementUtf8);
  }
}

char32_t FirstCodePoint(absl::string_view text) {
  if (text.empty()) return 0xFFFD;
  char32_t cp;
  DecodeUtf8(text.data(), text.data() + text.size(), &cp);
  return cp;
}

size_t CountCodePoints(absl::string_view text) {
  size_t count = 0;
  for (const char c : text) count += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return count;
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  const auto cat = Category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool IsCombiningMark(char32_t c) {
  if (c < 0x300) return false;
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool IsNonspacingMark(char32_t c) { return c >= 0x300 && Category(c) == UTF8PROC_CATEGORY_MN; }

bool IsOther(char32_t c) {
  const auto cat = Category(c);
  return cat == UTF8PROC_CATEGORY_CN || cat >= UTF8PROC_CATEGORY_CC;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled and squared Latin letters).
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  const auto cat = Category(c);
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_ND) ||
         cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC;
}

namespace {

// utf8proc over one piece of text.
void AppendNormalized(absl::string_view text, utf8proc_option_t options, std::string& out) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped, options);
  if (len < 0) {
    out.append(text.data(), text.size());
  } else {
    out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(len));
  }
  std::free(mapped);
}

}  // namespace

std::string NormalizeUnicode(absl::string_view text, NormalForm form) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  if (SkipAscii(s, text.size(), 0) == text.size()) return std::string(text);  // ASCII is stable
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  // ASCII characters have no decomposition, and none is ever the second character of a
  // composition or a combining mark. So only each run of non-ASCII characters, together with the
  // ASCII character before it (a starter that a combining mark may attach to), needs utf8proc;
  // the rest is copied. This keeps mostly-ASCII text (code, English) fast.
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;
  size_t i = 0;
  while (i < text.size()) {
    i = SkipAscii(s, text.size(), i);
    if (i == text.size()) break;
    const size_t begin = i > copied ? i - 1 : i;  // include the preceding ASCII starter
    size_t end = i;
    while (end < text.size() && s[end] >= 0x80) ++end;
    out.append(text.data() + copied, begin - copied);
    AppendNormalized(text.substr(begin, end - begin), static_cast<utf8proc_option_t>(options), out);
    copied = i = end;
  }
  out.append(text.data() + copied, text.size() - copied);
  return out;
}

std::string LowercaseUnicode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    const auto b = static_cast<uint8_t>(*p);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++p;
      continue;
    }
    char32_t cp;
    const size_t len = DecodeUtf8(p, end, &cp);
    if (cp == 0x130) {  // İ: the only unconditional multi-character lowercase mapping
      out.append("i\xCC\x87");
    } else if (cp == 0xFFFD && len == 1) {
      out.append(p, 1);  // keep a stray byte as it is
    } else {
      AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), out);
    }
    p += len;
  }
  return out;
}

std::optional<size_t> FindInvalidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (true) {
    i = SkipAscii(s, n, i);
    if (i >= n) return std::nullopt;
    size_t bad = 0;
    const size_t len = CheckSequence(s + i, n - i, &bad);
    if (len == 0) return i;
    i += len;
  }
}

std::string ToValidUtf8(absl::string_view bytes) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    const size_t ascii_end = SkipAscii(s, n, i);
    out.append(bytes.data() + i, ascii_end - i);
    i = ascii_end;
    if (i >= n) break;
    size_t bad = 0;
    const size_t len = CheckSequence(s + i, n - i, &bad);
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
    } else {
      out.append(kReplacementUtf8);
      i += bad;
    }
  }
  return out;
}

}  // namespace kiln::tokenizer_internal
