// A test suite's in-process kiln-server whose streamed tokens are paced (one every
// kPacedTokenDelay), so that load-generator tests measure a known inter-token latency and can
// end streams before their last token. One server per suite, started in SetUpTestSuite.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "clients/loadgen/workload.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace kiln::loadgen {

inline constexpr absl::Duration kPacedTokenDelay = absl::Milliseconds(20);

class PacedServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options = server_test::TestServerOptions();
    options.models = {{"plain", "plain", "", ""}};
    options.token_delay_for_testing = kPacedTokenDelay;
    server_ = server_test::TestServer::Start(options).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  static std::vector<std::shared_ptr<grpc::Channel>> Channels() { return {server_->channel()}; }
  static PromptSource Prompts(int32_t input, int32_t output) {
    WorkloadOptions workload;
    workload.input = LengthDistribution::Fixed(input);
    workload.output = LengthDistribution::Fixed(output);
    return *PromptSource::Create(workload);
  }

  inline static server_test::TestServer* server_ = nullptr;
};

}  // namespace kiln::loadgen
