// A Jinja2 engine for Hugging Face chat templates, with the semantics transformers'
// apply_chat_template gives them (jinja2's ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and loop controls; its own tojson; raise_exception and strftime_now globals).
//
//   KILN_ASSIGN_OR_RETURN(auto tmpl, ChatTemplate::Parse(source));
//   KILN_ASSIGN_OR_RETURN(std::string prompt, tmpl.Render(context));
//
// The context is a JSON object: messages, tools, add_generation_prompt, bos_token, eos_token and
// any extra kwargs (enable_thinking, ...). Use nlohmann::ordered_json to keep key order, which
// `tojson` output follows, as Python's dicts do. Errors are absl::Status values: a template with
// an unsupported feature is InvalidArgument naming it and its line:column; a render that calls
// raise_exception(msg) is FailedPrecondition with exactly msg; a render over a limit is
// ResourceExhausted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kiln {

struct ChatTemplateLimits {
  int64_t max_loop_iterations = 1'000'000;  // loop iterations over one render, range() sizes too
  int max_call_depth = 100;                 // nested macro calls
  // All text written (set-block and macro captures count again when output) and any one string
  // an expression builds.
  size_t max_output_bytes = 32u << 20;
  int max_nesting = 200;  // syntactic nesting at parse time
  // Nested evaluation (expressions, statements, through macro calls): bounds the native stack.
  int max_eval_depth = 500;
};

class ChatTemplate {
 public:
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source,
                                            const ChatTemplateLimits& limits = {});

  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln
