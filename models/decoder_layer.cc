#include "models/decoder_layer.h"

#include <algorithm>
#include <cmath>

#include "base/status_macros.h"

namespace kiln {
namespace {

void Resize(std::vector<float>& buffer, int64_t n) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
}

}  // namespace

size_t DecoderLayerWeights::bytes() const {
  return qkv->packed_bytes() + o->packed_bytes() + gate_up->packed_bytes() + down->packed_bytes() +
         (input_norm.size() + post_attention_norm.size() + q_norm.size() + k_norm.size()) *
             sizeof(float);
}

DecoderScratch& DecoderScratch::ForThisThread() {
  thread_local DecoderScratch scratch;
  return scratch;
}

void DecoderScratch::Prepare(const ModelConfig& c, std::span<const DecoderRows> rows,
                             int64_t total) {
  Resize(normed, total * c.hidden_size);
  Resize(qkv, total * (c.q_dim() + 2 * c.kv_dim()));
  Resize(attention, total * c.q_dim());
  Resize(projected, total * c.hidden_size);
  Resize(gate_up, total * 2 * c.intermediate_size);
  Resize(activated, total * c.intermediate_size);
  positions.resize(static_cast<size_t>(total));
  size_t row = 0;
  for (const DecoderRows& seq : rows) {
    for (int64_t t = 0; t < seq.count; ++t) {
      positions[row++] = static_cast<int32_t>(seq.cache->length() + t);
    }
  }
}

absl::Status RunDecoderLayer(const ModelConfig& c, const DecoderLayerWeights& layer,
                             const cpu::RopeTable& rope, int64_t cache_layer,
                             std::span<const DecoderRows> rows, int64_t total, float* x,
                             DecoderScratch& ws) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.q_dim();
  const int64_t kv_dim = c.kv_dim();
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const cpu::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                  static_cast<float>(1.0 / std::sqrt(double(c.head_dim)))};

  cpu::RmsNorm(x, hidden, layer.input_norm.data(), total, hidden, eps, ws.normed.data(), hidden);
  KILN_RETURN_IF_ERROR(layer.qkv->Forward(ws.normed.data(), total, ws.qkv.data()));
  float* qkv = ws.qkv.data();
  if (!layer.q_norm.empty()) {
    for (int64_t t = 0; t < total; ++t) {
      float* q = qkv + t * qkv_dim;
      cpu::RmsNorm(q, c.head_dim, layer.q_norm.data(), c.num_attention_heads, c.head_dim, eps, q,
                   c.head_dim);
      cpu::RmsNorm(q + q_dim, c.head_dim, layer.k_norm.data(), c.num_key_value_heads, c.head_dim,
                   eps, q + q_dim, c.head_dim);
    }
  }
  cpu::ApplyRope(qkv, total, qkv_dim, c.num_attention_heads, ws.positions.data(), rope);
  cpu::ApplyRope(qkv + q_dim, total, qkv_dim, c.num_key_value_heads, ws.positions.data(), rope);

  int64_t row = 0;
  for (const DecoderRows& seq : rows) {
    const int64_t n = seq.count;
    const int64_t start = seq.cache->length();
    float* keys = seq.cache->keys(cache_layer);
    float* values = seq.cache->values(cache_layer);
    for (int64_t t = 0; t < n; ++t) {
      const float* src = qkv + (row + t) * qkv_dim + q_dim;
      std::copy(src, src + kv_dim, keys + (start + t) * kv_dim);
      std::copy(src + kv_dim, src + 2 * kv_dim, values + (start + t) * kv_dim);
    }
    cpu::CausalAttention(shape, qkv + row * qkv_dim, qkv_dim, n, start, keys, values, kv_dim,
                         ws.attention.data() + row * q_dim, q_dim);
    row += n;
  }
  KILN_RETURN_IF_ERROR(layer.o->Forward(ws.attention.data(), total, ws.projected.data()));
  cpu::AddInPlace(x, ws.projected.data(), total * hidden);

  cpu::RmsNorm(x, hidden, layer.post_attention_norm.data(), total, hidden, eps, ws.normed.data(),
               hidden);
  KILN_RETURN_IF_ERROR(layer.gate_up->Forward(ws.normed.data(), total, ws.gate_up.data()));
  cpu::SiluMul(ws.gate_up.data(), total, inter, ws.activated.data());
  KILN_RETURN_IF_ERROR(layer.down->Forward(ws.activated.data(), total, ws.projected.data()));
  cpu::AddInPlace(x, ws.projected.data(), total * hidden);
  return absl::OkStatus();
}

}  // namespace kiln
