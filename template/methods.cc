// Python's str, dict and list methods, attribute and item access, and the globals transformers
// gives templates (range, dict, namespace, raise_exception, strftime_now).
#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "template/evaluator.h"
#include "template/py_str.h"

namespace kiln::jinja {

absl::StatusOr<List> Iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, x] : v.dict->items) keys.push_back(Value::Str(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (uint32_t cp : DecodeUtf8(v.s)) {
        std::string c;
        AppendUtf8(cp, c);
        chars.push_back(Value::Str(std::move(c)));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

Value GetAttr(const Value& obj, absl::string_view name) {
  if (obj.IsDict()) {
    const Value* v = obj.dict->Find(name);
    if (v != nullptr) return *v;
  }
  return Value::Undefined(std::string(name));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.IsDict()) {
    if (!key.IsString()) return Value::Undefined(ToStr(key));
    const Value* v = obj.dict->Find(key.s);
    return v != nullptr ? *v : Value::Undefined(key.s);
  }
  if ((obj.IsList() || obj.IsString()) && key.IsIntLike()) {
    int64_t i = key.AsInt();
    if (obj.IsList()) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined(ToStr(key));
      return (*obj.list)[static_cast<size_t>(i)];
    }
    std::vector<uint32_t> cps = DecodeUtf8(obj.s);
    int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined(ToStr(key));
    return Value::Str(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
  }
  if (key.IsString()) return GetAttr(obj, key.s);
  return Value::Undefined(ToStr(key));
}

absl::StatusOr<Value> CallMethod(Evaluator& ev, const Value& obj, absl::string_view name,
                                 CallArgs& args, bool* found) {
  *found = true;
  if (obj.IsString()) {
    const std::string& s = obj.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return Value::Str(Strip(s, args.Get(0, "chars"), name != "rstrip", name != "lstrip"));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* p = args.Get(0, "prefix");
      if (p == nullptr) return ArgError(name, "an argument is required");
      List options = p->IsList() ? *p->list : List{*p};
      for (const Value& o : options) {
        if (!o.IsString()) return ArgError(name, "arguments must be str or a tuple of str");
        bool hit = name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                        : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(),
                                                                              o.s.size(), o.s) == 0;
        if (hit) return Value::Bool(true);
      }
      return Value::Bool(false);
    }
    if (name == "split" || name == "rsplit") {
      const Value* sep = args.Get(0, "sep");
      if (sep != nullptr && !sep->IsNone() && (!sep->IsString() || sep->s.empty())) {
        return ArgError(name, "empty separator");
      }
      int64_t maxsplit = IntArg(args, 1, "maxsplit", -1);
      if (name == "rsplit" && maxsplit >= 0) {
        return absl::InvalidArgumentError("unsupported feature 'rsplit with maxsplit'");
      }
      return Value::MakeList(Split(s, sep, maxsplit));
    }
    if (name == "splitlines") {
      List out;
      for (std::string& l : Lines(s)) out.push_back(Value::Str(std::move(l)));
      return Value::MakeList(std::move(out));
    }
    if (name == "upper") return Value::Str(Upper(s));
    if (name == "lower") return Value::Str(Lower(s));
    if (name == "title") return Value::Str(PyTitle(s));
    if (name == "capitalize") return Value::Str(Capitalize(s));
    if (name == "replace") {
      if (args.args.size() < 2) return ArgError("replace", "old and new are required");
      std::string r =
          Replace(s, Str(args.args[0]), Str(args.args[1]), IntArg(args, 2, "count", -1));
      KILN_RETURN_IF_ERROR(ev.CheckSize(r.size()));
      return Value::Str(std::move(r));
    }
    if (name == "find" || name == "rfind" || name == "count" || name == "index") {
      const Value* sub = args.Get(0, "sub");
      if (sub == nullptr || !sub->IsString()) return ArgError(name, "a string is required");
      if (name == "count") {
        if (sub->s.empty()) return Value::Int(static_cast<int64_t>(DecodeUtf8(s).size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub->s); p != std::string::npos;
             p = s.find(sub->s, p + sub->s.size()))
          ++n;
        return Value::Int(n);
      }
      size_t at = name == "rfind" ? s.rfind(sub->s) : s.find(sub->s);
      if (at == std::string::npos) {
        if (name == "index") return absl::InvalidArgumentError("substring not found");
        return Value::Int(-1);
      }
      return Value::Int(static_cast<int64_t>(DecodeUtf8(s.substr(0, at)).size()));
    }
    if (name == "join") {
      const Value* it = args.Get(0, "iterable");
      if (it == nullptr) return ArgError("join", "an iterable is required");
      KILN_ASSIGN_OR_RETURN(List items, Iterate(*it));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].IsString()) return ArgError("join", "sequence item is not a str");
        if (i > 0) out += s;
        out += items[i].s;
        KILN_RETURN_IF_ERROR(ev.CheckSize(out.size()));
      }
      return Value::Str(std::move(out));
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
      if (s.empty()) return Value::Bool(false);
      for (unsigned char c : s) {
        bool ok = name == "isdigit"   ? std::isdigit(c) != 0
                  : name == "isalpha" ? std::isalpha(c) != 0
                  : name == "isspace" ? std::isspace(c) != 0
                                      : std::isalnum(c) != 0;
        if (!ok) return Value::Bool(false);
      }
      return Value::Bool(true);
    }
  } else if (obj.IsDict() && !obj.is_namespace) {
    if (name == "get") {
      const Value* key = args.Get(0, "key");
      if (key == nullptr) return ArgError("get", "a key is required");
      const Value* def = args.Get(1, "default");
      const Value* v = key->IsString() ? obj.dict->Find(key->s) : nullptr;
      if (v != nullptr) return *v;
      return def != nullptr ? *def : Value::None();
    }
    if (name == "items" || name == "keys" || name == "values") {
      List out;
      for (const auto& [k, x] : obj.dict->items) {
        out.push_back(name == "items"  ? Value::MakeList({Value::Str(k), x}, true)
                      : name == "keys" ? Value::Str(k)
                                       : x);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" ||
        name == "popitem") {
      return absl::InvalidArgumentError(
          absl::StrCat("access to attribute '", name, "' of 'dict' object is unsafe"));
    }
  } else if (obj.IsList()) {
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
        name == "remove" || name == "clear" || name == "sort" || name == "reverse") {
      return absl::InvalidArgumentError(
          absl::StrCat("access to attribute '", name, "' of 'list' object is unsafe"));
    }
    if (name == "index" || name == "count") {
      const Value* x = args.Get(0, "value");
      if (x == nullptr) return ArgError(name, "an argument is required");
      int64_t n = 0;
      for (size_t i = 0; i < obj.list->size(); ++i) {
        if (!Equals((*obj.list)[i], *x)) continue;
        if (name == "index") return Value::Int(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") return absl::InvalidArgumentError("value is not in list");
      return Value::Int(n);
    }
  }
  *found = false;
  return Value::None();
}

void AddGlobals(absl::flat_hash_map<std::string, Value>& vars) {
  vars["range"] =
      Value::Function("range", [](Evaluator& ev, CallArgs& args) -> absl::StatusOr<Value> {
        if (args.args.empty() || args.args.size() > 3) return ArgError("range", "1 to 3 arguments");
        for (const Value& a : args.args) {
          if (!a.IsIntLike()) return ArgError("range", "integer arguments are required");
        }
        int64_t start = 0, stop, step = 1;
        if (args.args.size() == 1) {
          stop = args.args[0].AsInt();
        } else {
          start = args.args[0].AsInt();
          stop = args.args[1].AsInt();
          if (args.args.size() == 3) step = args.args[2].AsInt();
        }
        if (step == 0) return ArgError("range", "step must not be zero");
        double count =
            std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                    static_cast<double>(step)));
        if (count > static_cast<double>(ev.max_loop_iterations())) {
          return absl::ResourceExhaustedError(
              absl::StrCat("range of ", static_cast<int64_t>(count), " items exceeds the limit of ",
                           ev.max_loop_iterations(), " loop iterations"));
        }
        List items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
          items.push_back(Value::Int(i));
        return Value::MakeList(std::move(items));
      });
  auto make_dict = [](bool ns) {
    return [ns](Evaluator& ev, CallArgs& args) -> absl::StatusOr<Value> {
      Value d = Value::MakeDict();
      d.is_namespace = ns;
      if (ns) ev.TrackNamespace(d.dict);
      for (const Value& a : args.args) {
        if (!a.IsDict()) return ArgError(ns ? "namespace" : "dict", "a mapping is required");
        for (const auto& [k, v] : a.dict->items) d.dict->Set(k, v);
      }
      for (const auto& [k, v] : args.kwargs) d.dict->Set(k, v);
      return d;
    };
  };
  vars["dict"] = Value::Function("dict", make_dict(false));
  vars["namespace"] = Value::Function("namespace", make_dict(true));
  vars["raise_exception"] =
      Value::Function("raise_exception", [](Evaluator&, CallArgs& args) -> absl::StatusOr<Value> {
        const Value* msg = args.Get(0, "message");
        return absl::FailedPreconditionError(msg != nullptr ? Str(*msg) : "");
      });
  vars["strftime_now"] =
      Value::Function("strftime_now", [](Evaluator&, CallArgs& args) -> absl::StatusOr<Value> {
        const Value* fmt = args.Get(0, "format");
        if (fmt == nullptr || !fmt->IsString()) return ArgError("strftime_now", "a format string");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[512];
        size_t n = std::strftime(buf, sizeof(buf), fmt->s.c_str(), &tm);
        return Value::Str(std::string(buf, n));
      });
}

}  // namespace kiln::jinja
