// Per-step metadata: everything an op of one forward step needs to know besides its tensors.
// The model builds it on the host and hands it to the execution context once per step
// (ExecutionContext::BeginStep); a device backend copies it into its own memory, and kernels read
// it from there rather than taking per-step values as launch arguments (what lets a GPU replay a
// captured graph for every decode step; docs/backends.md §1).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace kiln {

// Where one sequence's keys and values live: fp32, in backend memory, laid out as
// [layers][keys, values][capacity][kv_dim]. Positions [0, start_position) of the step's sequence
// are already written; the step writes the next `rows`.
struct KvCacheRef {
  float* data = nullptr;
  int64_t layers = 0;
  int64_t capacity = 0;  // positions per layer
  int64_t kv_dim = 0;    // num_key_value_heads × head_dim

  float* keys(int64_t layer) const { return data + (layer * 2) * capacity * kv_dim; }
  float* values(int64_t layer) const { return data + (layer * 2 + 1) * capacity * kv_dim; }
};

// The rows of one sequence in a step: rows [first_row, first_row + rows) hold its new tokens at
// positions [start_position, start_position + rows).
struct StepSequence {
  int64_t first_row = 0;
  int64_t rows = 0;
  int64_t start_position = 0;
  KvCacheRef kv;
};

// One step: `rows()` tokens of `sequences.size()` sequences, in sequence order.
struct StepMetadata {
  std::vector<int32_t> token_ids;     // per row
  std::vector<int32_t> positions;     // per row: its absolute position in its sequence
  std::vector<int32_t> row_sequence;  // per row: index into `sequences`
  std::vector<StepSequence> sequences;
  // Rows whose outputs GatherRows collects (the rows that want logits or hidden states),
  // ascending.
  std::vector<int32_t> gather_rows;

  int64_t rows() const { return static_cast<int64_t>(token_ids.size()); }
  // Empties every list and keeps their memory, so building the next step allocates nothing.
  void Clear();
  // Appends a sequence's `tokens` (the per-row entries follow from its first row and position).
  void AddSequence(const int32_t* tokens, int64_t count, int64_t start_position,
                   const KvCacheRef& kv);
};

// What an execution context was sized for (ContextOptions).
struct StepLimits {
  int64_t max_rows = 0;
  int64_t max_sequences = 0;
};

// Checks that the per-row lists agree with the sequences (rows partitioned in order, positions
// consecutive from start_position), that every cache has room for its rows and is used by one
// sequence only, that gather rows ascend within the step, and that the step fits `limits`.
// InvalidArgument (OutOfRange for a full cache) naming what is wrong.
absl::Status ValidateStep(const StepMetadata& step, const StepLimits& limits);

}  // namespace kiln
