#include "template/evaluator.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln::jinja {
namespace {

absl::Status TypeError(absl::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

absl::Status UndefinedError(const Value& v) {
  if (v.s.empty()) return absl::InvalidArgumentError("undefined value used");
  return absl::InvalidArgumentError(absl::StrCat("'", v.s, "' is undefined"));
}

absl::StatusOr<Value> Contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::kString:
      if (!item.IsString()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left "
                         "operand, not ",
                         TypeName(item)));
      }
      return Value::Bool(container.s.find(item.s) != std::string::npos);
    case Value::Kind::kList:
      for (const Value& x : *container.list) {
        if (Equals(x, item)) return Value::Bool(true);
      }
      return Value::Bool(false);
    case Value::Kind::kDict:
      if (item.IsList() || item.IsDict()) {
        return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      }
      return Value::Bool(item.IsString() && container.dict->Find(item.s) != nullptr);
    case Value::Kind::kUndefined:
      return Value::Bool(false);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

absl::Status Evaluator::ChargeIterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "template exceeded the limit of ", limits_.max_loop_iterations, " loop iterations"));
  }
  return absl::OkStatus();
}

absl::Status Evaluator::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template output exceeded the limit of ", limits_.max_output_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Evaluator::Append(std::string& out, absl::string_view s) {
  emitted_ += s.size();
  KILN_RETURN_IF_ERROR(CheckSize(emitted_));
  out.append(s.data(), s.size());
  return absl::OkStatus();
}

const Value* Evaluator::Lookup(absl::string_view name) const {
  for (const Frame* f = frame_; f != nullptr; f = f->parent) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

absl::StatusOr<std::string> Evaluator::Render(const Body& root, const Value& context) {
  Frame globals;
  AddGlobals(globals.vars);
  Frame top;
  top.parent = &globals;
  if (context.IsDict()) {
    for (const auto& [k, v] : context.dict->items) top.vars[k] = v;
  }
  frame_ = root_ = &top;
  iterations_ = 0;
  emitted_ = 0;
  call_depth_ = 0;
  eval_depth_ = 0;
  std::string out;
  auto flow = Exec(root, out);
  frame_ = root_ = nullptr;
  for (const std::weak_ptr<Dict>& weak : namespaces_) {
    if (std::shared_ptr<Dict> ns = weak.lock()) ns->items.clear();
  }
  namespaces_.clear();
  next_namespace_sweep_ = 64;
  if (!flow.ok()) return flow.status();
  return out;
}

void Evaluator::TrackNamespace(const std::shared_ptr<Dict>& ns) {
  // Most namespaces die with their scope: forget those whenever the list has doubled since the
  // last sweep, so that a loop creating namespaces keeps memory flat at O(1) amortized cost.
  if (namespaces_.size() >= next_namespace_sweep_) {
    std::erase_if(namespaces_, [](const std::weak_ptr<Dict>& weak) { return weak.expired(); });
    next_namespace_sweep_ = std::max<size_t>(64, 2 * namespaces_.size());
  }
  namespaces_.push_back(ns);
}

absl::StatusOr<Evaluator::Flow> Evaluator::Exec(const Body& body, std::string& out) {
  for (const NodePtr& n : body) {
    KILN_ASSIGN_OR_RETURN(Flow f, ExecNode(*n, out));
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

absl::StatusOr<Evaluator::Flow> Evaluator::ExecNode(const Node& n, std::string& out) {
  if (eval_depth_ >= limits_.max_eval_depth) {
    return absl::ResourceExhaustedError(absl::StrCat("template evaluation nested deeper than ",
                                                     limits_.max_eval_depth, " at line ",
                                                     n.pos.line, ":", n.pos.column));
  }
  ++eval_depth_;
  struct Leave {
    int& depth;
    ~Leave() { --depth; }
  } leave{eval_depth_};
  switch (n.kind) {
    case Node::Kind::kText:
      KILN_RETURN_IF_ERROR(Append(out, n.text));
      return Flow::kNormal;
    case Node::Kind::kOutput: {
      KILN_ASSIGN_OR_RETURN(Value v, Eval(*n.exprs[0]));
      KILN_RETURN_IF_ERROR(Append(out, v.IsString() ? v.s : ToStr(v)));
      return Flow::kNormal;
    }
    case Node::Kind::kIf:
      for (size_t i = 0; i < n.bodies.size(); ++i) {
        if (i < n.exprs.size()) {
          KILN_ASSIGN_OR_RETURN(Value c, Eval(*n.exprs[i]));
          if (!Truthy(c)) continue;
        }
        return Exec(n.bodies[i], out);
      }
      return Flow::kNormal;
    case Node::Kind::kFor:
      return ExecFor(n, out);
    case Node::Kind::kSet: {
      KILN_ASSIGN_OR_RETURN(Value v, Eval(*n.exprs[0]));
      KILN_RETURN_IF_ERROR(ExecSet(n, std::move(v)));
      return Flow::kNormal;
    }
    case Node::Kind::kSetBlock: {
      std::string captured;
      KILN_ASSIGN_OR_RETURN(Flow f, Exec(n.bodies[0], captured));
      KILN_RETURN_IF_ERROR(ExecSet(n, Value::Str(std::move(captured))));
      return f;
    }
    case Node::Kind::kMacro: {
      const Node* macro = &n;
      frame_->vars[n.attr] = Value::Function(
          n.attr, [macro](Evaluator& ev, CallArgs& args) { return ev.CallMacro(*macro, args); });
      return Flow::kNormal;
    }
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
    case Node::Kind::kScope:
      return Exec(n.bodies[0], out);
  }
  return Flow::kNormal;
}

absl::Status Evaluator::Bind(Frame& frame, const std::vector<std::string>& targets,
                             const Value& v) {
  if (targets.size() == 1) {
    frame.vars[targets[0]] = v;
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.size() != targets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
  return absl::OkStatus();
}

absl::Status Evaluator::ExecSet(const Node& n, Value value) {
  if (!n.attr.empty()) {
    const Value* ns = Lookup(n.targets[0]);
    if (ns == nullptr || !ns->IsDict() || !ns->is_namespace) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot assign attribute on non-namespace object '", n.targets[0],
                       "' at line ", n.pos.line, ":", n.pos.column));
    }
    ns->dict->Set(n.attr, std::move(value));
    return absl::OkStatus();
  }
  return Bind(*frame_, n.targets, value);
}

absl::StatusOr<Evaluator::Flow> Evaluator::ExecFor(const Node& n, std::string& out) {
  KILN_ASSIGN_OR_RETURN(Value iterable, Eval(*n.exprs[0]));
  if (!iterable.IsList() && !iterable.IsDict() && !iterable.IsString() && !iterable.IsUndefined()) {
    return absl::InvalidArgumentError(absl::StrCat("'", TypeName(iterable),
                                                   "' object is not iterable at line ", n.pos.line,
                                                   ":", n.pos.column));
  }
  KILN_ASSIGN_OR_RETURN(List items, Iterate(iterable));
  Frame frame;
  frame.parent = frame_;
  frame_ = &frame;
  struct Restore {
    Frame*& slot;
    Frame* saved;
    ~Restore() { slot = saved; }
  } restore{frame_, frame.parent};
  if (n.exprs[1] != nullptr) {
    List kept;
    for (Value& item : items) {
      KILN_RETURN_IF_ERROR(ChargeIterations(1));
      KILN_RETURN_IF_ERROR(Bind(frame, n.targets, item));
      KILN_ASSIGN_OR_RETURN(Value c, Eval(*n.exprs[1]));
      if (Truthy(c)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return Exec(n.bodies[1], out);
  const int64_t len = static_cast<int64_t>(items.size());
  Value loop = Value::MakeDict();
  auto loop_index = std::make_shared<int64_t>(0);
  for (int64_t i = 0; i < len; ++i) {
    KILN_RETURN_IF_ERROR(ChargeIterations(1));
    // Each iteration starts from the enclosing scope: what the body set last time is gone.
    frame.vars.clear();
    const Value& item = items[static_cast<size_t>(i)];
    KILN_RETURN_IF_ERROR(Bind(frame, n.targets, item));
    // One loop object for the whole loop, advanced in place (as jinja2's LoopContext is).
    if (i == 0) {
      Dict& d = *loop.dict;
      for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                              "depth", "depth0", "previtem", "nextitem", "cycle"}) {
        d.items.emplace_back(key, Value());
      }
      d.items[6].second = Value::Int(len);
      d.items[7].second = Value::Int(1);
      d.items[8].second = Value::Int(0);
      d.items[11].second = Value::Function(
          "cycle", [index = loop_index](Evaluator&, CallArgs& args) -> absl::StatusOr<Value> {
            if (args.args.empty()) return absl::InvalidArgumentError("no items for cycling given");
            return args.args[static_cast<size_t>(*index) % args.args.size()];
          });
    }
    *loop_index = i;
    auto& slots = loop.dict->items;
    slots[0].second = Value::Int(i + 1);
    slots[1].second = Value::Int(i);
    slots[2].second = Value::Int(len - i);
    slots[3].second = Value::Int(len - i - 1);
    slots[4].second = Value::Bool(i == 0);
    slots[5].second = Value::Bool(i == len - 1);
    slots[9].second = i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("previtem");
    slots[10].second =
        i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::Undefined("nextitem");
    frame.vars["loop"] = loop;
    KILN_ASSIGN_OR_RETURN(Flow f, Exec(n.bodies[0], out));
    if (f == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

absl::StatusOr<Value> Evaluator::CallMacro(const Node& m, CallArgs& args) {
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "macro '", m.attr, "' exceeded the call depth limit of ", limits_.max_call_depth));
  }
  if (args.args.size() > m.targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("macro '", m.attr, "' takes not more than ",
                                                   m.targets.size(), " argument(s)"));
  }
  for (const auto& [k, v] : args.kwargs) {
    if (std::find(m.targets.begin(), m.targets.end(), k) == m.targets.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("macro '", m.attr, "' takes no keyword argument '", k, "'"));
    }
  }
  Frame frame;
  frame.parent = root_;
  Frame* saved = frame_;
  frame_ = &frame;
  ++call_depth_;
  struct Restore {
    Evaluator* ev;
    Frame* saved;
    ~Restore() {
      ev->frame_ = saved;
      --ev->call_depth_;
    }
  } restore{this, saved};
  for (size_t i = 0; i < m.targets.size(); ++i) {
    const Value* given = args.Get(i, m.targets[i]);
    if (given != nullptr) {
      frame.vars[m.targets[i]] = *given;
    } else if (m.exprs[i] != nullptr) {
      KILN_ASSIGN_OR_RETURN(frame.vars[m.targets[i]], Eval(*m.exprs[i]));
    } else {
      frame.vars[m.targets[i]] = Value::Undefined(m.targets[i]);
    }
  }
  std::string out;
  KILN_RETURN_IF_ERROR(Exec(m.bodies[0], out).status());
  return Value::Str(std::move(out));
}

absl::StatusOr<Value> Evaluator::Call(const Value& fn, CallArgs& args) {
  if (fn.IsUndefined()) return UndefinedError(fn);
  if (fn.kind != Value::Kind::kCallable) {
    return absl::InvalidArgumentError(absl::StrCat("'", TypeName(fn), "' object is not callable"));
  }
  return fn.fn->fn(*this, args);
}

absl::StatusOr<Value> Evaluator::Eval(const Expr& e) {
  if (++eval_depth_ > limits_.max_eval_depth) {
    --eval_depth_;
    return absl::ResourceExhaustedError(absl::StrCat("template evaluation nested deeper than ",
                                                     limits_.max_eval_depth, " at line ",
                                                     e.pos.line, ":", e.pos.column));
  }
  auto v = EvalInner(e);
  --eval_depth_;
  if (!v.ok() && v.status().code() == absl::StatusCode::kInvalidArgument &&
      v.status().message().find(" at line ") == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(v.status().message(), " at line ", e.pos.line, ":", e.pos.column));
  }
  return v;
}

absl::StatusOr<CallArgs> Evaluator::EvalArgs(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
    args.args.push_back(std::move(v));
  }
  for (const auto& [k, x] : e.kwargs) {
    KILN_ASSIGN_OR_RETURN(Value v, Eval(*x));
    args.kwargs.emplace_back(k, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Evaluator::EvalCall(const Expr& e) {
  const Expr& callee = *e.args[0];
  KILN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
  if (callee.kind == Expr::Kind::kAttr) {
    KILN_ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0]));
    if (obj.IsUndefined()) return UndefinedError(obj);
    bool found = false;
    KILN_ASSIGN_OR_RETURN(Value r, CallMethod(*this, obj, callee.name, args, &found));
    if (found) return r;
    Value fn = GetAttr(obj, callee.name);
    if (fn.IsUndefined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", TypeName(obj), "' object has no method '", callee.name, "'"));
    }
    return Call(fn, args);
  }
  KILN_ASSIGN_OR_RETURN(Value fn, Eval(callee));
  return Call(fn, args);
}

namespace {

absl::StatusOr<Value> Arith(const std::string& op, const Value& a, const Value& b,
                            const Evaluator& ev) {
  if (a.IsUndefined()) return UndefinedError(a);
  if (b.IsUndefined()) return UndefinedError(b);
  if (a.IsNumber() && b.IsNumber()) {
    if (a.IsIntLike() && b.IsIntLike() && op != "/") {
      int64_t x = a.AsInt(), y = b.AsInt(), r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else if (op == "//" || op == "%") {
        if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
        int64_t q = FloorDiv(x, y);
        r = op == "//" ? q : x - q * y;
      } else if (op == "**") {
        if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        r = 1;
        for (int64_t k = 0; k < y && !overflow; ++k) {
          overflow = __builtin_mul_overflow(r, x, &r);
          if (r == 0 || r == 1) break;
        }
        if (x == -1) r = (y % 2 == 0) ? 1 : -1;
      }
      if (overflow) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(r);
    }
    double x = a.AsFloat(), y = b.AsFloat();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") return Value::Float(std::pow(x, y));
    if (y == 0) return absl::InvalidArgumentError("division by zero");
    if (op == "/") return Value::Float(x / y);
    if (op == "//") {
      // CPython's float floor division, which rounds the quotient of (x - fmod(x, y)) / y.
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
      double floor_div = std::floor(div);
      if (div - floor_div > 0.5) floor_div += 1.0;
      return Value::Float(div == 0 ? std::copysign(0.0, x / y) : floor_div);
    }
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
  }
  if (op == "+" && a.IsString() && b.IsString()) {
    KILN_RETURN_IF_ERROR(ev.CheckSize(a.s.size() + b.s.size()));
    return Value::Str(a.s + b.s);
  }
  if (op == "+" && a.IsList() && b.IsList() && a.is_tuple == b.is_tuple) {
    List items = *a.list;
    items.insert(items.end(), b.list->begin(), b.list->end());
    return Value::MakeList(std::move(items), a.is_tuple);
  }
  if (op == "*" && (a.IsString() || a.IsList()) && b.IsIntLike()) {
    int64_t count = std::max<int64_t>(0, b.AsInt());
    if (a.IsString()) {
      if (!a.s.empty() && count > 0) {
        KILN_RETURN_IF_ERROR(
            ev.CheckSize(static_cast<uint64_t>(count) > ev.max_loop_iterations() * 1000ull
                             ? SIZE_MAX
                             : a.s.size() * static_cast<size_t>(count)));
      }
      std::string s;
      if (!a.s.empty()) s.reserve(a.s.size() * static_cast<size_t>(count));
      for (int64_t k = 0; k < count && !a.s.empty(); ++k) s += a.s;
      return Value::Str(std::move(s));
    }
    if (!a.list->empty() && count > 0 &&
        static_cast<double>(a.list->size()) * static_cast<double>(count) >
            static_cast<double>(ev.max_loop_iterations())) {
      return absl::ResourceExhaustedError("list repetition exceeds the loop iteration limit");
    }
    List items;
    // An empty list repeated any number of times is empty at once (as in Python): the count is
    // not bounded by the iteration limit above, which only a non-empty list can reach.
    for (int64_t k = 0; k < count && !a.list->empty(); ++k) {
      items.insert(items.end(), a.list->begin(), a.list->end());
    }
    return Value::MakeList(std::move(items), a.is_tuple);
  }
  if (op == "*" && a.IsIntLike() && (b.IsString() || b.IsList())) return Arith(op, b, a, ev);
  return TypeError(op, a, b);
}

absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "in" || op == "notin") {
    KILN_ASSIGN_OR_RETURN(Value r, Contains(b, a));
    return r.b == (op == "in");
  }
  if (a.IsUndefined()) return UndefinedError(a);
  if (b.IsUndefined()) return UndefinedError(b);
  if (op == "<") return Less(a, b);
  if (op == ">") return Less(b, a);
  KILN_ASSIGN_OR_RETURN(bool lt, Less(op == "<=" ? b : a, op == "<=" ? a : b));
  return !lt;
}

}  // namespace

absl::StatusOr<Value> Evaluator::EvalInner(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName: {
      const Value* v = Lookup(e.name);
      if (v == nullptr) return Value::Undefined(e.name);
      return *v;
    }
    case Expr::Kind::kList: {
      List items;
      for (const ExprPtr& x : e.args) {
        KILN_ASSIGN_OR_RETURN(Value v, Eval(*x));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items), e.is_tuple);
    }
    case Expr::Kind::kDict: {
      Value d = Value::MakeDict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        KILN_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
        KILN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
        d.dict->Set(k.IsString() ? k.s : ToStr(k), std::move(v));
      }
      return d;
    }
    case Expr::Kind::kAttr: {
      KILN_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      if (obj.IsUndefined()) return UndefinedError(obj);
      Value r = GetAttr(obj, e.name);
      if (r.IsUndefined()) r.s = e.name;
      return r;
    }
    case Expr::Kind::kSubscript: {
      KILN_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      KILN_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      if (obj.IsUndefined()) return UndefinedError(obj);
      return GetItem(obj, key);
    }
    case Expr::Kind::kSlice: {
      KILN_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      if (obj.IsUndefined()) return UndefinedError(obj);
      int64_t parts[3] = {0, 0, 1};
      bool given[3] = {false, false, false};
      for (int k = 0; k < 3; ++k) {
        if (e.args[static_cast<size_t>(k) + 1] == nullptr) continue;
        KILN_ASSIGN_OR_RETURN(Value p, Eval(*e.args[static_cast<size_t>(k) + 1]));
        if (p.IsNone()) continue;
        if (!p.IsIntLike()) return absl::InvalidArgumentError("slice indices must be integers");
        parts[k] = p.AsInt();
        given[k] = true;
      }
      int64_t step = parts[2];
      if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
      std::vector<uint32_t> cps;
      int64_t len = 0;
      if (obj.IsString()) {
        cps = DecodeUtf8(obj.s);
        len = static_cast<int64_t>(cps.size());
      } else if (obj.IsList()) {
        len = static_cast<int64_t>(obj.list->size());
      } else {
        // jinja2 compiles a slice to a plain Python subscript: a TypeError here.
        return absl::InvalidArgumentError(
            absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
      }
      auto clamp = [&](int64_t x, bool is_given, int64_t def) {
        if (!is_given) return def;
        if (x < 0) x += len;
        if (step > 0) return std::clamp<int64_t>(x, 0, len);
        return std::clamp<int64_t>(x, -1, len - 1);
      };
      int64_t start = clamp(parts[0], given[0], step > 0 ? 0 : len - 1);
      int64_t stop = clamp(parts[1], given[1], step > 0 ? len : -1);
      std::vector<size_t> idx;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        idx.push_back(static_cast<size_t>(i));
      }
      if (obj.IsString()) {
        std::string s;
        for (size_t i : idx) AppendUtf8(cps[i], s);
        return Value::Str(std::move(s));
      }
      List items;
      for (size_t i : idx) items.push_back((*obj.list)[i]);
      return Value::MakeList(std::move(items), obj.is_tuple);
    }
    case Expr::Kind::kCall:
      return EvalCall(e);
    case Expr::Kind::kFilter: {
      KILN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      KILN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      return ApplyFilter(*this, e.name, v, args);
    }
    case Expr::Kind::kTest: {
      KILN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      KILN_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
      KILN_ASSIGN_OR_RETURN(bool r, ApplyTest(*this, e.name, v, args));
      return Value::Bool(r != e.negated);
    }
    case Expr::Kind::kUnary: {
      KILN_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (e.name == "not") return Value::Bool(!Truthy(v));
      if (v.IsUndefined()) return UndefinedError(v);
      if (v.IsIntLike()) return Value::Int(e.name == "-" ? -v.AsInt() : v.AsInt());
      if (v.kind == Value::Kind::kFloat) return Value::Float(e.name == "-" ? -v.f : v.f);
      return absl::InvalidArgumentError(
          absl::StrCat("bad operand type for unary ", e.name, ": '", TypeName(v), "'"));
    }
    case Expr::Kind::kBinary: {
      KILN_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      KILN_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
      return Arith(e.name, a, b, *this);
    }
    case Expr::Kind::kAnd: {
      KILN_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (!Truthy(a)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kOr: {
      KILN_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (Truthy(a)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kCompare: {
      // a < b < c is (a < b) and (b < c), each operand evaluated once.
      KILN_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      size_t op_begin = 0;
      for (size_t k = 1; k < e.args.size(); ++k) {
        size_t op_end = e.name.find(' ', op_begin);
        std::string op = e.name.substr(op_begin, op_end - op_begin);
        op_begin = op_end + 1;
        KILN_ASSIGN_OR_RETURN(Value b, Eval(*e.args[k]));
        KILN_ASSIGN_OR_RETURN(bool r, Compare(op, a, b));
        if (!r) return Value::Bool(false);
        a = std::move(b);
      }
      return Value::Bool(true);
    }
    case Expr::Kind::kConcat: {
      std::string s;
      for (const ExprPtr& x : e.args) {
        KILN_ASSIGN_OR_RETURN(Value v, Eval(*x));
        s += v.IsString() ? v.s : ToStr(v);
        KILN_RETURN_IF_ERROR(CheckSize(s.size()));
      }
      return Value::Str(std::move(s));
    }
    case Expr::Kind::kCond: {
      KILN_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
      if (Truthy(c)) return Eval(*e.args[1]);
      if (e.args[2] == nullptr) return Value::Undefined();
      return Eval(*e.args[2]);
    }
  }
  return absl::InternalError("unknown expression");
}

}  // namespace kiln::jinja
