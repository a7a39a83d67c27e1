#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;

constexpr double kNoLimit = 1e6;  // an upper bound that only keeps values finite
// For integers whose upper bound a RequestLimits check gives, with its flag's name.
constexpr int64_t kNoIntLimit = std::numeric_limits<int64_t>::max();
constexpr int kMaxJsonDepth = 64;
// OpenAI's roles (function: its deprecated form of tool). Others are refused: a role is written
// into the prompt by the chat template, next to its control tokens.
constexpr absl::string_view kRoles[] = {"system",    "developer", "user",
                                        "assistant", "tool",      "function"};

absl::string_view TypeName(const Json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  return "an object";
}

absl::Status TypeError(absl::string_view field, absl::string_view expected, const Json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got ", TypeName(value)));
}

// How deeply `text`'s arrays and objects nest (brackets outside strings), in one pass.
int JsonNesting(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// JSON text from the client, as `field`. Deeper text is refused before it is parsed: the parser
// and whatever walks the value (copies, the chat template's values, serialization) recurse;
// OpenAI's own requests nest a few levels.
absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view field) {
  if (const int depth = JsonNesting(text); depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": JSON nested ", depth, " levels deep, more than this server's ", kMaxJsonDepth));
  }
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." without the tag.
    absl::string_view reason = e.what();
    if (const size_t tag_end = reason.find("] "); tag_end != absl::string_view::npos) {
      reason.remove_prefix(tag_end + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(field, ": not valid JSON (", reason, ")"));
  }
}

absl::StatusOr<Json> ParseObject(absl::string_view body) {
  KILN_ASSIGN_OR_RETURN(Json root, ParseJson(body, "body"));
  if (!root.is_object()) return TypeError("body", "a JSON object", root);
  return root;
}

// The field's value, or null when absent (an explicit null counts as absent, as in OpenAI's
// SDKs).
const Json& Field(const Json& object, absl::string_view name) {
  static const Json kNull;
  const auto it = object.find(name);
  return it == object.end() ? kNull : *it;
}

absl::StatusOr<std::optional<double>> OptionalNumber(const Json& object, absl::string_view name,
                                                     double min, double max) {
  const Json& value = Field(object, name);
  if (value.is_null()) return std::nullopt;
  if (!value.is_number()) return TypeError(name, "a number", value);
  const double x = value.get<double>();
  if (!std::isfinite(x) || x < min || x > max) {
    return absl::InvalidArgumentError(
        max >= kNoLimit
            ? absl::StrCat(name, ": must be at least ", min, ", got ", value.dump())
            : absl::StrCat(name, ": must be in [", min, ", ", max, "], got ", value.dump()));
  }
  return x;
}

absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& value, absl::string_view name,
                                                   int64_t min, int64_t max) {
  if (value.is_null()) return std::nullopt;
  int64_t x = 0;
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", value.dump(), " is too large"));
    }
    x = value.get<int64_t>();
  } else if (value.is_number_float() &&
             std::nearbyint(value.get<double>()) == value.get<double>() &&
             std::abs(value.get<double>()) < 9e15) {
    x = static_cast<int64_t>(value.get<double>());
  } else {
    return TypeError(name, "an integer", value);
  }
  if (x < min || x > max) {
    return absl::InvalidArgumentError(
        max == kNoIntLimit ? absl::StrCat(name, ": must be at least ", min, ", got ", x)
                           : absl::StrCat(name, ": must be in [", min, ", ", max, "], got ", x));
  }
  return x;
}

absl::StatusOr<std::optional<int64_t>> OptionalIntField(const Json& object, absl::string_view name,
                                                        int64_t min, int64_t max) {
  return OptionalInt(Field(object, name), name, min, max);
}

absl::StatusOr<std::optional<bool>> OptionalBool(const Json& object, absl::string_view name) {
  const Json& value = Field(object, name);
  if (value.is_null()) return std::nullopt;
  if (!value.is_boolean()) return TypeError(name, "a boolean", value);
  return value.get<bool>();
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Json& object,
                                                          absl::string_view name) {
  const Json& value = Field(object, name);
  if (value.is_null()) return std::nullopt;
  if (!value.is_string()) return TypeError(name, "a string", value);
  return value.get<std::string>();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& value, absl::string_view name) {
  if (!value.is_array()) return TypeError(name, "an array of token ids", value);
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::optional<int64_t> id,
                          OptionalInt(value[i], absl::StrCat(name, "[", i, "]"), 0,
                                      std::numeric_limits<int32_t>::max()));
    if (!id.has_value()) return TypeError(absl::StrCat(name, "[", i, "]"), "a token id", value[i]);
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

absl::StatusOr<std::string> RequiredModel(const Json& root) {
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> model, OptionalString(root, "model"));
  if (!model.has_value() || model->empty()) {
    return absl::InvalidArgumentError("model: name the model to use (GET /v1/models lists them)");
  }
  return *std::move(model);
}

// Fields whose meaning kiln cannot honour: refused, so that a client does not silently get
// something else than it asked for.
absl::Status RefuseUnsupported(const Json& root) {
  if (const Json& bias = Field(root, "logit_bias"); !bias.is_null() && !bias.empty()) {
    return absl::InvalidArgumentError("logit_bias: not supported by this server");
  }
  if (const Json& format = Field(root, "response_format"); !format.is_null()) {
    const Json& type = format.is_object() ? Field(format, "type") : format;
    if (!(type.is_string() && type.get<std::string>() == "text")) {
      return absl::InvalidArgumentError(
          "response_format: only {\"type\": \"text\"} is supported (no guided decoding)");
    }
  }
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens,
                        OptionalIntField(root, "min_tokens", 0, 1 << 30));
  if (min_tokens.value_or(0) > 0) {
    return absl::InvalidArgumentError("min_tokens: not supported by this server");
  }
  if (!Field(root, "chat_template").is_null()) {
    return absl::InvalidArgumentError(
        "chat_template: per-request templates are not accepted; load the model with one "
        "(--chat-template, the config's chat_template_file, LoadModel's chat_template)");
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenAiSampling> ParseSampling(const Json& root, const RequestLimits& limits) {
  KILN_RETURN_IF_ERROR(RefuseUnsupported(root));
  OpenAiSampling out;
  KILN_ASSIGN_OR_RETURN(out.model, RequiredModel(root));

  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens,
                        OptionalIntField(root, "max_tokens", 1, 1 << 30));
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> max_completion_tokens,
                        OptionalIntField(root, "max_completion_tokens", 1, 1 << 30));
  if (max_completion_tokens.has_value()) max_tokens = max_completion_tokens;
  if (max_tokens.has_value()) out.max_tokens = static_cast<int32_t>(*max_tokens);

  SamplingParams& sampling = out.sampling;
  KILN_ASSIGN_OR_RETURN(std::optional<double> temperature,
                        OptionalNumber(root, "temperature", 0, kNoLimit));
  sampling.temperature = static_cast<float>(temperature.value_or(1.0));
  KILN_ASSIGN_OR_RETURN(std::optional<double> top_p, OptionalNumber(root, "top_p", 0, 1));
  if (top_p.has_value() && *top_p == 0) {
    return absl::InvalidArgumentError("top_p: must be in (0, 1], got 0");
  }
  sampling.top_p = static_cast<float>(top_p.value_or(1.0));
  // vLLM: -1 (and 0) turn top-k off.
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, OptionalIntField(root, "top_k", -1, 1 << 30));
  sampling.top_k = static_cast<int32_t>(std::max<int64_t>(0, top_k.value_or(0)));
  KILN_ASSIGN_OR_RETURN(std::optional<double> min_p, OptionalNumber(root, "min_p", 0, 1));
  sampling.min_p = static_cast<float>(min_p.value_or(0));
  KILN_ASSIGN_OR_RETURN(std::optional<double> presence,
                        OptionalNumber(root, "presence_penalty", -2, 2));
  sampling.presence_penalty = static_cast<float>(presence.value_or(0));
  KILN_ASSIGN_OR_RETURN(std::optional<double> frequency,
                        OptionalNumber(root, "frequency_penalty", -2, 2));
  sampling.frequency_penalty = static_cast<float>(frequency.value_or(0));
  KILN_ASSIGN_OR_RETURN(std::optional<double> repetition,
                        OptionalNumber(root, "repetition_penalty", 0, kNoLimit));
  if (repetition.has_value() && *repetition == 0) {
    return absl::InvalidArgumentError("repetition_penalty: must be greater than 0, got 0");
  }
  sampling.repetition_penalty = static_cast<float>(repetition.value_or(1.0));
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                        OptionalIntField(root, "seed", std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max()));
  if (seed.has_value()) sampling.seed = static_cast<uint64_t>(*seed);

  if (const Json& stop = Field(root, "stop"); stop.is_string()) {
    out.stop.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    for (size_t i = 0; i < stop.size(); ++i) {
      if (!stop[i].is_string())
        return TypeError(absl::StrCat("stop[", i, "]"), "a string", stop[i]);
      out.stop.push_back(stop[i].get<std::string>());
    }
  } else if (!stop.is_null()) {
    return TypeError("stop", "a string or an array of strings", stop);
  }
  KILN_RETURN_IF_ERROR(CheckStopStrings(out.stop, "stop", limits));
  if (const Json& ids = Field(root, "stop_token_ids"); !ids.is_null()) {
    KILN_ASSIGN_OR_RETURN(out.stop_token_ids, TokenIds(ids, "stop_token_ids"));
  }
  KILN_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, OptionalBool(root, "ignore_eos"));
  out.ignore_eos = ignore_eos.value_or(false);
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> n, OptionalIntField(root, "n", 1, kNoIntLimit));
  KILN_RETURN_IF_ERROR(CheckChoices(n.value_or(1), absl::StrCat("n = ", n.value_or(1)), limits));
  out.n = static_cast<int32_t>(n.value_or(1));

  KILN_ASSIGN_OR_RETURN(std::optional<bool> stream, OptionalBool(root, "stream"));
  out.stream = stream.value_or(false);
  if (const Json& options = Field(root, "stream_options"); !options.is_null()) {
    if (!options.is_object()) return TypeError("stream_options", "an object", options);
    if (!out.stream) {
      return absl::InvalidArgumentError("stream_options: only allowed when stream is true");
    }
    KILN_ASSIGN_OR_RETURN(std::optional<bool> usage, OptionalBool(options, "include_usage"));
    out.include_usage = usage.value_or(false);
  }
  return out;
}

// A message's content as the template sees it: a string, null, or text parts joined by "\n"
// (vLLM's "string" content format).
absl::StatusOr<Json> MessageContent(const Json& content, const std::string& field) {
  if (content.is_string() || content.is_null()) return content;
  if (!content.is_array())
    return TypeError(field, "a string or an array of content parts", content);
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_field = absl::StrCat(field, "[", j, "]");
    const Json& part = content[j];
    if (!part.is_object()) return TypeError(part_field, "a content part object", part);
    const Json& type = Field(part, "type");
    if (!type.is_string()) return TypeError(absl::StrCat(part_field, ".type"), "a string", type);
    if (type.get<std::string>() != "text") {
      return absl::InvalidArgumentError(
          absl::StrCat(part_field, ".type: '", type.get<std::string>(),
                       "' is not supported (only text parts; kiln serves text models)"));
    }
    const Json& text = Field(part, "text");
    if (!text.is_string()) return TypeError(absl::StrCat(part_field, ".text"), "a string", text);
    texts.push_back(text.get<std::string>());
  }
  return Json(absl::StrJoin(texts, "\n"));
}

absl::StatusOr<Json> ParseMessages(const Json& messages) {
  if (messages.is_null()) {
    return absl::InvalidArgumentError("messages: required (a non-empty array of messages)");
  }
  if (!messages.is_array()) return TypeError("messages", "an array of messages", messages);
  if (messages.empty()) return absl::InvalidArgumentError("messages: must not be empty");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    const Json& message = messages[i];
    if (!message.is_object()) return TypeError(field, "a message object", message);
    const Json& role = Field(message, "role");
    if (!role.is_string() || role.get<std::string>().empty()) {
      return TypeError(absl::StrCat(field, ".role"), "a role string", role);
    }
    if (std::find(std::begin(kRoles), std::end(kRoles), role.get<std::string>()) ==
        std::end(kRoles)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".role: ", Json(role).dump(),
                       " is not one of system, developer, user, assistant, "
                       "tool, function"));
    }
    Json copy = message;
    KILN_ASSIGN_OR_RETURN(copy["content"], MessageContent(Field(message, "content"),
                                                          absl::StrCat(field, ".content")));
    if (const Json& calls = Field(message, "tool_calls"); !calls.is_null()) {
      if (!calls.is_array()) {
        return TypeError(absl::StrCat(field, ".tool_calls"), "an array of tool calls", calls);
      }
      for (size_t j = 0; j < calls.size(); ++j) {
        const std::string call_field = absl::StrCat(field, ".tool_calls[", j, "]");
        const Json& function = calls[j].is_object() ? Field(calls[j], "function") : Json();
        if (!function.is_object() || !Field(function, "name").is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(call_field, ".function: expected an object with a name"));
        }
        // Templates index into the arguments (tool_call.arguments|items): they get the object
        // the JSON string encodes, as vLLM and transformers give them.
        const Json& arguments = Field(function, "arguments");
        if (arguments.is_string()) {
          KILN_ASSIGN_OR_RETURN(Json parsed,
                                ParseJson(arguments.get<std::string>(),
                                          absl::StrCat(call_field, ".function.arguments")));
          copy["tool_calls"][j]["function"]["arguments"] = std::move(parsed);
        }
      }
    }
    out.push_back(std::move(copy));
  }
  return out;
}

absl::StatusOr<ChatCompletionRequest> ParseChat(const Json& root, bool needs_sampling,
                                                const RequestLimits& limits) {
  ChatCompletionRequest out;
  if (needs_sampling) {
    KILN_ASSIGN_OR_RETURN(out.common, ParseSampling(root, limits));
    // Chat's logprobs is a switch; top_logprobs the count.
    KILN_ASSIGN_OR_RETURN(std::optional<bool> logprobs, OptionalBool(root, "logprobs"));
    out.common.logprobs = logprobs.value_or(false);
    KILN_ASSIGN_OR_RETURN(std::optional<int64_t> top,
                          OptionalIntField(root, "top_logprobs", 0, kNoIntLimit));
    if (top.has_value()) KILN_RETURN_IF_ERROR(CheckLogprobs(*top, "top_logprobs", limits));
    if (top.has_value() && *top > 0 && !out.common.logprobs) {
      return absl::InvalidArgumentError("top_logprobs: needs logprobs set to true");
    }
    out.common.top_logprobs = static_cast<int32_t>(top.value_or(0));
    if (const Json& choice = Field(root, "tool_choice"); !choice.is_null()) {
      if (!(choice.is_string() &&
            (choice.get<std::string>() == "none" || choice.get<std::string>() == "auto"))) {
        return absl::InvalidArgumentError(
            "tool_choice: only \"none\" and \"auto\" are supported (no forced tool calls)");
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(out.messages, ParseMessages(Field(root, "messages")));
  if (const Json& tools = Field(root, "tools"); !tools.is_null()) {
    if (!tools.is_array()) return TypeError("tools", "an array of tools", tools);
    if (!tools.empty()) out.tools = tools;
  }
  KILN_ASSIGN_OR_RETURN(std::optional<bool> add_generation_prompt,
                        OptionalBool(root, "add_generation_prompt"));
  out.add_generation_prompt = add_generation_prompt.value_or(true);
  KILN_ASSIGN_OR_RETURN(std::optional<bool> continue_final,
                        OptionalBool(root, "continue_final_message"));
  out.continue_final_message = continue_final.value_or(false);
  if (out.continue_final_message && out.add_generation_prompt) {
    return absl::InvalidArgumentError(
        "continue_final_message: cannot be true together with add_generation_prompt");
  }
  KILN_ASSIGN_OR_RETURN(std::optional<bool> add_special, OptionalBool(root, "add_special_tokens"));
  out.add_special_tokens = add_special.value_or(false);
  if (const Json& kwargs = Field(root, "chat_template_kwargs"); !kwargs.is_null()) {
    if (!kwargs.is_object()) return TypeError("chat_template_kwargs", "an object", kwargs);
    out.chat_template_kwargs = kwargs;
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatCompletionRequest> ParseChatCompletionRequest(absl::string_view body,
                                                                 const RequestLimits& limits) {
  KILN_ASSIGN_OR_RETURN(const Json root, ParseObject(body));
  return ParseChat(root, /*needs_sampling=*/true, limits);
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body,
                                                         const RequestLimits& limits) {
  KILN_ASSIGN_OR_RETURN(const Json root, ParseObject(body));
  CompletionRequest out;
  KILN_ASSIGN_OR_RETURN(out.common, ParseSampling(root, limits));
  // OpenAI's default for completions (vLLM's too); chat defaults to the rest of the context.
  if (!out.common.max_tokens.has_value()) out.common.max_tokens = 16;
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs,
                        OptionalIntField(root, "logprobs", 0, kNoIntLimit));
  if (logprobs.has_value()) KILN_RETURN_IF_ERROR(CheckLogprobs(*logprobs, "logprobs", limits));
  out.common.logprobs = logprobs.has_value();
  out.common.top_logprobs = static_cast<int32_t>(logprobs.value_or(0));
  KILN_ASSIGN_OR_RETURN(std::optional<bool> echo, OptionalBool(root, "echo"));
  if (echo.value_or(false)) {
    return absl::InvalidArgumentError("echo: not supported by this server");
  }
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> suffix, OptionalString(root, "suffix"));
  if (suffix.has_value() && !suffix->empty()) {
    return absl::InvalidArgumentError("suffix: not supported by this server");
  }
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> best_of,
                        OptionalIntField(root, "best_of", 1, kNoIntLimit));
  if (best_of.has_value() && *best_of != out.common.n) {
    return absl::InvalidArgumentError("best_of: only best_of = n is supported");
  }
  KILN_ASSIGN_OR_RETURN(std::optional<bool> add_special, OptionalBool(root, "add_special_tokens"));
  out.add_special_tokens = add_special.value_or(true);

  const Json& prompt = Field(root, "prompt");
  if (prompt.is_string()) {
    out.prompts.emplace_back(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number()) {
    KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(prompt, "prompt"));
    out.prompts.emplace_back(std::move(ids));
  } else if (prompt.is_array() && !prompt.empty()) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      const std::string field = absl::StrCat("prompt[", i, "]");
      if (prompt[i].is_string()) {
        out.prompts.emplace_back(prompt[i].get<std::string>());
      } else if (prompt[i].is_array()) {
        KILN_ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(prompt[i], field));
        out.prompts.emplace_back(std::move(ids));
      } else {
        return TypeError(field, "a string or an array of token ids", prompt[i]);
      }
    }
  } else if (prompt.is_array()) {
    return absl::InvalidArgumentError("prompt: must not be an empty array");
  } else {
    return TypeError("prompt",
                     "a string, an array of strings, an array of token ids or an array of such "
                     "arrays",
                     prompt);
  }
  KILN_RETURN_IF_ERROR(
      CheckChoices(static_cast<int64_t>(out.prompts.size()) * out.common.n,
                   absl::StrCat(out.prompts.size(), " prompts x n = ", out.common.n), limits));
  return out;
}

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body,
                                                     const RequestLimits& limits) {
  KILN_ASSIGN_OR_RETURN(const Json root, ParseObject(body));
  TokenizeRequest out;
  KILN_ASSIGN_OR_RETURN(out.model, RequiredModel(root));
  KILN_ASSIGN_OR_RETURN(std::optional<bool> token_strs, OptionalBool(root, "return_token_strs"));
  out.return_token_strs = token_strs.value_or(false);
  if (!Field(root, "messages").is_null()) {
    KILN_ASSIGN_OR_RETURN(out.chat, ParseChat(root, /*needs_sampling=*/false, limits));
    out.add_special_tokens = out.chat->add_special_tokens;
    return out;
  }
  KILN_ASSIGN_OR_RETURN(out.prompt, OptionalString(root, "prompt"));
  if (!out.prompt.has_value()) {
    return absl::InvalidArgumentError("prompt: required (or messages, for a chat prompt)");
  }
  KILN_ASSIGN_OR_RETURN(std::optional<bool> add_special, OptionalBool(root, "add_special_tokens"));
  out.add_special_tokens = add_special.value_or(true);
  return out;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body) {
  KILN_ASSIGN_OR_RETURN(const Json root, ParseObject(body));
  DetokenizeRequest out;
  KILN_ASSIGN_OR_RETURN(out.model, RequiredModel(root));
  const Json& tokens = Field(root, "tokens");
  if (tokens.is_null()) return absl::InvalidArgumentError("tokens: required (an array of ids)");
  KILN_ASSIGN_OR_RETURN(out.tokens, TokenIds(tokens, "tokens"));
  return out;
}

}  // namespace kiln
