// GPT-2's reversible byte <-> printable character map (the crate's bytes_char()).

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "tokenizer/components.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

// Bytes that are printable (and not a space) keep their own code point; the 68 others get
// U+0100 + n in increasing byte order.
constexpr bool KeepsOwnCodePoint(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> code_point{};
  std::array<std::string, 256> utf8;
  // UTF-8 of each byte's character packed for the encoder: up to two bytes and a length.
  std::array<uint8_t, 256> len{};
  std::array<std::array<char, 2>, 256> bytes{};
  // Inverse map over U+0000..U+0143 (all the characters used); -1 where unused.
  std::array<int16_t, 0x144> inverse{};

  Tables() {
    inverse.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = KeepsOwnCodePoint(b) ? static_cast<char32_t>(b) : next++;
      code_point[b] = cp;
      AppendUtf8(cp, utf8[b]);
      len[b] = static_cast<uint8_t>(utf8[b].size());
      for (size_t i = 0; i < utf8[b].size(); ++i) bytes[b][i] = utf8[b][i];
      inverse[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return GetTables().utf8; }

std::optional<uint8_t> UnicodeToByte(char32_t codepoint) {
  const Tables& t = GetTables();
  if (codepoint >= t.inverse.size() || t.inverse[codepoint] < 0) return std::nullopt;
  return static_cast<uint8_t>(t.inverse[codepoint]);
}

std::string ByteLevelEncode(absl::string_view text) {
  const Tables& t = GetTables();
  size_t size = 0;
  for (const char c : text) size += t.len[static_cast<uint8_t>(c)];
  std::string out(size, '\0');
  char* dst = out.data();
  for (const char c : text) {
    const auto b = static_cast<uint8_t>(c);
    dst[0] = t.bytes[b][0];
    if (t.len[b] == 2) dst[1] = t.bytes[b][1];
    dst += t.len[b];
  }
  return out;
}

}  // namespace kiln::tokenizer_internal
