#include "tokenizer/tokenizer_json.h"

#include <simdjson.h>

#include <functional>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "nlohmann/json.hpp"

namespace kiln::tokenizer_internal {
namespace {

using json = nlohmann::json;
using simdjson::dom::element;

absl::string_view View(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

absl::Status Invalid(absl::string_view where, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", where, ": ", detail));
}

// Parses `text` into `parser`. simdjson refuses a few documents that are valid JSON (integers
// beyond 64 bits); those are rewritten through nlohmann first, into `storage`.
absl::StatusOr<element> ParseDocument(simdjson::dom::parser& parser, absl::string_view text,
                                      absl::string_view file, std::string& storage) {
  element root;
  simdjson::error_code error = parser.parse(text.data(), text.size()).get(root);
  if (!error) return root;
  try {
    storage = json::parse(text.begin(), text.end()).dump();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": malformed JSON: ", e.what()));
  }
  error = parser.parse(storage.data(), storage.size()).get(root);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unreadable JSON: ", simdjson::error_message(error)));
  }
  return root;
}

// A small sub-document handed to the component parsers.
json ToNlohmann(element value) { return json::parse(simdjson::minify(value)); }

std::optional<std::string> OptionalString(element value) {
  std::string_view text;
  if (value.get_string().get(text)) return std::nullopt;
  return std::string(text);
}

bool Bool(element value, bool fallback) {
  bool result = fallback;
  if (value.get_bool().get(result)) return fallback;
  return result;
}

// A boolean field of an object; `fallback` when absent or not a boolean.
bool FieldBool(simdjson::dom::object object, std::string_view key, bool fallback) {
  bool result = fallback;
  if (object[key].get_bool().get(result)) return fallback;
  return result;
}

// vocab: {"token": id, ...}. `where` starts the error messages.
absl::Status ReadVocab(element value, absl::string_view where,
                       std::vector<std::pair<absl::string_view, int32_t>>& vocab) {
  simdjson::dom::object object;
  if (value.get_object().get(object)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": the vocabulary must be an object"));
  }
  vocab.reserve(object.size());
  for (simdjson::dom::key_value_pair field : object) {
    int64_t id = 0;
    if (field.value.get_int64().get(id) || id < 0 || id > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": vocab entry \"", View(field.key), "\" has no valid id"));
    }
    vocab.emplace_back(View(field.key), static_cast<int32_t>(id));
  }
  return absl::OkStatus();
}

// merges: ["a b", ...] or [["a", "b"], ...]. A legacy string with several spaces is split where
// both sides are tokens of the vocabulary.
absl::Status ReadMerges(element value, const std::function<bool(absl::string_view)>& in_vocab,
                        std::vector<std::pair<absl::string_view, absl::string_view>>& merges) {
  simdjson::dom::array array;
  if (value.get_array().get(array)) return Invalid("model", "\"merges\" must be a list");
  merges.reserve(array.size());
  size_t index = 0;
  for (element item : array) {
    std::string_view text;
    simdjson::dom::array pair;
    if (!item.get_string().get(text)) {
      absl::string_view line = View(text);
      size_t space = line.find(' ');
      if (space != absl::string_view::npos && line.find(' ', space + 1) != line.npos) {
        for (size_t at = space; at != line.npos; at = line.find(' ', at + 1)) {
          if (in_vocab(line.substr(0, at)) && in_vocab(line.substr(at + 1))) {
            space = at;
            break;
          }
        }
      }
      if (space == absl::string_view::npos) {
        return Invalid("model", absl::StrCat("merge #", index, " \"", line,
                                             "\" is not two tokens separated by a space"));
      }
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (!item.get_array().get(pair) && pair.size() == 2) {
      std::string_view a, b;
      if (pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b)) {
        return Invalid("model", absl::StrCat("merge #", index, " is not a pair of strings"));
      }
      merges.emplace_back(View(a), View(b));
    } else {
      return Invalid("model", absl::StrCat("merge #", index, " is neither \"a b\" nor [a, b]"));
    }
    ++index;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BpeModel>> ReadModel(element value) {
  simdjson::dom::object object;
  if (value.get_object().get(object)) return Invalid("model", "must be an object");
  std::string_view type;
  bool has_merges = false;
  for (simdjson::dom::key_value_pair field : object) has_merges |= field.key == "merges";
  if (!object["type"].get_string().get(type)) {
    if (type != "BPE") {
      return absl::InvalidArgumentError(absl::StrCat("unsupported model type ", View(type)));
    }
  } else if (!has_merges) {
    return absl::InvalidArgumentError("unsupported model type (no \"type\" and no \"merges\")");
  }

  BpeOptions options;
  std::vector<std::pair<absl::string_view, int32_t>> vocab;
  std::vector<std::pair<absl::string_view, absl::string_view>> merges;
  element merges_value;
  bool have_vocab = false;
  for (simdjson::dom::key_value_pair field : object) {
    const std::string_view key = field.key;
    element v = field.value;
    if (key == "vocab") {
      if (absl::Status s = ReadVocab(v, "tokenizer.json model", vocab); !s.ok()) return s;
      have_vocab = true;
    } else if (key == "merges") {
      merges_value = v;
    } else if (key == "dropout") {
      double dropout = 0;
      if (!v.is_null() && (v.get_double().get(dropout) || dropout != 0.0)) {
        return Invalid("model", absl::StrCat("BPE dropout ", simdjson::minify(v),
                                             " is not supported (only null or 0)"));
      }
    } else if (key == "unk_token") {
      options.unk_token = OptionalString(v);
    } else if (key == "continuing_subword_prefix") {
      options.continuing_subword_prefix = OptionalString(v).value_or("");
    } else if (key == "end_of_word_suffix") {
      options.end_of_word_suffix = OptionalString(v).value_or("");
    } else if (key == "fuse_unk") {
      options.fuse_unk = Bool(v, false);
    } else if (key == "byte_fallback") {
      options.byte_fallback = Bool(v, false);
    } else if (key == "ignore_merges") {
      options.ignore_merges = Bool(v, false);
    }
  }
  if (!have_vocab) return Invalid("model", "missing \"vocab\"");
  if (has_merges && !merges_value.is_null()) {
    absl::flat_hash_map<absl::string_view, int32_t> lookup;
    std::function<bool(absl::string_view)> in_vocab = [&](absl::string_view token) {
      if (lookup.empty()) lookup.insert(vocab.begin(), vocab.end());
      return lookup.contains(token);
    };
    if (absl::Status s = ReadMerges(merges_value, in_vocab, merges); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<BpeModel>> model =
      BpeModel::Create(vocab, merges, std::move(options));
  if (!model.ok()) return Invalid("model", model.status().message());
  return model;
}

absl::Status ReadAddedTokens(element value, std::vector<AddedToken>& tokens) {
  simdjson::dom::array array;
  if (value.is_null()) return absl::OkStatus();
  if (value.get_array().get(array)) return Invalid("added_tokens", "must be a list");
  for (element item : array) {
    simdjson::dom::object object;
    std::string_view content;
    if (item.get_object().get(object) || object["content"].get_string().get(content)) {
      return Invalid("added_tokens", "each entry needs a \"content\" string");
    }
    AddedToken token;
    token.content = std::string(content);
    int64_t id = -1;
    if (!object["id"].get_int64().get(id) && id >= 0 && id <= INT32_MAX) {
      token.id = static_cast<int32_t>(id);
    }
    token.special = FieldBool(object, "special", false);
    token.lstrip = FieldBool(object, "lstrip", false);
    token.rstrip = FieldBool(object, "rstrip", false);
    token.single_word = FieldBool(object, "single_word", false);
    token.normalized = FieldBool(object, "normalized", !token.special);
    tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

// Runs one of the component parsers on a sub-document, naming the component in errors.
template <typename T, typename Fn>
absl::StatusOr<std::unique_ptr<T>> ParseComponent(const json& spec, absl::string_view name,
                                                  Fn parse) {
  try {
    absl::StatusOr<std::unique_ptr<T>> result = parse(spec);
    if (!result.ok()) return Invalid(name, result.status().message());
    return result;
  } catch (const std::exception& e) {
    return Invalid(name, e.what());
  }
}

absl::Status BuildAddedVocabulary(const std::vector<AddedToken>& tokens, TokenizerParts& parts) {
  const BpeModel& model = *parts.model;
  absl::StatusOr<std::unique_ptr<AddedVocabulary>> added = AddedVocabulary::Create(
      tokens, [&model](absl::string_view token) { return model.TokenToId(token); },
      model.vocab_size(), parts.normalizer.get());
  if (!added.ok()) {  // a normalizer's regex failed on a token: keep its code
    return absl::Status(added.status().code(),
                        absl::StrCat("tokenizer.json added_tokens: ", added.status().message()));
  }
  parts.added = *std::move(added);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerParts> ParseTokenizerJson(absl::string_view text) {
  simdjson::dom::parser parser;
  std::string storage;
  absl::StatusOr<element> root = ParseDocument(parser, text, "tokenizer.json", storage);
  if (!root.ok()) return root.status();
  simdjson::dom::object object;
  if (root->get_object().get(object)) {
    return absl::InvalidArgumentError("tokenizer.json: the document is not an object");
  }

  TokenizerParts parts;
  std::vector<AddedToken> added_tokens;
  json normalizer_spec, pre_tokenizer_spec, post_processor_spec, decoder_spec;
  bool have_model = false;
  try {
    for (simdjson::dom::key_value_pair field : object) {
      const std::string_view key = field.key;
      if (key == "model") {
        absl::StatusOr<std::unique_ptr<BpeModel>> model = ReadModel(field.value);
        if (!model.ok()) return model.status();
        parts.model = *std::move(model);
        have_model = true;
      } else if (key == "added_tokens") {
        if (absl::Status s = ReadAddedTokens(field.value, added_tokens); !s.ok()) return s;
      } else if (key == "normalizer") {
        normalizer_spec = ToNlohmann(field.value);
      } else if (key == "pre_tokenizer") {
        pre_tokenizer_spec = ToNlohmann(field.value);
      } else if (key == "post_processor") {
        post_processor_spec = ToNlohmann(field.value);
      } else if (key == "decoder") {
        decoder_spec = ToNlohmann(field.value);
      } else if ((key == "truncation" || key == "padding") && !field.value.is_null()) {
        LOG(WARNING) << "tokenizer.json: \"" << key << "\" is ignored";
      }
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  if (!have_model) return absl::InvalidArgumentError("tokenizer.json: missing \"model\"");

  auto normalizer = ParseComponent<Normalizer>(normalizer_spec, "normalizer", ParseNormalizer);
  if (!normalizer.ok()) return normalizer.status();
  parts.normalizer = *std::move(normalizer);
  auto pre_tokenizer =
      ParseComponent<PreTokenizer>(pre_tokenizer_spec, "pre_tokenizer", ParsePreTokenizer);
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  parts.pre_tokenizer = *std::move(pre_tokenizer);
  auto decoder = ParseComponent<Decoder>(decoder_spec, "decoder", ParseDecoder);
  if (!decoder.ok()) return decoder.status();
  parts.decoder = *std::move(decoder);
  absl::StatusOr<SinglePostProcessor> post = ParsePostProcessor(post_processor_spec);
  if (!post.ok())
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", post.status().message()));
  parts.post_processor = *std::move(post);
  if (absl::Status s = BuildAddedVocabulary(added_tokens, parts); !s.ok()) return s;
  return parts;
}

absl::StatusOr<TokenizerParts> ParseGpt2Files(absl::string_view encoder_json,
                                              absl::string_view vocab_bpe) {
  simdjson::dom::parser parser;
  std::string storage;
  absl::StatusOr<element> root = ParseDocument(parser, encoder_json, "encoder.json", storage);
  if (!root.ok()) return root.status();
  std::vector<std::pair<absl::string_view, int32_t>> vocab;
  if (absl::Status s = ReadVocab(*root, "encoder.json", vocab); !s.ok()) return s;

  std::vector<std::pair<absl::string_view, absl::string_view>> merges;
  size_t line_number = 0;
  for (size_t pos = 0; pos < vocab_bpe.size();) {
    size_t end = vocab_bpe.find('\n', pos);
    if (end == absl::string_view::npos) end = vocab_bpe.size();
    absl::string_view line = vocab_bpe.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || absl::StartsWith(line, "#version")) continue;
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos || line.find(' ', space + 1) != line.npos) {
      return absl::InvalidArgumentError(absl::StrCat("vocab.bpe line ", line_number,
                                                     ": expected two tokens separated by a space"));
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }

  TokenizerParts parts;
  absl::StatusOr<std::unique_ptr<BpeModel>> model = BpeModel::Create(vocab, merges, BpeOptions{});
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("GPT-2 files: ", model.status().message()));
  }
  parts.model = *std::move(model);
  auto pre_tokenizer = ParseComponent<PreTokenizer>(json{{"type", "ByteLevel"},
                                                         {"add_prefix_space", false},
                                                         {"trim_offsets", true},
                                                         {"use_regex", true}},
                                                    "pre_tokenizer", ParsePreTokenizer);
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  parts.pre_tokenizer = *std::move(pre_tokenizer);
  auto decoder = ParseComponent<Decoder>(json{{"type", "ByteLevel"},
                                              {"add_prefix_space", true},
                                              {"trim_offsets", true},
                                              {"use_regex", true}},
                                         "decoder", ParseDecoder);
  if (!decoder.ok()) return decoder.status();
  parts.decoder = *std::move(decoder);
  std::vector<AddedToken> added;
  if (parts.model->TokenToId("<|endoftext|>").has_value()) {
    AddedToken eot;
    eot.content = "<|endoftext|>";
    eot.special = true;
    eot.normalized = false;
    added.push_back(eot);
  }
  if (absl::Status s = BuildAddedVocabulary(added, parts); !s.ok()) return s;
  return parts;
}

namespace {

std::optional<std::string> ConfigToken(const json& config, const char* field) {
  auto it = config.find(field);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

bool ConfigBool(const json& config, const char* field) {
  auto it = config.find(field);
  return it != config.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text) {
  TokenizerConfig config;
  if (text.empty()) return config;
  try {
    const json root = json::parse(text.begin(), text.end());
    if (!root.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: the document is not an object");
    }
    config.bos_token = ConfigToken(root, "bos_token");
    config.eos_token = ConfigToken(root, "eos_token");
    config.pad_token = ConfigToken(root, "pad_token");
    config.unk_token = ConfigToken(root, "unk_token");
    config.add_bos_token = ConfigBool(root, "add_bos_token");
    config.add_eos_token = ConfigBool(root, "add_eos_token");
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer_config.json: malformed JSON: ", e.what()));
  }
  return config;
}

absl::StatusOr<std::vector<int32_t>> ParseGenerationConfigEos(absl::string_view text) {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  try {
    const json root = json::parse(text.begin(), text.end());
    if (!root.is_object()) {
      return absl::InvalidArgumentError("generation_config.json: the document is not an object");
    }
    auto it = root.find("eos_token_id");
    if (it == root.end() || it->is_null()) return ids;
    auto add = [&ids](const json& value) -> absl::Status {
      if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
          value.get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("generation_config.json: eos_token_id ",
                                                       value.dump(), " is not a token id"));
      }
      ids.push_back(value.get<int32_t>());
      return absl::OkStatus();
    };
    if (it->is_array()) {
      for (const json& value : *it) {
        if (absl::Status s = add(value); !s.ok()) return s;
      }
    } else if (absl::Status s = add(*it); !s.ok()) {
      return s;
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation_config.json: malformed JSON: ", e.what()));
  }
  return ids;
}

}  // namespace kiln::tokenizer_internal
