// The values a template computes with (internal to template/): Python's None, bool, int, float,
// str, list/tuple and dict (insertion-ordered), plus Jinja's Undefined, namespace objects and
// callables (macros and globals). Lists, dicts and namespaces are shared by reference, as in
// Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kiln::jinja {

struct Value;
struct Dict;
struct CallArgs;
class Evaluator;

using List = std::vector<Value>;
using NativeFn = std::function<absl::StatusOr<Value>(Evaluator&, CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Kind kind = Kind::kUndefined;
  bool is_tuple = false;      // a kList written as a tuple (repr with parentheses)
  bool is_namespace = false;  // a kDict made by namespace(): attributes may be assigned
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;               // kString; for kUndefined, the name that was missing (messages)
  std::shared_ptr<List> list;  // kList
  std::shared_ptr<Dict> dict;  // kDict
  std::shared_ptr<Callable> fn;

  static Value Undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value None() { return Make(Kind::kNone); }
  static Value Bool(bool x) {
    Value v = Make(Kind::kBool);
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v = Make(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v = Make(Kind::kFloat);
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v = Make(Kind::kString);
    v.s = std::move(x);
    return v;
  }
  static Value MakeList(List items = {}, bool tuple = false) {
    Value v = Make(Kind::kList);
    v.list = std::make_shared<List>(std::move(items));
    v.is_tuple = tuple;
    return v;
  }
  static Value MakeDict();
  static Value Function(std::string name, NativeFn fn) {
    Value v = Make(Kind::kCallable);
    v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }

  bool IsUndefined() const { return kind == Kind::kUndefined; }
  bool IsNone() const { return kind == Kind::kNone; }
  bool IsString() const { return kind == Kind::kString; }
  bool IsList() const { return kind == Kind::kList; }
  bool IsDict() const { return kind == Kind::kDict; }
  bool IsNumber() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool IsIntLike() const { return kind == Kind::kInt || kind == Kind::kBool; }
  int64_t AsInt() const { return kind == Kind::kBool ? (b ? 1 : 0) : i; }
  double AsFloat() const { return kind == Kind::kFloat ? f : static_cast<double>(AsInt()); }

 private:
  static Value Make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// An insertion-ordered string-keyed dict (chat contexts have small dicts: linear lookup).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(absl::string_view key) const;
  void Set(std::string key, Value value);
};

inline Value Value::MakeDict() {
  Value v = Make(Kind::kDict);
  v.dict = std::make_shared<Dict>();
  return v;
}

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The argument at `pos` or named `name`, or nullptr.
  const Value* Get(size_t pos, absl::string_view name) const;
};

// Python semantics.
bool Truthy(const Value& v);
bool Equals(const Value& a, const Value& b);
// a < b as Python orders them; an error for unorderable types.
absl::StatusOr<bool> Less(const Value& a, const Value& b);
std::string TypeName(const Value& v);
// str(v) (Undefined renders as ""), and repr(v).
std::string ToStr(const Value& v);
std::string Repr(const Value& v);
std::string PyFloatRepr(double x);

// Conversion from and to JSON; ToJson fails on Undefined and callables.
Value FromJson(const nlohmann::ordered_json& j);
Value FromJson(const nlohmann::json& j);
struct JsonOptions {
  int indent = -1;  // < 0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;  // escape non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
  std::string item_sep;       // empty: Python's default for the indent
  std::string key_sep = ": ";
  // Output past this many bytes is ResourceExhausted: the indent and the separators are repeated
  // for every item, so a few bytes of template could otherwise ask for gigabytes.
  size_t max_bytes = SIZE_MAX;
};
// json.dumps(v, ...) byte for byte.
absl::StatusOr<std::string> DumpJson(const Value& v, const JsonOptions& options);

// UTF-8 helpers: strings index, slice and count by code point, as Python's str does.
std::vector<uint32_t> DecodeUtf8(absl::string_view s);
void AppendUtf8(uint32_t cp, std::string& out);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
bool IsPySpace(uint32_t cp);

}  // namespace kiln::jinja
