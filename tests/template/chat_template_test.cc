// Errors, positions and limits of the chat template engine (features are in features_test.cc).
#include "template/chat_template.h"

#include <chrono>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::string> Render(const std::string& src, const nlohmann::ordered_json& ctx = {},
                                   const ChatTemplateLimits& limits = {}) {
  auto tmpl = ChatTemplate::Parse(src, limits);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(ctx.is_null() ? nlohmann::ordered_json::object() : ctx);
}

TEST(ChatTemplateTest, RendersContext) {
  nlohmann::ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                {"add_generation_prompt", true}};
  auto out = Render(
      "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}>{% endif %}",
      ctx);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "user:hi>");
}

TEST(ChatTemplateTest, RendersUnorderedJson) {
  auto tmpl = ChatTemplate::Parse("{{ x | tojson }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = tmpl->Render(nlohmann::json{{"x", {{"b", 1}, {"a", 2}}}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "{\"a\": 2, \"b\": 1}");  // nlohmann::json sorts keys
  EXPECT_FALSE(tmpl->Render(nlohmann::json::array()).ok());
}

TEST(ChatTemplateTest, UnsupportedFeaturesNameThemAndTheirPosition) {
  struct Case {
    std::string src, message;
  } cases[] = {
      {"{% include 'other.jinja' %}", "unsupported tag 'include' at line 1:4"},
      {"a\n  {{ x | frobnicate }}", "unsupported filter 'frobnicate' at line 2:10"},
      {"{% if x is prime %}{% endif %}", "unsupported test 'prime' at line 1:12"},
      {"\n\n{% for x in y recursive %}{% endfor %}",
       "unsupported feature 'recursive' loops at line 3:15"},
      {"{{ f(*args) }}", "unsupported feature '*args' at line 1:6"},
      {"{% extends 'base' %}", "unsupported tag 'extends' at line 1:4"},
  };
  for (const auto& c : cases) {
    auto t = ChatTemplate::Parse(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(t.status().message()), c.message) << c.src;
  }
}

TEST(ChatTemplateTest, SyntaxErrorsHavePositions) {
  struct Case {
    std::string src, message;
  } cases[] = {
      {"{% if x %}open",
       "unexpected end of template, expected 'elif' or 'else' or 'endif' at line 1:15"},
      {"{{ 1 + }}", "expected an expression, got end of print statement at line 1:8"},
      {"line\n{{ 'abc }}", "unterminated string at line 2:4"},
      {"{% break %}", "'break' outside of a loop at line 1:4"},
      {"{{ x", "unterminated '{{' at line 1:1"},
      {"{# never closed", "unterminated comment at line 1:1"},
      {"{{ a ? b }}", "unexpected character '?' at line 1:6"},
      {"{% for x %}{% endfor %}", "expected 'in', got end of statement block at line 1:10"},
  };
  for (const auto& c : cases) {
    auto t = ChatTemplate::Parse(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(t.status().message()), c.message) << c.src;
  }
}

TEST(ChatTemplateTest, RenderErrorsHavePositions) {
  auto out = Render("ok\n{{ missing.attr }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(std::string(out.status().message()), "'missing' is undefined at line 2:11");
  out = Render("{{ 1 + 'a' }}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("unsupported operand type(s) for +: 'int' and 'str'"));
  out = Render("{% set x = 1 %}{% set x.y = 2 %}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("non-namespace"));
  out = Render("{{ [1].append(2) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("unsafe"));
}

TEST(ChatTemplateTest, RaiseExceptionGivesItsMessage) {
  auto out = Render("before{{ raise_exception('Conversation roles must alternate') }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(out.status().message()), "Conversation roles must alternate");
}

TEST(ChatTemplateTest, HugeRangeFailsFast) {
  auto start = std::chrono::steady_clock::now();
  auto out = Render("{% for i in range(10**9) %}{{ i }}{% endfor %}");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("loop iterations"));
}

TEST(ChatTemplateTest, NestedLoopsHitTheIterationLimit) {
  auto start = std::chrono::steady_clock::now();
  auto out = Render(
      "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
      "{% endfor %}{% endfor %}{% endfor %}");
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::seconds(30));  // sanitizer builds
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("limit of 1000000 loop iterations"));
}

TEST(ChatTemplateTest, LimitsAreConfigurable) {
  ChatTemplateLimits limits;
  limits.max_loop_iterations = 10;
  EXPECT_TRUE(Render("{% for i in range(10) %}{% endfor %}", {}, limits).ok());
  EXPECT_FALSE(Render("{% for i in range(11) %}{% endfor %}", {}, limits).ok());
  EXPECT_FALSE(
      Render("{% for i in [1,2,3,4] %}{% for j in [1,2,3] %}{% endfor %}{% endfor %}", {}, limits)
          .ok());
  limits = {};
  limits.max_output_bytes = 8;
  EXPECT_TRUE(Render("12345678", {}, limits).ok());
  EXPECT_FALSE(Render("123456789", {}, limits).ok());
  limits = {};
  limits.max_call_depth = 3;
  const std::string rec = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}";
  EXPECT_TRUE(Render(rec + "{{ f(2) }}", {}, limits).ok());
  EXPECT_FALSE(Render(rec + "{{ f(3) }}", {}, limits).ok());
}

// Found by fuzz/fuzz_chat_template.cc: indent's width and tojson's indent and separators are
// repeated for every line or item, so a few bytes of template asked for gigabytes (4 GB for
// indent(4000000000)) before the output limit was ever checked.
TEST(ChatTemplateTest, IndentAndTojsonRespectTheOutputLimit) {
  for (const char* src :
       {"{{ 'a\\nb' | indent(4000000000) }}", "{{ ('a\\n' * 1000000) | indent(100) }}",
        "{{ messages | tojson(indent=2000000000) }}",
        "{{ range(100000) | list | tojson(indent=1000) }}",
        "{{ range(10000) | list | tojson(separators=['x' * 10000, ':']) }}"}) {
    auto out = Render(src, {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
    ASSERT_FALSE(out.ok()) << src;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << src << out.status();
  }
  ChatTemplateLimits limits;
  limits.max_output_bytes = 64;
  EXPECT_EQ(Render("{{ 'a\\nb' | indent(61) }}", {}, limits).value_or("?"),
            "a\n" + std::string(61, ' ') + "b");  // 64 bytes
  EXPECT_FALSE(Render("{{ 'a\\nb' | indent(62) }}", {}, limits).ok());
  EXPECT_EQ(Render("{{ [1] | tojson(indent=2) }}").value_or("?"), "[\n  1\n]");
  // An indent past int's range is clamped, not wrapped around to a small one.
  EXPECT_FALSE(Render("{{ [1] | tojson(indent=4294967298) }}").ok());
}

// Found by fuzz/fuzz_chat_template.cc: a namespace stored inside itself (directly or in a list)
// was a shared_ptr cycle that outlived the render, leaking on every request (the asan preset's
// leak checker fails this test without the fix).
TEST(ChatTemplateTest, NamespaceCyclesAreFreed) {
  auto out = Render(
      "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{% set ns.all = [ns, {'k': ns}] %}"
      "{% for i in range(3) %}{% set inner = namespace(up=ns) %}{% set inner.me = inner %}"
      "{% endfor %}{{ ns.me.me.a }}{{ ns.all[1].k.a }}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "11");
  EXPECT_FALSE(
      Render("{% set ns = namespace() %}{% set ns.me = ns %}{{ raise_exception('x') }}").ok());
}

TEST(ChatTemplateTest, DeepMacroRecursionFails) {
  auto out = Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("macro 'f' exceeded the call depth limit of 100"));
}

TEST(ChatTemplateTest, HugeOutputFails) {
  auto out = Render(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("bytes"));
  out = Render("{{ 'x' * 10**12 }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  out = Render("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ChatTemplateTest, DeepNestingIsAnErrorNotACrash) {
  std::string src = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  auto t = ChatTemplate::Parse(src);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("nesting deeper than 200"));
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if 1 %}";
  t = ChatTemplate::Parse(ifs);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("nesting deeper"));
  t = ChatTemplate::Parse("{{ " + std::string(50000, '-') + "1 }}");
  ASSERT_FALSE(t.ok());
  t = ChatTemplate::Parse("{{ " + std::string(50000, '[') + " }}");
  ASSERT_FALSE(t.ok());
}

TEST(ChatTemplateTest, StrftimeNow) {
  auto out = Render("{{ strftime_now('%Y-%m-%d') | length }}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "10");
}

TEST(ChatTemplateTest, GenerationBlockRendersItsBody) {
  auto out = Render("{% generation %}gen {{ 1 }}{% endgeneration %}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "gen 1");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(ChatTemplateTest, DeepExpressionsInsideDeepRecursionDoNotOverflowTheStack) {
  // The recursive call sits 150 levels down its expression: the evaluation depth limit (500)
  // stops it long before the call depth limit (100) would.
  std::string expr = "f(n + 1) | length";
  for (int i = 0; i < 150; ++i) expr += " + 0";
  auto out = Render("{% macro f(n) %}{{ " + expr + " }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("nested deeper than 500"));
}

TEST(ChatTemplateTest, LongOperatorChainsAreBounded) {
  std::string sum = "1";
  for (int i = 0; i < 100000; ++i) sum += "+1";
  auto t = ChatTemplate::Parse("{{ " + sum + " }}");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("nesting deeper than 200"));
  std::string filters = "x";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  EXPECT_FALSE(ChatTemplate::Parse("{{ " + filters + " }}").ok());
  sum = "1";
  for (int i = 0; i < 150; ++i) sum += "+1";
  auto out = Render("{{ " + sum + " }}");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "151");
}

}  // namespace
}  // namespace kiln
