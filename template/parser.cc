#include "template/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "template/lexer.h"

namespace kiln::jinja {
namespace {

using T = Token::Type;

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_nesting)
      : toks_(std::move(tokens)), max_nesting_(max_nesting) {}

  absl::StatusOr<Body> Run() {
    std::string end;
    KILN_ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Cur() const { return toks_[i_]; }
  const Token& Peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  void Next() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool IsOp(absl::string_view op) const { return Cur().type == T::kOp && Cur().text == op; }
  bool IsName(absl::string_view name) const { return Cur().type == T::kName && Cur().text == name; }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kEof:
        return "end of template";
      case T::kBlockEnd:
        return "end of statement block";
      case T::kVarEnd:
        return "end of print statement";
      case T::kString:
        return "string";
      case T::kText:
        return "template data";
      default:
        return "'" + t.text + "'";
    }
  }

  absl::Status ErrorAt(const Pos& p, absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat(msg, " at line ", p.line, ":", p.column));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return ErrorAt(Cur().pos, absl::StrCat("expected ", expected, ", got ", Describe(Cur())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) return Unexpected("end of statement block");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != T::kName) return Unexpected("a name");
    std::string n = Cur().text;
    Next();
    return n;
  }

  // Counts the nesting a loop of binary operators or postfixes adds to the tree.
  struct Chain {
    Parser* parser;
    int n = 0;
    ~Chain() { parser->depth_ -= n; }
    absl::Status Add(const Pos& p) {
      ++n;
      return parser->Enter(p);
    }
  };

  absl::Status Enter(const Pos& p) {
    if (++depth_ > max_nesting_) {
      return ErrorAt(p, absl::StrCat("template nesting deeper than ", max_nesting_));
    }
    return absl::OkStatus();
  }

  // Parses nodes until a block whose tag is in `ends` (cursor left after that tag's name,
  // stored in *end) or the end of the template (only when `ends` is empty).
  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> ends, std::string* end) {
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == T::kEof) {
        if (ends.size() == 0) return body;
        std::string names;
        for (auto e : ends) absl::StrAppend(&names, names.empty() ? "" : " or ", "'", e, "'");
        return ErrorAt(t.pos, absl::StrCat("unexpected end of template, expected ", names));
      }
      if (t.type == T::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->pos = t.pos;
        n->text = t.text;
        body.push_back(std::move(n));
        Next();
        continue;
      }
      if (t.type == T::kVarBegin) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->pos = t.pos;
        Next();
        KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseTupleOrExpr());
        n->exprs.push_back(std::move(e));
        if (Cur().type != T::kVarEnd) return Unexpected("end of print statement");
        Next();
        body.push_back(std::move(n));
        continue;
      }
      if (t.type != T::kBlockBegin) return Unexpected("template data or a tag");
      Next();
      if (Cur().type != T::kName) return Unexpected("a tag name");
      for (auto e : ends) {
        if (Cur().text == e) {
          *end = Cur().text;
          Next();
          return body;
        }
      }
      KILN_ASSIGN_OR_RETURN(NodePtr n, ParseStatement());
      body.push_back(std::move(n));
    }
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    const Token tag = Cur();
    KILN_RETURN_IF_ERROR(Enter(tag.pos));
    auto n = std::make_unique<Node>();
    n->pos = tag.pos;
    Next();
    const std::string& name = tag.text;
    std::string end;
    if (name == "if") {
      n->kind = Node::Kind::kIf;
      while (true) {
        KILN_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression());
        n->exprs.push_back(std::move(cond));
        KILN_RETURN_IF_ERROR(ExpectBlockEnd());
        KILN_ASSIGN_OR_RETURN(Body b, ParseBody({"elif", "else", "endif"}, &end));
        n->bodies.push_back(std::move(b));
        if (end == "elif") continue;
        if (end == "else") {
          KILN_RETURN_IF_ERROR(ExpectBlockEnd());
          KILN_ASSIGN_OR_RETURN(Body eb, ParseBody({"endif"}, &end));
          n->bodies.push_back(std::move(eb));
        }
        break;
      }
    } else if (name == "for") {
      n->kind = Node::Kind::kFor;
      do {
        KILN_ASSIGN_OR_RETURN(std::string target, ExpectName());
        n->targets.push_back(std::move(target));
      } while (SkipOp(","));
      if (!SkipName("in")) return Unexpected("'in'");
      KILN_ASSIGN_OR_RETURN(ExprPtr iter, ParseOr());
      n->exprs.push_back(std::move(iter));
      ExprPtr cond;
      if (SkipName("if")) {
        KILN_ASSIGN_OR_RETURN(cond, ParseExpression());
      }
      n->exprs.push_back(std::move(cond));
      if (IsName("recursive")) return ErrorAt(Cur().pos, "unsupported feature 'recursive' loops");
      KILN_RETURN_IF_ERROR(ExpectBlockEnd());
      ++loops_;
      KILN_ASSIGN_OR_RETURN(Body b, ParseBody({"else", "endfor"}, &end));
      --loops_;
      n->bodies.push_back(std::move(b));
      n->bodies.emplace_back();
      if (end == "else") {
        KILN_RETURN_IF_ERROR(ExpectBlockEnd());
        KILN_ASSIGN_OR_RETURN(n->bodies[1], ParseBody({"endfor"}, &end));
      }
    } else if (name == "set") {
      do {
        KILN_ASSIGN_OR_RETURN(std::string target, ExpectName());
        n->targets.push_back(std::move(target));
        if (n->targets.size() == 1 && SkipOp(".")) {
          KILN_ASSIGN_OR_RETURN(n->attr, ExpectName());
          break;
        }
      } while (SkipOp(","));
      if (SkipOp("=")) {
        n->kind = Node::Kind::kSet;
        KILN_ASSIGN_OR_RETURN(ExprPtr value, ParseTupleOrExpr());
        n->exprs.push_back(std::move(value));
        KILN_RETURN_IF_ERROR(ExpectBlockEnd());
      } else {
        if (n->targets.size() != 1 || !n->attr.empty()) return Unexpected("'='");
        if (IsOp("|")) return ErrorAt(Cur().pos, "unsupported feature 'filtered block set'");
        n->kind = Node::Kind::kSetBlock;
        KILN_RETURN_IF_ERROR(ExpectBlockEnd());
        KILN_ASSIGN_OR_RETURN(Body b, ParseBody({"endset"}, &end));
        n->bodies.push_back(std::move(b));
      }
      if (n->kind == Node::Kind::kSet) {
        --depth_;
        return n;
      }
    } else if (name == "macro") {
      n->kind = Node::Kind::kMacro;
      KILN_ASSIGN_OR_RETURN(n->attr, ExpectName());
      KILN_RETURN_IF_ERROR(ExpectOp("("));
      while (!IsOp(")")) {
        if (!n->targets.empty()) KILN_RETURN_IF_ERROR(ExpectOp(","));
        KILN_ASSIGN_OR_RETURN(std::string param, ExpectName());
        n->targets.push_back(std::move(param));
        ExprPtr def;
        if (SkipOp("=")) {
          KILN_ASSIGN_OR_RETURN(def, ParseExpression());
        }
        n->exprs.push_back(std::move(def));
      }
      Next();
      KILN_RETURN_IF_ERROR(ExpectBlockEnd());
      int saved_loops = loops_;
      loops_ = 0;
      KILN_ASSIGN_OR_RETURN(Body b, ParseBody({"endmacro"}, &end));
      loops_ = saved_loops;
      n->bodies.push_back(std::move(b));
      if (Cur().type == T::kName) Next();  // {% endmacro name %}
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) return ErrorAt(tag.pos, absl::StrCat("'", name, "' outside of a loop"));
      n->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      KILN_RETURN_IF_ERROR(ExpectBlockEnd());
      --depth_;
      return n;
    } else if (name == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      n->kind = Node::Kind::kScope;
      KILN_RETURN_IF_ERROR(ExpectBlockEnd());
      KILN_ASSIGN_OR_RETURN(Body b, ParseBody({"endgeneration"}, &end));
      n->bodies.push_back(std::move(b));
    } else {
      return ErrorAt(tag.pos, absl::StrCat("unsupported tag '", name, "'"));
    }
    KILN_RETURN_IF_ERROR(ExpectBlockEnd());
    --depth_;
    return n;
  }

  ExprPtr MakeExpr(Expr::Kind kind, const Pos& pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // An expression, or a tuple written without parentheses (`a, b`).
  absl::StatusOr<ExprPtr> ParseTupleOrExpr() {
    Pos p = Cur().pos;
    KILN_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
    if (!IsOp(",")) return first;
    ExprPtr t = MakeExpr(Expr::Kind::kList, p);
    t->is_tuple = true;
    t->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().type == T::kVarEnd || Cur().type == T::kBlockEnd) break;
      KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
      t->args.push_back(std::move(e));
    }
    return t;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    KILN_RETURN_IF_ERROR(Enter(Cur().pos));
    KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (IsName("if")) {
      Pos p = Cur().pos;
      Next();
      ExprPtr c = MakeExpr(Expr::Kind::kCond, p);
      KILN_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      ExprPtr other;
      if (SkipName("else")) {
        KILN_ASSIGN_OR_RETURN(other, ParseExpression());
      }
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    --depth_;
    return e;
  }

  ExprPtr Binary(Expr::Kind kind, std::string op, const Pos& p, ExprPtr a, ExprPtr b) {
    ExprPtr e = MakeExpr(kind, p);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // `operand (op operand)*`, left-associative, for the operators `ops`: keywords (`or`, `and`)
  // or symbols (`+`, `*`, ...). Each level of the precedence ladder is one of these.
  absl::StatusOr<ExprPtr> ParseLeftChain(std::initializer_list<absl::string_view> ops,
                                         bool keywords, Expr::Kind kind,
                                         absl::StatusOr<ExprPtr> (Parser::*operand)()) {
    auto at_op = [&] {
      for (absl::string_view op : ops) {
        if (keywords ? IsName(op) : IsOp(op)) return true;
      }
      return false;
    };
    Chain chain{this};
    KILN_ASSIGN_OR_RETURN(ExprPtr e, (this->*operand)());
    while (at_op()) {
      Pos p = Cur().pos;
      KILN_RETURN_IF_ERROR(chain.Add(p));
      std::string op = Cur().text;
      Next();
      KILN_ASSIGN_OR_RETURN(ExprPtr r, (this->*operand)());
      e = Binary(kind, op, p, std::move(e), std::move(r));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    return ParseLeftChain({"or"}, /*keywords=*/true, Expr::Kind::kOr, &Parser::ParseAnd);
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    return ParseLeftChain({"and"}, /*keywords=*/true, Expr::Kind::kAnd, &Parser::ParseNot);
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      Pos p = Cur().pos;
      Next();
      KILN_RETURN_IF_ERROR(Enter(p));
      ExprPtr e = MakeExpr(Expr::Kind::kUnary, p);
      e->name = "not";
      KILN_ASSIGN_OR_RETURN(ExprPtr x, ParseNot());
      e->args.push_back(std::move(x));
      --depth_;
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    Chain chain{this};
    KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    const Expr* chain_start = nullptr;
    while (true) {
      Pos p = Cur().pos;
      KILN_RETURN_IF_ERROR(chain.Add(p));
      std::string op;
      if (Cur().type == T::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                   Cur().text == "<=" || Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == T::kName && Peek().text == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        return e;
      }
      KILN_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      if (e->kind != Expr::Kind::kCompare || chain_start != e.get()) {
        e = Binary(Expr::Kind::kCompare, op, p, std::move(e), std::move(r));
        chain_start = e.get();
      } else {
        e->name += " " + op;
        e->args.push_back(std::move(r));
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseLeftChain({"+", "-"}, false, Expr::Kind::kBinary, &Parser::ParseConcat);
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseMath2());
    if (!IsOp("~")) return e;
    ExprPtr c = MakeExpr(Expr::Kind::kConcat, Cur().pos);
    c->args.push_back(std::move(e));
    while (SkipOp("~")) {
      KILN_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
      c->args.push_back(std::move(r));
    }
    return c;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseLeftChain({"*", "/", "//", "%"}, false, Expr::Kind::kBinary, &Parser::ParsePow);
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseLeftChain({"**"}, false, Expr::Kind::kBinary, &Parser::ParseUnaryWithFilter);
  }

  absl::StatusOr<ExprPtr> ParseUnaryWithFilter() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Pos p = Cur().pos;
    KILN_RETURN_IF_ERROR(Enter(p));
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = MakeExpr(Expr::Kind::kUnary, p);
      e->name = Cur().text;
      Next();
      KILN_ASSIGN_OR_RETURN(ExprPtr x, ParseUnary(false));
      e->args.push_back(std::move(x));
    } else {
      KILN_ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    KILN_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    if (with_filter) {
      KILN_ASSIGN_OR_RETURN(e, ParseFilterExpr(std::move(e)));
    }
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    Pos p = t.pos;
    if (t.type == T::kName) {
      ExprPtr e = MakeExpr(Expr::Kind::kLiteral, p);
      if (t.text == "true" || t.text == "True") {
        e->literal = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      Next();
      return e;
    }
    if (t.type == T::kString) {
      std::string s;
      while (Cur().type == T::kString) {
        s += Cur().text;
        Next();
      }
      ExprPtr e = MakeExpr(Expr::Kind::kLiteral, p);
      e->literal = Value::Str(std::move(s));
      return e;
    }
    if (t.type == T::kInt || t.type == T::kFloat) {
      ExprPtr e = MakeExpr(Expr::Kind::kLiteral, p);
      if (t.type == T::kInt) {
        int64_t v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) return ErrorAt(p, "integer literal out of range");
        e->literal = Value::Int(v);
      } else {
        e->literal = Value::Float(std::strtod(t.text.c_str(), nullptr));
      }
      Next();
      return e;
    }
    if (SkipOp("(")) {
      ExprPtr tuple = MakeExpr(Expr::Kind::kList, p);
      tuple->is_tuple = true;
      if (SkipOp(")")) return tuple;
      KILN_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
      if (SkipOp(")")) return first;
      tuple->args.push_back(std::move(first));
      while (SkipOp(",")) {
        if (IsOp(")")) break;
        KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
        tuple->args.push_back(std::move(e));
      }
      KILN_RETURN_IF_ERROR(ExpectOp(")"));
      return tuple;
    }
    if (SkipOp("[")) {
      ExprPtr list = MakeExpr(Expr::Kind::kList, p);
      while (!IsOp("]")) {
        if (!list->args.empty()) KILN_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("]")) break;
        KILN_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
        list->args.push_back(std::move(e));
      }
      Next();
      return list;
    }
    if (SkipOp("{")) {
      ExprPtr dict = MakeExpr(Expr::Kind::kDict, p);
      while (!IsOp("}")) {
        if (!dict->args.empty()) KILN_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp("}")) break;
        KILN_ASSIGN_OR_RETURN(ExprPtr k, ParseExpression());
        KILN_RETURN_IF_ERROR(ExpectOp(":"));
        KILN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        dict->args.push_back(std::move(k));
        dict->args.push_back(std::move(v));
      }
      Next();
      return dict;
    }
    return Unexpected("an expression");
  }

  absl::Status ParseCallArgs(Expr& e) {
    // Cursor is after "(".
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) KILN_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (SkipOp(")")) break;
      if (IsOp("*") || IsOp("**")) return ErrorAt(Cur().pos, "unsupported feature '*args'");
      if (Cur().type == T::kName && Peek().type == T::kOp && Peek().text == "=") {
        std::string name = Cur().text;
        Next();
        Next();
        KILN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        e.kwargs.emplace_back(std::move(name), std::move(v));
      } else {
        if (!e.kwargs.empty()) return ErrorAt(Cur().pos, "positional argument after keyword");
        KILN_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        e.args.push_back(std::move(v));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    Chain chain{this};
    while (true) {
      Pos p = Cur().pos;
      KILN_RETURN_IF_ERROR(chain.Add(p));
      if (SkipOp(".")) {
        if (Cur().type == T::kInt) {
          ExprPtr idx = MakeExpr(Expr::Kind::kLiteral, Cur().pos);
          idx->literal = Value::Int(std::atoll(Cur().text.c_str()));
          Next();
          e = Binary(Expr::Kind::kSubscript, "", p, std::move(e), std::move(idx));
          continue;
        }
        KILN_ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr a = MakeExpr(Expr::Kind::kAttr, p);
        a->name = std::move(name);
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (SkipOp("[")) {
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            KILN_ASSIGN_OR_RETURN(parts[k], ParseExpression());
          }
          if (k < 2 && SkipOp(":")) {
            slice = true;
            continue;
          }
          break;
        }
        KILN_RETURN_IF_ERROR(ExpectOp("]"));
        ExprPtr s = MakeExpr(slice ? Expr::Kind::kSlice : Expr::Kind::kSubscript, p);
        s->args.push_back(std::move(e));
        if (!slice && parts[0] == nullptr) return ErrorAt(p, "empty subscript");
        for (auto& part : parts) {
          if (slice || part) s->args.push_back(std::move(part));
        }
        e = std::move(s);
      } else if (SkipOp("(")) {
        ExprPtr c = MakeExpr(Expr::Kind::kCall, p);
        c->args.push_back(std::move(e));
        KILN_RETURN_IF_ERROR(ParseCallArgs(*c));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr e) {
    Chain chain{this};
    while (true) {
      Pos p = Cur().pos;
      KILN_RETURN_IF_ERROR(chain.Add(p));
      if (SkipOp("|")) {
        Pos np = Cur().pos;
        KILN_ASSIGN_OR_RETURN(std::string name, ExpectName());
        if (!IsKnownFilter(name)) {
          return ErrorAt(np, absl::StrCat("unsupported filter '", name, "'"));
        }
        ExprPtr f = MakeExpr(Expr::Kind::kFilter, p);
        f->name = std::move(name);
        f->args.push_back(std::move(e));
        if (SkipOp("(")) KILN_RETURN_IF_ERROR(ParseCallArgs(*f));
        e = std::move(f);
      } else if (IsName("is")) {
        Next();
        ExprPtr t = MakeExpr(Expr::Kind::kTest, p);
        t->negated = SkipName("not");
        Pos np = Cur().pos;
        KILN_ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!IsKnownTest(t->name)) {
          return ErrorAt(np, absl::StrCat("unsupported test '", t->name, "'"));
        }
        t->args.push_back(std::move(e));
        if (SkipOp("(")) {
          KILN_RETURN_IF_ERROR(ParseCallArgs(*t));
        } else if ((Cur().type == T::kName && Cur().text != "else" && Cur().text != "or" &&
                    Cur().text != "and" && Cur().text != "if" && Cur().text != "in" &&
                    Cur().text != "not" && Cur().text != "is") ||
                   Cur().type == T::kString || Cur().type == T::kInt || Cur().type == T::kFloat ||
                   IsOp("[") || IsOp("{")) {
          KILN_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          KILN_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (SkipOp("(")) {
        ExprPtr c = MakeExpr(Expr::Kind::kCall, p);
        c->args.push_back(std::move(e));
        KILN_RETURN_IF_ERROR(ParseCallArgs(*c));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int max_nesting_;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source, int max_nesting) {
  KILN_ASSIGN_OR_RETURN(std::vector<Token> tokens,
                        Tokenize(std::string_view(source.data(), source.size())));
  return Parser(std::move(tokens), max_nesting).Run();
}

}  // namespace kiln::jinja
