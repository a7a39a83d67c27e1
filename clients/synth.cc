#include "clients/synth.h"

#include <cmath>
#include <fstream>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "clients/synth_tokenizer.h"
#include "loaders/safetensors_writer.h"
#include "models/manifest.h"

namespace kiln {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(absl::string_view name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a stable per-tensor stream id
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Element i of a tensor's N(mean, std²) stream: counter-based, so threads and order do not
// change the values.
void FillNormal(uint64_t stream, float mean, float std, int64_t n, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t pair = 0; pair < (n + 1) / 2; ++pair) {
    const uint64_t bits = SplitMix64(stream ^ SplitMix64(static_cast<uint64_t>(pair)));
    const double u1 = (static_cast<double>(bits >> 40) + 1.0) / 16777217.0;  // (0, 1]
    const double u2 = static_cast<double>(bits & 0xffffffu) / 16777216.0;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    out[2 * pair] = mean + std * static_cast<float>(radius * std::cos(angle));
    if (2 * pair + 1 < n)
      out[2 * pair + 1] = mean + std * static_cast<float>(radius * std::sin(angle));
  }
}

ModelConfig Base(Architecture arch, std::string name) {
  ModelConfig c;
  c.architecture = arch;
  c.architecture_name = std::move(name);
  return c;
}

}  // namespace

const std::vector<absl::string_view>& SynthPresets() {
  static const std::vector<absl::string_view> kPresets = {
      "kiln-tiny", "qwen2.5-0.5b", "llama-3.2-1b", "qwen3-0.6b", "mistral-tiny"};
  return kPresets;
}

absl::StatusOr<ModelConfig> SynthPresetConfig(absl::string_view preset) {
  ModelConfig c;
  if (preset == "kiln-tiny") {
    c = Base(Architecture::kLlama, "LlamaForCausalLM");
    c.hidden_size = 256, c.intermediate_size = 768, c.num_hidden_layers = 4;
    c.num_attention_heads = 8, c.num_key_value_heads = 2, c.head_dim = 32;
    c.vocab_size = 512, c.max_position_embeddings = 2048, c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0, c.eos_token_ids = {SynthEosTokenId(c.vocab_size)};
  } else if (preset == "qwen2.5-0.5b") {
    c = Base(Architecture::kQwen2, "Qwen2ForCausalLM");
    c.hidden_size = 896, c.intermediate_size = 4864, c.num_hidden_layers = 24;
    c.num_attention_heads = 14, c.num_key_value_heads = 2, c.head_dim = 64;
    c.vocab_size = 151936, c.max_position_embeddings = 32768, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0, c.tie_word_embeddings = true, c.qkv_bias = true;
    c.eos_token_ids = {151643};
  } else if (preset == "llama-3.2-1b") {
    c = Base(Architecture::kLlama, "LlamaForCausalLM");
    c.hidden_size = 2048, c.intermediate_size = 8192, c.num_hidden_layers = 16;
    c.num_attention_heads = 32, c.num_key_value_heads = 8, c.head_dim = 64;
    c.vocab_size = 128256, c.max_position_embeddings = 131072, c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000.0, c.tie_word_embeddings = true;
    c.rope_scaling = {.llama3 = true,
                      .factor = 32.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 8192.0};
    c.bos_token_id = 128000, c.eos_token_ids = {128001};
  } else if (preset == "qwen3-0.6b") {
    c = Base(Architecture::kQwen3, "Qwen3ForCausalLM");
    c.hidden_size = 1024, c.intermediate_size = 3072, c.num_hidden_layers = 28;
    c.num_attention_heads = 16, c.num_key_value_heads = 8, c.head_dim = 128;
    c.vocab_size = 151936, c.max_position_embeddings = 40960, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0, c.tie_word_embeddings = true, c.qk_norm = true;
  } else if (preset == "mistral-tiny") {
    c = Base(Architecture::kMistral, "MistralForCausalLM");
    c.hidden_size = 256, c.intermediate_size = 640, c.num_hidden_layers = 2;
    c.num_attention_heads = 8, c.num_key_value_heads = 4, c.head_dim = 32;
    c.vocab_size = 2048, c.max_position_embeddings = 4096, c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0, c.sliding_window = 4096;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown preset \"", preset, "\"; known: ", absl::StrJoin(SynthPresets(), ", ")));
  }
  return c;
}

absl::Status WriteSynthCheckpoint(const std::filesystem::path& dir, const ModelConfig& config,
                                  const SynthOptions& options) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", error.message()));
  }
  std::vector<ParamSpec> manifest = BuildParamManifest(config);
  // MTP heads (config.num_mtp_layers), DeepSeek style: model.layers.{L+k}.{enorm, hnorm,
  // eh_proj, shared_head.norm} and a decoder block under the same prefix.
  if (config.num_mtp_layers > 0) {
    ModelConfig extended = config;
    extended.num_hidden_layers += config.num_mtp_layers;
    for (ParamSpec& spec : BuildParamManifest(extended)) {
      if (spec.layer >= config.num_hidden_layers) manifest.push_back(std::move(spec));
    }
    for (int64_t k = 0; k < config.num_mtp_layers; ++k) {
      const std::string prefix = absl::StrCat("model.layers.", config.num_hidden_layers + k, ".");
      const int64_t h = config.hidden_size;
      const int64_t layer = config.num_hidden_layers + k;
      manifest.push_back({prefix + "enorm.weight", {h}, ParamRole::kInputNorm, layer});
      manifest.push_back({prefix + "hnorm.weight", {h}, ParamRole::kInputNorm, layer});
      manifest.push_back({prefix + "eh_proj.weight", {h, 2 * h}, ParamRole::kQ, layer});
      manifest.push_back({prefix + "shared_head.norm.weight", {h}, ParamRole::kFinalNorm, layer});
    }
  }
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorToWrite> tensors;
  std::vector<float> values;
  for (const ParamSpec& spec : manifest) {
    if (!spec.required) continue;  // a tied lm_head is not written
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    values.resize(static_cast<size_t>(n));
    const bool is_norm = spec.role == ParamRole::kInputNorm ||
                         spec.role == ParamRole::kPostAttentionNorm ||
                         spec.role == ParamRole::kFinalNorm || spec.role == ParamRole::kQNorm ||
                         spec.role == ParamRole::kKNorm;
    FillNormal(HashName(spec.name) ^ SplitMix64(options.seed), is_norm ? 1.0f : 0.0f, 0.02f, n,
               values.data());
    std::vector<std::byte>& bytes =
        storage.emplace_back(static_cast<size_t>(n) * DTypeSize(options.dtype));
    ConvertFromF32(options.dtype, values.data(), n, bytes.data());
    tensors.push_back({spec.name, options.dtype, spec.shape, bytes});
  }
  KILN_RETURN_IF_ERROR(WriteSafetensorsCheckpoint(dir, tensors, options.max_shard_bytes));

  ModelConfig written = config;
  written.torch_dtype = options.dtype == DType::kBF16  ? "bfloat16"
                        : options.dtype == DType::kF16 ? "float16"
                                                       : "float32";
  std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
  out << ModelConfigToJson(written);
  if (!out) {
    return absl::InternalError(absl::StrCat("cannot write ", (dir / "config.json").string()));
  }
  if (options.write_tokenizer && config.vocab_size <= kMaxSynthTokenizerVocab) {
    KILN_RETURN_IF_ERROR(WriteSynthTokenizer(dir, config.vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace kiln
