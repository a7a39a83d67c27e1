// The syntax tree of a parsed template (internal to template/).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace kiln::jinja {

struct Pos {
  int line = 1;
  int column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // args (is_tuple for tuples)
    kDict,       // args: key, value, key, value, ...
    kAttr,       // args[0].name
    kSubscript,  // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (nullptr parts are absent)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..], kwargs)
    kUnary,      // name: "-", "+", "not"; args[0]
    kBinary,     // name: operator; args[0], args[1]
    kAnd,
    kOr,
    kCompare,  // name: "==", "!=", "<", "<=", ">", ">=", "in", "notin"
    kConcat,   // args joined with ~
    kCond,     // args[1] if args[0] else args[2] (args[2] may be nullptr)
  };
  Kind kind;
  Pos pos;
  std::string name;
  bool negated = false;  // kTest: "is not"
  bool is_tuple = false;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kScope };
  Kind kind;
  Pos pos;
  std::string text;  // kText
  // kOutput: exprs[0]. kIf: exprs[i] is the condition of bodies[i] (an else has no condition, so
  // bodies.size() may be exprs.size() + 1). kFor: exprs[0] iterable, exprs[1] filter (or null),
  // bodies[0] body, bodies[1] else. kSet: exprs[0] value; kSetBlock: bodies[0].
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  // kFor/kSet targets: one or more names; kSet "ns.attr" has targets {ns} and attr.
  std::vector<std::string> targets;
  std::string attr;
  // kMacro: name in attr, parameter names in targets, their defaults (or null) in exprs.
};

}  // namespace kiln::jinja
