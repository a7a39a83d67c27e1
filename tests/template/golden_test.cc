// Renders the real chat templates of tests/data/chat_templates/ on every case of their
// expected_*.json (made by Python jinja2, see tools/chat_templates/generate_expected.py) and
// requires byte-for-byte equal output, or the same raise_exception message.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "template/chat_template.h"

namespace kiln {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesJinja2) {
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/chat_templates/";
  const std::string name = GetParam();
  std::string source = ReadFile(dir + name + ".jinja");
  ASSERT_FALSE(source.empty());
  auto expected = nlohmann::ordered_json::parse(ReadFile(dir + "expected_" + name + ".json"));
  auto tmpl = ChatTemplate::Parse(source);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  int passed = 0, total = 0;
  for (const auto& c : expected["cases"]) {
    ++total;
    const std::string case_name = c["name"].get<std::string>();
    auto out = tmpl->Render(c["context"]);
    if (c.contains("error")) {
      EXPECT_FALSE(out.ok()) << case_name;
      if (!out.ok()) {
        EXPECT_EQ(out.status().message(), c["error"].get<std::string>()) << case_name;
        if (out.status().message() == c["error"].get<std::string>()) ++passed;
      }
      continue;
    }
    ASSERT_TRUE(out.ok()) << case_name << ": " << out.status();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << case_name;
    if (*out == c["expected"].get<std::string>()) ++passed;
  }
  EXPECT_GE(total, 40);
  std::cout << name << ": " << passed << "/" << total << " cases match\n";
}

INSTANTIATE_TEST_SUITE_P(ChatTemplates, GoldenTest,
                         ::testing::Values("qwen3", "llama3_1", "deepseek_v3", "gemma3"));

}  // namespace
}  // namespace kiln
