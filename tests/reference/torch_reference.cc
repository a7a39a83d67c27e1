#include "tests/reference/torch_reference.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <limits>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "loaders/safetensors_writer.h"
#include "models/model_config.h"

namespace kiln {
namespace {

using Weights = std::map<std::string, torch::Tensor>;

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

std::string ShapeString(torch::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

// The weights of one forward, upcast to the compute dtype, with their shapes checked.
class WeightGetter {
 public:
  WeightGetter(const Weights& weights, torch::ScalarType dtype)
      : weights_(weights), dtype_(dtype) {}

  torch::Tensor Get(const std::string& name, std::vector<int64_t> shape) const {
    auto it = weights_.find(name);
    if (it == weights_.end())
      throw std::invalid_argument("ReferenceLogits: missing weight " + name);
    return Checked(name, it->second, shape);
  }

 private:
  torch::Tensor Checked(const std::string& name, const torch::Tensor& t,
                        const std::vector<int64_t>& shape) const {
    if (t.sizes() != torch::IntArrayRef(shape)) {
      throw std::invalid_argument(absl::StrCat("ReferenceLogits: ", name, " has shape ",
                                               ShapeString(t.sizes()), ", expected ",
                                               ShapeString(shape)));
    }
    return t.to(torch::kCPU).to(dtype_);
  }

  const Weights& weights_;
  torch::ScalarType dtype_;
};

// x · rsqrt(mean(x²) + eps) · w over the last dimension (transformers' LlamaRMSNorm).
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return w * (x * torch::rsqrt(variance + eps));
}

// nn.Linear: x Wᵀ (+ b when the config says the layer has a bias, as transformers builds it).
torch::Tensor Linear(const WeightGetter& w, const std::string& prefix, const torch::Tensor& x,
                     int64_t out_features, int64_t in_features, bool bias) {
  torch::Tensor y = torch::matmul(x, w.Get(prefix + ".weight", {out_features, in_features}).t());
  if (bias) y = y + w.Get(prefix + ".bias", {out_features});
  return y;
}

// inv_freq exactly as transformers' _compute_default_rope_parameters and, for rope_type "llama3",
// _compute_llama3_parameters (Python's `s / t` on a tensor is reciprocal(t) * s).
torch::Tensor InvFreq(const ModelConfig& config, torch::ScalarType dtype) {
  const int64_t dim = config.head_dim;
  torch::Tensor exponent =
      torch::arange(0, dim, 2, torch::kLong).to(dtype) / static_cast<double>(dim);
  torch::Tensor inv_freq = torch::pow(config.rope_theta, exponent).reciprocal();
  const RopeScaling& s = config.rope_scaling;
  if (!s.llama3) return inv_freq;
  const double low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  torch::Tensor wavelen = inv_freq.reciprocal() * (2 * std::numbers::pi);
  torch::Tensor inv_freq_llama =
      torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  torch::Tensor smooth_factor =
      (wavelen.reciprocal() * s.original_max_position_embeddings - s.low_freq_factor) /
      (s.high_freq_factor - s.low_freq_factor);
  torch::Tensor smoothed_inv_freq =
      (1 - smooth_factor) * inv_freq_llama / s.factor + smooth_factor * inv_freq_llama;
  torch::Tensor is_medium_freq = torch::logical_not(wavelen < high_freq_wavelen) *
                                 torch::logical_not(wavelen > low_freq_wavelen);
  return torch::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
}

// cat(-x[..., d/2:], x[..., :d/2]).
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

void CheckConfig(const ModelConfig& c) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("ReferenceLogits: bad config: " + what);
  };
  if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers < 0 ||
      c.vocab_size <= 0) {
    fail("sizes must be positive");
  }
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    fail("num_attention_heads must be a positive multiple of num_key_value_heads");
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) fail("head_dim must be positive and even");
}

// Rotary tables and the attention mask of one sequence at positions 0..n-1.
struct SequenceTables {
  torch::Tensor cos, sin;  // [n, 1, head_dim]
  torch::Tensor masked;    // [n, n], true where a query must not see a key
};

SequenceTables MakeTables(const ModelConfig& config, int64_t n, torch::ScalarType dt) {
  SequenceTables t;
  // cos/sin of cat(freqs, freqs).
  torch::Tensor positions = torch::arange(n, torch::kLong).to(dt);
  torch::Tensor freqs = torch::outer(positions, InvFreq(config, dt));
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  t.cos = emb.cos().unsqueeze(1);
  t.sin = emb.sin().unsqueeze(1);
  // Masked: keys after the query and, with a sliding window, keys at query - window or earlier
  // (transformers' sliding_window_overlay: a query sees at most `sliding_window` keys).
  t.masked = torch::ones({n, n}, torch::kBool).triu(/*diagonal=*/1);
  if (config.sliding_window > 0) {
    t.masked = t.masked.logical_or(
        torch::ones({n, n}, torch::kBool).tril(/*diagonal=*/-config.sliding_window));
  }
  return t;
}

// One decoder layer (attention + MLP with residuals) whose weights are named `p` + the Hugging
// Face names, e.g. p = "model.layers.3.".
torch::Tensor DecoderLayer(const ModelConfig& config, const WeightGetter& w, const std::string& p,
                           torch::Tensor x, const SequenceTables& tables) {
  const int64_t n = x.size(0);
  const int64_t hidden = config.hidden_size;
  const int64_t heads = config.num_attention_heads;
  const int64_t kv_heads = config.num_key_value_heads;
  const int64_t head_dim = config.head_dim;
  const int64_t inter = config.intermediate_size;
  const double eps = config.rms_norm_eps;
  const double scaling = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int64_t group = heads / kv_heads;

  torch::Tensor h = RmsNorm(x, w.Get(p + "input_layernorm.weight", {hidden}), eps);
  const bool bias = config.qkv_bias;
  torch::Tensor q = Linear(w, p + "self_attn.q_proj", h, heads * head_dim, hidden, bias)
                        .view({n, heads, head_dim});
  torch::Tensor k = Linear(w, p + "self_attn.k_proj", h, kv_heads * head_dim, hidden, bias)
                        .view({n, kv_heads, head_dim});
  torch::Tensor v = Linear(w, p + "self_attn.v_proj", h, kv_heads * head_dim, hidden, bias)
                        .view({n, kv_heads, head_dim});
  if (config.qk_norm) {
    q = RmsNorm(q, w.Get(p + "self_attn.q_norm.weight", {head_dim}), eps);
    k = RmsNorm(k, w.Get(p + "self_attn.k_norm.weight", {head_dim}), eps);
  }
  q = q * tables.cos + RotateHalf(q) * tables.sin;
  k = k * tables.cos + RotateHalf(k) * tables.sin;

  // [heads, n, head_dim]; query head j reads kv head j / group (transformers' repeat_kv).
  q = q.transpose(0, 1);
  k = k.transpose(0, 1).repeat_interleave(group, 0);
  v = v.transpose(0, 1).repeat_interleave(group, 0);
  torch::Tensor scores = torch::matmul(q, k.transpose(1, 2)) * scaling;  // [heads, n, n]
  scores = scores.masked_fill(tables.masked, -std::numeric_limits<double>::infinity());
  torch::Tensor probs = torch::softmax(scores, -1);
  torch::Tensor attn = torch::matmul(probs, v).transpose(0, 1).reshape({n, heads * head_dim});
  x = x + Linear(w, p + "self_attn.o_proj", attn, hidden, heads * head_dim, config.o_proj_bias);

  h = RmsNorm(x, w.Get(p + "post_attention_layernorm.weight", {hidden}), eps);
  torch::Tensor gate = Linear(w, p + "mlp.gate_proj", h, inter, hidden, false);
  torch::Tensor up = Linear(w, p + "mlp.up_proj", h, inter, hidden, false);
  return x + Linear(w, p + "mlp.down_proj", torch::silu(gate) * up, hidden, inter, false);
}

torch::Tensor LmHead(const ModelConfig& config, const WeightGetter& w) {
  const std::string name =
      config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  return w.Get(name, {config.vocab_size, config.hidden_size});
}

void CheckIds(const ModelConfig& config, const std::vector<int64_t>& token_ids) {
  for (int64_t id : token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      throw std::invalid_argument(absl::StrCat("ReferenceLogits: token id ", id, " out of range"));
    }
  }
}

torch::ScalarType ComputeType(ReferencePrecision precision) {
  return precision == ReferencePrecision::kFloat64 ? torch::kDouble : torch::kFloat;
}

}  // namespace

torch::Tensor ReferenceFinalHidden(const ModelConfig& config, const Weights& weights,
                                   const std::vector<int64_t>& token_ids,
                                   ReferencePrecision precision) {
  CheckConfig(config);
  CheckIds(config, token_ids);
  const torch::ScalarType dt = ComputeType(precision);
  const WeightGetter w(weights, dt);
  const int64_t n = static_cast<int64_t>(token_ids.size());
  torch::Tensor embed = w.Get("model.embed_tokens.weight", {config.vocab_size, config.hidden_size});
  torch::Tensor ids = torch::tensor(std::vector<int64_t>(token_ids), torch::kLong);
  torch::Tensor x = embed.index_select(0, ids);  // [n, hidden]
  const SequenceTables tables = MakeTables(config, n, dt);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    x = DecoderLayer(config, w, LayerPrefix(layer), x, tables);
  }
  return RmsNorm(x, w.Get("model.norm.weight", {config.hidden_size}), config.rms_norm_eps);
}

torch::Tensor ReferenceLogits(const ModelConfig& config, const Weights& weights,
                              const std::vector<int64_t>& token_ids, ReferencePrecision precision) {
  torch::Tensor x = ReferenceFinalHidden(config, weights, token_ids, precision);
  const WeightGetter w(weights, ComputeType(precision));
  return torch::matmul(x, LmHead(config, w).t()).to(torch::kFloat).contiguous();
}

ReferenceMtpOutput ReferenceMtpStep(const ModelConfig& config, const Weights& weights,
                                    const ReferenceMtpHead& head,
                                    const std::vector<int64_t>& token_ids,
                                    const torch::Tensor& hidden, ReferencePrecision precision) {
  CheckConfig(config);
  CheckIds(config, token_ids);
  const torch::ScalarType dt = ComputeType(precision);
  const WeightGetter w(weights, dt);
  const int64_t n = static_cast<int64_t>(token_ids.size());
  const int64_t hsize = config.hidden_size;
  const double eps = config.rms_norm_eps;
  if (hidden.sizes() != torch::IntArrayRef({n, hsize})) {
    throw std::invalid_argument("ReferenceMtpStep: hidden has shape " +
                                ShapeString(hidden.sizes()) + ", expected " +
                                ShapeString({n, hsize}));
  }
  torch::Tensor embed = w.Get("model.embed_tokens.weight", {config.vocab_size, hsize});
  torch::Tensor ids = torch::tensor(std::vector<int64_t>(token_ids), torch::kLong);
  torch::Tensor e = embed.index_select(0, ids);  // [n, hidden]
  if (head.zero_embedding_at_start && n > 0) e[0].zero_();
  torch::Tensor e_normed = RmsNorm(e, w.Get(head.embedding_norm, {hsize}), eps);
  torch::Tensor h_normed = RmsNorm(hidden.to(dt), w.Get(head.hidden_norm, {hsize}), eps);
  torch::Tensor joined = head.hidden_first ? torch::cat({h_normed, e_normed}, -1)
                                           : torch::cat({e_normed, h_normed}, -1);
  torch::Tensor x = torch::matmul(joined, w.Get(head.proj, {hsize, 2 * hsize}).t());
  x = DecoderLayer(config, w, head.block_prefix, x, MakeTables(config, n, dt));
  torch::Tensor normed = RmsNorm(x, w.Get(head.final_norm, {hsize}), eps);
  ReferenceMtpOutput out;
  out.logits = torch::matmul(normed, LmHead(config, w).t()).to(torch::kFloat).contiguous();
  out.next_hidden = (head.next_hidden_normed ? normed : x).to(torch::kFloat).contiguous();
  return out;
}

void AddRandomMtpWeights(const ModelConfig& config, const ReferenceMtpHead& head, uint64_t seed,
                         DType dtype, std::map<std::string, torch::Tensor>& weights) {
  ModelConfig one = config;
  one.num_hidden_layers = 1;
  const std::string layer0 = LayerPrefix(0);
  for (auto& [name, tensor] : RandomHfWeights(one, seed, dtype)) {
    if (name.rfind(layer0, 0) == 0)
      weights[head.block_prefix + name.substr(layer0.size())] = tensor;
  }
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  const int64_t h = config.hidden_size;
  auto make = [&](std::vector<int64_t> shape, double stddev, double mean) {
    return (torch::randn(shape, gen, torch::kFloat) * stddev + mean)
        .to(TorchDType(dtype))
        .contiguous();
  };
  weights[head.embedding_norm] = make({h}, 0.1, 1.0);
  weights[head.hidden_norm] = make({h}, 0.1, 1.0);
  weights[head.proj] = make({h, 2 * h}, 1.0 / std::sqrt(2.0 * static_cast<double>(h)), 0.0);
  weights[head.final_norm] = make({h}, 0.1, 1.0);
}

std::map<std::string, torch::Tensor> RandomHfWeights(const ModelConfig& config, uint64_t seed,
                                                     DType dtype) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const torch::ScalarType out_dtype = TorchDType(dtype);
  const int64_t hidden = config.hidden_size;
  const int64_t q_dim = config.num_attention_heads * config.head_dim;
  const int64_t kv_dim = config.num_key_value_heads * config.head_dim;
  const int64_t inter = config.intermediate_size;
  Weights out;
  // Generated in a fixed order from one generator, so a seed always gives the same tensors.
  auto normal = [&](std::vector<int64_t> shape, double stddev, double mean) {
    torch::Tensor t = torch::randn(shape, gen, torch::kFloat) * stddev + mean;
    return t.to(out_dtype).contiguous();
  };
  auto linear = [&](const std::string& name, int64_t out_f, int64_t in_f, double gain = 1.0) {
    out[name + ".weight"] = normal({out_f, in_f}, gain / std::sqrt(static_cast<double>(in_f)), 0);
  };
  auto norm = [&](const std::string& name, int64_t size, double spread = 0.1) {
    out[name] = normal({size}, spread, 1.0);
  };

  // A tied embedding is also the lm_head, so it gets the lm_head's scale.
  const double embed_std =
      config.tie_word_embeddings ? 1.0 / std::sqrt(static_cast<double>(hidden)) : 1.0;
  out["model.embed_tokens.weight"] = normal({config.vocab_size, hidden}, embed_std, 0.0);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string p = LayerPrefix(layer);
    const double qk_gain = config.qk_norm ? 3.0 : 1.0;
    linear(p + "self_attn.q_proj", q_dim, hidden, qk_gain);
    linear(p + "self_attn.k_proj", kv_dim, hidden, qk_gain);
    linear(p + "self_attn.v_proj", kv_dim, hidden);
    linear(p + "self_attn.o_proj", hidden, q_dim);
    if (config.qkv_bias) {
      out[p + "self_attn.q_proj.bias"] = normal({q_dim}, 0.5, 0.0);
      out[p + "self_attn.k_proj.bias"] = normal({kv_dim}, 0.5, 0.0);
      out[p + "self_attn.v_proj.bias"] = normal({kv_dim}, 0.5, 0.0);
    }
    if (config.o_proj_bias) out[p + "self_attn.o_proj.bias"] = normal({hidden}, 0.5, 0.0);
    if (config.qk_norm) {
      norm(p + "self_attn.q_norm.weight", config.head_dim, 0.3);
      norm(p + "self_attn.k_norm.weight", config.head_dim, 0.3);
    }
    linear(p + "mlp.gate_proj", inter, hidden);
    linear(p + "mlp.up_proj", inter, hidden);
    linear(p + "mlp.down_proj", hidden, inter);
    norm(p + "input_layernorm.weight", hidden);
    norm(p + "post_attention_layernorm.weight", hidden);
  }
  norm("model.norm.weight", hidden);
  if (!config.tie_word_embeddings) linear("lm_head", config.vocab_size, hidden);
  return out;
}

absl::Status WriteHfCheckpoint(const std::filesystem::path& dir, const ModelConfig& config,
                               const Weights& weights, uint64_t max_shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", dir.string(), ": ", ec.message()));
  {
    const std::filesystem::path config_path = dir / "config.json";
    std::ofstream file(config_path, std::ios::binary | std::ios::trunc);
    file << ModelConfigToJson(config);
    file.close();
    if (!file) return absl::InternalError("writing " + config_path.string());
  }
  std::vector<torch::Tensor> keep_alive;  // contiguous copies the spans point into
  std::vector<TensorToWrite> tensors;
  keep_alive.reserve(weights.size());
  tensors.reserve(weights.size());
  for (const auto& [name, tensor] : weights) {
    if (!tensor.defined() || tensor.device().type() != torch::kCPU) {
      return absl::InvalidArgumentError("WriteHfCheckpoint: " + name + " is not a CPU tensor");
    }
    absl::StatusOr<DType> dtype = KilnDType(tensor.scalar_type());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteHfCheckpoint: ", name, ": ", dtype.status().message()));
    }
    const torch::Tensor& data = keep_alive.emplace_back(tensor.contiguous());
    TensorToWrite t;
    t.name = name;
    t.dtype = *dtype;
    t.shape = data.sizes().vec();
    t.data =
        std::span<const std::byte>(static_cast<const std::byte*>(data.data_ptr()), data.nbytes());
    tensors.push_back(std::move(t));
  }
  return WriteSafetensorsCheckpoint(dir, tensors, max_shard_bytes);
}

torch::ScalarType TorchDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return torch::kFloat;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kF16:
      return torch::kHalf;
  }
  throw std::invalid_argument("TorchDType: unknown kiln::DType");
}

absl::StatusOr<DType> KilnDType(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat:
      return DType::kF32;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kHalf:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("torch dtype ", c10::toString(dtype), " has no kiln::DType"));
  }
}

absl::StatusOr<torch::Tensor> LoadF32File(const std::filesystem::path& path, int64_t rows,
                                          int64_t cols) {
  static_assert(std::endian::native == std::endian::little, "the .f32 files are little-endian");
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError("cannot open " + path.string());
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  const uintmax_t expected = static_cast<uintmax_t>(rows * cols) * sizeof(float);
  if (ec || size != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " holds ", ec ? 0 : size, " bytes, expected ", expected));
  }
  torch::Tensor out = torch::empty({rows, cols}, torch::kFloat);
  file.read(static_cast<char*>(out.data_ptr()), static_cast<std::streamsize>(expected));
  if (!file) return absl::DataLossError("short read from " + path.string());
  return out;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) {
    throw std::invalid_argument("MaxAbsDiff: shapes " + ShapeString(a.sizes()) + " and " +
                                ShapeString(b.sizes()) + " differ");
  }
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace kiln
