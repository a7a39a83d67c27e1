// PreparedModel: a model whose weights went through PostLoad. It is the only type with a
// forward pass, and only models/lifecycle.h can make one (design.md §1, invariant 1).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "models/kv_cache.h"
#include "models/load_report.h"
#include "models/model_config.h"
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
  absl::string_view backend_name() const { return backend_->name(); }
  DType compute_dtype() const { return compute_dtype_; }
  int64_t parameter_count() const { return parameter_count_; }
  // Bytes the model holds for its forward pass: packed weights, norms, the embedding table.
  size_t weight_bytes() const;
  // Bytes read from memory per decoded token at batch 1 (packed weights + one embedding row).
  size_t bytes_streamed_per_token() const;
  StageTimings& timings() { return timings_; }
  const StageTimings& timings() const { return timings_; }

  absl::StatusOr<KvCache> NewCache(int64_t capacity) const;

  // Runs all chunks as one batched step: every GEMM covers the tokens of all chunks.
  // Appends to `logits` one row of vocab_size floats per requested position, in chunk order.
  absl::Status Forward(std::span<const SequenceChunk> chunks, std::vector<float>* logits) const;

 private:
  friend absl::StatusOr<std::unique_ptr<PreparedModel>> PostLoad(BoundModel bound,
                                                                 std::shared_ptr<Backend> backend,
                                                                 const PostLoadOptions& options);
  PreparedModel() = default;

  struct Layer {
    std::vector<float> input_norm, post_attention_norm, q_norm, k_norm;
    std::unique_ptr<PackedLinear> qkv, o, gate_up, down;
  };

  ModelConfig config_;
  LoadReport report_;
  StageTimings timings_;
  DType compute_dtype_ = DType::kF32;
  int64_t parameter_count_ = 0;
  std::shared_ptr<Backend> backend_;
  WeightSource source_;   // keeps the embedding table's bytes alive (zero-copy where mapped)
  WeightView embedding_;  // [vocab, hidden] in its stored dtype
  std::vector<float> final_norm_;
  std::unique_ptr<PackedLinear> lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<cpu::RopeTable> rope_;
};

}  // namespace kiln
