// Per-step metadata: everything an op of one forward step needs to know besides its tensors.
// The model builds it on the host and hands it to the execution context once per step
// (ExecutionContext::BeginStep); a device backend copies it into its own memory, and kernels read
// it from there rather than taking per-step values as launch arguments (what lets a GPU replay a
// captured graph for every decode step; docs/backends.md §1).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/buffer.h"
#include "kernels/dtype.h"

namespace kiln {

// The KV pool every sequence of a step reads and writes: `num_blocks` fixed-size blocks in
// backend memory, each holding `block_size` positions of every layer as `dtype` (fp32, or bf16 for
// half the memory and half the bytes each attention reads), per layer the keys and then the values:
// [layers][keys, values][block_size · kv_dim]. Keys are stored transposed, [kv_dim][block_size], so
// that one key dimension of a block's positions is contiguous (a vector of 16 scores on a CPU, a
// coalesced read on a GPU); values are rows, [block_size][kv_dim]. A sequence's block table lists
// its blocks in position order: position p lives in block table[p / block_size] at offset p %
// block_size.
struct KvPoolRef {
  void* data = nullptr;
  Device device;
  int64_t num_blocks = 0;
  int64_t block_size = 0;  // positions per block
  int64_t layers = 0;
  int64_t kv_dim = 0;         // num_key_value_heads × head_dim
  DType dtype = DType::kF32;  // kF32 or kBF16 (KvPoolHolds)

  int64_t block_elements() const { return layers * 2 * block_size * kv_dim; }
  // The keys (which = 0) or values (which = 1) of `layer` in `block`: block_size · kv_dim
  // elements of T, which must be the pool's type (float for kF32, uint16_t bits for kBF16).
  template <typename T>
  T* rows(int32_t block, int64_t layer, int which) const {
    return static_cast<T*>(data) + block * block_elements() +
           (layer * 2 + which) * block_size * kv_dim;
  }
  // Where value i (0 ≤ i < kv_dim) of the position at `offset` in a block lies in rows(…, 0)
  // (the keys) or rows(…, 1) (the values).
  int64_t key_index(int64_t offset, int64_t i) const { return i * block_size + offset; }
  int64_t value_index(int64_t offset, int64_t i) const { return offset * kv_dim + i; }
};

// Whether a KV pool can hold elements of `dtype`: fp32, or bf16.
constexpr bool KvPoolHolds(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

// The rows of one sequence in a step: rows [first_row, first_row + rows) hold its new tokens at
// positions [start_position, start_position + rows); positions below start_position are already
// in its blocks. Its block table is StepMetadata::block_tables[table_offset, + table_size).
struct StepSequence {
  int64_t first_row = 0;
  int64_t rows = 0;
  int64_t start_position = 0;
  int64_t table_offset = 0;
  int64_t table_size = 0;
};

// One step: `rows()` tokens of `sequences.size()` sequences, in sequence order.
struct StepMetadata {
  std::vector<int32_t> token_ids;     // per row
  std::vector<int32_t> positions;     // per row: its absolute position in its sequence
  std::vector<int32_t> row_sequence;  // per row: index into `sequences`
  std::vector<StepSequence> sequences;
  std::vector<int32_t> block_tables;  // every sequence's block table, back to back
  // Rows whose outputs GatherRows collects (the rows that want logits or hidden states),
  // ascending.
  std::vector<int32_t> gather_rows;
  KvPoolRef pool;

  int64_t rows() const { return static_cast<int64_t>(token_ids.size()); }
  const int32_t* table(const StepSequence& sequence) const {
    return block_tables.data() + sequence.table_offset;
  }
  // Empties every list and keeps their memory, so building the next step allocates nothing.
  void Clear();
  // Appends a sequence's `tokens` (the per-row entries follow from its first row and position)
  // and its block table.
  void AddSequence(const int32_t* tokens, int64_t count, int64_t start_position,
                   std::span<const int32_t> block_table);
};

// What an execution context was sized for (ContextOptions).
struct StepLimits {
  int64_t max_rows = 0;
  int64_t max_sequences = 0;
};

// Checks that the per-row lists agree with the sequences (rows partitioned in order, positions
// consecutive from start_position), that every block table covers its sequence's positions with
// blocks of the pool, that gather rows ascend within the step, and that the step fits `limits`.
// InvalidArgument naming what is wrong. (Sequences may share blocks — a cached prefix — so
// whether a sequence writes only its own is the caller's to ensure.)
absl::Status ValidateStep(const StepMetadata& step, const StepLimits& limits);

}  // namespace kiln
