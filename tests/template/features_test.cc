// One small template per language feature (tests/data/chat_templates/expected_features.json,
// rendered by Python jinja2): the output must match byte for byte; where jinja2 fails, so must
// the render, with the same message for raise_exception.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "template/chat_template.h"

namespace kiln {
namespace {

TEST(FeaturesTest, MatchJinja2) {
  std::ifstream in(std::string(KILN_TEST_DATA_DIR) + "/chat_templates/expected_features.json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto data = nlohmann::ordered_json::parse(ss.str());
  int passed = 0, total = 0;
  for (const auto& c : data["cases"]) {
    ++total;
    const std::string name = c["name"].get<std::string>();
    const std::string src = c["template"].get<std::string>();
    SCOPED_TRACE(name + ": " + src);
    auto tmpl = ChatTemplate::Parse(src);
    absl::StatusOr<std::string> out =
        tmpl.ok() ? tmpl->Render(c["context"]) : absl::StatusOr<std::string>(tmpl.status());
    if (c.contains("error")) {
      EXPECT_FALSE(out.ok()) << "jinja2 failed with: " << c["error"] << "; we gave: " << *out;
      if (!out.ok() && c.value("raised", false)) {
        EXPECT_EQ(out.status().message(), c["error"].get<std::string>());
        if (out.status().message() == c["error"].get<std::string>()) ++passed;
      } else if (!out.ok()) {
        ++passed;
      }
      continue;
    }
    if (!out.ok()) {
      ADD_FAILURE() << out.status();
      continue;
    }
    EXPECT_EQ(*out, c["expected"].get<std::string>());
    if (*out == c["expected"].get<std::string>()) ++passed;
  }
  std::cout << "features: " << passed << "/" << total << " cases match\n";
}

}  // namespace
}  // namespace kiln
