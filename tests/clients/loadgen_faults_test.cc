// kiln-loadgen's client-side faults and latency series: the fault plan (--cancel-fraction,
// --disconnect-fraction), the flags, the accounting that keeps requests ended on purpose apart
// from successes and failures (summary, text, JSON), the inter-token latency series by window,
// and the gRPC runner cancelling streams and dropping their connections against an in-process
// server whose tokens are paced at a known delay. (The HTTP runner's faults are tested against a
// fake server in loadgen_http_test.cc.)
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "clients/loadgen/options.h"
#include "clients/loadgen/phase.h"
#include "clients/loadgen/report.h"
#include "clients/loadgen/runner.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/workload.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/clients/paced_server_fixture.h"
#include "tests/server/server_test_util.h"

namespace kiln::loadgen {
namespace {

using server_test::TestServer;
using server_test::TestServerOptions;

// ---- the fault plan -------------------------------------------------------------------------

TEST(LoadgenWorkloadTest, FaultPlansDrawTheFractionsAndTokenCounts) {
  constexpr int kDraws = 20000, kMaxTokens = 50;
  FaultPlanner planner(/*cancel_fraction=*/0.1, /*disconnect_fraction=*/0.05, /*seed=*/7);
  std::map<ClientFault, int> kinds;
  std::map<int32_t, int> counts;
  std::vector<FaultPlanner::Plan> plans;
  for (int i = 0; i < kDraws; ++i) {
    const FaultPlanner::Plan plan = planner.Next(kMaxTokens);
    plans.push_back(plan);
    ++kinds[plan.fault];
    if (plan.fault == ClientFault::kNone) {
      EXPECT_EQ(plan.after_tokens, 0);
      continue;
    }
    ASSERT_GE(plan.after_tokens, 1);
    ASSERT_LT(plan.after_tokens, kMaxTokens);  // always before the last token
    ++counts[plan.after_tokens];
  }
  // Binomial standard deviations: 42 and 31 draws.
  EXPECT_NEAR(kinds[ClientFault::kCancel], 0.10 * kDraws, 200);
  EXPECT_NEAR(kinds[ClientFault::kDisconnect], 0.05 * kDraws, 150);
  // Uniform over 1..49: every count drawn, none far from 3000 / 49 ≈ 61 times.
  EXPECT_EQ(counts.size(), 49u);
  EXPECT_EQ(counts.begin()->first, 1);
  EXPECT_EQ(counts.rbegin()->first, 49);
  for (const auto& [count, times] : counts) EXPECT_NEAR(times, 61, 35) << count;

  // The same seed, the same plan; requests too short to stop early are left alone.
  FaultPlanner again(0.1, 0.05, 7);
  for (int i = 0; i < 100; ++i) {
    const FaultPlanner::Plan plan = again.Next(kMaxTokens);
    EXPECT_EQ(plan.fault, plans[i].fault);
    EXPECT_EQ(plan.after_tokens, plans[i].after_tokens);
  }
  FaultPlanner all_cancel(1, 0, 1), all_disconnect(0, 1, 1), none(0, 0, 1);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(all_cancel.Next(10).fault, ClientFault::kCancel);
    EXPECT_EQ(all_disconnect.Next(10).fault, ClientFault::kDisconnect);
    EXPECT_EQ(none.Next(10).fault, ClientFault::kNone);
    EXPECT_EQ(all_cancel.Next(1).fault, ClientFault::kNone);
    const FaultPlanner::Plan two = all_cancel.Next(2);
    EXPECT_EQ(two.fault, ClientFault::kCancel);
    EXPECT_EQ(two.after_tokens, 1);
  }
}

// ---- flags ------------------------------------------------------------------------------------

absl::StatusOr<LoadgenOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "kiln-loadgen");
  return ParseOptions(static_cast<int>(args.size()), args.data());
}

TEST(LoadgenOptionsTest, FaultsAndWindow) {
  absl::StatusOr<LoadgenOptions> o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cancel_fraction, 0);
  EXPECT_EQ(o->disconnect_fraction, 0);
  EXPECT_EQ(o->window, absl::Seconds(60));

  o = Parse({"--cancel-fraction", "0.1", "--disconnect_fraction=0.05", "--window", "10s"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->cancel_fraction, 0.1);
  EXPECT_DOUBLE_EQ(o->disconnect_fraction, 0.05);
  EXPECT_EQ(o->window, absl::Seconds(10));
  o = Parse({"--protocol=openai", "--cancel-fraction=1", "--window=500ms"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cancel_fraction, 1);
  EXPECT_EQ(o->window, absl::Milliseconds(500));
  o = Parse({"--disconnect-fraction=0.5", "--cancel-fraction=0.5"});  // a sum of 1 is allowed
  ASSERT_TRUE(o.ok()) << o.status();

  for (const auto& [args, flag] : std::vector<std::pair<std::vector<const char*>, std::string>>{
           {{"--cancel-fraction", "-0.1"}, "--cancel-fraction"},
           {{"--cancel-fraction", "1.5"}, "--cancel-fraction"},
           {{"--cancel-fraction", "some"}, "--cancel-fraction"},
           {{"--disconnect-fraction", "nan"}, "--disconnect-fraction"},
           {{"--disconnect-fraction"}, "--disconnect-fraction"},
           {{"--cancel-fraction=0.6", "--disconnect-fraction=0.5"}, "sum to more than 1"},
           {{"--disconnect-fraction=0.1", "--tls"}, "--disconnect-fraction"},
           {{"--disconnect-fraction=0.1", "--tls-ca=ca.pem"}, "--disconnect-fraction"},
           {{"--window", "0"}, "--window"},
           {{"--window", "soon"}, "--window"}}) {
    absl::StatusOr<LoadgenOptions> bad = Parse(args);
    ASSERT_FALSE(bad.ok()) << args[0];
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(bad.status().message(), flag)) << bad.status();
  }
  // TLS without dropped connections stays allowed.
  EXPECT_TRUE(Parse({"--cancel-fraction=0.1", "--tls"}).ok());

  // A phase refuses fractions outside [0, 1] or summing past 1 before sending anything.
  PhaseConfig config;
  config.concurrency = 1;
  config.requests = 1;
  EXPECT_TRUE(ValidatePhaseConfig(config).ok());
  config.cancel_fraction = 0.7;
  config.disconnect_fraction = 0.4;
  EXPECT_EQ(ValidatePhaseConfig(config).code(), absl::StatusCode::kInvalidArgument);
  config.disconnect_fraction = -0.1;
  EXPECT_EQ(ValidatePhaseConfig(config).code(), absl::StatusCode::kInvalidArgument);
}

// ---- accounting and the latency series ----------------------------------------------------

TEST(LoadgenStatsTest, ClientFaultsAreNeitherSuccessesNorFailures) {
  RequestRecord done;  // planned to be cancelled, but its stream ended first: a success
  done.ttft_seconds = 0.1, done.e2e_seconds = 0.4, done.output_tokens = 4;
  done.itl_seconds = {0.1, 0.1, 0.1};
  done.finish_reason = "LENGTH";
  done.planned_fault = ClientFault::kCancel, done.fault_after_tokens = 5;
  RequestRecord failed;
  failed.code = 5, failed.error = "model 'x' is not loaded";
  RequestRecord cancelled;
  cancelled.ttft_seconds = 0.05, cancelled.e2e_seconds = 0.2, cancelled.output_tokens = 3;
  cancelled.itl_seconds = {0.9, 0.9};  // would dominate the ITL if it counted
  cancelled.code = 1, cancelled.code_label = "cancelled";
  cancelled.planned_fault = cancelled.fault = ClientFault::kCancel;
  cancelled.fault_after_tokens = 3;
  RequestRecord disconnected;
  disconnected.ttft_seconds = 0.05, disconnected.output_tokens = 2;
  disconnected.code = 14, disconnected.code_label = "disconnected";
  disconnected.planned_fault = disconnected.fault = ClientFault::kDisconnect;
  RequestRecord raced = cancelled;  // cancelled after the server sent its last status: still ours
  raced.code = 0;
  EXPECT_TRUE(done.succeeded());
  EXPECT_TRUE(failed.failed());
  for (const RequestRecord* r : {&cancelled, &disconnected, &raced}) {
    EXPECT_FALSE(r->succeeded());
    EXPECT_FALSE(r->failed());
    EXPECT_FALSE(IsGood(*r, GoodputLimits{}));
  }
  EXPECT_EQ(ClientFaultLabel(ClientFault::kCancel), "cancelled");
  EXPECT_EQ(ClientFaultLabel(ClientFault::kDisconnect), "disconnected");
  EXPECT_EQ(ClientFaultLabel(ClientFault::kNone), "");

  const PhaseSummary s =
      SummarizePhase({done, failed, cancelled, disconnected, raced}, 1.0, GoodputLimits{});
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.succeeded, 1);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.cancelled, 2);
  EXPECT_EQ(s.disconnected, 1);
  EXPECT_EQ(s.fault_output_tokens, 3 + 2 + 3);
  EXPECT_EQ(s.output_tokens, 4);           // of the successful request only
  ASSERT_EQ(s.errors_by_code.size(), 1u);  // neither CANCELLED nor UNAVAILABLE
  EXPECT_EQ(s.errors_by_code.at("NOT_FOUND"), 1);
  EXPECT_EQ(s.finish_reasons, (std::map<std::string, int64_t>{{"LENGTH", 1}}));
  // Latencies are the successful request's alone.
  EXPECT_EQ(s.ttft.count, 1);
  EXPECT_EQ(s.itl.count, 3);
  EXPECT_DOUBLE_EQ(s.itl.max, 0.1);
  EXPECT_EQ(s.e2e.count, 1);

  // The text and JSON reports keep them apart from the errors.
  RunReport report;
  report.target = "t";
  report.model = "m";
  PhaseResult phase;
  phase.records = {done, failed, cancelled, disconnected, raced};
  phase.start_unix_seconds = 1.7e9;
  phase.issue_end_seconds = 1;
  report.phases.push_back(phase);
  report.summaries.push_back(s);
  report.summaries.back().label = "concurrency 2";
  std::ostringstream text;
  PrintSummary(report, text);
  EXPECT_TRUE(absl::StrContains(text.str(), "Cancelled / disconnected (client): 2 / 1"))
      << text.str();
  EXPECT_TRUE(absl::StrContains(text.str(), "Errors NOT_FOUND:")) << text.str();
  EXPECT_FALSE(absl::StrContains(text.str(), "Errors CANCELLED")) << text.str();
  EXPECT_FALSE(absl::StrContains(text.str(), "Errors cancelled")) << text.str();
  testing_util::ScratchDir scratch;
  const std::string path = (scratch / "faults.json").string();
  ASSERT_TRUE(WriteJson(report, path).ok());
  std::ifstream in(path);
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  const nlohmann::json& p = json["phases"][0];
  EXPECT_EQ(p["failed"], 1);
  EXPECT_EQ(p["cancelled"], 2);
  EXPECT_EQ(p["disconnected"], 1);
  EXPECT_EQ(p["fault_output_tokens"], 8);
  EXPECT_EQ(p["errors_by_code"].size(), 1u);
  EXPECT_EQ(p["start_unix_s"], 1.7e9);
  EXPECT_EQ(p["finish_reasons"]["LENGTH"], 1);
  const nlohmann::json& requests = json["requests"];
  ASSERT_EQ(requests.size(), 5u);
  EXPECT_EQ(requests[0]["planned_fault"], "cancel");
  EXPECT_EQ(requests[0]["client_fault"], "");
  EXPECT_EQ(requests[1].count("planned_fault"), 0u);
  EXPECT_EQ(requests[2]["client_fault"], "cancelled");
  EXPECT_EQ(requests[2]["fault_after_tokens"], 3);
  EXPECT_EQ(requests[3]["client_fault"], "disconnected");
  EXPECT_EQ(requests[3]["code"], "disconnected");
}

TEST(LoadgenStatsTest, ItlSeriesGroupsTokensByArrivalWindow) {
  // Tokens arrive at 0.5 (the first), 0.8, 1.2, 1.3 and 3.3 s: windows of 1 s hold the gaps
  // {0.3}, {0.4, 0.1}, {}, {2.0}.
  RequestRecord a;
  a.start_seconds = 0.2, a.ttft_seconds = 0.3;
  a.itl_seconds = {0.3, 0.4, 0.1, 2.0};
  a.output_tokens = 5;
  RequestRecord b;  // from 1.0 s: tokens at 1.5 and 1.75
  b.start_seconds = 1.0, b.ttft_seconds = 0.5, b.itl_seconds = {0.25}, b.output_tokens = 2;
  b.warmup = true;  // by time: warm-up requests count too
  RequestRecord failed = a;
  failed.code = 14;
  RequestRecord cancelled = a;
  cancelled.fault = ClientFault::kCancel;
  const std::vector<ItlWindow> series =
      ItlSeries({a, b, failed, cancelled}, /*window_seconds=*/1.0, /*full_until_seconds=*/2.0);
  ASSERT_EQ(series.size(), 4u);
  EXPECT_EQ(series[0].start_seconds, 0);
  EXPECT_EQ(series[0].end_seconds, 1);
  EXPECT_EQ(series[0].itl.count, 1);
  EXPECT_DOUBLE_EQ(series[0].itl.p99, 0.3);
  EXPECT_EQ(series[1].itl.count, 3);  // 0.4, 0.1 and b's 0.25
  EXPECT_DOUBLE_EQ(series[1].itl.max, 0.4);
  EXPECT_DOUBLE_EQ(series[1].itl.p99, Percentile({0.1, 0.25, 0.4}, 99));
  EXPECT_DOUBLE_EQ(series[1].itl.p50, 0.25);
  EXPECT_EQ(series[2].itl.count, 0);
  EXPECT_EQ(series[3].itl.count, 1);
  EXPECT_DOUBLE_EQ(series[3].itl.p99, 2.0);
  EXPECT_TRUE(series[0].full);
  EXPECT_TRUE(series[1].full);  // ends at 2.0, the end of the issuing period
  EXPECT_FALSE(series[2].full);
  EXPECT_FALSE(series[3].full);
  EXPECT_TRUE(ItlSeries({a}, 0, 2).empty());
  EXPECT_TRUE(ItlSeries({failed, cancelled}, 1, 2).empty());
}

// ---- the gRPC runner against a server ---------------------------------------------------------

// Paced tokens: a stream of 10 lasts 200 ms, so that the client ends it well before its end.
class LoadgenFaultRunnerTest : public PacedServerTest {};

TEST_F(LoadgenFaultRunnerTest, CancelsAndDroppedConnectionsEndStreamsEarly) {
  constexpr int kRequests = 16, kMaxTokens = 10;
  PhaseConfig config;
  config.model = "plain";
  config.concurrency = 4;
  config.requests = kRequests;
  config.cancel_fraction = 0.35;
  config.disconnect_fraction = 0.35;
  config.seed = 5;
  PromptSource prompts = Prompts(4, kMaxTokens);
  LiveCounters live;
  absl::StatusOr<PhaseResult> result =
      RunPhase(Channels(), config, prompts, &live, server_->server().address());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->records.size(), static_cast<size_t>(kRequests));
  int plain = 0, cancelled = 0, disconnected = 0;
  for (const RequestRecord& r : result->records) {
    EXPECT_EQ(r.fault, r.planned_fault) << r.id << ": " << r.code_name() << " " << r.error;
    if (r.planned_fault == ClientFault::kNone) {
      // The shared channel carries on whatever happens to the others' connections.
      EXPECT_TRUE(r.succeeded()) << r.code_name() << ": " << r.error;
      EXPECT_EQ(r.output_tokens, kMaxTokens);
      ++plain;
      continue;
    }
    // Stopped after its count of tokens (a response already on its way may still arrive), well
    // before the end.
    EXPECT_GE(r.output_tokens, r.fault_after_tokens) << r.id;
    EXPECT_LT(r.output_tokens, kMaxTokens) << r.id;
    EXPECT_TRUE(r.finish_reason.empty()) << r.finish_reason;
    EXPECT_FALSE(r.failed());
    if (r.planned_fault == ClientFault::kCancel) {
      EXPECT_EQ(StatusCodeName(r.code), "CANCELLED") << r.error;
      EXPECT_EQ(r.code_name(), "cancelled");
      ++cancelled;
    } else {
      // The connection went away under the call: no cancellation, the transport failed.
      EXPECT_EQ(StatusCodeName(r.code), "UNAVAILABLE") << r.error;
      EXPECT_EQ(r.code_name(), "disconnected");
      ++disconnected;
    }
  }
  // Seed 5 plans all three kinds.
  EXPECT_GT(plain, 0);
  EXPECT_GT(cancelled, 0);
  EXPECT_GT(disconnected, 0);
  const PhaseSummary s = SummarizePhase(result->records, result->measured_seconds, {});
  EXPECT_EQ(s.requests, kRequests);
  EXPECT_EQ(s.succeeded, plain);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.cancelled, cancelled);
  EXPECT_EQ(s.disconnected, disconnected);
  EXPECT_TRUE(s.errors_by_code.empty()) << s.errors_by_code.begin()->first;
  EXPECT_EQ(live.errors.load(), 0);
  EXPECT_EQ(live.cancelled.load(), cancelled);
  EXPECT_EQ(live.disconnected.load(), disconnected);
  // The server's handlers of the cut streams end: nothing stays running.
  EXPECT_TRUE(server_test::WaitFor(
      [] { return server_test::StatsOf(server_->registry(), "plain").running == 0; }));

  // Dropping connections needs a HOST:PORT to open them to.
  for (const char* address : {"", "unix:/tmp/kiln.sock", "no-port", "[::1"}) {
    EXPECT_EQ(RunPhase(Channels(), config, prompts, nullptr, address).status().code(),
              absl::StatusCode::kInvalidArgument)
        << address;
  }
  config.disconnect_fraction = 0;  // cancels alone need no address
  config.requests = 2;
  EXPECT_TRUE(RunPhase(Channels(), config, prompts).ok());
}

}  // namespace
}  // namespace kiln::loadgen
