// A checkpoint's chat templates: from tokenizer_config.json (one or several named) and
// chat_template.jinja; one that does not parse is left out with its error.
#include "template/chat_template_set.h"

#include "gtest/gtest.h"

namespace kiln {
namespace {

std::string Render(const ChatTemplate& t) {
  nlohmann::ordered_json context;
  context["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  absl::StatusOr<std::string> text = t.Render(context);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(ChatTemplateSetTest, OneTemplateInTheTokenizerConfig) {
  absl::StatusOr<ChatTemplateSet> set = ChatTemplateSet::FromSideFiles(
      {{"tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"})"}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->errors.empty());
  absl::StatusOr<const ChatTemplate*> found = set->Find("");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(Render(**found), "<user>hi");
}

TEST(ChatTemplateSetTest, NamedTemplatesAndTheJinjaFileAsDefault) {
  absl::StatusOr<ChatTemplateSet> set = ChatTemplateSet::FromSideFiles(
      {{"tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "config"},
                               {"name": "tool_use", "template": "tools: {{ messages | length }}"}]})"},
       {"chat_template.jinja", "file {{ messages[0].content }}"}});
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->templates.size(), 2u);
  EXPECT_EQ(Render(**set->Find("default")), "file hi");
  EXPECT_EQ(Render(**set->Find("tool_use")), "tools: 1");
  absl::StatusOr<const ChatTemplate*> missing = set->Find("rag");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("default, tool_use"), absl::string_view::npos)
      << missing.status();
}

TEST(ChatTemplateSetTest, ATemplateThatDoesNotParseIsLeftOutWithItsReason) {
  absl::StatusOr<ChatTemplateSet> set = ChatTemplateSet::FromSideFiles(
      {{"tokenizer_config.json", R"({"chat_template": "{% include 'other.jinja' %}"})"}});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->templates.empty());
  ASSERT_EQ(set->errors.size(), 1u);
  EXPECT_NE(set->errors[0].find("template 'default' (tokenizer_config.json)"), std::string::npos)
      << set->errors[0];
  EXPECT_NE(set->errors[0].find("include"), std::string::npos) << set->errors[0];
  absl::StatusOr<const ChatTemplate*> missing = set->Find("");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("include"), absl::string_view::npos)
      << missing.status();
}

TEST(ChatTemplateSetTest, NoTemplateAndBadConfigs) {
  absl::StatusOr<ChatTemplateSet> none =
      ChatTemplateSet::FromSideFiles({{"tokenizer_config.json", R"({"bos_token": "<s>"})"}});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->templates.empty());
  EXPECT_TRUE(none->errors.empty());
  EXPECT_FALSE(ChatTemplateSet::FromSideFiles({{"tokenizer_config.json", "{"}}).ok());
  EXPECT_FALSE(
      ChatTemplateSet::FromSideFiles({{"tokenizer_config.json", R"({"chat_template": 3})"}}).ok());
  EXPECT_FALSE(ChatTemplateSet::FromSideFiles(
                   {{"tokenizer_config.json", R"({"chat_template": [{"name": "x"}]})"}})
                   .ok());
}

}  // namespace
}  // namespace kiln
