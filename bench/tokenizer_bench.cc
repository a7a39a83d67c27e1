// Tokenizer speed on one thread with Qwen3's tokenizer (tests/data/tokenizers/qwen3, an 11 MB
// tokenizer.json): load time, and encode / decode throughput over about 1 MB of mixed text built
// deterministically from the conformance corpus (prose, code, numbers, whitespace, CJK and other
// scripts, emoji...). Prints medians next to the goals:
//   load   ≤ 0.3 s          (Tokenizer::FromDirectory, reading the files included)
//   encode ≥ 10 MB/s        (bytes of text per second)
//   decode                  (bytes of text produced per second; no goal, reported alongside)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer_dir, KILN_SOURCE_DIR "/tests/data/tokenizers/qwen3",
          "model directory with tokenizer.json (+ tokenizer_config.json)");
ABSL_FLAG(std::string, corpus, KILN_SOURCE_DIR "/tests/data/tokenizers/corpus.json",
          "corpus.json whose strings make up the benchmark text");
ABSL_FLAG(int32_t, text_bytes, 1 << 20, "approximate size of the benchmark text");
ABSL_FLAG(int32_t, repeats, 5, "repetitions per measurement (the median is printed)");

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kLoadGoalSeconds = 0.3;
constexpr double kEncodeGoalMBps = 10.0;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The corpus strings, shuffled with a fixed seed and concatenated (newline-separated) until the
// text is at least `bytes` long. Fisher-Yates over mt19937's raw output, so the text is the same
// with every standard library.
std::string MixedText(const std::vector<std::string>& strings, size_t bytes) {
  std::mt19937 rng(20240601);
  std::string text;
  std::vector<size_t> order(strings.size());
  while (text.size() < bytes) {
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
    for (size_t i : order) {
      text += strings[i];
      text += '\n';
      if (text.size() >= bytes) break;
    }
  }
  return text;
}

const char* Verdict(bool met) { return met ? "ok" : "MISSED"; }

int Run() {
  const std::filesystem::path dir = absl::GetFlag(FLAGS_tokenizer_dir);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));

  // Load.
  std::vector<double> load_s;
  std::unique_ptr<Tokenizer> tokenizer;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::FromDirectory(dir);
    load_s.push_back(Seconds(start));
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), loaded.status().ToString().c_str());
      return 1;
    }
    tokenizer = *std::move(loaded);
  }
  std::error_code ec;
  const uintmax_t json_bytes = std::filesystem::file_size(dir / "tokenizer.json", ec);
  const double load = Median(load_s);
  std::printf("tokenizer                 %s (tokenizer.json %.1f MB, vocab %d)\n", dir.c_str(),
              ec ? 0.0 : json_bytes / 1e6, tokenizer->vocab_size());
  std::printf("load                      %8.3f s    goal <= %.1f s   %s   (median of %d)\n", load,
              kLoadGoalSeconds, Verdict(load <= kLoadGoalSeconds), repeats);

  // Text.
  const std::filesystem::path corpus_path = absl::GetFlag(FLAGS_corpus);
  const nlohmann::json corpus = nlohmann::json::parse(ReadFile(corpus_path), nullptr, false);
  if (corpus.is_discarded() || !corpus.contains("strings")) {
    std::fprintf(stderr, "cannot read %s\n", corpus_path.c_str());
    return 1;
  }
  std::vector<std::string> strings;
  for (const nlohmann::json& s : corpus["strings"])
    strings.push_back(s.at("text").get<std::string>());
  const std::string text =
      MixedText(strings, static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_text_bytes))));
  const double mb = text.size() / 1e6;

  // Encode (the whole text in one call).
  std::vector<double> encode_s;
  std::vector<int32_t> ids;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::vector<int32_t>> encoded = tokenizer->Encode(text, false);
    encode_s.push_back(Seconds(start));
    if (!encoded.ok()) {
      std::fprintf(stderr, "Encode: %s\n", encoded.status().ToString().c_str());
      return 1;
    }
    ids = *std::move(encoded);
  }
  const double encode = Median(encode_s);
  std::printf(
      "text                      %8.3f MB, %zu corpus strings shuffled, %zu tokens "
      "(%.2f bytes/token)\n",
      mb, strings.size(), ids.size(), ids.empty() ? 0.0 : text.size() * 1.0 / ids.size());
  std::printf("encode                    %8.2f MB/s goal >= %.0f MB/s  %s   (%.2f M tokens/s)\n",
              mb / encode, kEncodeGoalMBps, Verdict(mb / encode >= kEncodeGoalMBps),
              ids.size() / encode / 1e6);

  // Encode string by string (per-call overhead, as a server encodes many short prompts).
  std::vector<double> per_string_s;
  size_t per_string_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    per_string_bytes = 0;
    const Clock::time_point start = Clock::now();
    for (const std::string& s : strings) {
      absl::StatusOr<std::vector<int32_t>> encoded = tokenizer->Encode(s, true);
      if (!encoded.ok()) {
        std::fprintf(stderr, "Encode: %s\n", encoded.status().ToString().c_str());
        return 1;
      }
      per_string_bytes += s.size();
    }
    per_string_s.push_back(Seconds(start));
  }
  const double per_string = Median(per_string_s);
  std::printf("encode per string         %8.2f MB/s (%zu calls, %.1f us/call)\n",
              per_string_bytes / 1e6 / per_string, strings.size(),
              per_string / strings.size() * 1e6);

  // Decode (all ids in one call).
  std::vector<double> decode_s;
  size_t decoded_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<std::string> decoded = tokenizer->Decode(ids, false);
    decode_s.push_back(Seconds(start));
    if (!decoded.ok()) {
      std::fprintf(stderr, "Decode: %s\n", decoded.status().ToString().c_str());
      return 1;
    }
    decoded_bytes = decoded->size();
  }
  const double decode = Median(decode_s);
  std::printf("decode                    %8.2f MB/s (%.2f M tokens/s)\n",
              decoded_bytes / 1e6 / decode, ids.size() / decode / 1e6);

  // Streaming decode, one id at a time (what a server does while generating).
  std::vector<double> stream_s;
  size_t streamed_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    streamed_bytes = 0;
    const Clock::time_point start = Clock::now();
    StreamingDecoder decoder(*tokenizer, /*skip_special_tokens=*/false);
    for (int32_t id : ids) {
      absl::StatusOr<std::string> piece = decoder.Push(id);
      if (!piece.ok()) {
        std::fprintf(stderr, "StreamingDecoder: %s\n", piece.status().ToString().c_str());
        return 1;
      }
      streamed_bytes += piece->size();
    }
    streamed_bytes += decoder.Finish().size();
    stream_s.push_back(Seconds(start));
  }
  const double stream = Median(stream_s);
  std::printf("streaming decode          %8.2f MB/s (%.2f M tokens/s)\n",
              streamed_bytes / 1e6 / stream, ids.size() / stream / 1e6);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kiln::Run();
}
