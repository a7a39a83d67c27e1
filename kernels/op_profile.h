// Where a step's time goes, op by op: an ExecutionContext given an OpProfile adds each op's wall
// time to it (benches print the shares). While profiling, the context waits for each op before
// stopping its clock, so an asynchronous backend is timed as well, without its overlap.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

enum class OpKind : int {
  kEmbed,
  kRmsNorm,
  kAddRmsNorm,
  kLinear,
  kRopeAndAppendKv,
  kAttention,
  kSiluMul,
  kAdd,
  kGatherRows,
  kCopyFromHost,
  kCopyToHost,
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kCopyToHost) + 1;

absl::string_view OpKindName(OpKind kind);

struct OpProfile {
  struct Entry {
    double seconds = 0;
    int64_t calls = 0;
  };
  std::array<Entry, kNumOpKinds> by_kind{};
  // Linear time by the linear's name (PackedLinear::name(), e.g. "layers.3.qkv").
  std::map<std::string, Entry, std::less<>> by_linear;

  const Entry& of(OpKind kind) const { return by_kind[static_cast<size_t>(kind)]; }
  double total_seconds() const;
  void Clear() { *this = OpProfile(); }
};

}  // namespace kiln
