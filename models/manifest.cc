#include "models/manifest.h"

#include "absl/strings/str_cat.h"

namespace kiln {

std::vector<ParamSpec> BuildParamManifest(const ModelConfig& c, WeightLayout layout) {
  const int64_t hidden = c.hidden_size;
  const bool fused = layout == WeightLayout::kEngine;
  std::vector<ParamSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}, ParamRole::kEmbedding});
  // A tied checkpoint may still ship lm_head.weight (a copy of the embedding); take it if so.
  specs.push_back(
      {"lm_head.weight", {c.vocab_size, hidden}, ParamRole::kLmHead, -1, !c.tie_word_embeddings});
  specs.push_back({"model.norm.weight", {hidden}, ParamRole::kFinalNorm});
  const int64_t qkv_rows = c.q_dim() + 2 * c.kv_dim();
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string prefix = absl::StrCat("model.layers.", layer, ".");
    auto add = [&](absl::string_view suffix, std::vector<int64_t> shape, ParamRole role) {
      specs.push_back({absl::StrCat(prefix, suffix), std::move(shape), role, layer});
    };
    add("input_layernorm.weight", {hidden}, ParamRole::kInputNorm);
    add("post_attention_layernorm.weight", {hidden}, ParamRole::kPostAttentionNorm);
    if (fused) {
      add("self_attn.qkv_proj.weight", {qkv_rows, hidden}, ParamRole::kQKV);
      if (c.qkv_bias) add("self_attn.qkv_proj.bias", {qkv_rows}, ParamRole::kQKVBias);
    } else {
      add("self_attn.q_proj.weight", {c.q_dim(), hidden}, ParamRole::kQ);
      add("self_attn.k_proj.weight", {c.kv_dim(), hidden}, ParamRole::kK);
      add("self_attn.v_proj.weight", {c.kv_dim(), hidden}, ParamRole::kV);
      if (c.qkv_bias) {
        add("self_attn.q_proj.bias", {c.q_dim()}, ParamRole::kQBias);
        add("self_attn.k_proj.bias", {c.kv_dim()}, ParamRole::kKBias);
        add("self_attn.v_proj.bias", {c.kv_dim()}, ParamRole::kVBias);
      }
    }
    add("self_attn.o_proj.weight", {hidden, c.q_dim()}, ParamRole::kO);
    if (c.o_proj_bias) add("self_attn.o_proj.bias", {hidden}, ParamRole::kOBias);
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", {c.head_dim}, ParamRole::kQNorm);
      add("self_attn.k_norm.weight", {c.head_dim}, ParamRole::kKNorm);
    }
    if (fused) {
      add("mlp.gate_up_proj.weight", {2 * c.intermediate_size, hidden}, ParamRole::kGateUp);
    } else {
      add("mlp.gate_proj.weight", {c.intermediate_size, hidden}, ParamRole::kGate);
      add("mlp.up_proj.weight", {c.intermediate_size, hidden}, ParamRole::kUp);
    }
    add("mlp.down_proj.weight", {hidden, c.intermediate_size}, ParamRole::kDown);
  }
  return specs;
}

}  // namespace kiln
