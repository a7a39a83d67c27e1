// Jinja2's filters and tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "template/evaluator.h"
#include "template/parser.h"
#include "template/py_str.h"

namespace kiln::jinja {
namespace {

constexpr absl::string_view kFilters[] = {
    "abs",      "attr",   "batch",      "capitalize", "count",    "d",       "default",
    "dictsort", "e",      "escape",     "first",      "float",    "indent",  "int",
    "items",    "join",   "last",       "length",     "list",     "lower",   "map",
    "max",      "min",    "reject",     "rejectattr", "replace",  "reverse", "round",
    "safe",     "select", "selectattr", "sort",       "string",   "sum",     "title",
    "tojson",   "trim",   "unique",     "upper",      "wordcount"};

constexpr absl::string_view kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",   "equalto",   "even",
    "false",   "float",    "ge",       "gt",          "in",   "integer",   "iterable",
    "le",      "lower",    "lt",       "mapping",     "ne",   "none",      "number",
    "odd",     "sameas",   "sequence", "string",      "true", "undefined", "upper"};

absl::StatusOr<Value> SortList(List items, bool reverse, bool case_sensitive,
                               const Value* attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute != nullptr && !attribute->IsNone() ? AttrPath(v, Str(*attribute)) : v;
    if (!case_sensitive && k.IsString()) k.s = Lower(k.s);
    return k;
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& v : items) keyed.emplace_back(key(v), std::move(v));
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto lt = reverse ? Less(b.first, a.first) : Less(a.first, b.first);
    if (!lt.ok()) {
      error = lt.status();
      return false;
    }
    return *lt;
  });
  KILN_RETURN_IF_ERROR(error);
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Round(const Value& v, const CallArgs& args) {
  if (!v.IsNumber()) return ArgError("round", "a number is required");
  int64_t precision = IntArg(args, 0, "precision", 0);
  const Value* method = args.Get(1, "method");
  std::string m = method != nullptr ? Str(*method) : "common";
  if (m == "common" && v.IsIntLike()) return Value::Int(v.AsInt());  // round(int, n) is an int
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.AsFloat() * scale;
  if (m == "common") {
    x = std::nearbyint(x);  // Python's round: ties to even
  } else if (m == "floor") {
    x = std::floor(x);
  } else if (m == "ceil") {
    x = std::ceil(x);
  } else {
    return ArgError("round", "method must be common, ceil or floor");
  }
  return Value::Float(x / scale);
}

absl::StatusOr<Value> Select(Evaluator& ev, const Value& v, CallArgs& args, bool by_attr,
                             bool keep) {
  if (!Truthy(v)) return Value::MakeList();  // jinja2 skips a falsy sequence
  KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
  size_t first = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) {
    if (args.args.empty()) return ArgError("selectattr", "an attribute name is required");
    attr = Str(args.args[0]);
  }
  List out;
  for (const Value& item : items) {
    Value x = by_attr ? AttrPath(item, attr) : item;
    bool ok;
    if (args.args.size() > first) {
      CallArgs test_args = Shift(args, first + 1);
      KILN_ASSIGN_OR_RETURN(ok, ApplyTest(ev, Str(args.args[first]), x, test_args));
    } else {
      ok = Truthy(x);
    }
    if (ok == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> Indent(const Evaluator& ev, const Value& v, const CallArgs& args) {
  if (!v.IsString()) return ArgError("indent", "a string is required");
  const Value* width = args.Get(0, "width");
  std::string ind;
  if (width == nullptr) {
    ind = std::string(4, ' ');
  } else if (width->IsString()) {
    ind = width->s;
  } else {
    const int64_t spaces = std::max<int64_t>(0, width->AsInt());
    KILN_RETURN_IF_ERROR(ev.CheckSize(static_cast<uint64_t>(spaces)));
    ind = std::string(static_cast<size_t>(spaces), ' ');
  }
  bool first = BoolArg(args, 1, "first", false);
  bool blank = BoolArg(args, 2, "blank", false);
  std::vector<std::string> lines = Lines(Str(v) + "\n");
  // The result's exact size, checked before it is built: the indent repeats on every line.
  size_t indents = first ? 1 : 0;
  for (size_t i = 1; i < lines.size(); ++i) indents += blank || !lines[i].empty() ? 1 : 0;
  KILN_RETURN_IF_ERROR(ev.CheckSize(!ind.empty() && indents > (SIZE_MAX - v.s.size()) / ind.size()
                                        ? SIZE_MAX
                                        : v.s.size() + indents * ind.size()));
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += "\n";
    if (i > 0 && (blank || !lines[i].empty())) rv += ind;
    rv += lines[i];
  }
  if (first) rv = ind + rv;
  return Value::Str(std::move(rv));
}

absl::StatusOr<Value> MinMax(const Value& v, const CallArgs& args, bool max) {
  KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.empty()) return Value::Undefined();
  KILN_ASSIGN_OR_RETURN(Value sorted,
                        SortList(std::move(items), max, BoolArg(args, 0, "case_sensitive", false),
                                 args.Get(1, "attribute")));
  return sorted.list->front();
}

}  // namespace

bool IsKnownFilter(absl::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(absl::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<Value> ApplyFilter(Evaluator& ev, absl::string_view name, const Value& v,
                                  CallArgs& args) {
  if (name == "trim") return Value::Str(Strip(Str(v), args.Get(0, "chars"), true, true));
  if (name == "length" || name == "count") {
    if (v.IsString()) return Value::Int(static_cast<int64_t>(DecodeUtf8(v.s).size()));
    if (v.IsList()) return Value::Int(static_cast<int64_t>(v.list->size()));
    if (v.IsDict()) return Value::Int(static_cast<int64_t>(v.dict->items.size()));
    if (v.IsUndefined()) return Value::Int(0);
    return absl::InvalidArgumentError(
        absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
  if (name == "tojson") {
    JsonOptions o;
    if (const Value* indent = args.Get(1, "indent"); indent != nullptr && !indent->IsNone()) {
      // Clamped, not truncated: 2**32 + 2 must not become 2 (o.max_bytes refuses a huge one).
      o.indent = static_cast<int>(std::clamp<int64_t>(
          indent->AsInt(), std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
    }
    o.max_bytes = ev.max_output_bytes();
    if (const Value* seps = args.Get(2, "separators");
        seps != nullptr && seps->IsList() && seps->list->size() == 2) {
      o.item_sep = Str((*seps->list)[0]);
      o.key_sep = Str((*seps->list)[1]);
    }
    o.sort_keys = BoolArg(args, 3, "sort_keys", false);
    o.ensure_ascii = BoolArg(args, 0, "ensure_ascii", false);
    KILN_ASSIGN_OR_RETURN(std::string s, DumpJson(v, o));
    return Value::Str(std::move(s));
  }
  if (name == "upper") return Value::Str(Upper(Str(v)));
  if (name == "lower") return Value::Str(Lower(Str(v)));
  if (name == "capitalize") return Value::Str(Capitalize(Str(v)));
  if (name == "title") return Value::Str(JinjaTitle(Str(v)));
  if (name == "replace") {
    const Value* from = args.Get(0, "old");
    const Value* to = args.Get(1, "new");
    if (from == nullptr || to == nullptr) return ArgError("replace", "old and new are required");
    const Value* count = args.Get(2, "count");
    int64_t n = count != nullptr && !count->IsNone() ? count->AsInt() : -1;
    std::string r = Replace(Str(v), Str(*from), Str(*to), n);
    KILN_RETURN_IF_ERROR(ev.CheckSize(r.size()));
    return Value::Str(std::move(r));
  }
  if (name == "join") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    const Value* sep = args.Get(0, "d");
    const Value* attr = args.Get(1, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && sep != nullptr) out += Str(*sep);
      out += Str(attr != nullptr && !attr->IsNone() ? AttrPath(items[i], Str(*attr)) : items[i]);
      KILN_RETURN_IF_ERROR(ev.CheckSize(out.size()));
    }
    return Value::Str(std::move(out));
  }
  if (name == "items") {
    if (v.IsUndefined()) return Value::MakeList();
    if (!v.IsDict()) return ArgError("items", "can only get item pairs from a mapping");
    List out;
    for (const auto& [k, x] : v.dict->items)
      out.push_back(Value::MakeList({Value::Str(k), x}, true));
    return Value::MakeList(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* def = args.Get(0, "default_value");
    bool boolean = BoolArg(args, 1, "boolean", false);
    if (v.IsUndefined() || (boolean && !Truthy(v))) return def != nullptr ? *def : Value::Str("");
    return v;
  }
  if (name == "first" || name == "last") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    if (items.empty()) return Value::Undefined();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    return Value::MakeList(std::move(items));
  }
  if (name == "string") return Value::Str(Str(v));
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value::Str(HtmlEscape(Str(v)));
  if ((name == "int" || name == "float") && v.IsUndefined()) {
    return absl::InvalidArgumentError(absl::StrCat("'", v.s, "' is undefined"));
  }
  if (name == "int") {
    const Value* def = args.Get(0, "default");
    Value d = def != nullptr ? *def : Value::Int(0);
    if (v.IsIntLike()) return Value::Int(v.AsInt());
    if (v.kind == Value::Kind::kFloat) return Value::Int(static_cast<int64_t>(v.f));
    if (v.IsString()) {
      std::string s = Strip(v.s, nullptr, true, true);
      char* end = nullptr;
      long long x = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::Int(x);
      double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::Int(static_cast<int64_t>(f));
    }
    return d;
  }
  if (name == "float") {
    const Value* def = args.Get(0, "default");
    if (v.IsNumber()) return Value::Float(v.AsFloat());
    if (v.IsString()) {
      std::string s = Strip(v.s, nullptr, true, true);
      char* end = nullptr;
      double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(f);
    }
    return def != nullptr ? *def : Value::Float(0.0);
  }
  if (name == "abs") {
    if (v.IsIntLike()) return Value::Int(std::abs(v.AsInt()));
    if (v.kind == Value::Kind::kFloat) return Value::Float(std::fabs(v.f));
    return ArgError("abs", "bad operand type");
  }
  if (name == "round") return Round(v, args);
  if (name == "unique") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    bool cs = BoolArg(args, 0, "case_sensitive", false);
    const Value* attr = args.Get(1, "attribute");
    List out, seen;
    for (const Value& item : items) {
      Value k = attr != nullptr && !attr->IsNone() ? AttrPath(item, Str(*attr)) : item;
      if (!cs && k.IsString()) k.s = Lower(k.s);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, k); })) {
        seen.push_back(k);
        out.push_back(item);
      }
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "reverse") {
    if (v.IsString()) {
      std::vector<uint32_t> cps = DecodeUtf8(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::Str(EncodeUtf8(cps, 0, cps.size()));
    }
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "sort") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    return SortList(std::move(items), BoolArg(args, 0, "reverse", false),
                    BoolArg(args, 1, "case_sensitive", false), args.Get(2, "attribute"));
  }
  if (name == "dictsort") {
    if (!v.IsDict()) return ArgError("dictsort", "a mapping is required");
    const Value* by = args.Get(1, "by");
    bool by_value = by != nullptr && Str(*by) == "value";
    List pairs;
    for (const auto& [k, x] : v.dict->items)
      pairs.push_back(Value::MakeList({Value::Str(k), x}, true));
    bool cs = BoolArg(args, 0, "case_sensitive", false);
    bool reverse = BoolArg(args, 2, "reverse", false);
    std::vector<std::pair<Value, Value>> keyed;
    for (Value& p : pairs) {
      Value k = (*p.list)[by_value ? 1 : 0];
      if (!cs && k.IsString()) k.s = Lower(k.s);
      keyed.emplace_back(std::move(k), std::move(p));
    }
    absl::Status error;
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      auto lt = reverse ? Less(b.first, a.first) : Less(a.first, b.first);
      if (!lt.ok()) error = lt.status();
      return lt.ok() && *lt;
    });
    KILN_RETURN_IF_ERROR(error);
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value::MakeList(std::move(out));
  }
  if (name == "max" || name == "min") return MinMax(v, args, name == "max");
  if (name == "sum") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    const Value* attr = args.Get(0, "attribute");
    const Value* start = args.Get(1, "start");
    Value total = start != nullptr ? *start : Value::Int(0);
    for (const Value& item : items) {
      Value x = attr != nullptr && !attr->IsNone() ? AttrPath(item, Str(*attr)) : item;
      if (!x.IsNumber() || !total.IsNumber()) return ArgError("sum", "numbers are required");
      total = total.IsIntLike() && x.IsIntLike() ? Value::Int(total.AsInt() + x.AsInt())
                                                 : Value::Float(total.AsFloat() + x.AsFloat());
    }
    return total;
  }
  if (name == "selectattr" || name == "rejectattr") {
    return Select(ev, v, args, true, name == "selectattr");
  }
  if (name == "select" || name == "reject") return Select(ev, v, args, false, name == "select");
  if (name == "map") {
    if (!Truthy(v)) return Value::MakeList();  // jinja2 skips a falsy sequence
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    List out;
    if (const Value* attr = args.Get(99, "attribute"); attr != nullptr) {
      const Value* def = args.Get(99, "default");
      for (const Value& item : items) {
        Value x = AttrPath(item, Str(*attr));
        out.push_back(x.IsUndefined() && def != nullptr ? *def : x);
      }
      return Value::MakeList(std::move(out));
    }
    if (args.args.empty()) return ArgError("map", "a filter name or attribute= is required");
    std::string filter = Str(args.args[0]);
    if (!IsKnownFilter(filter) || filter == "map") {
      return absl::InvalidArgumentError(absl::StrCat("unsupported filter '", filter, "'"));
    }
    CallArgs rest = Shift(args, 1);
    for (const Value& item : items) {
      KILN_ASSIGN_OR_RETURN(Value x, ApplyFilter(ev, filter, item, rest));
      out.push_back(std::move(x));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "attr") {
    const Value* a = args.Get(0, "name");
    return a != nullptr ? GetAttr(v, Str(*a)) : Value::Undefined();
  }
  if (name == "wordcount") {
    int64_t words = 0;
    bool in_word = false;
    for (unsigned char c : Str(v)) {
      bool w = std::isalnum(c) || c == '_' || c >= 0x80;
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::Int(words);
  }
  if (name == "indent") return Indent(ev, v, args);
  if (name == "batch") {
    KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
    int64_t size = IntArg(args, 0, "linecount", 1);
    if (size <= 0) return ArgError("batch", "linecount must be positive");
    const Value* fill = args.Get(1, "fill_with");
    List out, cur;
    for (const Value& item : items) {
      cur.push_back(item);
      if (static_cast<int64_t>(cur.size()) == size) out.push_back(Value::MakeList(std::move(cur)));
      if (cur.size() == static_cast<size_t>(size)) cur.clear();
    }
    if (!cur.empty()) {
      while (fill != nullptr && !fill->IsNone() && static_cast<int64_t>(cur.size()) < size) {
        cur.push_back(*fill);
      }
      out.push_back(Value::MakeList(std::move(cur)));
    }
    return Value::MakeList(std::move(out));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(Evaluator& ev, absl::string_view name, const Value& v,
                               CallArgs& args) {
  (void)ev;
  const Value* arg = args.Get(0, "value");
  auto need_arg = [&]() -> absl::Status {
    if (arg == nullptr) return ArgError(name, "an argument is required");
    return absl::OkStatus();
  };
  if (name == "defined") return !v.IsUndefined();
  if (name == "undefined") return v.IsUndefined();
  if (name == "none") return v.IsNone();
  if (name == "string") return v.IsString();
  if (name == "number") return v.IsNumber();
  if (name == "integer") return v.kind == Value::Kind::kInt;
  if (name == "float") return v.kind == Value::Kind::kFloat;
  if (name == "boolean") return v.kind == Value::Kind::kBool;
  if (name == "mapping") return v.IsDict() && !v.is_namespace;
  if (name == "iterable") return v.IsList() || v.IsDict() || v.IsString() || v.IsUndefined();
  if (name == "sequence") return v.IsList() || v.IsDict() || v.IsString() || v.IsUndefined();
  if (name == "callable") return v.kind == Value::Kind::kCallable;
  if (name == "true") return v.kind == Value::Kind::kBool && v.b;
  if (name == "false") return v.kind == Value::Kind::kBool && !v.b;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    // value % 2 == 1, value % 2 == 0, value % num == 0 with Python's numbers.
    Value divisor = Value::Int(2);
    if (name == "divisibleby") {
      KILN_RETURN_IF_ERROR(need_arg());
      divisor = *arg;
    }
    if (!v.IsNumber() || !divisor.IsNumber()) return ArgError(name, "numbers are required");
    if (divisor.AsFloat() == 0) return ArgError(name, "division by zero");
    double m;
    if (v.IsIntLike() && divisor.IsIntLike()) {
      int64_t r = v.AsInt() % divisor.AsInt();
      if (r != 0 && ((r < 0) != (divisor.AsInt() < 0))) r += divisor.AsInt();
      m = static_cast<double>(r);
    } else {
      m = std::fmod(v.AsFloat(), divisor.AsFloat());
      if (m != 0 && ((m < 0) != (divisor.AsFloat() < 0))) m += divisor.AsFloat();
    }
    return name == "odd" ? m == 1 : m == 0;
  }
  if (name == "eq" || name == "equalto" || name == "ne") {
    KILN_RETURN_IF_ERROR(need_arg());
    return Equals(v, *arg) == (name != "ne");
  }
  if (name == "sameas") {
    KILN_RETURN_IF_ERROR(need_arg());
    if (v.kind != arg->kind) return false;
    if (v.IsList()) return v.list == arg->list;
    if (v.IsDict()) return v.dict == arg->dict;
    return Equals(v, *arg);
  }
  if (name == "lt" || name == "le" || name == "gt" || name == "ge") {
    KILN_RETURN_IF_ERROR(need_arg());
    KILN_ASSIGN_OR_RETURN(bool lt, Less(v, *arg));
    KILN_ASSIGN_OR_RETURN(bool gt, Less(*arg, v));
    if (name == "lt") return lt;
    if (name == "gt") return gt;
    if (name == "le") return !gt;
    return !lt;
  }
  if (name == "in") {
    KILN_RETURN_IF_ERROR(need_arg());
    if (arg->IsString()) return v.IsString() && arg->s.find(v.s) != std::string::npos;
    if (arg->IsDict()) return v.IsString() && arg->dict->Find(v.s) != nullptr;
    KILN_ASSIGN_OR_RETURN(List items, Iterate(*arg));
    return std::any_of(items.begin(), items.end(), [&](const Value& x) { return Equals(x, v); });
  }
  if (name == "lower" || name == "upper") {
    bool cased = false;
    for (unsigned char c : Str(v)) {
      if (std::isalpha(c)) {
        cased = true;
        if ((name == "lower") != (std::islower(c) != 0)) return false;
      }
    }
    return cased;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported test '", name, "'"));
}

}  // namespace kiln::jinja
