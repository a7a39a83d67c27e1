#include "clients/synth_tokenizer.h"

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/components.h"

namespace kiln {
namespace {

constexpr char kTrainingText[] =
    "kiln is a standalone inference server for large language models. It loads a checkpoint, "
    "packs the weights for the machine it runs on, and answers requests over gRPC. Each request "
    "carries a prompt; the server turns the prompt into tokens, runs the model over them, and "
    "streams the generated text back as it is produced. The model reads every token of the "
    "prompt in one batched step and then writes one token at a time, keeping the keys and values "
    "of earlier positions in a cache so that nothing is computed twice. Many requests share the "
    "same step: the engine gathers the tokens of all running sequences into one matrix "
    "multiplication, which is how a server keeps its processors busy. When a client goes away, "
    "its sequence stops at the next step and its cache is returned. The weights are read from "
    "safetensors or Tensorizer files, checked byte for byte, and packed once before the first "
    "forward pass. Speculative heads that predict several tokens ahead are found by accounting "
    "for every tensor in the checkpoint, not by guessing their names. Hello world! The quick "
    "brown fox jumps over the lazy dog. 0123456789 In the beginning there was a kiln, and the "
    "kiln was hot; potters brought their clay and the fire turned it into something that lasts.";

constexpr const char* kSpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// Words as the byte-level pre-tokenizer sees them: an optional leading space and a run of
// letters or digits, or single other characters, each mapped to the ByteLevel alphabet.
std::vector<std::vector<std::string>> Words() {
  const std::string text = kTrainingText;
  std::vector<std::vector<std::string>> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ') ++j;
    while (j < text.size() && std::isalnum(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i || (j == i + 1 && text[i] == ' ')) j = i + 1;
    std::vector<std::string> symbols;
    for (size_t k = i; k < j; ++k) {
      symbols.push_back(tokenizer_internal::ByteToUnicode()[static_cast<uint8_t>(text[k])]);
    }
    words.push_back(std::move(symbols));
    i = j;
  }
  return words;
}

}  // namespace

int32_t SynthEosTokenId(int64_t vocab_size) {
  return static_cast<int32_t>(vocab_size) - 3;  // the specials take the last three ids
}

absl::Status WriteSynthTokenizer(const std::filesystem::path& dir, int64_t vocab_size) {
  const int64_t specials = std::size(kSpecialTokens);
  if (vocab_size < 256 + specials) {
    return absl::InvalidArgumentError(
        absl::StrCat("a byte-level tokenizer needs a vocabulary of at least ", 256 + specials));
  }
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer_internal::ByteToUnicode()[b]] = b;
  int64_t next_id = 256;
  const int64_t merge_budget = vocab_size - 256 - specials;

  // Classic BPE training: merge the most frequent adjacent pair (ties: the smallest pair) until
  // the budget is spent or no pair occurs twice.
  std::vector<std::vector<std::string>> words = Words();
  nlohmann::json merges = nlohmann::json::array();
  while (next_id - 256 < merge_budget) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& word : words) {
      for (size_t k = 0; k + 1 < word.size(); ++k) ++counts[{word[k], word[k + 1]}];
    }
    auto best = counts.end();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (best == counts.end() || it->second > best->second) best = it;
    }
    if (best == counts.end() || best->second < 2) break;
    const auto [left, right] = best->first;
    const std::string merged = left + right;
    if (!vocab.contains(merged)) vocab[merged] = next_id++;
    merges.push_back(nlohmann::json::array({left, right}));
    for (auto& word : words) {
      std::vector<std::string> out;
      for (size_t k = 0; k < word.size(); ++k) {
        if (k + 1 < word.size() && word[k] == left && word[k + 1] == right) {
          out.push_back(merged);
          ++k;
        } else {
          out.push_back(word[k]);
        }
      }
      word = std::move(out);
    }
  }

  // Reserved tokens fill the gap so that every id below vocab_size decodes.
  nlohmann::json added = nlohmann::json::array();
  auto add_special = [&](const std::string& content, int64_t id) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  };
  for (int64_t reserved = 0; next_id < vocab_size - specials; ++reserved) {
    add_special(absl::StrCat("<|reserved_", reserved, "|>"), next_id++);
  }
  for (const char* special : kSpecialTokens) add_special(special, next_id++);

  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}};
  nlohmann::ordered_json tokenizer;
  tokenizer["version"] = "1.0";
  tokenizer["truncation"] = nullptr;
  tokenizer["padding"] = nullptr;
  tokenizer["added_tokens"] = added;
  tokenizer["normalizer"] = nullptr;
  tokenizer["pre_tokenizer"] = byte_level;
  tokenizer["post_processor"] = byte_level;
  tokenizer["decoder"] = byte_level;
  tokenizer["model"] = {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", vocab},
                        {"merges", merges}};
  // ChatML, as Qwen's models write it: the default model serves chat requests too.
  constexpr char kChatTemplate[] =
      "{%- for message in messages %}"
      "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + "
      "'<|im_end|>\\n' }}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  const nlohmann::json config = {{"bos_token", nullptr},
                                 {"eos_token", "<|endoftext|>"},
                                 {"pad_token", "<|endoftext|>"},
                                 {"add_bos_token", false},
                                 {"tokenizer_class", "PreTrainedTokenizerFast"},
                                 {"chat_template", kChatTemplate}};
  for (const auto& [name, text] : {std::pair{"tokenizer.json", tokenizer.dump()},
                                   std::pair{"tokenizer_config.json", config.dump(2)}}) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out << text << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", (dir / name).string()));
  }
  return absl::OkStatus();
}

}  // namespace kiln
