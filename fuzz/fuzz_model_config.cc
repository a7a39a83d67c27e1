// config.json → ModelConfig: the input is the JSON text. A config that parses must also survive
// the round trip through ModelConfigToJson (what `kiln synth` and native tensorized files write).
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "models/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<kiln::ModelConfig> config =
      kiln::ParseModelConfig(kiln::fuzz::AsStringView(data, size));
  if (!config.ok()) return 0;
  (void)config->q_dim();
  (void)config->kv_dim();
  absl::StatusOr<kiln::ModelConfig> again =
      kiln::ParseModelConfig(kiln::ModelConfigToJson(*config));
  if (!again.ok()) {
    std::fprintf(stderr, "a parsed config does not parse again: %s\n",
                 std::string(again.status().message()).c_str());
    __builtin_trap();
  }
  return 0;
}
