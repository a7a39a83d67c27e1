// Renders a parsed template (internal to template/): statements, expressions, scopes and limits.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "template/ast.h"
#include "template/chat_template.h"
#include "template/value.h"

namespace kiln::jinja {

class Evaluator {
 public:
  explicit Evaluator(const ChatTemplateLimits& limits) : limits_(limits) {}

  // Renders `root` with the context's entries (a dict) as template variables.
  absl::StatusOr<std::string> Render(const Body& root, const Value& context);

  // For the builtins.
  absl::StatusOr<Value> Call(const Value& fn, CallArgs& args);
  absl::Status ChargeIterations(int64_t n);
  absl::Status CheckSize(size_t bytes) const;
  int64_t max_loop_iterations() const { return limits_.max_loop_iterations; }
  size_t max_output_bytes() const { return limits_.max_output_bytes; }
  // namespace() objects are the one mutable value: `{% set ns.self = ns %}` makes a reference
  // cycle that shared_ptr alone never frees. Render empties every namespace still alive when it
  // ends (no value outlives a render: its result is text), which breaks such cycles.
  void TrackNamespace(const std::shared_ptr<Dict>& ns);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct Frame {
    absl::flat_hash_map<std::string, Value> vars;
    Frame* parent = nullptr;
  };

  absl::StatusOr<Flow> Exec(const Body& body, std::string& out);
  absl::StatusOr<Flow> ExecNode(const Node& node, std::string& out);
  absl::StatusOr<Flow> ExecFor(const Node& node, std::string& out);
  absl::Status ExecSet(const Node& node, Value value);
  absl::Status Append(std::string& out, absl::string_view s);
  absl::StatusOr<Value> CallMacro(const Node& macro, CallArgs& args);

  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> EvalInner(const Expr& e);
  absl::StatusOr<Value> EvalCall(const Expr& e);
  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first);
  absl::Status Bind(Frame& frame, const std::vector<std::string>& targets, const Value& v);
  const Value* Lookup(absl::string_view name) const;

  ChatTemplateLimits limits_;
  Frame* frame_ = nullptr;
  Frame* root_ = nullptr;
  int64_t iterations_ = 0;
  size_t emitted_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  std::vector<std::weak_ptr<Dict>> namespaces_;
  size_t next_namespace_sweep_ = 64;
};

// builtins.cc
absl::StatusOr<Value> ApplyFilter(Evaluator& ev, absl::string_view name, const Value& v,
                                  CallArgs& args);
absl::StatusOr<bool> ApplyTest(Evaluator& ev, absl::string_view name, const Value& v,
                               CallArgs& args);
// obj.name(args) for Python's str and dict methods; *found is false when there is none.
absl::StatusOr<Value> CallMethod(Evaluator& ev, const Value& obj, absl::string_view name,
                                 CallArgs& args, bool* found);
void AddGlobals(absl::flat_hash_map<std::string, Value>& vars);
// Python iteration: list items, dict keys, string characters; Undefined is empty.
absl::StatusOr<List> Iterate(const Value& v);
// obj.name as Jinja's getattr does it (dict keys by attribute); Undefined when missing.
Value GetAttr(const Value& obj, absl::string_view name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);

}  // namespace kiln::jinja
