// Self-checks of the torch reference forward: it reproduces the committed transformers logits of
// the tiny Llama fixture, and it agrees with a second, deliberately different implementation
// (token-by-token with a KV cache, explicit per-head loops in double, pairwise rotary) on rotary
// scaling, GQA, biases, q/k norms, odd head_dim and tied embeddings.
#include "tests/reference/torch_reference.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "models/model_config.h"

namespace kiln {
namespace {

using Weights = std::map<std::string, torch::Tensor>;
namespace fs = std::filesystem;

fs::path FixtureDir() { return fs::path(KILN_TEST_DATA_DIR) / "llama_tiny"; }

// ---- A minimal safetensors reader, written from the format description (not kiln's loader):
// 8-byte LE header length, JSON header {name: {dtype, shape, data_offsets}}, then the data.
absl::StatusOr<Weights> ReadSafetensorsFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError("cannot open " + path.string());
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) return absl::DataLossError(path.string() + ": too short");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > bytes.size() - 8) return absl::DataLossError(path.string() + ": bad header");
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  const size_t data_start = 8 + header_len;
  Weights out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string dtype_name = info.at("dtype").get<std::string>();
    torch::ScalarType dtype;
    if (dtype_name == "F32") {
      dtype = torch::kFloat;
    } else if (dtype_name == "BF16") {
      dtype = torch::kBFloat16;
    } else if (dtype_name == "F16") {
      dtype = torch::kHalf;
    } else {
      return absl::UnimplementedError(name + ": dtype " + dtype_name);
    }
    const std::vector<int64_t> shape = info.at("shape").get<std::vector<int64_t>>();
    const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
    torch::Tensor t = torch::empty(shape, dtype);
    if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] - offsets[0] != t.nbytes() ||
        data_start + offsets[1] > bytes.size()) {
      return absl::DataLossError(path.string() + ": bad data_offsets for " + name);
    }
    if (t.nbytes() > 0)
      std::memcpy(t.data_ptr(), bytes.data() + data_start + offsets[0], t.nbytes());
    out.emplace(name, std::move(t));
  }
  return out;
}

// model.safetensors, or the shards named by model.safetensors.index.json.
absl::StatusOr<Weights> ReadSafetensorsCheckpoint(const fs::path& dir) {
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!fs::exists(index_path)) return ReadSafetensorsFile(dir / "model.safetensors");
  std::ifstream index_file(index_path);
  const nlohmann::json index = nlohmann::json::parse(index_file);
  const auto weight_map = index.at("weight_map").get<std::map<std::string, std::string>>();
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) shards.insert(shard);
  Weights out;
  for (const std::string& shard : shards) {
    absl::StatusOr<Weights> part = ReadSafetensorsFile(dir / shard);
    if (!part.ok()) return part.status();
    for (auto& [name, t] : *part) {
      auto it = weight_map.find(name);
      if (it == weight_map.end() || it->second != shard) {
        return absl::DataLossError(name + " in " + shard + " but not indexed there");
      }
      out.emplace(name, std::move(t));
    }
  }
  if (out.size() != weight_map.size()) return absl::DataLossError("index names missing tensors");
  return out;
}

ModelConfig TinyLlamaConfig() {  // tests/data/llama_tiny/config.json, by hand
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 256;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  c.torch_dtype = "float32";
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

const std::vector<int64_t> kFixtureIds = {1, 2, 3, 4, 5};

Weights LoadFixtureWeights() {
  absl::StatusOr<Weights> weights = ReadSafetensorsFile(FixtureDir() / "model.safetensors");
  EXPECT_TRUE(weights.ok()) << weights.status();
  return weights.ok() ? *weights : Weights{};
}

torch::Tensor LoadExpected(const std::string& file) {
  absl::StatusOr<torch::Tensor> t = LoadF32File(FixtureDir() / file, 5, 256);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : torch::zeros({5, 256});
}

TEST(TorchReferenceFixture, MatchesTransformersFp32Logits) {
  const Weights weights = LoadFixtureWeights();
  ASSERT_EQ(weights.size(), 21u);
  for (const auto& [name, t] : weights) EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
  const torch::Tensor expected = LoadExpected("expected_logits_fp32.f32");
  const torch::Tensor logits = ReferenceLogits(TinyLlamaConfig(), weights, kFixtureIds);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);
  const double diff = MaxAbsDiff(logits, expected);
  std::cout << "fixture fp32: max |reference - transformers| = " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
  const torch::Tensor argmax = logits.argmax(-1);
  const std::vector<int64_t> expected_argmax = {12, 131, 168, 193, 4};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(argmax[i].item<int64_t>(), expected_argmax[i]);
}

TEST(TorchReferenceFixture, MatchesTransformersOnBf16RoundedWeights) {
  Weights weights = LoadFixtureWeights();
  for (auto& [name, t] : weights) t = t.to(torch::kBFloat16);
  const torch::Tensor expected = LoadExpected("expected_logits_bf16_weights.f32");
  const double diff =
      MaxAbsDiff(ReferenceLogits(TinyLlamaConfig(), weights, kFixtureIds), expected);
  std::cout << "fixture bf16 weights: max |reference - transformers| = " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
  // The rounding is visible at this tolerance, so the check above is not vacuous.
  EXPECT_GT(MaxAbsDiff(expected, LoadExpected("expected_logits_fp32.f32")), 1e-3);
}

TEST(TorchReferenceFixture, DoublePrecisionAgrees) {
  const Weights weights = LoadFixtureWeights();
  const torch::Tensor f32 = ReferenceLogits(TinyLlamaConfig(), weights, kFixtureIds);
  const torch::Tensor f64 =
      ReferenceLogits(TinyLlamaConfig(), weights, kFixtureIds, ReferencePrecision::kFloat64);
  EXPECT_EQ(f64.scalar_type(), torch::kFloat);
  EXPECT_LE(MaxAbsDiff(f32, f64), 1e-5);
  EXPECT_LE(MaxAbsDiff(f64, LoadExpected("expected_logits_fp32.f32")), 1e-4);
}

// ---- The independent implementation: one token at a time against a growing KV cache, explicit
// per-head loops in double, rotary as rotations of the pairs (i, i + d/2).
enum class Mutation { kNone, kInterleavedRope, kGqaModulo, kNoRopeScaling };

struct Dense {
  std::vector<double> v;
  explicit Dense(const torch::Tensor& t) {
    const torch::Tensor d = t.to(torch::kDouble).contiguous();
    v.assign(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
};

class LoopModel {
 public:
  LoopModel(const ModelConfig& c, const Weights& w) : c_(c) {
    for (const auto& [name, t] : w) w_.emplace(name, Dense(t));
  }

  std::vector<std::vector<double>> Run(const std::vector<int64_t>& ids, Mutation m) const {
    const int64_t hidden = c_.hidden_size, d = c_.head_dim, kvh = c_.num_key_value_heads;
    const std::vector<double> inv_freq = InvFreq(m);
    // cache[layer][kv head][position] = head_dim values
    std::vector<std::vector<std::vector<std::vector<double>>>> k_cache(
        c_.num_hidden_layers, std::vector<std::vector<std::vector<double>>>(kvh));
    auto v_cache = k_cache;
    std::vector<std::vector<double>> logits;
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const std::vector<double>& embed = W("model.embed_tokens.weight");
      std::vector<double> x(embed.begin() + ids[pos] * hidden,
                            embed.begin() + (ids[pos] + 1) * hidden);
      for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
        const std::string p = "model.layers." + std::to_string(layer) + ".";
        std::vector<double> h = Norm(x, W(p + "input_layernorm.weight"));
        std::vector<double> q = Affine(p + "self_attn.q_proj", h);
        std::vector<double> k = Affine(p + "self_attn.k_proj", h);
        std::vector<double> v = Affine(p + "self_attn.v_proj", h);
        for (int64_t head = 0; head < c_.num_attention_heads; ++head) {
          Rotate(q.data() + head * d, p + "self_attn.q_norm.weight", pos, inv_freq, m);
        }
        for (int64_t g = 0; g < kvh; ++g) {
          Rotate(k.data() + g * d, p + "self_attn.k_norm.weight", pos, inv_freq, m);
          k_cache[layer][g].emplace_back(k.begin() + g * d, k.begin() + (g + 1) * d);
          v_cache[layer][g].emplace_back(v.begin() + g * d, v.begin() + (g + 1) * d);
        }
        std::vector<double> attn(c_.num_attention_heads * d, 0.0);
        const int64_t group = c_.num_attention_heads / kvh;
        for (int64_t head = 0; head < c_.num_attention_heads; ++head) {
          const int64_t g = m == Mutation::kGqaModulo ? head % kvh : head / group;
          std::vector<double> scores(pos + 1, -std::numeric_limits<double>::infinity());
          for (size_t u = 0; u <= pos; ++u) {
            if (c_.sliding_window > 0 && pos - u >= static_cast<size_t>(c_.sliding_window))
              continue;
            double dot = 0;
            for (int64_t i = 0; i < d; ++i) dot += q[head * d + i] * k_cache[layer][g][u][i];
            scores[u] = dot / std::sqrt(static_cast<double>(d));
          }
          const double top = *std::max_element(scores.begin(), scores.end());
          double total = 0;
          for (double& s : scores) total += (s = std::exp(s - top));
          for (size_t u = 0; u <= pos; ++u) {
            for (int64_t i = 0; i < d; ++i) {
              attn[head * d + i] += scores[u] / total * v_cache[layer][g][u][i];
            }
          }
        }
        Add(x, Affine(p + "self_attn.o_proj", attn));
        h = Norm(x, W(p + "post_attention_layernorm.weight"));
        std::vector<double> gate = Affine(p + "mlp.gate_proj", h);
        const std::vector<double> up = Affine(p + "mlp.up_proj", h);
        for (size_t i = 0; i < gate.size(); ++i)
          gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
        Add(x, Affine(p + "mlp.down_proj", gate));
      }
      x = Norm(x, W("model.norm.weight"));
      logits.push_back(Affine(c_.tie_word_embeddings ? "model.embed_tokens" : "lm_head", x));
    }
    return logits;
  }

 private:
  const std::vector<double>& W(const std::string& name) const { return w_.at(name).v; }

  // W x (+ b), W stored [out, in] row-major.
  std::vector<double> Affine(const std::string& prefix, const std::vector<double>& x) const {
    const std::vector<double>& w = W(prefix + ".weight");
    const size_t out = w.size() / x.size();
    std::vector<double> y(out, 0.0);
    for (size_t o = 0; o < out; ++o) {
      for (size_t i = 0; i < x.size(); ++i) y[o] += w[o * x.size() + i] * x[i];
    }
    auto bias = w_.find(prefix + ".bias");
    if (bias != w_.end()) Add(y, bias->second.v);
    return y;
  }

  std::vector<double> Norm(std::vector<double> x, const std::vector<double>& w) const {
    double sum_sq = 0;
    for (double e : x) sum_sq += e * e;
    const double r = 1.0 / std::sqrt(sum_sq / static_cast<double>(x.size()) + c_.rms_norm_eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= r * w[i];
    return x;
  }

  static void Add(std::vector<double>& y, const std::vector<double>& x) {
    for (size_t i = 0; i < y.size(); ++i) y[i] += x[i];
  }

  // Optional per-head norm, then rotary at `pos` of one head in place.
  void Rotate(double* x, const std::string& norm_name, size_t pos,
              const std::vector<double>& inv_freq, Mutation m) const {
    const int64_t d = c_.head_dim, half = d / 2;
    if (c_.qk_norm) {
      std::vector<double> normed = Norm(std::vector<double>(x, x + d), W(norm_name));
      std::copy(normed.begin(), normed.end(), x);
    }
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[i];
      const int64_t a = m == Mutation::kInterleavedRope ? 2 * i : i;
      const int64_t b = m == Mutation::kInterleavedRope ? 2 * i + 1 : i + half;
      const double xa = x[a], xb = x[b];
      x[a] = xa * std::cos(angle) - xb * std::sin(angle);
      x[b] = xb * std::cos(angle) + xa * std::sin(angle);
    }
  }

  // Meta's Llama 3.1 apply_scaling, written from its piecewise definition.
  std::vector<double> InvFreq(Mutation m) const {
    const RopeScaling& s = c_.rope_scaling;
    std::vector<double> out;
    for (int64_t i = 0; i < c_.head_dim / 2; ++i) {
      double f =
          std::pow(c_.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c_.head_dim));
      if (s.llama3 && m != Mutation::kNoRopeScaling) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > s.original_max_position_embeddings / s.low_freq_factor) {
          f /= s.factor;
        } else if (wavelen >= s.original_max_position_embeddings / s.high_freq_factor) {
          const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                                (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      out.push_back(f);
    }
    return out;
  }

  ModelConfig c_;
  std::map<std::string, Dense> w_;
};

torch::Tensor ToTensor(const std::vector<std::vector<double>>& rows) {
  torch::Tensor t = torch::empty(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.empty() ? 0 : rows[0].size())},
      torch::kDouble);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), t.data_ptr<double>() + r * rows[r].size());
  }
  return t;
}

struct Case {
  std::string name;
  Architecture arch;
  int64_t hidden, heads, kv_heads, head_dim;
  bool tied = false;
  bool llama3 = false;
  bool attention_bias = false;  // config.json attention_bias: q/k/v and o_proj biases
  int64_t sliding_window = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ModelConfig CaseConfig(const Case& k) {
  ModelConfig c;
  c.architecture = k.arch;
  c.architecture_name = k.arch == Architecture::kLlama     ? "LlamaForCausalLM"
                        : k.arch == Architecture::kMistral ? "MistralForCausalLM"
                        : k.arch == Architecture::kQwen2   ? "Qwen2ForCausalLM"
                                                           : "Qwen3ForCausalLM";
  c.hidden_size = k.hidden;
  c.intermediate_size = 2 * k.hidden + 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = k.heads;
  c.num_key_value_heads = k.kv_heads;
  c.head_dim = k.head_dim;
  c.vocab_size = 96;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = k.arch == Architecture::kLlama ? 1e-5 : 1e-6;
  c.rope_theta = k.arch == Architecture::kQwen2 || k.arch == Architecture::kQwen3 ? 1e6 : 1e4;
  c.tie_word_embeddings = k.tied;
  c.qkv_bias = k.arch == Architecture::kQwen2 || k.attention_bias;
  c.o_proj_bias = k.attention_bias;
  c.sliding_window = k.sliding_window;
  c.qk_norm = k.arch == Architecture::kQwen3;
  if (k.llama3) {
    // With theta 500 and original_max_position_embeddings 64, a head_dim-16 head has two
    // frequencies in the kept band (wavelength < 16), one in the smoothed band (29.5, smooth
    // factor 0.39) and five in the divided band, which still turn visibly over 13 positions.
    c.rope_theta = 500;
    c.rope_scaling = {.llama3 = true,
                      .factor = 8,
                      .low_freq_factor = 1,
                      .high_freq_factor = 4,
                      .original_max_position_embeddings = 64};
  }
  return c;
}

const std::vector<int64_t> kCaseIds = {3, 17, 95, 0, 42, 42, 7, 63, 88, 1, 50, 29, 11};

class CrossCheck : public ::testing::TestWithParam<Case> {};

TEST_P(CrossCheck, ReferenceMatchesLoopImplementation) {
  const ModelConfig config = CaseConfig(GetParam());
  const Weights weights = RandomHfWeights(config, 1234, DType::kF32);
  const torch::Tensor reference = ReferenceLogits(config, weights, kCaseIds);
  const torch::Tensor loops = ToTensor(LoopModel(config, weights).Run(kCaseIds, Mutation::kNone));
  ASSERT_EQ(reference.sizes(), loops.sizes());
  EXPECT_TRUE(torch::isfinite(reference).all().item<bool>());
  const double diff = MaxAbsDiff(reference, loops);
  // The float64 reference still returns float32, so it differs by float32 rounding (~1e-6).
  const double diff64 =
      MaxAbsDiff(ReferenceLogits(config, weights, kCaseIds, ReferencePrecision::kFloat64), loops);
  std::cout << GetParam().name << ": max |reference - loops| float32 " << diff << ", float64 "
            << diff64 << ", max |logit| " << reference.abs().max().item<float>() << "\n";
  EXPECT_LE(diff, 1e-5);
  EXPECT_LE(diff64, 2e-6);
  // Logits are O(1) and spread out, as RandomHfWeights promises.
  const double stddev = reference.to(torch::kDouble).std().item<double>();
  EXPECT_GT(stddev, 0.3);
  EXPECT_LT(stddev, 3.0);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, CrossCheck,
    ::testing::Values(
        Case{"llama_gqa2_llama3_rope", Architecture::kLlama, 48, 4, 2, 16, false, true},
        Case{"llama_gqa4_tied_llama3", Architecture::kLlama, 32, 8, 2, 16, true, true},
        Case{"llama_attention_bias", Architecture::kLlama, 32, 4, 2, 8, false, false, true},
        Case{"mistral_mha_tied", Architecture::kMistral, 32, 4, 4, 8, true},
        Case{"mistral_sliding_window", Architecture::kMistral, 32, 4, 2, 8, false, false, false, 5},
        Case{"qwen2_bias_gqa4", Architecture::kQwen2, 40, 8, 2, 8, true},
        Case{"qwen2_bias_mha_untied", Architecture::kQwen2, 24, 2, 2, 16},
        Case{"qwen3_qknorm_gqa2_tied", Architecture::kQwen3, 32, 4, 2, 16, true},
        Case{"qwen3_qknorm_gqa4", Architecture::kQwen3, 48, 4, 1, 24}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Every feature changes the logits by far more than the tolerances used to compare kiln's forward
// with the reference, so a forward that skips or botches one cannot pass.
TEST(TorchReferenceSensitivity, FeaturesMoveLogitsFarBeyondTolerance) {
  auto check = [](const std::string& what, const torch::Tensor& a, const torch::Tensor& b) {
    const double effect = MaxAbsDiff(a, b);
    std::cout << "effect of " << what << ": max |delta logits| = " << effect << "\n";
    EXPECT_GT(effect, 0.25) << what;
  };
  const ModelConfig llama = CaseConfig({"", Architecture::kLlama, 48, 4, 2, 16, false, true});
  const Weights lw = RandomHfWeights(llama, 7, DType::kF32);
  const torch::Tensor lref = ReferenceLogits(llama, lw, kCaseIds);
  const LoopModel loops(llama, lw);
  check("interleaved (GPT-J) rotary", lref,
        ToTensor(loops.Run(kCaseIds, Mutation::kInterleavedRope)));
  check("kv head j % kv_heads", lref, ToTensor(loops.Run(kCaseIds, Mutation::kGqaModulo)));
  check("no llama3 rope scaling", lref, ToTensor(loops.Run(kCaseIds, Mutation::kNoRopeScaling)));

  const ModelConfig qwen2 = CaseConfig({"", Architecture::kQwen2, 40, 8, 2, 8, true});
  Weights qw = RandomHfWeights(qwen2, 7, DType::kF32);
  const torch::Tensor qref = ReferenceLogits(qwen2, qw, kCaseIds);
  for (auto& [name, t] : qw) {
    if (name.ends_with(".bias")) t = torch::zeros_like(t);
  }
  check("no q/k/v biases", qref, ReferenceLogits(qwen2, qw, kCaseIds));

  ModelConfig llama_bias = CaseConfig({"", Architecture::kLlama, 32, 4, 2, 8, false, false, true});
  const Weights bw = RandomHfWeights(llama_bias, 7, DType::kF32);
  const torch::Tensor bref = ReferenceLogits(llama_bias, bw, kCaseIds);
  llama_bias.o_proj_bias = false;
  check("no o_proj bias", bref, ReferenceLogits(llama_bias, bw, kCaseIds));

  ModelConfig qwen3 = CaseConfig({"", Architecture::kQwen3, 32, 4, 2, 16, true});
  const Weights q3w = RandomHfWeights(qwen3, 7, DType::kF32);
  const torch::Tensor q3ref = ReferenceLogits(qwen3, q3w, kCaseIds);
  qwen3.qk_norm = false;
  check("no q/k norm", q3ref, ReferenceLogits(qwen3, q3w, kCaseIds));

  ModelConfig mistral =
      CaseConfig({"", Architecture::kMistral, 32, 4, 2, 8, false, false, false, 5});
  const Weights mw = RandomHfWeights(mistral, 7, DType::kF32);
  const torch::Tensor mref = ReferenceLogits(mistral, mw, kCaseIds);
  mistral.sliding_window = 0;
  check("no sliding window", mref, ReferenceLogits(mistral, mw, kCaseIds));
}

std::set<std::string> ExpectedNames(const ModelConfig& c) {
  std::set<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
  if (!c.tie_word_embeddings) names.insert("lm_head.weight");
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    for (const char* s :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      names.insert(p + s);
    }
    if (c.qkv_bias) {
      for (const char* s : {"q", "k", "v"}) names.insert(p + "self_attn." + s + "_proj.bias");
    }
    if (c.o_proj_bias) names.insert(p + "self_attn.o_proj.bias");
    if (c.qk_norm) {
      names.insert(p + "self_attn.q_norm.weight");
      names.insert(p + "self_attn.k_norm.weight");
    }
  }
  return names;
}

TEST(RandomHfWeights, NamesShapesDtypesAndDeterminism) {
  for (const Case& k : {Case{"", Architecture::kLlama, 48, 4, 2, 16, false, true},
                        Case{"", Architecture::kQwen2, 40, 8, 2, 8, true},
                        Case{"", Architecture::kLlama, 32, 4, 2, 8, false, false, true},
                        Case{"", Architecture::kQwen3, 48, 4, 1, 24}}) {
    const ModelConfig c = CaseConfig(k);
    const Weights f32 = RandomHfWeights(c, 99, DType::kF32);
    std::set<std::string> names;
    for (const auto& [name, t] : f32) names.insert(name);
    EXPECT_EQ(names, ExpectedNames(c));
    EXPECT_EQ(f32.at("model.layers.1.self_attn.q_proj.weight").sizes(),
              torch::IntArrayRef({c.q_dim(), c.hidden_size}));
    EXPECT_EQ(f32.at("model.layers.0.self_attn.k_proj.weight").sizes(),
              torch::IntArrayRef({c.kv_dim(), c.hidden_size}));
    EXPECT_EQ(f32.at("model.layers.0.self_attn.o_proj.weight").sizes(),
              torch::IntArrayRef({c.hidden_size, c.q_dim()}));
    EXPECT_EQ(f32.at("model.layers.0.mlp.down_proj.weight").sizes(),
              torch::IntArrayRef({c.hidden_size, c.intermediate_size}));
    const Weights again = RandomHfWeights(c, 99, DType::kF32);
    const Weights other = RandomHfWeights(c, 100, DType::kF32);
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      const Weights rounded = RandomHfWeights(c, 99, dtype);
      for (const auto& [name, t] : f32) {
        EXPECT_TRUE(t.is_contiguous() && rounded.at(name).is_contiguous()) << name;
        EXPECT_EQ(rounded.at(name).scalar_type(), TorchDType(dtype)) << name;
        EXPECT_TRUE(torch::equal(rounded.at(name), t.to(TorchDType(dtype)))) << name;
      }
    }
    for (const auto& [name, t] : f32) {
      EXPECT_TRUE(torch::equal(t, again.at(name))) << name;
      EXPECT_FALSE(torch::equal(t, other.at(name))) << name;
    }
  }
}

TEST(TorchReference, RejectsBadInputs) {
  const ModelConfig c = CaseConfig({"", Architecture::kQwen2, 40, 8, 2, 8, true});
  Weights w = RandomHfWeights(c, 5, DType::kF32);
  EXPECT_ANY_THROW(ReferenceLogits(c, w, {0, c.vocab_size}));
  EXPECT_ANY_THROW(ReferenceLogits(c, w, {-1}));
  Weights missing = w;
  missing.erase("model.layers.1.self_attn.k_proj.bias");
  EXPECT_ANY_THROW(ReferenceLogits(c, missing, {1, 2}));
  Weights transposed = w;
  transposed["model.layers.0.mlp.down_proj.weight"] =
      transposed["model.layers.0.mlp.down_proj.weight"].t().contiguous();
  EXPECT_ANY_THROW(ReferenceLogits(c, transposed, {1, 2}));
  ModelConfig untied = c;
  untied.tie_word_embeddings = false;
  EXPECT_ANY_THROW(ReferenceLogits(untied, w, {1, 2}));
}

TEST(TorchReference, LoadF32FileChecksSize) {
  EXPECT_FALSE(LoadF32File(FixtureDir() / "expected_logits_fp32.f32", 5, 255).ok());
  EXPECT_FALSE(LoadF32File(FixtureDir() / "no_such_file.f32", 1, 1).ok());
}

// WriteHfCheckpoint (through kiln's writer) read back with the reader above.
TEST(WriteHfCheckpoint, RoundTripsSingleFileAndShards) {
  const ModelConfig c = CaseConfig({"", Architecture::kQwen3, 48, 4, 1, 24, false});
  for (const auto& [dtype, shard_bytes] :
       std::vector<std::pair<DType, uint64_t>>{{DType::kF32, 1ull << 30}, {DType::kBF16, 40000}}) {
    const Weights weights = RandomHfWeights(c, 11, dtype);
    const fs::path dir =
        fs::path(::testing::TempDir()) / ("kiln_ref_ckpt_" + std::to_string(getpid()) + "_" +
                                          std::to_string(static_cast<int>(dtype)));
    fs::remove_all(dir);
    ASSERT_TRUE(WriteHfCheckpoint(dir, c, weights, shard_bytes).ok());
    EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), shard_bytes < (1ull << 30));
    absl::StatusOr<ModelConfig> parsed = ReadModelConfig((dir / "config.json").string());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->architecture, c.architecture);
    EXPECT_EQ(parsed->head_dim, c.head_dim);
    EXPECT_EQ(parsed->num_key_value_heads, c.num_key_value_heads);
    EXPECT_EQ(parsed->qk_norm, c.qk_norm);
    absl::StatusOr<Weights> read = ReadSafetensorsCheckpoint(dir);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->size(), weights.size());
    for (const auto& [name, t] : weights) {
      ASSERT_TRUE(read->count(name)) << name;
      EXPECT_TRUE(torch::equal(read->at(name), t)) << name;
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace kiln
