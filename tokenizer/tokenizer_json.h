// Reading the files of a tokenizer (internal to tokenizer/): tokenizer.json (simdjson for the
// large vocabulary, merges and added tokens; the small component specs go to the Parse*
// functions as nlohmann::json), the legacy GPT-2 encoder.json + vocab.bpe pair,
// tokenizer_config.json and generation_config.json.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/components.h"
#include "tokenizer/post_processor.h"

namespace kiln::tokenizer_internal {

// Everything a tokenizer is made of; any component but the model and the added vocabulary may
// be null (absent from the file).
struct TokenizerParts {
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<AddedVocabulary> added;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  SinglePostProcessor post_processor;
};

// Errors say which part of the file is wrong (malformed JSON with its position, the unknown
// model or component type, the merge that names a missing token, ...).
absl::StatusOr<TokenizerParts> ParseTokenizerJson(absl::string_view text);

// encoder.json (token -> id) and vocab.bpe ("#version" header, then one "a b" merge a line):
// byte-level BPE with GPT-2's split regex and <|endoftext|> as a special added token.
absl::StatusOr<TokenizerParts> ParseGpt2Files(absl::string_view encoder_json,
                                              absl::string_view vocab_bpe);

// The parts of tokenizer_config.json a server uses. Token fields may be a string or an
// {"content": ...} object; absent or null fields stay unset.
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  bool add_bos_token = false;
  bool add_eos_token = false;
};
// Empty text gives the defaults.
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text);

// generation_config.json's eos_token_id (an int or a list of ints); empty when absent or when
// the text is empty.
absl::StatusOr<std::vector<int32_t>> ParseGenerationConfigEos(absl::string_view text);

}  // namespace kiln::tokenizer_internal
