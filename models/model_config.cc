#include "models/model_config.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field \"", field, "\" ", what));
}

// Upper bounds far above any real model (hidden 16384, vocabulary 262144, 128 heads of 256,
// 126 layers, 10M positions) that keep the products the model is built from (q_dim, weight
// shapes, KV pool sizes) inside int64: a hostile config.json is refused here, not overflowed later.
constexpr int64_t kMaxDimension = int64_t{1} << 24;  // widths, heads, vocabulary
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxPositions = std::numeric_limits<int32_t>::max();

// Reads a positive integer field of at most `max`; `fallback` < 0 makes it required.
absl::StatusOr<int64_t> PositiveInt(const Json& json, absl::string_view field, int64_t fallback,
                                    int64_t max = kMaxDimension) {
  auto it = json.find(field);
  if (it == json.end() || it->is_null()) {
    if (fallback < 0) return FieldError(field, "is missing");
    return fallback;
  }
  if (!it->is_number_integer()) return FieldError(field, "must be an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) {
    return FieldError(field, absl::StrCat("must be at most ", max, ", got ", it->get<uint64_t>()));
  }
  int64_t value = it->get<int64_t>();
  if (value <= 0) return FieldError(field, absl::StrCat("must be positive, got ", value));
  if (value > max) return FieldError(field, absl::StrCat("must be at most ", max, ", got ", value));
  return value;
}

absl::StatusOr<double> PositiveNumber(const Json& json, absl::string_view field, double fallback) {
  auto it = json.find(field);
  if (it == json.end() || it->is_null()) return fallback;
  if (!it->is_number()) return FieldError(field, "must be a number");
  double value = it->get<double>();
  if (!(value > 0)) return FieldError(field, "must be positive");
  return value;
}

absl::StatusOr<bool> Bool(const Json& json, absl::string_view field, bool fallback) {
  auto it = json.find(field);
  if (it == json.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return FieldError(field, "must be true or false");
  return it->get<bool>();
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& json) {
  RopeScaling scaling;
  auto it = json.find("rope_scaling");
  if (it == json.end() || it->is_null()) return scaling;
  if (!it->is_object()) return FieldError("rope_scaling", "must be an object or null");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (auto t = it->find(key); t != it->end() && t->is_string()) type = t->get<std::string>();
  }
  if (type == "default") return scaling;
  if (type != "llama3") {
    return FieldError("rope_scaling",
                      absl::StrCat("has unsupported type \"", type, "\" (supported: llama3)"));
  }
  scaling.llama3 = true;
  auto number = [&](const char* key, double* out) -> absl::Status {
    auto v = it->find(key);
    if (v == it->end() || !v->is_number() || !(v->get<double>() > 0)) {
      return FieldError(absl::StrCat("rope_scaling.", key), "must be a positive number");
    }
    *out = v->get<double>();
    return absl::OkStatus();
  };
  for (auto [key, out] :
       {std::pair{"factor", &scaling.factor},
        std::pair{"low_freq_factor", &scaling.low_freq_factor},
        std::pair{"high_freq_factor", &scaling.high_freq_factor},
        std::pair{"original_max_position_embeddings", &scaling.original_max_position_embeddings}}) {
    if (absl::Status status = number(key, out); !status.ok()) return status;
  }
  if (scaling.high_freq_factor <= scaling.low_freq_factor) {
    return FieldError("rope_scaling", "needs high_freq_factor > low_freq_factor");
  }
  return scaling;
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& json, absl::string_view field) {
  std::vector<int32_t> ids;
  auto it = json.find(field);
  if (it == json.end() || it->is_null()) return ids;
  // A token id must be an int32 >= 0; get<int32_t> alone would wrap 4294967298 to 2.
  auto token_id = [&](const Json& id) -> absl::StatusOr<int32_t> {
    if (id.is_number_unsigned() &&
        id.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return id.get<int32_t>();
    }
    if (id.is_number_integer()) {
      return FieldError(field, absl::StrCat("holds ", id.dump(), ", not a token id in [0, 2^31)"));
    }
    return FieldError(field, "must hold integers");
  };
  if (it->is_number_integer()) {
    KILN_ASSIGN_OR_RETURN(int32_t id, token_id(*it));
    ids.push_back(id);
  } else if (it->is_array()) {
    for (const Json& element : *it) {
      KILN_ASSIGN_OR_RETURN(int32_t id, token_id(element));
      ids.push_back(id);
    }
  } else {
    return FieldError(field, "must be an integer or a list of integers");
  }
  return ids;
}

}  // namespace

const std::vector<absl::string_view>& SupportedArchitectures() {
  static const std::vector<absl::string_view> kNames = {"LlamaForCausalLM", "MistralForCausalLM",
                                                        "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
  return kNames;
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  Json json = Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("config.json is not valid JSON");
  if (!json.is_object()) return absl::InvalidArgumentError("config.json must be a JSON object");

  ModelConfig config;
  auto archs = json.find("architectures");
  if (archs == json.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return FieldError("architectures", "must be a non-empty list of names");
  }
  config.architecture_name = (*archs)[0].get<std::string>();
  if (config.architecture_name == "LlamaForCausalLM") {
    config.architecture = Architecture::kLlama;
  } else if (config.architecture_name == "MistralForCausalLM") {
    config.architecture = Architecture::kMistral;
  } else if (config.architecture_name == "Qwen2ForCausalLM") {
    config.architecture = Architecture::kQwen2;
  } else if (config.architecture_name == "Qwen3ForCausalLM") {
    config.architecture = Architecture::kQwen3;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported architecture \"", config.architecture_name,
                     "\"; supported: ", absl::StrJoin(SupportedArchitectures(), ", ")));
  }

  KILN_ASSIGN_OR_RETURN(config.hidden_size, PositiveInt(json, "hidden_size", -1));
  KILN_ASSIGN_OR_RETURN(config.intermediate_size, PositiveInt(json, "intermediate_size", -1));
  KILN_ASSIGN_OR_RETURN(config.num_hidden_layers,
                        PositiveInt(json, "num_hidden_layers", -1, kMaxLayers));
  KILN_ASSIGN_OR_RETURN(config.num_attention_heads, PositiveInt(json, "num_attention_heads", -1));
  KILN_ASSIGN_OR_RETURN(config.num_key_value_heads,
                        PositiveInt(json, "num_key_value_heads", config.num_attention_heads));
  KILN_ASSIGN_OR_RETURN(config.vocab_size, PositiveInt(json, "vocab_size", -1));
  if (config.hidden_size % config.num_attention_heads != 0 && !json.contains("head_dim")) {
    return FieldError("hidden_size", "must be divisible by num_attention_heads");
  }
  KILN_ASSIGN_OR_RETURN(
      config.head_dim,
      PositiveInt(json, "head_dim", config.hidden_size / config.num_attention_heads));
  if (config.head_dim % 2 != 0) return FieldError("head_dim", "must be even for rotary");
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return FieldError("num_key_value_heads", "must divide num_attention_heads");
  }
  // Both factors are at most kMaxDimension, so the product itself cannot overflow.
  if (config.q_dim() > kMaxDimension) {
    return FieldError("head_dim",
                      absl::StrCat("times num_attention_heads must be at most ", kMaxDimension,
                                   ", got ", config.head_dim, " x ", config.num_attention_heads));
  }
  KILN_ASSIGN_OR_RETURN(config.max_position_embeddings,
                        PositiveInt(json, "max_position_embeddings", 4096, kMaxPositions));
  KILN_ASSIGN_OR_RETURN(config.rms_norm_eps, PositiveNumber(json, "rms_norm_eps", 1e-6));
  KILN_ASSIGN_OR_RETURN(config.rope_theta, PositiveNumber(json, "rope_theta", 10000.0));
  KILN_ASSIGN_OR_RETURN(config.rope_scaling, ParseRopeScaling(json));
  KILN_ASSIGN_OR_RETURN(config.tie_word_embeddings, Bool(json, "tie_word_embeddings", false));

  bool attention_bias = false;
  KILN_ASSIGN_OR_RETURN(attention_bias, Bool(json, "attention_bias", false));
  bool mlp_bias = false;
  KILN_ASSIGN_OR_RETURN(mlp_bias, Bool(json, "mlp_bias", false));
  if (mlp_bias) return FieldError("mlp_bias", "true is not supported");
  switch (config.architecture) {
    case Architecture::kQwen2:
      config.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o_proj bias.
      break;
    case Architecture::kQwen3:
      config.qk_norm = true;
      [[fallthrough]];
    case Architecture::kLlama:
      config.qkv_bias = attention_bias;
      config.o_proj_bias = attention_bias;
      break;
    case Architecture::kMistral:
      break;
  }

  if (auto act = json.find("hidden_act"); act != json.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return FieldError("hidden_act", "must be \"silu\"");
    }
  }
  bool use_sliding_window = config.architecture == Architecture::kMistral;
  KILN_ASSIGN_OR_RETURN(use_sliding_window, Bool(json, "use_sliding_window", use_sliding_window));
  if (use_sliding_window) {
    KILN_ASSIGN_OR_RETURN(config.sliding_window,
                          PositiveInt(json, "sliding_window", 0, kMaxPositions));
  }
  if (auto dtype = json.find("torch_dtype"); dtype != json.end() && dtype->is_string()) {
    config.torch_dtype = dtype->get<std::string>();
  }
  KILN_ASSIGN_OR_RETURN(config.eos_token_ids, TokenIds(json, "eos_token_id"));
  std::vector<int32_t> bos;
  KILN_ASSIGN_OR_RETURN(bos, TokenIds(json, "bos_token_id"));
  if (!bos.empty()) config.bos_token_id = bos.front();
  for (const char* key : {"num_nextn_predict_layers", "mtp_num_hidden_layers"}) {
    auto it = json.find(key);
    if (it == json.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxLayers) {
      return FieldError(key, absl::StrCat("must be an integer in [0, ", kMaxLayers, "]"));
    }
    config.num_mtp_layers = std::max(config.num_mtp_layers, it->get<int64_t>());
  }
  return config;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& config) {
  Json json;
  json["architectures"] = {config.architecture_name};
  static constexpr absl::string_view kModelTypes[] = {"llama", "mistral", "qwen2", "qwen3"};
  json["model_type"] = kModelTypes[static_cast<int>(config.architecture)];
  json["hidden_size"] = config.hidden_size;
  json["intermediate_size"] = config.intermediate_size;
  json["num_hidden_layers"] = config.num_hidden_layers;
  json["num_attention_heads"] = config.num_attention_heads;
  json["num_key_value_heads"] = config.num_key_value_heads;
  json["head_dim"] = config.head_dim;
  json["vocab_size"] = config.vocab_size;
  json["max_position_embeddings"] = config.max_position_embeddings;
  json["rms_norm_eps"] = config.rms_norm_eps;
  json["rope_theta"] = config.rope_theta;
  if (config.rope_scaling.llama3) {
    json["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", config.rope_scaling.factor},
        {"low_freq_factor", config.rope_scaling.low_freq_factor},
        {"high_freq_factor", config.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", config.rope_scaling.original_max_position_embeddings}};
  } else {
    json["rope_scaling"] = nullptr;
  }
  json["hidden_act"] = "silu";
  json["tie_word_embeddings"] = config.tie_word_embeddings;
  if (config.architecture != Architecture::kQwen2 &&
      config.architecture != Architecture::kMistral) {
    json["attention_bias"] = config.qkv_bias;
  }
  if (config.sliding_window > 0) {
    json["use_sliding_window"] = true;
    json["sliding_window"] = config.sliding_window;
  } else if (config.architecture == Architecture::kMistral ||
             config.architecture == Architecture::kQwen2) {
    json["use_sliding_window"] = false;
    json["sliding_window"] = nullptr;
  }
  if (!config.torch_dtype.empty()) json["torch_dtype"] = config.torch_dtype;
  if (config.bos_token_id >= 0) json["bos_token_id"] = config.bos_token_id;
  if (config.eos_token_ids.size() == 1) {
    json["eos_token_id"] = config.eos_token_ids[0];
  } else if (!config.eos_token_ids.empty()) {
    json["eos_token_id"] = config.eos_token_ids;
  }
  if (config.num_mtp_layers > 0) json["num_nextn_predict_layers"] = config.num_mtp_layers;
  return json.dump(2) + "\n";
}

}  // namespace kiln
