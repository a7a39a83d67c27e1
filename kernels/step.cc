#include "kernels/step.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln {

void StepMetadata::Clear() {
  token_ids.clear();
  positions.clear();
  row_sequence.clear();
  sequences.clear();
  gather_rows.clear();
}

void StepMetadata::AddSequence(const int32_t* tokens, int64_t count, int64_t start_position,
                               const KvCacheRef& kv) {
  const int32_t index = static_cast<int32_t>(sequences.size());
  sequences.push_back({rows(), count, start_position, kv});
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
  int64_t next_row = 0;
  for (size_t s = 0; s < step.sequences.size(); ++s) {
    const StepSequence& seq = step.sequences[s];
    if (seq.first_row != next_row || seq.rows <= 0) {
      return invalid("sequence ", s, " has rows [", seq.first_row, ", +", seq.rows,
                     "); expected a non-empty range from row ", next_row);
    }
    if (seq.kv.data == nullptr || seq.kv.layers <= 0 || seq.kv.kv_dim <= 0) {
      return invalid("sequence ", s, " has no KV cache");
    }
    // Quadratic, but over a step's few sequences, and it allocates nothing.
    for (size_t earlier = 0; earlier < s; ++earlier) {
      if (step.sequences[earlier].kv.data == seq.kv.data) {
        return absl::InvalidArgumentError("two chunks of one step share a KV cache");
      }
    }
    if (seq.start_position < 0 || seq.start_position + seq.rows > seq.kv.capacity) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", seq.start_position + seq.rows,
                                                " tokens exceeds its KV cache capacity of ",
                                                seq.kv.capacity));
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
