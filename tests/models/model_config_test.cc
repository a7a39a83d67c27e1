#include "models/model_config.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

nlohmann::json LlamaJson() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"vocab_size", 256},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"hidden_act", "silu"},
          {"eos_token_id", 2}};
}

absl::StatusOr<ModelConfig> Parse(const nlohmann::json& json) {
  return ParseModelConfig(json.dump());
}

TEST(ModelConfigTest, ParsesLlamaWithDefaults) {
  absl::StatusOr<ModelConfig> config = Parse(LlamaJson());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, Architecture::kLlama);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_FALSE(config->rope_scaling.llama3);
  EXPECT_EQ(config->eos_token_ids, std::vector<int32_t>{2});
}

TEST(ModelConfigTest, ArchitectureFeatures) {
  nlohmann::json json = LlamaJson();
  json["architectures"] = {"Qwen2ForCausalLM"};
  ASSERT_TRUE(Parse(json).ok());
  EXPECT_TRUE(Parse(json)->qkv_bias);
  EXPECT_FALSE(Parse(json)->o_proj_bias);

  json["architectures"] = {"Qwen3ForCausalLM"};
  json["head_dim"] = 32;
  ASSERT_TRUE(Parse(json).ok());
  EXPECT_TRUE(Parse(json)->qk_norm);
  EXPECT_EQ(Parse(json)->head_dim, 32);
  EXPECT_EQ(Parse(json)->q_dim(), 128);

  json["architectures"] = {"MistralForCausalLM"};
  json["sliding_window"] = 4096;
  ASSERT_TRUE(Parse(json).ok());
  EXPECT_EQ(Parse(json)->sliding_window, 4096);
  json["sliding_window"] = nullptr;
  EXPECT_EQ(Parse(json)->sliding_window, 0);
}

TEST(ModelConfigTest, Llama3RopeScaling) {
  nlohmann::json json = LlamaJson();
  json["rope_scaling"] = {{"rope_type", "llama3"},
                          {"factor", 32.0},
                          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  absl::StatusOr<ModelConfig> config = Parse(json);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->rope_scaling.llama3);
  EXPECT_EQ(config->rope_scaling.factor, 32.0);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 8192.0);

  json["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(std::string(Parse(json).status().message()).find("yarn"), std::string::npos);
  json["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_NE(std::string(Parse(json).status().message()).find("low_freq_factor"), std::string::npos);
}

TEST(ModelConfigTest, UnknownArchitectureListsSupported) {
  nlohmann::json json = LlamaJson();
  json["architectures"] = {"GPT2LMHeadModel"};
  absl::Status status = Parse(json).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_NE(message.find("GPT2LMHeadModel"), std::string::npos);
  for (absl::string_view name : SupportedArchitectures()) {
    EXPECT_NE(message.find(std::string(name)), std::string::npos) << name;
  }
}

TEST(ModelConfigTest, BadFieldsAreNamed) {
  struct Case {
    const char* field;
    nlohmann::json value;
  };
  const Case cases[] = {
      {"hidden_size", nullptr},   {"hidden_size", -64},   {"num_hidden_layers", "2"},
      {"num_key_value_heads", 3}, {"head_dim", 15},       {"rms_norm_eps", -1.0},
      {"tie_word_embeddings", 1}, {"hidden_act", "gelu"}, {"mlp_bias", true},
      {"eos_token_id", "x"},      {"vocab_size", 0},      {"rope_theta", "big"},
  };
  for (const Case& c : cases) {
    nlohmann::json json = LlamaJson();
    json[c.field] = c.value;
    absl::Status status = Parse(json).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(status.message()).find(c.field), std::string::npos)
        << c.field << ": " << status.message();
  }
  EXPECT_FALSE(ParseModelConfig("{not json").ok());
  EXPECT_FALSE(ParseModelConfig("[1, 2]").ok());
  EXPECT_FALSE(ReadModelConfig("/nonexistent/config.json").ok());
}

TEST(ModelConfigTest, JsonRoundTrip) {
  for (const char* arch :
       {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    nlohmann::json json = LlamaJson();
    json["architectures"] = {arch};
    json["tie_word_embeddings"] = true;
    json["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}};
    absl::StatusOr<ModelConfig> first = Parse(json);
    ASSERT_TRUE(first.ok()) << first.status();
    absl::StatusOr<ModelConfig> second = ParseModelConfig(ModelConfigToJson(*first));
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->architecture, first->architecture);
    EXPECT_EQ(second->head_dim, first->head_dim);
    EXPECT_EQ(second->qkv_bias, first->qkv_bias);
    EXPECT_EQ(second->qk_norm, first->qk_norm);
    EXPECT_EQ(second->tie_word_embeddings, true);
    EXPECT_EQ(second->rope_scaling.llama3, true);
    EXPECT_EQ(second->rope_scaling.original_max_position_embeddings, 64.0);
    EXPECT_EQ(second->eos_token_ids, first->eos_token_ids);
  }
}

// Found by fuzz/fuzz_model_config.cc: sizes no model has made q_dim() (heads x head_dim) overflow
// int64, and token ids past int32 wrapped around. Each is refused naming the field.
TEST(ModelConfigTest, AbsurdSizesAreRefused) {
  auto error = [](const nlohmann::json& json) {
    return std::string(Parse(json).status().message());
  };
  nlohmann::json json = LlamaJson();
  json["num_attention_heads"] = 4294967296;
  json["num_key_value_heads"] = 1;
  json["head_dim"] = 4294967296;
  EXPECT_NE(error(json).find("\"num_attention_heads\" must be at most 16777216"), std::string::npos)
      << error(json);

  json = LlamaJson();
  json["num_attention_heads"] = 65536;
  json["num_key_value_heads"] = 1;
  json["head_dim"] = 65536;
  EXPECT_NE(error(json).find("\"head_dim\" times num_attention_heads must be at most"),
            std::string::npos)
      << error(json);

  for (const char* field : {"hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers",
                            "max_position_embeddings"}) {
    json = LlamaJson();
    json[field] = std::numeric_limits<uint64_t>::max();
    EXPECT_NE(error(json).find(absl::StrCat("\"", field, "\" must be at most")), std::string::npos)
        << field << ": " << error(json);
  }

  json = LlamaJson();
  json["eos_token_id"] = {2, 4294967298};
  EXPECT_NE(error(json).find("\"eos_token_id\" holds 4294967298"), std::string::npos)
      << error(json);
  json["eos_token_id"] = -1;
  EXPECT_FALSE(Parse(json).ok());

  // The largest values allowed still parse.
  json = LlamaJson();
  json["hidden_size"] = 16777216;
  json["num_attention_heads"] = 4096;
  json["num_key_value_heads"] = 4096;
  json["max_position_embeddings"] = 2147483647;
  EXPECT_TRUE(Parse(json).ok()) << error(json);
}

}  // namespace
}  // namespace kiln
