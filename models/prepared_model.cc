// The decoder forward pass (Llama family) and the MTP draft step, batched over all tokens of a
// step and written once against the backend's op set. Both run their decoder blocks through
// models/decoder_layer.h.
#include "models/prepared_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln {
namespace {

absl::Status CheckContext(const ModelConfig& config, int64_t capacity) {
  int64_t limit = config.max_position_embeddings;
  if (config.sliding_window > 0) limit = std::min(limit, config.sliding_window);
  if (capacity > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("context of ", capacity, " tokens exceeds the model's limit of ", limit));
  }
  return absl::OkStatus();
}

// Appends `rows` rows of `cols` floats from `src` (backend memory) to `out`.
absl::Status AppendToHost(ExecutionContext& ctx, const TensorView& src, std::vector<float>* out) {
  const size_t offset = out->size();
  out->resize(offset + static_cast<size_t>(src.elements()));
  return ctx.CopyToHost(src, out->data() + offset);
}

}  // namespace

size_t PreparedModel::mtp_bytes() const {
  size_t total = 0;
  for (const MtpHead& head : mtp_heads_) {
    total += head.block.bytes() + head.proj->packed_bytes() +
             static_cast<size_t>(head.embedding_norm.elements() + head.hidden_norm.elements() +
                                 head.final_norm.elements()) *
                 sizeof(float);
  }
  return total;
}

size_t PreparedModel::weight_bytes() const {
  size_t total = embedding_.span_bytes() + lm_head_->packed_bytes() + final_norm_.span_bytes() +
                 rope_inv_freq_.span_bytes();
  for (const Layer& layer : layers_) total += layer.bytes();
  return total + mtp_bytes();
}

size_t PreparedModel::bytes_streamed_per_token() const {
  return weight_bytes() - mtp_bytes() - embedding_.span_bytes() +
         static_cast<size_t>(config_.hidden_size) * DTypeSize(embedding_.dtype);
}

int64_t PreparedModel::context_limit() const {
  int64_t limit = config_.max_position_embeddings;
  if (config_.sliding_window > 0) limit = std::min(limit, config_.sliding_window);
  return limit;
}

absl::StatusOr<KvCache> PreparedModel::NewCache(int64_t capacity) const {
  if (capacity <= 0) return absl::InvalidArgumentError("KV cache capacity must be positive");
  KILN_RETURN_IF_ERROR(CheckContext(config_, capacity));
  return KvCache(kv_pool_, config_.num_hidden_layers, capacity);
}

absl::StatusOr<KvCache> PreparedModel::NewMtpCache(int64_t capacity) const {
  if (mtp_heads_.empty()) return absl::FailedPreconditionError("the model has no MTP heads");
  if (capacity <= 0) return absl::InvalidArgumentError("KV cache capacity must be positive");
  KILN_RETURN_IF_ERROR(CheckContext(config_, capacity));
  return KvCache(kv_pool_, /*layers=*/1, capacity);
}

absl::StatusOr<KvCache> PreparedModel::NewMtpCache(const KvCache& target, int64_t capacity) const {
  if (mtp_heads_.empty()) return absl::FailedPreconditionError("the model has no MTP heads");
  if (target.pool() != kv_pool_.get() || target.layers() != config_.num_hidden_layers) {
    return absl::InvalidArgumentError("the target KV cache was not made by this model");
  }
  if (capacity <= 0) return absl::InvalidArgumentError("KV cache capacity must be positive");
  KILN_RETURN_IF_ERROR(CheckContext(config_, capacity));
  return target.Share(/*layers=*/1, capacity);
}

absl::Status PreparedModel::CheckChunk(std::span<const Chunk> chunks, size_t index,
                                       int64_t cache_layers) const {
  const Chunk& chunk = chunks[index];
  KvCache* cache = chunk.cache;
  if (cache == nullptr) return absl::InvalidArgumentError("sequence without a KV cache");
  for (size_t earlier = 0; earlier < index; ++earlier) {
    if (chunks[earlier].cache == cache) {
      return absl::InvalidArgumentError("two chunks of one step share a KV cache");
    }
  }
  if (cache->pool() != kv_pool_.get() || cache->layers() != cache_layers) {
    return absl::InvalidArgumentError(absl::StrCat(cache_layers == 1 ? "MTP chunk's" : "sequence's",
                                                   " KV cache was not made by this model"));
  }
  if (chunk.tokens.empty()) return absl::InvalidArgumentError("sequence chunk with no tokens");
  const int64_t n = static_cast<int64_t>(chunk.tokens.size());
  if (cache->length() + n > cache->capacity()) {
    return absl::OutOfRangeError(absl::StrCat("sequence of ", cache->length() + n,
                                              " tokens exceeds its KV cache capacity of ",
                                              cache->capacity()));
  }
  for (int32_t token : chunk.tokens) {
    if (token < 0 || token >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", token, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status PreparedModel::ReserveBlocks(std::span<const Chunk> chunks) const {
  for (const Chunk& chunk : chunks) {
    KILN_RETURN_IF_ERROR(
        chunk.cache->Reserve(chunk.cache->length() + static_cast<int64_t>(chunk.tokens.size())));
  }
  return absl::OkStatus();
}

void PreparedModel::set_op_profile(OpProfile* profile) const {
  absl::MutexLock lock(&mutex_);
  context_->set_profile(profile);
}

void PreparedModel::set_linear_observer(ExecutionContext::LinearObserver observer) const {
  absl::MutexLock lock(&mutex_);
  context_->set_linear_observer(std::move(observer));
}

const PackedLinear* PreparedModel::FindLinear(absl::string_view name) const {
  auto in_layer = [&](const Layer& layer) -> const PackedLinear* {
    for (const PackedLinear* linear :
         {layer.qkv.get(), layer.o.get(), layer.gate_up.get(), layer.down.get()}) {
      if (linear != nullptr && linear->name() == name) return linear;
    }
    return nullptr;
  };
  if (lm_head_ != nullptr && lm_head_->name() == name) return lm_head_.get();
  for (const Layer& layer : layers_) {
    if (const PackedLinear* found = in_layer(layer)) return found;
  }
  for (const MtpHead& head : mtp_heads_) {
    if (head.proj != nullptr && head.proj->name() == name) return head.proj.get();
    if (const PackedLinear* found = in_layer(head.block)) return found;
  }
  return nullptr;
}

absl::Status PreparedModel::Forward(std::span<const SequenceChunk> chunks,
                                    std::vector<float>* logits,
                                    std::vector<float>* hidden_out) const {
  absl::MutexLock lock(&mutex_);
  chunks_.clear();
  for (const SequenceChunk& chunk : chunks) {
    chunks_.push_back({chunk.cache, chunk.tokens, {}, chunk.all_logits});
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    KILN_RETURN_IF_ERROR(CheckChunk(chunks_, i, config_.num_hidden_layers));
  }
  KILN_RETURN_IF_ERROR(ReserveBlocks(chunks_));
  return Run(chunks_, nullptr, logits, hidden_out);
}

absl::Status PreparedModel::MtpForward(int head_index, std::span<const MtpChunk> chunks,
                                       std::vector<float>* logits,
                                       std::vector<float>* hidden_out) const {
  if (head_index < 0 || head_index >= num_mtp_heads()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MTP head ", head_index, " does not exist (", num_mtp_heads(), " heads)"));
  }
  const int64_t hidden = config_.hidden_size;
  absl::MutexLock lock(&mutex_);
  chunks_.clear();
  for (const MtpChunk& chunk : chunks) {
    chunks_.push_back({chunk.cache, chunk.tokens, chunk.hidden, chunk.all_logits});
  }
  for (size_t i = 0; i < chunks_.size(); ++i) {
    KILN_RETURN_IF_ERROR(CheckChunk(chunks_, i, /*cache_layers=*/1));
    const int64_t n = static_cast<int64_t>(chunks_[i].tokens.size());
    if (static_cast<int64_t>(chunks_[i].hidden.size()) != n * hidden) {
      return absl::InvalidArgumentError(absl::StrCat("MTP chunk of ", n, " tokens needs ",
                                                     n * hidden, " hidden values, got ",
                                                     chunks_[i].hidden.size()));
    }
  }
  KILN_RETURN_IF_ERROR(ReserveBlocks(chunks_));
  return Run(chunks_, &mtp_heads_[static_cast<size_t>(head_index)], logits, hidden_out);
}

// Rows are taken in chunk order and cut into sub-steps at the capacity; a chunk cut in two runs
// its second piece after the first one's keys and values are cached, which is what one step
// computes too (causal attention reads only earlier positions).
absl::Status PreparedModel::Run(std::span<const Chunk> chunks, const MtpHead* head,
                                std::vector<float>* logits, std::vector<float>* hidden_out) const {
  std::vector<Piece>& pieces = pieces_;
  size_t next = 0;
  int64_t offset = 0;  // of chunks[next]
  while (next < chunks.size()) {
    step_.Clear();
    step_.pool = kv_pool_->ref();
    pieces.clear();
    int64_t rows = 0;
    while (next < chunks.size() && rows < capacity_.max_rows &&
           static_cast<int64_t>(pieces.size()) < capacity_.max_sequences) {
      const Chunk& chunk = chunks[next];
      const int64_t total = static_cast<int64_t>(chunk.tokens.size());
      const int64_t take = std::min(total - offset, capacity_.max_rows - rows);
      const int64_t first_row = rows;
      step_.AddSequence(chunk.tokens.data() + offset, take, chunk.cache->length(),
                        chunk.cache->blocks());
      for (int64_t t = chunk.all_logits ? 0 : total - 1 - offset; t < take; ++t) {
        step_.gather_rows.push_back(static_cast<int32_t>(first_row + t));
      }
      pieces.push_back({&chunk, offset, take});
      rows += take;
      offset += take;
      if (offset == total) {
        ++next;
        offset = 0;
      }
    }
    KILN_RETURN_IF_ERROR(RunSubStep(pieces, head, logits, hidden_out));
    for (const Piece& piece : pieces) {
      piece.chunk->cache->set_length(piece.chunk->cache->length() + piece.rows);
    }
  }
  return absl::OkStatus();
}

absl::Status PreparedModel::RunSubStep(std::span<const Piece> pieces, const MtpHead* head,
                                       std::vector<float>* logits,
                                       std::vector<float>* hidden_out) const {
  ExecutionContext& ctx = *context_;
  KILN_RETURN_IF_ERROR(ctx.BeginStep(step_));
  return ctx.RunStep([&] { return RunStepOps(pieces, head, logits, hidden_out); });
}

absl::Status PreparedModel::RunStepOps(std::span<const Piece> pieces, const MtpHead* head,
                                       std::vector<float>* logits,
                                       std::vector<float>* hidden_out) const {
  ExecutionContext& ctx = *context_;
  const int64_t rows = step_.rows();
  const int64_t hidden = config_.hidden_size;
  const TensorView x = buffers_.residual.Rows(0, rows);
  if (head == nullptr) {
    KILN_RETURN_IF_ERROR(ctx.Embed(embedding_, {}, x));
    for (size_t l = 0; l < layers_.size(); ++l) {
      KILN_RETURN_IF_ERROR(RunDecoderLayer(ctx, config_, layers_[l], rope_inv_freq_,
                                           static_cast<int64_t>(l), buffers_));
    }
    return NormAndLogits(x, final_norm_, logits, hidden_out);
  }

  // MTP draft step (docs/mtp.md): x = proj(concat(norm_e(e), norm_h(h))), MiMo the other way
  // round; then the head's block, then its final norm and the main LM head.
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const TensorView embedded = buffers_.embedded.Rows(0, rows);
  const TensorView hidden_in = buffers_.hidden_in.Rows(0, rows);
  const TensorView concat = buffers_.concat.Rows(0, rows);
  KILN_RETURN_IF_ERROR(ctx.Embed(
      embedding_, {.zero_at_position_zero = head->info.zero_embedding_at_start}, embedded));
  int64_t row = 0;
  for (const Piece& piece : pieces) {
    const float* h = piece.chunk->hidden.data() + piece.offset * hidden;
    KILN_RETURN_IF_ERROR(ctx.CopyFromHost(h, hidden_in.Rows(row, piece.rows)));
    row += piece.rows;
  }
  const int64_t e_col = head->info.hidden_first ? hidden : 0;
  const int64_t h_col = head->info.hidden_first ? 0 : hidden;
  KILN_RETURN_IF_ERROR(
      ctx.RmsNorm(embedded, head->embedding_norm, eps, concat.Cols(e_col, hidden)));
  KILN_RETURN_IF_ERROR(ctx.RmsNorm(hidden_in, head->hidden_norm, eps, concat.Cols(h_col, hidden)));
  KILN_RETURN_IF_ERROR(ctx.Linear(*head->proj, concat, x));
  // The head's layer slot in the pool follows the main layers.
  const int64_t head_layer = config_.num_hidden_layers + (head - mtp_heads_.data());
  KILN_RETURN_IF_ERROR(
      RunDecoderLayer(ctx, config_, head->block, rope_inv_freq_, head_layer, buffers_));
  if (hidden_out != nullptr && !head->info.next_hidden_normed) {
    // DeepSeek: a further draft step reads h' before the head's final norm.
    KILN_RETURN_IF_ERROR(AppendToHost(ctx, x, hidden_out));
    hidden_out = nullptr;
  }
  return NormAndLogits(x, head->final_norm, logits, hidden_out);
}

absl::Status PreparedModel::NormAndLogits(const TensorView& x, const TensorView& norm,
                                          std::vector<float>* logits,
                                          std::vector<float>* normed_out) const {
  ExecutionContext& ctx = *context_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  TensorView source = x;
  if (normed_out != nullptr) {
    // Every row normalized once; the logits rows are gathered from them, so that the logits do
    // not depend on whether hidden states were asked for.
    source = buffers_.normed.Rows(0, x.rows);
    KILN_RETURN_IF_ERROR(ctx.RmsNorm(x, norm, eps, source));
    KILN_RETURN_IF_ERROR(AppendToHost(ctx, source, normed_out));
  }
  const int64_t wanted = static_cast<int64_t>(step_.gather_rows.size());
  for (int64_t first = 0; first < wanted; first += capacity_.max_logits_rows) {
    const int64_t count = std::min(capacity_.max_logits_rows, wanted - first);
    const TensorView selected = buffers_.selected.Rows(0, count);
    KILN_RETURN_IF_ERROR(ctx.GatherRows(source, first, count, selected));
    if (normed_out == nullptr) KILN_RETURN_IF_ERROR(ctx.RmsNorm(selected, norm, eps, selected));
    const TensorView out = buffers_.logits.Rows(0, count);
    KILN_RETURN_IF_ERROR(ctx.Linear(*lm_head_, selected, out));
    KILN_RETURN_IF_ERROR(AppendToHost(ctx, out, logits));
  }
  return absl::OkStatus();
}

}  // namespace kiln
