// Chat templates: the input is a Jinja2 template, optionally followed by kContextSeparator and
// the render context as JSON (messages, tools, add_generation_prompt, ...; a fixed conversation
// when absent or not a JSON object). A template that parses is rendered. Limits are smaller than
// the server's so that a slow template is reported by the limits, not by libFuzzer's timeout;
// the code paths are the same.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "template/chat_template.h"

namespace {

constexpr absl::string_view kContextSeparator = "\n--kiln-context--\n";

const nlohmann::ordered_json& DefaultContext() {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"json({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "<think>add</think>4", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
      {"role": "tool", "content": "4"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "function": {"name": "add", "description": "Adds",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false})json");
  return context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input = kiln::fuzz::AsStringView(data, size);
  const size_t separator = input.find(kContextSeparator);
  const absl::string_view source = input.substr(0, separator);

  kiln::ChatTemplateLimits limits;
  limits.max_loop_iterations = 20'000;
  limits.max_output_bytes = 256 << 10;
  absl::StatusOr<kiln::ChatTemplate> chat_template =
      kiln::ChatTemplate::Parse(std::string_view(source.data(), source.size()), limits);
  if (!chat_template.ok()) return 0;

  nlohmann::ordered_json context = DefaultContext();
  if (separator != absl::string_view::npos) {
    nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(
        input.substr(separator + kContextSeparator.size()), /*cb=*/nullptr,
        /*allow_exceptions=*/false);
    if (parsed.is_object()) context = std::move(parsed);
  }
  (void)chat_template->Render(context);
  return 0;
}
