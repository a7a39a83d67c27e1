// The decoder forward pass (Llama family) and the MTP draft step, batched over all tokens of a
// step. Both run their decoder blocks through models/decoder_layer.h.
#include "models/prepared_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/ops.h"

namespace kiln {
namespace {

// Step-level buffers reused across steps by each calling thread (one step loop per model); the
// per-layer ones are in DecoderScratch.
struct Workspace {
  std::vector<float> residual, selected, embedded, concat;

  static Workspace& ForThisThread() {
    thread_local Workspace workspace;
    return workspace;
  }
};

void Resize(std::vector<float>& buffer, int64_t n) {
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
}

// Rows whose logits a chunk asked for (all, or its last), offset by the chunk's first row.
void SelectRows(int64_t first_row, int64_t n, bool all, std::vector<int64_t>& selected) {
  for (int64_t t = all ? 0 : n - 1; t < n; ++t) selected.push_back(first_row + t);
}

absl::Status CheckContext(const ModelConfig& config, int64_t capacity) {
  int64_t limit = config.max_position_embeddings;
  if (config.sliding_window > 0) limit = std::min(limit, config.sliding_window);
  if (capacity > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("context of ", capacity, " tokens exceeds the model's limit of ", limit));
  }
  return absl::OkStatus();
}

void AdvanceCaches(std::span<const DecoderRows> rows) {
  for (const DecoderRows& seq : rows) seq.cache->set_length(seq.cache->length() + seq.count);
}

}  // namespace

size_t PreparedModel::mtp_bytes() const {
  size_t total = 0;
  for (const MtpHead& head : mtp_heads_) {
    total += head.block.bytes() + head.proj->packed_bytes() +
             (head.embedding_norm.size() + head.hidden_norm.size() + head.final_norm.size()) * 4;
  }
  return total;
}

size_t PreparedModel::weight_bytes() const {
  size_t total = embedding_.bytes() + lm_head_->packed_bytes() + final_norm_.size() * 4;
  for (const Layer& layer : layers_) total += layer.bytes();
  return total + mtp_bytes();
}

size_t PreparedModel::bytes_streamed_per_token() const {
  return weight_bytes() - mtp_bytes() - embedding_.bytes() +
         static_cast<size_t>(config_.hidden_size) * DTypeSize(embedding_.dtype);
}

absl::StatusOr<KvCache> PreparedModel::NewCache(int64_t capacity) const {
  KILN_RETURN_IF_ERROR(CheckContext(config_, capacity));
  return KvCache::Create(config_, capacity);
}

absl::StatusOr<KvCache> PreparedModel::NewMtpCache(int64_t capacity) const {
  if (mtp_heads_.empty()) return absl::FailedPreconditionError("the model has no MTP heads");
  KILN_RETURN_IF_ERROR(CheckContext(config_, capacity));
  ModelConfig one_layer = config_;
  one_layer.num_hidden_layers = 1;
  return KvCache::Create(one_layer, capacity);
}

absl::StatusOr<int64_t> PreparedModel::AddRows(KvCache* cache, std::span<const int32_t> tokens,
                                               std::vector<DecoderRows>& rows) const {
  if (cache == nullptr) return absl::InvalidArgumentError("sequence without a KV cache");
  for (const DecoderRows& earlier : rows) {
    if (earlier.cache == cache) {
      return absl::InvalidArgumentError("two chunks of one step share a KV cache");
    }
  }
  if (tokens.empty()) return absl::InvalidArgumentError("sequence chunk with no tokens");
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (cache->length() + n > cache->capacity()) {
    return absl::OutOfRangeError(absl::StrCat("sequence of ", cache->length() + n,
                                              " tokens exceeds its KV cache capacity of ",
                                              cache->capacity()));
  }
  for (int32_t token : tokens) {
    if (token < 0 || token >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", token, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  rows.push_back({cache, n});
  return n;
}

absl::Status PreparedModel::NormAndLogits(const float* x, int64_t total,
                                          const std::vector<float>& norm,
                                          std::span<const int64_t> selected_rows,
                                          std::vector<float>* logits,
                                          std::vector<float>* normed_out) const {
  const int64_t hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const int64_t selected = static_cast<int64_t>(selected_rows.size());
  Workspace& ws = Workspace::ForThisThread();
  Resize(ws.selected, selected * hidden);
  if (normed_out != nullptr) {
    // Every row normalized once; the logits rows are copied from them, so that the logits do
    // not depend on whether hidden states were asked for.
    const size_t offset = normed_out->size();
    normed_out->resize(offset + static_cast<size_t>(total * hidden));
    float* normed = normed_out->data() + offset;
    cpu::RmsNorm(x, hidden, norm.data(), total, hidden, eps, normed, hidden);
    for (int64_t i = 0; i < selected; ++i) {
      const float* src = normed + selected_rows[static_cast<size_t>(i)] * hidden;
      std::copy(src, src + hidden, ws.selected.data() + i * hidden);
    }
  } else {
    for (int64_t i = 0; i < selected; ++i) {
      cpu::RmsNorm(x + selected_rows[static_cast<size_t>(i)] * hidden, hidden, norm.data(), 1,
                   hidden, eps, ws.selected.data() + i * hidden, hidden);
    }
  }
  const size_t offset = logits->size();
  logits->resize(offset + static_cast<size_t>(selected * config_.vocab_size));
  return lm_head_->Forward(ws.selected.data(), selected, logits->data() + offset);
}

absl::Status PreparedModel::Forward(std::span<const SequenceChunk> chunks,
                                    std::vector<float>* logits,
                                    std::vector<float>* hidden_out) const {
  const int64_t hidden = config_.hidden_size;
  std::vector<DecoderRows> rows;
  std::vector<int64_t> selected;
  int64_t total = 0;
  for (const SequenceChunk& chunk : chunks) {
    KILN_ASSIGN_OR_RETURN(int64_t n, AddRows(chunk.cache, chunk.tokens, rows));
    SelectRows(total, n, chunk.all_logits, selected);
    total += n;
  }
  if (total == 0) return absl::OkStatus();

  Workspace& ws = Workspace::ForThisThread();
  DecoderScratch& scratch = DecoderScratch::ForThisThread();
  scratch.Prepare(config_, rows, total);
  Resize(ws.residual, total * hidden);
  float* x = ws.residual.data();
  {
    int64_t row = 0;
    for (const SequenceChunk& chunk : chunks) {
      const int64_t n = static_cast<int64_t>(chunk.tokens.size());
      cpu::EmbeddingLookup(embedding_, chunk.tokens.data(), n, x + row * hidden);
      row += n;
    }
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    KILN_RETURN_IF_ERROR(RunDecoderLayer(config_, layers_[l], *rope_, static_cast<int64_t>(l), rows,
                                         total, x, scratch));
  }
  AdvanceCaches(rows);
  // Final norm and logits only for the rows that asked for them.
  return NormAndLogits(x, total, final_norm_, selected, logits, hidden_out);
}

absl::Status PreparedModel::MtpForward(int head_index, std::span<const MtpChunk> chunks,
                                       std::vector<float>* logits,
                                       std::vector<float>* hidden_out) const {
  if (head_index < 0 || head_index >= num_mtp_heads()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MTP head ", head_index, " does not exist (", num_mtp_heads(), " heads)"));
  }
  const MtpHead& head = mtp_heads_[static_cast<size_t>(head_index)];
  const int64_t hidden = config_.hidden_size;
  std::vector<DecoderRows> rows;
  std::vector<int64_t> selected;
  int64_t total = 0;
  for (const MtpChunk& chunk : chunks) {
    KILN_ASSIGN_OR_RETURN(int64_t n, AddRows(chunk.cache, chunk.tokens, rows));
    if (chunk.cache->kv_dim() != config_.kv_dim()) {
      return absl::InvalidArgumentError("MTP chunk's KV cache was not made by this model");
    }
    if (static_cast<int64_t>(chunk.hidden.size()) != n * hidden) {
      return absl::InvalidArgumentError(absl::StrCat("MTP chunk of ", n, " tokens needs ",
                                                     n * hidden, " hidden values, got ",
                                                     chunk.hidden.size()));
    }
    SelectRows(total, n, chunk.all_logits, selected);
    total += n;
  }
  if (total == 0) return absl::OkStatus();

  Workspace& ws = Workspace::ForThisThread();
  DecoderScratch& scratch = DecoderScratch::ForThisThread();
  scratch.Prepare(config_, rows, total);
  Resize(ws.embedded, total * hidden);
  Resize(ws.concat, total * 2 * hidden);
  Resize(ws.residual, total * hidden);
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // concat(norm_e(e), norm_h(h)), or the reverse order (MiMo), one row per token.
  const int64_t e_col = head.info.hidden_first ? hidden : 0;
  const int64_t h_col = head.info.hidden_first ? 0 : hidden;
  {
    int64_t row = 0;
    for (const MtpChunk& chunk : chunks) {
      const int64_t n = static_cast<int64_t>(chunk.tokens.size());
      float* e = ws.embedded.data() + row * hidden;
      cpu::EmbeddingLookup(embedding_, chunk.tokens.data(), n, e);
      if (head.info.zero_embedding_at_start && chunk.cache->length() == 0) {
        std::fill(e, e + hidden, 0.0f);
      }
      float* out = ws.concat.data() + row * 2 * hidden;
      cpu::RmsNorm(e, hidden, head.embedding_norm.data(), n, hidden, eps, out + e_col, 2 * hidden);
      cpu::RmsNorm(chunk.hidden.data(), hidden, head.hidden_norm.data(), n, hidden, eps,
                   out + h_col, 2 * hidden);
      row += n;
    }
  }
  float* x = ws.residual.data();
  KILN_RETURN_IF_ERROR(head.proj->Forward(ws.concat.data(), total, x));
  KILN_RETURN_IF_ERROR(RunDecoderLayer(config_, head.block, *rope_, 0, rows, total, x, scratch));
  AdvanceCaches(rows);
  if (hidden_out != nullptr && !head.info.next_hidden_normed) {
    hidden_out->insert(hidden_out->end(), x, x + total * hidden);
    hidden_out = nullptr;
  }
  return NormAndLogits(x, total, head.final_norm, selected, logits, hidden_out);
}

}  // namespace kiln
