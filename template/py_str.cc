#include "template/py_str.h"

#include <algorithm>
#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "template/evaluator.h"

namespace kiln::jinja {

absl::Status ArgError(absl::string_view fn, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(fn, "(): ", msg));
}

std::string Str(const Value& v) { return v.IsString() ? v.s : ToStr(v); }

// ASCII case mapping (chat templates only case-map their own ASCII text).
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string Capitalize(const std::string& s) {
  if (s.empty()) return s;
  return Upper(s.substr(0, 1)) + Lower(s.substr(1));
}

// str.strip/lstrip/rstrip: `chars` null strips Python whitespace.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  std::vector<uint32_t> set;
  bool ws = chars == nullptr || chars->IsNone() || chars->IsUndefined();
  if (!ws) set = DecodeUtf8(Str(*chars));
  auto strip = [&](uint32_t c) {
    return ws ? IsPySpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(cps, b, e);
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between characters and at both ends.
    std::vector<uint32_t> cps = DecodeUtf8(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) AppendUtf8(cps[i], out);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

List Split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->IsNone()) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && IsPySpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && IsPySpace(cps[e - 1])) --e;
        out.push_back(Value::Str(EncodeUtf8(cps, i, e)));
        break;
      }
      size_t b = i;
      while (i < cps.size() && !IsPySpace(cps[i])) ++i;
      out.push_back(Value::Str(EncodeUtf8(cps, b, i)));
    }
    return out;
  }
  const std::string& d = sep->s;
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t at = s.find(d, pos);
    if (at == std::string::npos) break;
    out.push_back(Value::Str(s.substr(pos, at - pos)));
    pos = at + d.size();
  }
  out.push_back(Value::Str(s.substr(pos)));
  return out;
}

// Jinja's title filter: each run after [-\s({[<] starts upper case, the rest lower.
std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool start = true;
  for (char c : s) {
    bool sep = c == '-' || std::isspace(static_cast<unsigned char>(c)) || c == '(' || c == '{' ||
               c == '[' || c == '<';
    if (sep) {
      out += c;
      start = true;
    } else {
      out += static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                     : std::tolower(static_cast<unsigned char>(c)));
      start = false;
    }
  }
  return out;
}

// Python's str.title: a letter after a non-letter is upper case, others lower.
std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    bool alpha = std::isalpha(u) != 0;
    out += static_cast<char>(alpha ? (prev_cased ? std::tolower(u) : std::toupper(u)) : c);
    prev_cased = alpha;
  }
  return out;
}

// Attribute lookup for selectattr/map/sort/join: dotted paths, integer parts index.
Value AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (digits && cur.IsList()) {
      auto r = GetItem(cur, Value::Int(std::stoll(part)));
      cur = r.ok() ? *r : Value::Undefined(part);
    } else {
      cur = GetAttr(cur, part);
    }
    if (dot == std::string::npos || cur.IsUndefined()) return cur;
    pos = dot + 1;
  }
}

CallArgs Shift(const CallArgs& args, size_t n) {
  CallArgs out;
  for (size_t i = n; i < args.args.size(); ++i) out.args.push_back(args.args[i]);
  out.kwargs = args.kwargs;
  return out;
}

int64_t IntArg(const CallArgs& args, size_t pos, absl::string_view name, int64_t def) {
  const Value* v = args.Get(pos, name);
  return v != nullptr && v->IsNumber() ? static_cast<int64_t>(v->AsFloat()) : def;
}

bool BoolArg(const CallArgs& args, size_t pos, absl::string_view name, bool def) {
  const Value* v = args.Get(pos, name);
  return v != nullptr ? Truthy(*v) : def;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find_first_of("\r\n", pos);
    if (nl == std::string::npos) {
      lines.push_back(s.substr(pos));
      break;
    }
    lines.push_back(s.substr(pos, nl - pos));
    pos = nl + ((s[nl] == '\r' && nl + 1 < s.size() && s[nl + 1] == '\n') ? 2 : 1);
  }
  return lines;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace kiln::jinja
