// A small byte-level BPE tokenizer for synthesized models, so that the default model takes text.
#pragma once

#include <cstdint>
#include <filesystem>

#include "absl/status/status.h"

namespace kiln {

// Writes tokenizer.json and tokenizer_config.json into `dir`: 256 byte tokens, BPE merges
// learned from a built-in English text, and the special tokens <|endoftext|> (the EOS),
// <|im_start|> and <|im_end|>, with a ChatML chat template in tokenizer_config.json; reserved
// special tokens fill the vocabulary up to `vocab_size` so that every id a model can produce
// decodes. Deterministic.
absl::Status WriteSynthTokenizer(const std::filesystem::path& dir, int64_t vocab_size);

// Id of <|endoftext|> in such a tokenizer.
int32_t SynthEosTokenId(int64_t vocab_size);

}  // namespace kiln
