// Encode/decode of fuzzed text with real tokenizers: kiln-brown's (byte-level BPE, GPT-2 style)
// and Mistral's (SentencePiece-style BPE with byte fallback), loaded once from the source tree.
// The first input byte picks the tokenizer and the flags; the rest is the text to encode, and
// read as little-endian int32 ids it is also decoded (in whole and streamed). Valid UTF-8 that
// encodes must decode back to the same text for the byte-level tokenizer.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

std::unique_ptr<kiln::Tokenizer> LoadOrDie(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<kiln::Tokenizer>> tokenizer =
      kiln::Tokenizer::FromDirectory(kiln::fuzz::SourcePath(dir));
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", dir.c_str(),
                 std::string(tokenizer.status().message()).c_str());
    std::abort();
  }
  return *std::move(tokenizer);
}

struct Tokenizers {
  std::unique_ptr<kiln::Tokenizer> byte_level = LoadOrDie("checkpoints/kiln-brown");
  std::unique_ptr<kiln::Tokenizer> sentencepiece = LoadOrDie("tests/data/tokenizers/mistral");
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizers tokenizers;
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const bool byte_level = (selector & 1) == 0;
  const bool add_special = (selector & 2) != 0;
  const bool skip_special = (selector & 4) != 0;
  const kiln::Tokenizer& tok = byte_level ? *tokenizers.byte_level : *tokenizers.sentencepiece;
  const absl::string_view text = kiln::fuzz::AsStringView(data + 1, size - 1);

  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, add_special);
  if (ids.ok()) {
    absl::StatusOr<std::string> decoded = tok.Decode(*ids, skip_special);
    if (!decoded.ok()) {
      std::fprintf(stderr, "ids from Encode do not decode: %s\n",
                   std::string(decoded.status().message()).c_str());
      __builtin_trap();
    }
    // Byte-level BPE without a normalizer loses nothing: decoding gives back the text.
    if (byte_level && !add_special && !skip_special && *decoded != text) {
      std::fprintf(stderr, "byte-level round trip changed the text\n");
      __builtin_trap();
    }
  }

  // The same bytes as ids (folded into a range around the vocabulary, so some are outside it).
  std::vector<int32_t> fuzzed_ids(text.size() / sizeof(int32_t));
  if (!fuzzed_ids.empty()) {
    std::memcpy(fuzzed_ids.data(), text.data(), fuzzed_ids.size() * sizeof(int32_t));
  }
  const int64_t range = int64_t{tok.vocab_size()} + 8;
  for (int32_t& id : fuzzed_ids)
    id = static_cast<int32_t>((int64_t{id} % range + range) % range) - 4;
  (void)tok.Decode(fuzzed_ids, skip_special);
  (void)tok.DecodeBytes(fuzzed_ids, skip_special);
  kiln::StreamingDecoder stream(tok, skip_special);
  for (int32_t id : fuzzed_ids) {
    if (!stream.Push(id).ok()) break;
  }
  (void)stream.Finish();
  return 0;
}
