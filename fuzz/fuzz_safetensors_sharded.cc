// Safetensors, sharded directory: the input is model.safetensors.index.json and the shards it
// may name, separated by kPartSeparator: part 0 is the index, part i >= 1 is written as
// model-0000i-of-0000N.safetensors (N = the number of shards). The index may name any path,
// so confinement to the model directory is exercised too.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "fuzz/fuzz_util.h"
#include "loaders/safetensors.h"

namespace {

constexpr absl::string_view kPartSeparator = "\n--kiln-shard--\n";
constexpr size_t kMaxShards = 8;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path model_dir = kiln::fuzz::ScratchDir() / "sharded";
  std::vector<absl::string_view> parts =
      kiln::fuzz::SplitParts(kiln::fuzz::AsStringView(data, size), kPartSeparator);
  if (parts.size() > kMaxShards + 1) return -1;  // not worth keeping in the corpus
  std::filesystem::create_directories(model_dir);
  kiln::fuzz::ClearDir(model_dir);
  kiln::fuzz::WriteFileOrDie(model_dir / "model.safetensors.index.json", parts[0]);
  const size_t shards = parts.size() - 1;
  for (size_t i = 1; i < parts.size(); ++i) {
    kiln::fuzz::WriteFileOrDie(
        model_dir / absl::StrFormat("model-%05d-of-%05d.safetensors", i, shards), parts[i]);
  }
  absl::StatusOr<kiln::WeightSource> source = kiln::OpenSafetensorsCheckpoint(model_dir);
  if (source.ok()) {
    for (const kiln::TensorRecord& record : source->records()) {
      kiln::fuzz::TouchBytes({record.data, record.byte_size});
    }
  }
  return 0;
}
