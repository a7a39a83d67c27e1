// PreparedModel: a model whose weights went through PostLoad. It is the only type with a
// forward pass, and only models/lifecycle.h can make one (design.md §1, invariant 1). Its forward
// is written once against the backend's op set (kernels/backend.h) and runs on whichever backend
// PostLoad prepared it for.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "models/decoder_layer.h"
#include "models/kv_cache.h"
#include "models/load_report.h"
#include "models/model_config.h"
#include "models/mtp.h"
#include "models/step_buffers.h"
#include "models/weight_source.h"

namespace kiln {

struct BoundModel;
struct PostLoadOptions;

// New tokens of one sequence for one forward step. The cache holds the sequence's earlier
// positions; the step appends the new ones.
struct SequenceChunk {
  KvCache* cache = nullptr;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every new token, else only for the last
};

// Rows of one sequence for an MTP draft step (docs/mtp.md). Row r sits at position
// p = cache->length() + r and predicts token p + 2 from t_{p+1} and h_p.
struct MtpChunk {
  KvCache* cache = nullptr;         // the sequence's cache for this head (NewMtpCache)
  std::span<const int32_t> tokens;  // t_{p+1} for every row
  // tokens.size() rows of hidden_size floats: h_p. For the first draft step, the main model's
  // final-norm hidden state (Forward's `hidden`); for a further step, the previous MtpForward's
  // `hidden_out` row.
  std::span<const float> hidden;
  bool all_logits = false;  // logits for every row, else only for the last
};

struct StageTimings {
  double open_seconds = 0;       // loader: open, validate, map
  double bind_seconds = 0;       // bind + restore
  double post_load_seconds = 0;  // packing for the backend
};

class PreparedModel {
 public:
  PreparedModel(const PreparedModel&) = delete;
  PreparedModel& operator=(const PreparedModel&) = delete;
  ~PreparedModel();

  const ModelConfig& config() const { return config_; }
  const LoadReport& report() const { return report_; }
  const SourceProvenance& provenance() const { return source_.provenance(); }
  // The records the model was built from (kept alive; `kiln tensorize` writes them out again).
  const WeightSource& source() const { return source_; }
  // The backend it runs on ("cpu") and what that backend runs ("oneDNN 2.6.3 brgemm ...").
  absl::string_view backend_name() const { return backend_->name(); }
  std::string backend_description() const { return backend_->description(); }
  DType compute_dtype() const { return compute_dtype_; }
  // The weight quantization PostLoad applied (kNone: every linear in compute_dtype()), and in how
  // many of the model's linears (shapes or CPUs the quantized kernels refuse fall back).
  Quantization quantization() const { return quantization_; }
  int quantized_linears() const { return quantized_linears_; }
  int linear_count() const { return linear_count_; }
  // Linears whose packed bytes came from the file (written with `kiln tensorize --prepack`)
  // instead of being packed at load.
  int adopted_linears() const { return adopted_linears_; }
  // Of those, the ones read from the file's mapping rather than from a copy (PackedImage::backing).
  int adopted_in_place_linears() const { return adopted_in_place_linears_; }
  // Each linear prepared from a single record, under that record's name ("lm_head.weight" for a
  // tied LM head): what `kiln tensorize --prepack` stores as packed images.
  const std::vector<std::pair<std::string, const PackedLinear*>>& linears_by_record() const {
    return linears_by_record_;
  }
  int64_t parameter_count() const { return parameter_count_; }
  // Bytes the model holds for its forward pass: packed weights, norms, the embedding table, the
  // RoPE table (MTP heads included).
  size_t weight_bytes() const;
  // Bytes of the execution context's activation arena (sized once, at PostLoad).
  size_t scratch_bytes() const { return scratch_bytes_; }
  // Whether the embedding is read in place from the checkpoint's memory (backends that read host
  // memory) rather than from a copy PostLoad made.
  bool embedding_zero_copy() const { return embedding_zero_copy_; }
  const StepCapacity& step_capacity() const { return capacity_; }
  // Bytes read from memory per decoded token at batch 1 by Forward (packed weights + one
  // embedding row; MTP heads excluded).
  size_t bytes_streamed_per_token() const;
  StageTimings& timings() { return timings_; }
  const StageTimings& timings() const { return timings_; }

  // The most positions one sequence may hold: max_position_embeddings (or the sliding window).
  int64_t context_limit() const;
  // An empty KV cache for one sequence of up to `capacity` positions; it takes blocks of the
  // model's KV pool as it grows.
  absl::StatusOr<KvCache> NewCache(int64_t capacity) const;
  // The model's KV pool (blocks in the backend's memory, allocated once at PostLoad).
  KvPool& kv_pool() const { return *kv_pool_; }

  // Runs all chunks as one batched step: every GEMM covers the tokens of all chunks (a step
  // larger than step_capacity() runs as several sub-steps, with the same results). Calls are
  // serialized: the model has one execution context.
  // Appends to `logits` one row of vocab_size floats per requested position, in chunk order.
  // When `hidden` is given, also appends the last hidden state after the final norm (the input
  // of the LM head; what MTP draft heads read) for every new token of every chunk, in chunk
  // order: one row of hidden_size floats per token.
  absl::Status Forward(std::span<const SequenceChunk> chunks, std::vector<float>* logits,
                       std::vector<float>* hidden = nullptr) const;

  // While set (not null), Forward and MtpForward add each op's time to `profile` (benches).
  void set_op_profile(OpProfile* profile) const;
  // While set, Forward and MtpForward call `observer` after every linear (benches).
  void set_linear_observer(ExecutionContext::LinearObserver observer) const;
  // The packed linear PostLoad named `name` ("lm_head", "layers.3.qkv", "mtp.0.proj", ...), or
  // null.
  const PackedLinear* FindLinear(absl::string_view name) const;

  // MTP heads restored from the checkpoint (0 when it has none), in head order; draft step s
  // uses head s % num_mtp_heads().
  int num_mtp_heads() const { return static_cast<int>(mtp_heads_.size()); }
  // 0 <= head < num_mtp_heads().
  const MtpHeadInfo& mtp_head_info(int head) const {
    return mtp_heads_[static_cast<size_t>(head)].info;
  }
  // A one-layer KV cache for one MTP head of one sequence (each head needs its own), in blocks of
  // its own; with `target`, in the layer slot of `target`'s blocks (no blocks of its own).
  absl::StatusOr<KvCache> NewMtpCache(int64_t capacity) const;
  absl::StatusOr<KvCache> NewMtpCache(const KvCache& target, int64_t capacity) const;

  // One MTP draft step of head `head` over all chunks as one batch (docs/mtp.md):
  //   e = Embed(t) (0 at position 0 for the DeepSeek and MiMo layouts)
  //   x = proj(concat(norm_e(e), norm_h(h)))   (MiMo: concat(norm_h(h), norm_e(e)))
  //   h' = DecoderBlock(x) with the head's KV cache;  logits = lm_head(final_norm(h'))
  // The main model's embedding and lm_head are used. Appends to `logits` one row of vocab_size
  // floats per requested row, in chunk order. When `hidden_out` is given, appends for every row
  // the hidden state a further draft step takes as its `hidden`: h' before the head's final norm
  // for the DeepSeek layout (DeepSeek-V3/GLM reference code), after it for Qwen3-Next and MiMo.
  absl::Status MtpForward(int head, std::span<const MtpChunk> chunks, std::vector<float>* logits,
                          std::vector<float>* hidden_out = nullptr) const;

 private:
  friend absl::StatusOr<std::unique_ptr<PreparedModel>> PostLoad(BoundModel bound,
                                                                 std::shared_ptr<Backend> backend,
                                                                 const PostLoadOptions& options);
  PreparedModel() = default;

  using Layer = DecoderLayerWeights;
  struct MtpHead {
    MtpHeadInfo info;
    TensorView embedding_norm, hidden_norm, final_norm;
    std::unique_ptr<PackedLinear> proj;  // [hidden, 2·hidden]
    Layer block;
  };
  // One sequence's part of a step, main forward or MTP draft step alike.
  struct Chunk {
    KvCache* cache = nullptr;
    std::span<const int32_t> tokens;
    std::span<const float> hidden;  // MTP: tokens.size() rows of h_p
    bool all_logits = false;
  };

  // Bytes of the MTP heads' packed weights and norms (held, not streamed by the main forward).
  size_t mtp_bytes() const;
  // Checks one chunk (a cache of this model with room, tokens in the vocabulary, a cache used by
  // no earlier chunk of `chunks`).
  absl::Status CheckChunk(std::span<const Chunk> chunks, size_t index, int64_t cache_layers) const;
  // Backs every chunk's new positions with blocks of the pool (ResourceExhausted when it is out).
  absl::Status ReserveBlocks(std::span<const Chunk> chunks) const;
  // Runs the chunks (`head` null: the main model) as sub-steps that fit the step capacity.
  absl::Status Run(std::span<const Chunk> chunks, const MtpHead* head, std::vector<float>* logits,
                   std::vector<float>* hidden_out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // One sub-step: step_ holds its metadata; `pieces` say which rows of which chunk it covers.
  struct Piece {
    const Chunk* chunk;
    int64_t offset;  // first token of the chunk in this sub-step
    int64_t rows;
  };
  absl::Status RunSubStep(std::span<const Piece> pieces, const MtpHead* head,
                          std::vector<float>* logits, std::vector<float>* hidden_out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The sub-step's ops, run by the context (ExecutionContext::RunStep) on the calling thread.
  absl::Status RunStepOps(std::span<const Piece> pieces, const MtpHead* head,
                          std::vector<float>* logits, std::vector<float>* hidden_out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Final norm and LM head of the sub-step's rows of `x` that want logits (appended to
  // `logits`); when `normed_out` is given, every row is normalized and appended to it first.
  absl::Status NormAndLogits(const TensorView& x, const TensorView& norm,
                             std::vector<float>* logits, std::vector<float>* normed_out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  ModelConfig config_;
  LoadReport report_;
  StageTimings timings_;
  DType compute_dtype_ = DType::kF32;
  Quantization quantization_ = Quantization::kNone;
  int quantized_linears_ = 0;
  int linear_count_ = 0;
  int adopted_linears_ = 0;
  int adopted_in_place_linears_ = 0;
  int64_t parameter_count_ = 0;
  std::shared_ptr<Backend> backend_;
  WeightSource source_;  // keeps the checkpoint's bytes alive (read in place where zero-copy)
  // Everything below lives in memory PostLoad prepared on the backend, owned by `weights_`.
  PreparedWeights weights_;
  TensorView embedding_;  // [vocab, hidden] in its stored dtype
  bool embedding_zero_copy_ = false;
  TensorView final_norm_;
  TensorView rope_inv_freq_;  // [1, head_dim / 2]
  std::unique_ptr<PackedLinear> lm_head_;
  std::vector<Layer> layers_;
  std::vector<MtpHead> mtp_heads_;
  std::vector<std::pair<std::string, const PackedLinear*>> linears_by_record_;
  // Layer slots: the main layers, then one per MTP head.
  std::shared_ptr<KvPool> kv_pool_;

  StepCapacity capacity_;
  size_t scratch_bytes_ = 0;
  mutable absl::Mutex mutex_;
  std::unique_ptr<ExecutionContext> context_ ABSL_PT_GUARDED_BY(mutex_);
  StepBuffers buffers_;  // views into context_'s arena
  // Built per step and sub-step; their memory is reused, so a warm step allocates nothing.
  mutable std::vector<Chunk> chunks_ ABSL_GUARDED_BY(mutex_);
  mutable std::vector<Piece> pieces_ ABSL_GUARDED_BY(mutex_);
  mutable StepMetadata step_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace kiln
