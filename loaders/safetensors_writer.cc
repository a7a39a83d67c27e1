#include "loaders/safetensors_writer.h"

#include <cstdio>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "loaders/loader_util.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

// Bytes `tensor` must have: product of its shape × dtype size, without overflow.
absl::StatusOr<uint64_t> ExpectedBytes(const TensorToWrite& tensor) {
  uint64_t elements = 1;
  for (int64_t d : tensor.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", tensor.name, " has negative dimension ", d));
    }
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", tensor.name, " has too many elements"));
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, DTypeSize(tensor.dtype), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor.name, " has too many bytes"));
  }
  return bytes;
}

// Checks names and byte sizes of all tensors; returns the total payload size.
absl::StatusOr<uint64_t> Validate(std::span<const TensorToWrite> tensors) {
  absl::flat_hash_set<absl::string_view> names;
  uint64_t total = 0;
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (tensor.name == "__metadata__") {
      return absl::InvalidArgumentError("a tensor cannot be named __metadata__");
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", tensor.name, " is given more than once"));
    }
    absl::StatusOr<uint64_t> expected = ExpectedBytes(tensor);
    if (!expected.ok()) return expected.status();
    if (tensor.data.size() != *expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", tensor.name, " has ", tensor.data.size(), " bytes of data but ",
                       DTypeName(tensor.dtype), " shape [", absl::StrJoin(tensor.shape, ","),
                       "] needs ", *expected));
    }
    if (__builtin_add_overflow(total, *expected, &total)) {
      return absl::InvalidArgumentError("total tensor size overflows");
    }
  }
  return total;
}

absl::Status WriteValidated(const fs::path& path, std::span<const TensorToWrite> tensors,
                            const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    const uint64_t end = offset + tensor.data.size();
    header[tensor.name] = {{"dtype", std::string(DTypeName(tensor.dtype))},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // e.g. a name that is not valid UTF-8
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path.string(), ": header is not valid JSON: ", e.what()));
  }
  // Pad with spaces (valid JSON whitespace) so the data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::byte length[8];
  for (int i = 0; i < 8; ++i) {
    length[i] = static_cast<std::byte>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  }
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(tensors.size() + 2);
  pieces.emplace_back(length, sizeof(length));
  pieces.emplace_back(reinterpret_cast<const std::byte*>(text.data()), text.size());
  for (const TensorToWrite& tensor : tensors) pieces.push_back(tensor.data);
  return loader_internal::WriteFileAtomically(path, pieces);
}

std::string ShardName(size_t index, size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "model-%05zu-of-%05zu.safetensors", index, count);
  return buffer;
}

}  // namespace

absl::Status WriteSafetensorsFile(const fs::path& path, std::span<const TensorToWrite> tensors,
                                  const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<uint64_t> total = Validate(tensors);
  if (!total.ok()) {
    return absl::Status(total.status().code(), absl::StrCat("cannot write ", path.string(), ": ",
                                                            total.status().message()));
  }
  return WriteValidated(path, tensors, metadata);
}

absl::Status WriteSafetensorsCheckpoint(const fs::path& dir, std::span<const TensorToWrite> tensors,
                                        uint64_t max_shard_bytes) {
  absl::StatusOr<uint64_t> total = Validate(tensors);
  if (!total.ok()) {
    return absl::Status(
        total.status().code(),
        absl::StrCat("cannot write checkpoint ", dir.string(), ": ", total.status().message()));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint directory ", dir.string(), ": ", ec.message()));
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (*total <= max_shard_bytes) {
    if (absl::Status status = WriteValidated(dir / kSingleName, tensors, metadata); !status.ok()) {
      return status;
    }
    // A stale index from an earlier sharded write would take precedence over this file.
    fs::remove(dir / kIndexName, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot remove stale ", (dir / kIndexName).string(), ": ", ec.message()));
    }
    return absl::OkStatus();
  }

  // Greedy: a shard takes tensors in order until the next one would exceed the limit; a tensor
  // larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorToWrite>> shards;
  uint64_t shard_bytes = 0;
  for (const TensorToWrite& tensor : tensors) {
    if (shards.empty() ||
        (!shards.back().empty() && shard_bytes + tensor.data.size() > max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(tensor);
    shard_bytes += tensor.data.size();
  }

  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = ShardName(i + 1, shards.size());
    if (absl::Status status = WriteValidated(dir / name, shards[i], metadata); !status.ok()) {
      return status;
    }
    for (const TensorToWrite& tensor : shards[i]) weight_map[tensor.name] = name;
  }
  // The index is written last, so it never names a shard that is not complete on disk.
  const json index = {{"metadata", {{"total_size", *total}}}, {"weight_map", weight_map}};
  std::string text;
  try {
    text = index.dump(2);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", (dir / kIndexName).string(), ": ", e.what()));
  }
  text.push_back('\n');
  const std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(text.data()),
                                         text.size());
  return loader_internal::WriteFileAtomically(dir / kIndexName, {&piece, 1});
}

}  // namespace kiln
