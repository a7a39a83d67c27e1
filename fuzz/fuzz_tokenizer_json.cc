// tokenizer.json load, then encode/decode: the input is tokenizer.json, optionally followed by
// tokenizer_config.json and generation_config.json (parts separated by kPartSeparator). A
// tokenizer that loads encodes a fixed text (ASCII, accents, emoji, its special tokens) and
// decodes every id of a small vocabulary, in whole and streamed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr absl::string_view kPartSeparator = "\n--kiln-file--\n";
constexpr absl::string_view kSampleText =
    "Hello world!  It's 1961, naïve café — 中文 😀\n\t<|endoftext|><s></s> hi";
constexpr int32_t kMaxDecodedVocab = 512;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<absl::string_view> parts =
      kiln::fuzz::SplitParts(kiln::fuzz::AsStringView(data, size), kPartSeparator);
  if (parts.size() > 3) return -1;
  parts.resize(3);
  absl::StatusOr<std::unique_ptr<kiln::Tokenizer>> tokenizer =
      kiln::Tokenizer::FromTokenizerJson(parts[0], parts[1], parts[2]);
  if (!tokenizer.ok()) return 0;
  const kiln::Tokenizer& tok = **tokenizer;

  for (bool add_special : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(kSampleText, add_special);
    if (ids.ok()) (void)tok.Decode(*ids, /*skip_special_tokens=*/!add_special);
  }
  std::vector<int32_t> all_ids(std::min(tok.vocab_size(), kMaxDecodedVocab));
  std::iota(all_ids.begin(), all_ids.end(), 0);
  (void)tok.Decode(all_ids, /*skip_special_tokens=*/false);
  (void)tok.DecodeBytes(all_ids, /*skip_special_tokens=*/true);
  kiln::StreamingDecoder stream(tok);
  for (int32_t id : all_ids) {
    (void)tok.IdToToken(id);
    (void)tok.IsSpecial(id);
    if (!stream.Push(id).ok()) break;
  }
  (void)stream.Finish();
  return 0;
}
