// The decoder forward pass (Llama family), batched over all tokens of a step.
#include "models/prepared_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/ops.h"

namespace kiln {
namespace {

// Activation buffers reused across steps by each calling thread (one step loop per model).
struct Workspace {
  std::vector<float> residual, normed, qkv, attention, projected, gate_up, activated, selected;
  std::vector<int32_t> positions;

  static Workspace& ForThisThread() {
    thread_local Workspace workspace;
    return workspace;
  }
};

void Resize(std::vector<float>& buffer, int64_t n) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
}

}  // namespace

size_t PreparedModel::weight_bytes() const {
  size_t total = embedding_.bytes() + lm_head_->packed_bytes() + final_norm_.size() * 4;
  for (const Layer& layer : layers_) {
    total += layer.qkv->packed_bytes() + layer.o->packed_bytes() + layer.gate_up->packed_bytes() +
             layer.down->packed_bytes();
    total += (layer.input_norm.size() + layer.post_attention_norm.size() + layer.q_norm.size() +
              layer.k_norm.size()) *
             4;
  }
  return total;
}

size_t PreparedModel::bytes_streamed_per_token() const {
  return weight_bytes() - embedding_.bytes() +
         static_cast<size_t>(config_.hidden_size) * DTypeSize(embedding_.dtype);
}

absl::StatusOr<KvCache> PreparedModel::NewCache(int64_t capacity) const {
  int64_t limit = config_.max_position_embeddings;
  if (config_.sliding_window > 0) limit = std::min(limit, config_.sliding_window);
  if (capacity > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("context of ", capacity, " tokens exceeds the model's limit of ", limit));
  }
  return KvCache::Create(config_, capacity);
}

absl::Status PreparedModel::Forward(std::span<const SequenceChunk> chunks,
                                    std::vector<float>* logits) const {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.q_dim();
  const int64_t kv_dim = c.kv_dim();
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t inter = c.intermediate_size;

  int64_t total = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& chunk = chunks[i];
    if (chunk.cache == nullptr) return absl::InvalidArgumentError("sequence without a KV cache");
    for (size_t j = 0; j < i; ++j) {
      if (chunks[j].cache == chunk.cache) {
        return absl::InvalidArgumentError("two chunks of one step share a KV cache");
      }
    }
    if (chunk.tokens.empty()) return absl::InvalidArgumentError("sequence chunk with no tokens");
    const int64_t end = chunk.cache->length() + static_cast<int64_t>(chunk.tokens.size());
    if (end > chunk.cache->capacity()) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", end,
                                                " tokens exceeds its KV cache capacity of ",
                                                chunk.cache->capacity()));
    }
    for (int32_t token : chunk.tokens) {
      if (token < 0 || token >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", token, " is outside the vocabulary [0, ", c.vocab_size, ")"));
      }
    }
    total += static_cast<int64_t>(chunk.tokens.size());
  }
  if (total == 0) return absl::OkStatus();

  Workspace& ws = Workspace::ForThisThread();
  Resize(ws.residual, total * hidden);
  Resize(ws.normed, total * hidden);
  Resize(ws.qkv, total * qkv_dim);
  Resize(ws.attention, total * q_dim);
  Resize(ws.projected, total * hidden);
  Resize(ws.gate_up, total * 2 * inter);
  Resize(ws.activated, total * inter);
  ws.positions.resize(static_cast<size_t>(total));

  float* x = ws.residual.data();
  {
    int64_t row = 0;
    for (const SequenceChunk& chunk : chunks) {
      cpu::EmbeddingLookup(embedding_, chunk.tokens.data(),
                           static_cast<int64_t>(chunk.tokens.size()), x + row * hidden);
      for (size_t t = 0; t < chunk.tokens.size(); ++t) {
        ws.positions[static_cast<size_t>(row) + t] =
            static_cast<int32_t>(chunk.cache->length() + static_cast<int64_t>(t));
      }
      row += static_cast<int64_t>(chunk.tokens.size());
    }
  }

  const cpu::AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                  static_cast<float>(1.0 / std::sqrt(double(c.head_dim)))};
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
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
    cpu::ApplyRope(qkv, total, qkv_dim, c.num_attention_heads, ws.positions.data(), *rope_);
    cpu::ApplyRope(qkv + q_dim, total, qkv_dim, c.num_key_value_heads, ws.positions.data(), *rope_);

    int64_t row = 0;
    for (const SequenceChunk& chunk : chunks) {
      const int64_t n = static_cast<int64_t>(chunk.tokens.size());
      const int64_t start = chunk.cache->length();
      float* keys = chunk.cache->keys(static_cast<int64_t>(l));
      float* values = chunk.cache->values(static_cast<int64_t>(l));
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
  }

  // Final norm and logits only for the rows that asked for them.
  std::vector<int64_t> rows;
  {
    int64_t row = 0;
    for (const SequenceChunk& chunk : chunks) {
      const int64_t n = static_cast<int64_t>(chunk.tokens.size());
      for (int64_t t = chunk.all_logits ? 0 : n - 1; t < n; ++t) rows.push_back(row + t);
      row += n;
      chunk.cache->set_length(chunk.cache->length() + n);
    }
  }
  const int64_t selected = static_cast<int64_t>(rows.size());
  Resize(ws.selected, selected * hidden);
  for (int64_t i = 0; i < selected; ++i) {
    cpu::RmsNorm(x + rows[static_cast<size_t>(i)] * hidden, hidden, final_norm_.data(), 1, hidden,
                 eps, ws.selected.data() + i * hidden, hidden);
  }
  const size_t offset = logits->size();
  logits->resize(offset + static_cast<size_t>(selected * c.vocab_size));
  return lm_head_->Forward(ws.selected.data(), selected, logits->data() + offset);
}

}  // namespace kiln
