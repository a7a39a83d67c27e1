#include "kernels/step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln {

void StepMetadata::Clear() {
  token_ids.clear();
  positions.clear();
  row_sequence.clear();
  sequences.clear();
  block_tables.clear();
  gather_rows.clear();
}

void StepMetadata::AddSequence(const int32_t* tokens, int64_t count, int64_t start_position,
                               std::span<const int32_t> block_table) {
  const int32_t index = static_cast<int32_t>(sequences.size());
  sequences.push_back({rows(), count, start_position, static_cast<int64_t>(block_tables.size()),
                       static_cast<int64_t>(block_table.size())});
  block_tables.insert(block_tables.end(), block_table.begin(), block_table.end());
  token_ids.insert(token_ids.end(), tokens, tokens + count);
  for (int64_t i = 0; i < count; ++i) {
    positions.push_back(static_cast<int32_t>(start_position + i));
    row_sequence.push_back(index);
  }
}

absl::Status ValidateStep(const StepMetadata& step, const StepLimits& limits) {
  const int64_t rows = step.rows();
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("step metadata: ", parts...));
  };
  if (static_cast<int64_t>(step.positions.size()) != rows ||
      static_cast<int64_t>(step.row_sequence.size()) != rows) {
    return invalid(rows, " token ids but ", step.positions.size(), " positions and ",
                   step.row_sequence.size(), " row sequences");
  }
  if (rows > limits.max_rows) {
    return invalid(rows, " rows exceed the context's limit of ", limits.max_rows);
  }
  if (static_cast<int64_t>(step.sequences.size()) > limits.max_sequences) {
    return invalid(step.sequences.size(), " sequences exceed the context's limit of ",
                   limits.max_sequences);
  }
  if (!step.sequences.empty() && (step.pool.data == nullptr || step.pool.block_size <= 0 ||
                                  step.pool.layers <= 0 || step.pool.kv_dim <= 0)) {
    return invalid("no KV pool");
  }
  if (!KvPoolHolds(step.pool.dtype)) {
    return invalid("a KV pool of ", DTypeName(step.pool.dtype), "; pools hold F32 or BF16");
  }
  int64_t next_row = 0;
  for (size_t s = 0; s < step.sequences.size(); ++s) {
    const StepSequence& seq = step.sequences[s];
    if (seq.first_row != next_row || seq.rows <= 0) {
      return invalid("sequence ", s, " has rows [", seq.first_row, ", +", seq.rows,
                     "); expected a non-empty range from row ", next_row);
    }
    if (seq.start_position < 0 || seq.table_offset < 0 || seq.table_size < 0 ||
        seq.table_offset + seq.table_size > static_cast<int64_t>(step.block_tables.size())) {
      return invalid("sequence ", s, " has an invalid start position or block table");
    }
    const int64_t needed = seq.start_position + seq.rows;
    if (seq.table_size * step.pool.block_size < needed) {
      return invalid("sequence ", s, "'s block table of ", seq.table_size, " blocks holds ",
                     seq.table_size * step.pool.block_size, " positions; the step writes up to ",
                     needed);
    }
    const int32_t* table = step.table(seq);
    for (int64_t b = 0; b < seq.table_size; ++b) {
      if (table[b] < 0 || table[b] >= step.pool.num_blocks) {
        return invalid("sequence ", s, " names block ", table[b], " of a pool of ",
                       step.pool.num_blocks);
      }
    }
    for (int64_t i = 0; i < seq.rows; ++i) {
      const size_t r = static_cast<size_t>(seq.first_row + i);
      if (step.row_sequence[r] != static_cast<int32_t>(s) ||
          step.positions[r] != seq.start_position + i) {
        return invalid("row ", r, " does not match sequence ", s, " (position ", step.positions[r],
                       ", sequence ", step.row_sequence[r], ")");
      }
    }
    next_row += seq.rows;
  }
  if (next_row != rows) return invalid("sequences cover ", next_row, " of ", rows, " rows");
  int64_t previous = -1;
  for (int32_t row : step.gather_rows) {
    if (row <= previous || row >= rows) {
      return invalid("gather row ", row, " is not ascending within [0, ", rows, ")");
    }
    previous = row;
  }
  return absl::OkStatus();
}

}  // namespace kiln
