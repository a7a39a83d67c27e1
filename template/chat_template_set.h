// A model's chat templates, as Hugging Face checkpoints ship them: `chat_template` in
// tokenizer_config.json (one template, or a list of {"name", "template"}), and a
// chat_template.jinja file beside it, which transformers prefers as the default. Each is parsed
// once at load; one that does not parse (an unsupported feature) is left out with its error, so
// the model still serves everything else.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "template/chat_template.h"

namespace kiln {

struct ChatTemplateSet {
  std::map<std::string, ChatTemplate> templates;  // by name; the unnamed one is "default"
  // "template 'default' (chat_template.jinja): unsupported ... at 3:14", one per template left
  // out.
  std::vector<std::string> errors;

  // The named template, or "default" for an empty name; NotFound naming those there are (and
  // why a template is missing when it failed to parse).
  absl::StatusOr<const ChatTemplate*> Find(const std::string& name) const;

  // From a checkpoint's side files (file name → contents). InvalidArgument only when
  // tokenizer_config.json itself is not valid JSON or its chat_template has the wrong type.
  static absl::StatusOr<ChatTemplateSet> FromSideFiles(
      const std::map<std::string, std::string>& side_files);
};

}  // namespace kiln
