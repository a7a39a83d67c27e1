// The synthesized checkpoints the model benchmarks run on (real shapes, random weights).
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "clients/synth.h"

namespace kiln::bench {

// The checkpoint of synth preset `preset` with `dtype` ("bf16" or "f32") weights under
// `model_dir`, written there on first use and reused afterwards.
inline absl::StatusOr<std::filesystem::path> SynthCheckpoint(const std::string& preset,
                                                             const std::string& dtype,
                                                             const std::string& model_dir) {
  if (dtype != "bf16" && dtype != "f32") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype ", dtype, ": use bf16 or f32"));
  }
  KILN_ASSIGN_OR_RETURN(ModelConfig config, SynthPresetConfig(preset));
  SynthOptions synth;
  synth.dtype = dtype == "f32" ? DType::kF32 : DType::kBF16;
  const std::filesystem::path dir = std::filesystem::path(model_dir) / (preset + "-" + dtype);
  if (!std::filesystem::exists(dir / "config.json")) {
    std::printf("writing %s ...\n", dir.c_str());
    KILN_RETURN_IF_ERROR(WriteSynthCheckpoint(dir, config, synth));
  }
  return dir;
}

}  // namespace kiln::bench
