#include "template/lexer.h"

#include <algorithm>
#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kiln::jinja {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool IsIdentStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    const size_t n = src_.size();
    while (pos < n) {
      size_t tag = FindTag(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? n : tag) - pos);
      if (tag == std::string::npos) {
        Emit(Token::Type::kText, pos, std::move(text));
        break;
      }
      char kind = src_[tag + 1];
      char mod = tag + 2 < n ? src_[tag + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: only spaces/tabs between the line start and the tag are removed.
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        bool line_start = nl != std::string::npos || pos == 0 || src_[pos - 1] == '\n';
        if (line_start && std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(),
                                      [](char c) { return IsSpace(c); })) {
          text.resize(l_pos);
        }
      }
      Emit(Token::Type::kText, pos, std::move(text));
      if (kind == '#') {
        size_t end = src_.find("#}", tag + 2);
        if (end == std::string::npos) return Error(tag, "unterminated comment");
        bool strip = end > tag + 2 && src_[end - 1] == '-';
        bool keep = end > tag + 2 && src_[end - 1] == '+';
        pos = end + 2;
        if (strip) {
          while (pos < n && IsSpace(src_[pos])) ++pos;
        } else if (!keep && pos < n && src_[pos] == '\n') {
          ++pos;
        }
        continue;
      }
      auto r = LexTag(tag, kind);
      if (!r.ok()) return r.status();
      pos = *r;
    }
    Emit(Token::Type::kEof, n, "");
    return std::move(tokens_);
  }

 private:
  size_t FindTag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  Pos PosOf(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  void Emit(Token::Type type, size_t offset, std::string text) {
    if (type == Token::Type::kText && text.empty()) return;
    tokens_.push_back(Token{type, PosOf(offset), std::move(text)});
  }

  absl::Status Error(size_t offset, absl::string_view msg) const {
    Pos p = PosOf(offset);
    return absl::InvalidArgumentError(absl::StrCat(msg, " at line ", p.line, ":", p.column));
  }

  // Lexes the tag opened at `tag`; returns the offset after it (and its whitespace handling).
  absl::StatusOr<size_t> LexTag(size_t tag, char kind) {
    const size_t n = src_.size();
    Emit(kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, tag, "");
    size_t p = tag + 2;
    if (p < n && (src_[p] == '-' || src_[p] == '+')) ++p;
    const char close = kind == '{' ? '}' : '%';
    int depth = 0;
    while (true) {
      while (p < n && IsSpace(src_[p])) ++p;
      if (p >= n) return Error(tag, kind == '{' ? "unterminated '{{'" : "unterminated '{%'");
      char c = src_[p];
      char modifier = '\0';
      size_t end_at = p;
      if ((c == '-' || (c == '+' && kind == '%')) &&
          src_.compare(p + 1, 2, std::string{close, '}'}) == 0) {
        modifier = c;
        end_at = p + 1;
      }
      if (depth == 0 && src_.compare(end_at, 2, std::string{close, '}'}) == 0 &&
          (modifier != '\0' || end_at == p)) {
        Emit(kind == '{' ? Token::Type::kVarEnd : Token::Type::kBlockEnd, p, "");
        p = end_at + 2;
        if (modifier == '-') {
          while (p < n && IsSpace(src_[p])) ++p;
        } else if (kind == '%' && modifier != '+' && p < n && src_[p] == '\n') {
          ++p;
        }
        return p;
      }
      if (IsIdentStart(c)) {
        size_t s = p;
        while (p < n && (IsIdentStart(src_[p]) || IsDigit(src_[p]))) ++p;
        Emit(Token::Type::kName, s, src_.substr(s, p - s));
      } else if (IsDigit(c)) {
        size_t s = p;
        while (p < n && (IsDigit(src_[p]) || src_[p] == '_')) ++p;
        bool is_float = false;
        if (p + 1 < n && src_[p] == '.' && IsDigit(src_[p + 1])) {
          is_float = true;
          ++p;
          while (p < n && (IsDigit(src_[p]) || src_[p] == '_')) ++p;
        }
        if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
          size_t q = p + 1;
          if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
          if (q < n && IsDigit(src_[q])) {
            is_float = true;
            p = q;
            while (p < n && IsDigit(src_[p])) ++p;
          }
        }
        std::string num;
        for (size_t k = s; k < p; ++k) {
          if (src_[k] != '_') num += src_[k];
        }
        Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, s, std::move(num));
      } else if (c == '\'' || c == '"') {
        size_t s = p;
        auto str = LexString(p);
        if (!str.ok()) return str.status();
        Emit(Token::Type::kString, s, *std::move(str));
      } else {
        static constexpr std::string_view kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (auto o : kOps2) {
          if (src_.compare(p, 2, o) == 0) op = std::string(o);
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~()[]{},.:|=<>;").find(c) == std::string_view::npos) {
            return Error(p, absl::StrCat("unexpected character '", std::string(1, c), "'"));
          }
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        Emit(Token::Type::kOp, p, op);
        p += op.size();
      }
    }
  }

  // A Python string literal starting at p (a quote); unescapes as unicode-escape does.
  absl::StatusOr<std::string> LexString(size_t& p) {
    const size_t start = p;
    const char q = src_[p++];
    std::string out;
    const size_t n = src_.size();
    while (true) {
      if (p >= n) return Error(start, "unterminated string");
      char c = src_[p++];
      if (c == q) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p >= n) return Error(start, "unterminated string");
      char e = src_[p++];
      auto hex = [&](int digits) -> absl::StatusOr<uint32_t> {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          if (p >= n || !std::isxdigit(static_cast<unsigned char>(src_[p]))) {
            return Error(start, "truncated escape in string");
          }
          char h = src_[p++];
          v = v * 16 + static_cast<uint32_t>(IsDigit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          auto v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
          if (!v.ok()) return v.status();
          AppendUtf8(*v, out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              v = v * 8 + static_cast<uint32_t>(src_[p++] - '0');
            }
            AppendUtf8(v, out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).Run();
}

}  // namespace kiln::jinja
