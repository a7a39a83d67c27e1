#include "template/chat_template.h"

#include "base/status_macros.h"
#include "template/ast.h"
#include "template/evaluator.h"
#include "template/parser.h"

namespace kiln {

struct ChatTemplate::Impl {
  jinja::Body body;
  ChatTemplateLimits limits;
};

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source,
                                                 const ChatTemplateLimits& limits) {
  auto impl = std::make_shared<Impl>();
  impl->limits = limits;
  KILN_ASSIGN_OR_RETURN(
      impl->body,
      jinja::ParseTemplate(absl::string_view(source.data(), source.size()), limits.max_nesting));
  return ChatTemplate(std::move(impl));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return absl::InvalidArgumentError("the context must be a JSON object");
  jinja::Evaluator ev(impl_->limits);
  return ev.Render(impl_->body, jinja::FromJson(context));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context) const {
  if (!context.is_object()) return absl::InvalidArgumentError("the context must be a JSON object");
  jinja::Evaluator ev(impl_->limits);
  return ev.Render(impl_->body, jinja::FromJson(context));
}

}  // namespace kiln
