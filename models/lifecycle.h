// The one door from weights to a runnable model: Bind → Restore → PostLoad → PreparedModel.
// Every loader ends here (design.md §1, invariant 1).
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "models/kv_pool.h"
#include "models/model_config.h"
#include "models/prepared_model.h"
#include "models/weight_source.h"

namespace kiln {

struct PostLoadOptions {
  // Dtype weights are packed in. Unset: the checkpoint's (F32 → F32, BF16 → BF16, F16 → F32).
  std::optional<DType> compute_dtype;
  // The largest step the execution context is sized for (larger ones run as sub-steps).
  StepCapacity step_capacity;
  // The KV pool; a budget of 0 sizes it for default_sequences sequences of default_context
  // positions (at most max_position_embeddings), at most a quarter of the backend's available
  // memory.
  KvPoolOptions kv_pool;
  // Weight quantization of the linears (kernels/quantization.h); kNone keeps compute_dtype.
  Quantization quantize = Quantization::kNone;
};

// The compute dtype a user names ("", "bf16" or "f32"; any case): nullopt for "" (the
// checkpoint's), else the dtype; InvalidArgument for anything else.
absl::StatusOr<std::optional<DType>> ParseComputeDType(absl::string_view text);

absl::StatusOr<std::unique_ptr<PreparedModel>> BuildPreparedModel(
    WeightSource source, const ModelConfig& config, std::shared_ptr<Backend> backend,
    const PostLoadOptions& options = {});

// Number of PostLoad runs in this process (tests check that each load runs it exactly once).
uint64_t PostLoadRunCount();

}  // namespace kiln
