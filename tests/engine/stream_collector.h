// Collects one request's updates from the engine's callbacks (run on the engine's thread) for
// a test thread to read after Wait().
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "gtest/gtest.h"

namespace kiln {

struct StreamCollector {
  absl::Mutex mutex;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<SampledToken> logprobs;
  std::vector<GenerationUpdate> updates;
  std::optional<GenerationUpdate> last;  // the final update: finish reason, status, stats
  absl::Notification done;

  UpdateCallback Callback() {
    return [this](GenerationUpdate update) {
      const bool final = update.finish != FinishReason::kNone || !update.status.ok();
      {
        absl::MutexLock lock(&mutex);
        tokens.insert(tokens.end(), update.token_ids.begin(), update.token_ids.end());
        text += update.text;
        logprobs.insert(logprobs.end(), update.logprobs.begin(), update.logprobs.end());
        if (final) last = update;
        updates.push_back(std::move(update));
      }
      // After the lock is released: the waiter may destroy this object once notified.
      if (final) done.Notify();
    };
  }
  void Wait(absl::Duration timeout = absl::Seconds(120)) {
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(timeout));
  }
};

}  // namespace kiln
