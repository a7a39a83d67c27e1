// OpenAI HTTP request bodies: the input is a raw body, parsed as /v1/chat/completions,
// /v1/completions, /tokenize and /detokenize would parse it. A chat request that parses is then
// rendered, as the server does, through the Qwen3 chat template (tests/data/chat_templates) and
// the prompt encoded with kiln-brown's tokenizer, so fuzzed messages, tools and
// chat_template_kwargs reach the template engine.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "server/openai_request.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Fixture {
  std::unique_ptr<kiln::ChatTemplate> chat_template;
  std::unique_ptr<kiln::Tokenizer> tokenizer;
};

const Fixture& GetFixture() {
  static const Fixture fixture = [] {
    Fixture f;
    absl::StatusOr<kiln::ChatTemplate> parsed = kiln::ChatTemplate::Parse(
        kiln::fuzz::ReadSourceFileOrDie("tests/data/chat_templates/qwen3.jinja"));
    absl::StatusOr<std::unique_ptr<kiln::Tokenizer>> tokenizer =
        kiln::Tokenizer::FromDirectory(kiln::fuzz::SourcePath("checkpoints/kiln-brown"));
    if (!parsed.ok() || !tokenizer.ok()) {
      std::fprintf(stderr, "fixture: %s %s\n", parsed.status().ToString().c_str(),
                   tokenizer.status().ToString().c_str());
      std::abort();
    }
    f.chat_template = std::make_unique<kiln::ChatTemplate>(*std::move(parsed));
    f.tokenizer = *std::move(tokenizer);
    return f;
  }();
  return fixture;
}

// The context openai_service builds: the request's template kwargs, then its own fields.
void RenderChat(const kiln::ChatCompletionRequest& chat, const Fixture& fixture) {
  nlohmann::ordered_json context = chat.chat_template_kwargs;
  if (!context.contains("bos_token")) context["bos_token"] = "<|endoftext|>";
  if (!context.contains("eos_token")) context["eos_token"] = "<|endoftext|>";
  context["messages"] = chat.messages;
  if (!chat.tools.is_null()) context["tools"] = chat.tools;
  context["add_generation_prompt"] = chat.add_generation_prompt;
  absl::StatusOr<std::string> prompt = fixture.chat_template->Render(context);
  if (prompt.ok()) (void)fixture.tokenizer->Encode(*prompt, chat.add_special_tokens);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& fixture = GetFixture();
  const absl::string_view body = kiln::fuzz::AsStringView(data, size);

  absl::StatusOr<kiln::ChatCompletionRequest> chat = kiln::ParseChatCompletionRequest(body);
  if (chat.ok()) RenderChat(*chat, fixture);

  absl::StatusOr<kiln::CompletionRequest> completion = kiln::ParseCompletionRequest(body);
  if (completion.ok()) {
    for (const kiln::CompletionPrompt& prompt : completion->prompts) {
      if (const std::string* text = std::get_if<std::string>(&prompt)) {
        (void)fixture.tokenizer->Encode(*text, completion->add_special_tokens);
      } else {
        (void)fixture.tokenizer->Decode(std::get<std::vector<int32_t>>(prompt));
      }
    }
  }

  absl::StatusOr<kiln::TokenizeRequest> tokenize = kiln::ParseTokenizeRequest(body);
  if (tokenize.ok() && tokenize->chat.has_value()) RenderChat(*tokenize->chat, fixture);

  absl::StatusOr<kiln::DetokenizeRequest> detokenize = kiln::ParseDetokenizeRequest(body);
  if (detokenize.ok()) (void)fixture.tokenizer->Decode(detokenize->tokens);
  return 0;
}
