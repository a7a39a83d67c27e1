#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::jinja {

const Value* Dict::Find(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::Get(size_t pos, absl::string_view name) const {
  if (pos < args.size()) return &args[pos];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool Truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return v.is_namespace || !v.dict->items.empty();
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

bool Equals(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) {
    if (a.IsIntLike() && b.IsIntLike()) return a.AsInt() == b.AsInt();
    return a.AsFloat() == b.AsFloat();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList:
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!Equals((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    case Value::Kind::kDict: {
      if (a.is_namespace || b.is_namespace) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_tuple ? "tuple" : "list";
    case Value::Kind::kDict:
      return v.is_namespace ? "Namespace" : "dict";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) {
    if (a.IsIntLike() && b.IsIntLike()) return a.AsInt() < b.AsInt();
    return a.AsFloat() < b.AsFloat();
  }
  if (a.IsString() && b.IsString()) return a.s < b.s;
  if (a.IsList() && b.IsList()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      const Value& x = (*a.list)[i];
      const Value& y = (*b.list)[i];
      if (Equals(x, y)) continue;
      return Less(x, y);
    }
    return a.list->size() < b.list->size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

std::string PyFloatRepr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
             digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

namespace {

std::string StrRepr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string Repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return StrRepr(v.s);
    case Value::Kind::kList: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr((*v.list)[i]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      if (v.is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += StrRepr(k) + ": " + Repr(x);
      }
      return out + "}";
    }
    default:
      return ToStr(v);
  }
}

std::string ToStr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return PyFloatRepr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kCallable:
      return "<function " + v.fn->name + ">";
    default:
      return Repr(v);
  }
}

namespace {

// Deeper JSON becomes None there: conversion recurses, and callers that take JSON from outside
// bound its depth long before (the OpenAI API at 64 levels).
constexpr int kMaxJsonDepth = 512;

template <typename J>
Value FromJsonImpl(const J& j, int depth = 0) {
  if (depth > kMaxJsonDepth) return Value::None();
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::Str(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(FromJsonImpl(x, depth + 1));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::MakeDict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict->Set(it.key(), FromJsonImpl(it.value(), depth + 1));
      return d;
    }
    default:
      return Value::None();
  }
}

// One byte of a JSON string as json.dumps writes it (bytes >= 0x80 pass through).
void AppendJsonByte(unsigned char c, std::string& out) {
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
  }
}

void JsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  if (!ensure_ascii) {
    for (unsigned char c : s) AppendJsonByte(c, out);
  } else {
    auto hex = [&](uint32_t u) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\u%04x", u);
      out += buf;
    };
    for (uint32_t cp : DecodeUtf8(s)) {
      if (cp < 0x80) {
        AppendJsonByte(static_cast<unsigned char>(cp), out);
      } else if (cp >= 0x10000) {
        hex(0xd800 + ((cp - 0x10000) >> 10));
        hex(0xdc00 + ((cp - 0x10000) & 0x3ff));
      } else {
        hex(cp);
      }
    }
  }
  out += '"';
}

absl::Status Dump(const Value& v, const JsonOptions& o, const std::string& item_sep, int level,
                  std::string& out) {
  if (level > 512) return absl::InvalidArgumentError("tojson: value nested too deeply");
  // Whether `more` bytes still fit under o.max_bytes (indent <= INT_MAX times level <= 513 and
  // the separators' sizes cannot overflow size_t).
  auto fits = [&](size_t more) {
    return out.size() <= o.max_bytes && more <= o.max_bytes - out.size();
  };
  auto too_long = [&] {  // built only when needed: Dump runs once per value
    return absl::ResourceExhaustedError(
        absl::StrCat("tojson: output exceeds the limit of ", o.max_bytes, " bytes"));
  };
  if (!fits(0)) return too_long();
  auto newline = [&](int lvl) {
    if (o.indent >= 0) {
      const size_t spaces = static_cast<size_t>(o.indent) * static_cast<size_t>(lvl);
      if (!fits(1 + spaces)) return false;
      out += '\n';
      out.append(spaces, ' ');
    }
    return true;
  };
  switch (v.kind) {
    case Value::Kind::kNone:
      out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return absl::OkStatus();
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += PyFloatRepr(v.f);
      }
      return absl::OkStatus();
    case Value::Kind::kString:
      JsonString(v.s, o.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return absl::OkStatus();
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0 && !fits(item_sep.size())) return too_long();
        if (i > 0) out += item_sep;
        if (!newline(level + 1)) return too_long();
        if (auto st = Dump((*v.list)[i], o, item_sep, level + 1, out); !st.ok()) return st;
      }
      if (!newline(level)) return too_long();
      out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0 && !fits(item_sep.size())) return too_long();
        if (i > 0) out += item_sep;
        if (!newline(level + 1)) return too_long();
        JsonString(items[i]->first, o.ensure_ascii, out);
        if (!fits(o.key_sep.size())) return too_long();
        out += o.key_sep;
        if (auto st = Dump(items[i]->second, o, item_sep, level + 1, out); !st.ok()) return st;
      }
      if (!newline(level)) return too_long();
      out += '}';
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
}

}  // namespace

Value FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }
Value FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }

absl::StatusOr<std::string> DumpJson(const Value& v, const JsonOptions& options) {
  std::string item_sep = options.item_sep;
  if (item_sep.empty()) item_sep = options.indent >= 0 ? "," : ", ";
  std::string out;
  if (auto st = Dump(v, options, item_sep, 0, out); !st.ok()) return st;
  return out;
}

std::vector<uint32_t> DecodeUtf8(absl::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + static_cast<size_t>(n) > s.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) AppendUtf8(cps[i], out);
  return out;
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

}  // namespace kiln::jinja
