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
