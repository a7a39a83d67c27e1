// The independent reference forward pass for the tests: a slow, plain-libtorch transcription of
// the Hugging Face transformers forward of LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM and Qwen3ForCausalLM. It shares no code with kiln's kernels or models; kiln's
// forward is checked against it.
//
// Only the test binaries include this header (it pulls in <torch/types.h>, which is slow to
// compile; keep the number of translation units that include it small).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "models/model_config.h"

namespace kiln {

// Arithmetic of ReferenceLogits. kFloat32 matches transformers run in float32 (the weights are
// upcast to float32, whatever their stored dtype); kFloat64 does everything in double, for
// self-checks of the reference.
enum class ReferencePrecision { kFloat32, kFloat64 };

// Logits, float32 [token_ids.size(), vocab_size], for every position of one sequence that starts
// at position 0 (no BOS is added). `weights` uses the Hugging Face names (see RandomHfWeights).
// As in transformers, the config decides which weights are used: q/k/v biases with qkv_bias, the
// o_proj bias with o_proj_bias, q_norm/k_norm with qk_norm, lm_head.weight unless
// tie_word_embeddings (then lm_head is model.embed_tokens.weight); other entries are ignored.
// With sliding_window > 0 a query attends to at most that many keys (itself and earlier ones).
// Throws (c10::Error or std::invalid_argument) on a missing or mis-shaped weight, a bad config or
// an out-of-range id.
torch::Tensor ReferenceLogits(const ModelConfig& config,
                              const std::map<std::string, torch::Tensor>& weights,
                              const std::vector<int64_t>& token_ids,
                              ReferencePrecision precision = ReferencePrecision::kFloat32);

// The main model's last hidden states after the final norm (the input of the LM head), float32
// or float64 [token_ids.size(), hidden_size]: what MTP heads read as h_i. Same contract as
// ReferenceLogits.
torch::Tensor ReferenceFinalHidden(const ModelConfig& config,
                                   const std::map<std::string, torch::Tensor>& weights,
                                   const std::vector<int64_t>& token_ids,
                                   ReferencePrecision precision = ReferencePrecision::kFloat32);

// An MTP head by the names of its weights (docs/mtp.md). The decoder block is `config`'s
// architecture with its Hugging Face names under `block_prefix`.
struct ReferenceMtpHead {
  std::string embedding_norm;  // e.g. "model.layers.2.enorm.weight"
  std::string hidden_norm;     // e.g. "model.layers.2.hnorm.weight"
  std::string proj;            // [hidden, 2·hidden], e.g. "model.layers.2.eh_proj.weight"
  std::string final_norm;      // e.g. "model.layers.2.shared_head.norm.weight"
  std::string block_prefix;    // e.g. "model.layers.2."
  bool hidden_first = false;   // concat(hnorm(h), enorm(e)) (MiMo) instead of (enorm(e), hnorm(h))
  bool zero_embedding_at_start = true;  // e = 0 at position 0 (DeepSeek, GLM, MiMo)
  bool next_hidden_normed = false;      // next_hidden is h' after final_norm (Qwen3-Next, MiMo)
};

struct ReferenceMtpOutput {
  torch::Tensor logits;       // float32 [n, vocab]: lm_head(final_norm(h'))
  torch::Tensor next_hidden;  // float32 [n, hidden]: h' (after final_norm if next_hidden_normed)
};

// The MTP step of docs/mtp.md for one sequence at positions 0..n-1 in one causal pass:
//   e = Embed(token_ids[p]); x = proj(concat(enorm(e), hnorm(hidden[p]))); h' = block(x);
//   logits = lm_head(final_norm(h')), with the main model's embedding and lm_head.
// `hidden` is [n, hidden_size]. A second draft step at position n is the last row of a pass over
// n + 1 rows whose last hidden row is the first pass's next_hidden[n - 1].
ReferenceMtpOutput ReferenceMtpStep(const ModelConfig& config,
                                    const std::map<std::string, torch::Tensor>& weights,
                                    const ReferenceMtpHead& head,
                                    const std::vector<int64_t>& token_ids,
                                    const torch::Tensor& hidden,
                                    ReferencePrecision precision = ReferencePrecision::kFloat32);

// Adds deterministic random weights of `head` to `weights`: the block as RandomHfWeights makes a
// layer (renamed under block_prefix), the norms 1 + 0.1 N(0, 1), proj N(0, 1) / sqrt(2·hidden).
void AddRandomMtpWeights(const ModelConfig& config, const ReferenceMtpHead& head, uint64_t seed,
                         DType dtype, std::map<std::string, torch::Tensor>& weights);

// Deterministic random weights for `config`'s architecture, with the Hugging Face names and
// shapes, rounded to `dtype` (torch float32 / bfloat16 / float16), contiguous, on the CPU:
//   model.embed_tokens.weight [vocab, hidden]             N(0, 1), tied: N(0, 1) / sqrt(hidden)
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight [out, in]          N(0, 1) / sqrt(in)
//   model.layers.N.self_attn.{q,k,v}_proj.bias [out] (qkv_bias)       N(0, 0.5)
//   model.layers.N.self_attn.o_proj.bias [hidden] (o_proj_bias)       N(0, 0.5)
//   model.layers.N.self_attn.{q,k}_norm.weight [head_dim] (qk_norm)   1 + 0.3 N(0, 1)
//   model.layers.N.mlp.{gate,up,down}_proj.weight [out, in]           N(0, 1) / sqrt(in)
//   model.layers.N.{input,post_attention}_layernorm.weight, model.norm.weight   1 + 0.1 N(0, 1)
//   lm_head.weight [vocab, hidden] (absent when tie_word_embeddings)  N(0, 1) / sqrt(hidden)
// With qk_norm, q_proj and k_proj are scaled by 3 so that a forward that skips the q/k norms is
// far off. The logits come out O(1) (standard deviation about 1 over the vocabulary).
std::map<std::string, torch::Tensor> RandomHfWeights(const ModelConfig& config, uint64_t seed,
                                                     DType dtype);

// A Hugging Face checkpoint directory: config.json (kiln::ModelConfigToJson) plus the tensors via
// kiln::WriteSafetensorsCheckpoint (sharded above `max_shard_bytes`). Creates `dir` if needed.
// Tensors must be float32, bfloat16 or float16 CPU tensors.
absl::Status WriteHfCheckpoint(const std::filesystem::path& dir, const ModelConfig& config,
                               const std::map<std::string, torch::Tensor>& weights,
                               uint64_t max_shard_bytes);

// torch dtype <-> kiln::DType (float32, bfloat16, float16 only).
torch::ScalarType TorchDType(DType dtype);
absl::StatusOr<DType> KilnDType(torch::ScalarType dtype);

// A raw little-endian float32 file of rows × cols values (e.g. expected_logits_fp32.f32) as a
// float32 [rows, cols] tensor. Fails unless the file holds exactly that many bytes.
absl::StatusOr<torch::Tensor> LoadF32File(const std::filesystem::path& path, int64_t rows,
                                          int64_t cols);

// max |a - b| over all elements, computed in double (a and b must have the same shape).
double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace kiln
