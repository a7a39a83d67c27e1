// Deterministic random-weight checkpoints of real model shapes (`kiln synth`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "models/model_config.h"

namespace kiln {

// Named shapes: "kiln-tiny" (the embedded default: 512-token byte-level vocabulary),
// "qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b", "mistral-tiny".
const std::vector<absl::string_view>& SynthPresets();
absl::StatusOr<ModelConfig> SynthPresetConfig(absl::string_view preset);

struct SynthOptions {
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  uint64_t max_shard_bytes = uint64_t{1} << 30;  // shard above 1 GiB
  // Also write a byte-level BPE tokenizer (clients/synth_tokenizer.h) covering the vocabulary,
  // for vocabularies up to kMaxSynthTokenizerVocab.
  bool write_tokenizer = true;
};
inline constexpr int64_t kMaxSynthTokenizerVocab = 65536;

// Writes config.json and safetensors weights into `dir` (created if needed). Linear weights and
// embeddings ~ N(0, 0.02²), biases ~ N(0, 0.02²), norm weights ~ 1 + N(0, 0.02²): small enough
// that activations stay finite at any depth. The same options give the same bytes on any machine.
// config.num_mtp_layers > 0 adds that many DeepSeek-style MTP heads (model.layers.{L+k}.*).
absl::Status WriteSynthCheckpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                  const SynthOptions& options);

}  // namespace kiln
