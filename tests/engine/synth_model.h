// The engine tests' models: a synthetic checkpoint written into a scratch directory and loaded
// on the CPU backend, through the same LoadModel path as the server.
#pragma once

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "clients/synth.h"
#include "gtest/gtest.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"

namespace kiln::testing_util {

// Greedy continuation of `prompt` by a plain forward loop over a KV cache of its own: what the
// engine's output is compared with.
inline std::vector<int32_t> GreedyByForwardLoop(const PreparedModel& model,
                                                const std::vector<int32_t>& prompt, int n) {
  absl::StatusOr<KvCache> cache = model.NewCache(static_cast<int64_t>(prompt.size()) + n);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return {};
  std::vector<int32_t> step = prompt, out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits;
    SequenceChunk chunk{&*cache, step, false};
    EXPECT_TRUE(model.Forward({&chunk, 1}, &logits).ok());
    out.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    step = {out.back()};
  }
  return out;
}

inline absl::StatusOr<std::unique_ptr<PreparedModel>> WriteAndLoad(const std::filesystem::path& dir,
                                                                   const ModelConfig& config,
                                                                   const SynthOptions& options) {
  KILN_RETURN_IF_ERROR(WriteSynthCheckpoint(dir, config, options));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  return LoadModel(dir, std::shared_ptr<Backend>(std::move(backend)));
}

}  // namespace kiln::testing_util
