// Safetensors, single file: the input is a whole model.safetensors (u64 header length, JSON
// header, data), opened from a model directory the way a load opens it.
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "loaders/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path model_dir = [] {
    std::filesystem::path dir = kiln::fuzz::ScratchDir() / "safetensors";
    std::filesystem::create_directories(dir);
    return dir;
  }();
  kiln::fuzz::WriteFileOrDie(model_dir / "model.safetensors", kiln::fuzz::AsStringView(data, size));
  absl::StatusOr<kiln::WeightSource> source = kiln::OpenSafetensorsCheckpoint(model_dir);
  if (source.ok()) {
    for (const kiln::TensorRecord& record : source->records()) {
      kiln::fuzz::TouchBytes({record.data, record.byte_size});
    }
  }
  return 0;
}
