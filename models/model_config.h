// The architecture description read from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "models/rope.h"

namespace kiln {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as spelled in config.json, e.g. "Qwen2ForCausalLM"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;       // q/k/v projection biases (Qwen2; Llama/Qwen3 attention_bias)
  bool o_proj_bias = false;    // o_proj bias (Llama/Qwen3 attention_bias)
  int64_t sliding_window = 0;  // 0 = none; sequences are capped at this length otherwise
  bool qk_norm = false;        // per-head RMSNorm of q and k before rotary (Qwen3)
  std::string torch_dtype;     // informational
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;
  // MTP (multi-token prediction) layers the checkpoint advertises: num_nextn_predict_layers
  // (DeepSeek-V3, GLM, Qwen3-Next, MiMo) or mtp_num_hidden_layers (Qwen3.5); 0 if absent.
  int64_t num_mtp_layers = 0;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Names accepted in config.json's "architectures".
const std::vector<absl::string_view>& SupportedArchitectures();

// Parses config.json text; errors name the field at fault (or list the supported architectures).
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);
absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path);

// Hugging Face config.json text for `config` (what `kiln synth` and the tests write).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace kiln
