#include "template/chat_template_set.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

constexpr char kDefault[] = "default";

void Add(ChatTemplateSet& set, const std::string& name, const std::string& source,
         const std::string& origin) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    set.errors.push_back(
        absl::StrCat("template '", name, "' (", origin, "): ", parsed.status().message()));
    set.templates.erase(name);
    return;
  }
  set.templates.insert_or_assign(name, *std::move(parsed));
}

}  // namespace

absl::StatusOr<const ChatTemplate*> ChatTemplateSet::Find(const std::string& name) const {
  const std::string key = name.empty() ? kDefault : name;
  if (auto it = templates.find(key); it != templates.end()) return &it->second;
  std::vector<std::string> names;
  for (const auto& [known, _] : templates) names.push_back(known);
  std::string message = absl::StrCat("the model has no chat template '", key, "'");
  if (!names.empty()) absl::StrAppend(&message, " (it has: ", absl::StrJoin(names, ", "), ")");
  for (const std::string& error : errors) {
    if (error.rfind(absl::StrCat("template '", key, "'"), 0) == 0) {
      absl::StrAppend(&message, "; ", error);
    }
  }
  return absl::NotFoundError(message);
}

absl::StatusOr<ChatTemplateSet> ChatTemplateSet::FromSideFiles(
    const std::map<std::string, std::string>& side_files) {
  ChatTemplateSet set;
  if (auto it = side_files.find("tokenizer_config.json"); it != side_files.end()) {
    const nlohmann::json config = nlohmann::json::parse(it->second, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
    }
    if (auto field = config.find("chat_template"); field != config.end() && !field->is_null()) {
      if (field->is_string()) {
        Add(set, kDefault, field->get<std::string>(), "tokenizer_config.json");
      } else if (field->is_array()) {
        for (const nlohmann::json& entry : *field) {
          if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
              !entry.contains("template") || !entry["template"].is_string()) {
            return absl::InvalidArgumentError(
                "tokenizer_config.json: chat_template entries need a string name and template");
          }
          Add(set, entry["name"].get<std::string>(), entry["template"].get<std::string>(),
              "tokenizer_config.json");
        }
      } else {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: chat_template is neither a string nor a list of named "
            "templates");
      }
    }
  }
  if (auto it = side_files.find("chat_template.jinja"); it != side_files.end()) {
    Add(set, kDefault, it->second, "chat_template.jinja");
  }
  return set;
}

}  // namespace kiln
