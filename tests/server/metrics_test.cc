// Prometheus metrics: the text renderer (escaping, number format, cumulative histogram buckets)
// and the /metrics endpoint of a started server, scraped over HTTP, checked by promtool, and
// watched as Generate calls move the counters and histograms.
#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "tests/server/server_test_util.h"

namespace kiln::server_test {
namespace {

using metrics::Counter;
using metrics::Gauge;
using metrics::Histogram;

// ---- renderer ---------------------------------------------------------------------------------

TEST(MetricsRendererTest, FormatsNumbers) {
  EXPECT_EQ(metrics::FormatValue(0), "0");
  EXPECT_EQ(metrics::FormatValue(3), "3");
  EXPECT_EQ(metrics::FormatValue(-2.5), "-2.5");
  EXPECT_EQ(metrics::FormatValue(0.1), "0.1");
  EXPECT_EQ(metrics::FormatValue(1e21), "1e+21");
  EXPECT_EQ(metrics::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(metrics::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(metrics::FormatValue(std::nan("")), "NaN");
  double parsed = 0;
  ASSERT_TRUE(absl::SimpleAtod(metrics::FormatValue(1.0 / 3.0), &parsed));
  EXPECT_EQ(parsed, 1.0 / 3.0);  // shortest form, but exact
}

TEST(MetricsRendererTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(metrics::EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(metrics::EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(metrics::EscapeHelp("say \"hi\"\\\n"), "say \"hi\"\\\\\\n");

  metrics::Registry registry;
  registry.AddCounter("kiln_test_total", "Help with a\nnewline.", {"model", "code"})
      .WithLabels({"we\"ird\\name\n", "OK"})
      .Increment(2);
  EXPECT_EQ(registry.Render(),
            "# HELP kiln_test_total Help with a\\nnewline.\n"
            "# TYPE kiln_test_total counter\n"
            "kiln_test_total{model=\"we\\\"ird\\\\name\\n\",code=\"OK\"} 2\n");
}

TEST(MetricsRendererTest, ValidatesNames) {
  EXPECT_TRUE(metrics::IsValidMetricName("kiln_requests_total"));
  EXPECT_TRUE(metrics::IsValidMetricName("a:b_c9"));
  EXPECT_FALSE(metrics::IsValidMetricName("9lives"));
  EXPECT_FALSE(metrics::IsValidMetricName("kiln-requests"));
  EXPECT_FALSE(metrics::IsValidMetricName(""));
  EXPECT_TRUE(metrics::IsValidLabelName("model"));
  EXPECT_FALSE(metrics::IsValidLabelName("a:b"));
  EXPECT_FALSE(metrics::IsValidLabelName("__reserved"));
}

TEST(MetricsRendererTest, HistogramBucketsAreCumulative) {
  metrics::Registry registry;
  Histogram& histogram =
      registry.AddHistogram("kiln_test_seconds", "Test.", {"model"}, {0.1, 0.5, 1})
          .WithLabels({"m"});
  histogram.Observe(0.05);
  histogram.Observe(0.1);  // on the bound: counted in le="0.1"
  histogram.Observe(0.3);
  histogram.Observe(0.7, 2);
  histogram.Observe(5);
  const Histogram::Snapshot snapshot = histogram.snapshot();
  EXPECT_EQ(snapshot.cumulative, (std::vector<uint64_t>{2, 3, 5, 6}));
  EXPECT_EQ(snapshot.count, 6u);
  EXPECT_DOUBLE_EQ(snapshot.sum, 0.05 + 0.1 + 0.3 + 1.4 + 5);
  const std::string text = registry.Render();
  EXPECT_EQ(text,
            "# HELP kiln_test_seconds Test.\n"
            "# TYPE kiln_test_seconds histogram\n"
            "kiln_test_seconds_bucket{model=\"m\",le=\"0.1\"} 2\n"
            "kiln_test_seconds_bucket{model=\"m\",le=\"0.5\"} 3\n"
            "kiln_test_seconds_bucket{model=\"m\",le=\"1\"} 5\n"
            "kiln_test_seconds_bucket{model=\"m\",le=\"+Inf\"} 6\n"
            "kiln_test_seconds_sum{model=\"m\"} " +
                metrics::FormatValue(snapshot.sum) +
                "\n"
                "kiln_test_seconds_count{model=\"m\"} 6\n");
}

TEST(MetricsRendererTest, UnlabelledMetricsGaugesAndCollectors) {
  metrics::Registry registry;
  Gauge& gauge = registry.AddGauge("kiln_test_bytes", "Bytes.", {}).WithLabels({});
  gauge.Set(10);
  gauge.Add(-4);
  Counter& counter = registry.AddCounter("kiln_test_events_total", "Events.", {}).WithLabels({});
  counter.Increment();
  counter.Increment(-5);  // counters never go down
  metrics::Family<Gauge>& sampled = registry.AddGauge("kiln_test_sampled", "Sampled.", {"k"});
  int scrapes = 0;
  registry.AddCollector([&] {
    sampled.Clear();
    sampled.WithLabels({absl::StrCat("scrape", ++scrapes)}).Set(scrapes);
  });
  registry.AddHistogram("kiln_test_empty_seconds", "Empty.", {}, {1}).WithLabels({});
  const std::string first = registry.Render();
  EXPECT_NE(first.find("\nkiln_test_bytes 6\n"), std::string::npos) << first;
  EXPECT_NE(first.find("\nkiln_test_events_total 1\n"), std::string::npos) << first;
  EXPECT_NE(first.find("\nkiln_test_sampled{k=\"scrape1\"} 1\n"), std::string::npos) << first;
  EXPECT_NE(first.find("\nkiln_test_empty_seconds_bucket{le=\"+Inf\"} 0\n"), std::string::npos);
  EXPECT_NE(first.find("\nkiln_test_empty_seconds_count 0\n"), std::string::npos);
  const std::string second = registry.Render();
  EXPECT_EQ(second.find("scrape1"), std::string::npos) << second;
  EXPECT_NE(second.find("kiln_test_sampled{k=\"scrape2\"} 2\n"), std::string::npos) << second;
}

// ---- the endpoint -------------------------------------------------------------------------------

struct HttpReply {
  int status = 0;
  std::string body;
};

// A plain HTTP/1.0 GET over a loopback socket.
HttpReply HttpGet(int port, const std::string& path) {
  HttpReply reply;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return reply;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return reply;
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return reply;
  }
  std::string raw;
  char buffer[4096];
  ssize_t got;
  while ((got = read(fd, buffer, sizeof(buffer))) > 0) raw.append(buffer, got);
  close(fd);
  // "HTTP/1.1 200 OK\r\n...\r\n\r\nbody"
  const size_t space = raw.find(' ');
  const size_t end = raw.find("\r\n\r\n");
  if (space == std::string::npos || end == std::string::npos) return reply;
  absl::SimpleAtoi(raw.substr(space + 1, 3), &reply.status);
  reply.body = raw.substr(end + 4);
  return reply;
}

// The value of one series ("name{labels}" exactly as rendered); NaN when absent.
double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
    }
  }
  return std::nan("");
}

// Runs `promtool check metrics` on `text`; returns its exit status and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  testing_util::ScratchDir scratch;
  const std::string path = (scratch / "metrics.txt").string();
  std::ofstream(path) << text;
  const std::string command = "promtool check metrics < '" + path + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buffer[1024];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

bool HavePromtool() { return std::system("command -v promtool >/dev/null 2>&1") == 0; }

class MetricsEndpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options = TestServerOptions();
    options.models = {{"plain", "plain", "", ""}};
    options.metrics_listen = "127.0.0.1:0";
    options.engine.max_context = 2048;  // room for a long generation
    server_ = TestServer::Start(options).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  std::string Scrape() {
    HttpReply reply = HttpGet(server_->server().metrics_port(), "/metrics");
    EXPECT_EQ(reply.status, 200);
    return reply.body;
  }

  static TestServer* server_;
};
TestServer* MetricsEndpointTest::server_ = nullptr;

TEST_F(MetricsEndpointTest, PortAddressAndReadyLine) {
  RunningServer& server = server_->server();
  EXPECT_GT(server.metrics_port(), 0);
  EXPECT_NE(server.metrics_port(), server.port());
  EXPECT_EQ(server.metrics_address(), "127.0.0.1:" + std::to_string(server.metrics_port()));
  EXPECT_CONTAINS(server.ReadyLine(),
                  "; metrics on http://" + server.metrics_address() + "/metrics");
}

TEST_F(MetricsEndpointTest, UnknownPathsAre404) {
  const int port = server_->server().metrics_port();
  EXPECT_EQ(HttpGet(port, "/").status, 404);
  EXPECT_EQ(HttpGet(port, "/metricsx").status, 404);
  EXPECT_EQ(HttpGet(port, "/metrics/extra").status, 404);
  EXPECT_EQ(HttpGet(port, "/favicon.ico").status, 404);
  EXPECT_EQ(HttpGet(port, "/metrics").status, 200);
}

TEST_F(MetricsEndpointTest, PromtoolAcceptsTheExposition) {
  ASSERT_TRUE(HavePromtool())
      << "promtool (Debian package prometheus) is not installed: run scripts/setup.sh";
  // Some traffic first, so that every labelled family has samples to check.
  ASSERT_TRUE(GenerateAll(server_->inference(), GreedyRequest("plain", {1, 2, 3}, 3)).status.ok());
  GenerateAll(server_->inference(), GreedyRequest("nope", {1, 2, 3}, 3));
  const std::string text = Scrape();
  const auto [status, output] = Promtool(text);
  EXPECT_EQ(status, 0) << "promtool check metrics:\n" << output << "\non:\n" << text;
  EXPECT_TRUE(output.empty()) << output;
}

TEST_F(MetricsEndpointTest, GenerateMovesCountersAndHistograms) {
  const std::string before = Scrape();
  auto value = [](const std::string& text, const std::string& series) {
    const double v = Sample(text, series);
    return std::isnan(v) ? 0.0 : v;  // a series appears with its first observation
  };
  const std::string ok =
      "kiln_requests_total{model=\"plain\",code=\"OK\",finish_reason=\"length\",protocol=\"grpc\"}";
  const std::string not_found =
      "kiln_requests_total{model=\"\",code=\"NOT_FOUND\",finish_reason=\"none\",protocol=\"grpc\"}";
  const std::string invalid_series =
      "kiln_requests_total{model=\"plain\",code=\"INVALID_ARGUMENT\",finish_reason=\"none\","
      "protocol=\"grpc\"}";
  const std::string generated = "kiln_generation_tokens_total{model=\"plain\"}";
  const std::string prompt = "kiln_prompt_tokens_total{model=\"plain\"}";
  const std::string ttft = "kiln_time_to_first_token_seconds_count{model=\"plain\"}";
  const std::string itl = "kiln_inter_token_latency_seconds_count{model=\"plain\"}";
  const std::string e2e = "kiln_e2e_request_latency_seconds_count{model=\"plain\"}";
  const std::string e2e_inf =
      "kiln_e2e_request_latency_seconds_bucket{model=\"plain\",le=\"+Inf\"}";

  constexpr int kRequests = 3;
  constexpr int kMaxTokens = 5;
  for (int i = 0; i < kRequests; ++i) {
    StreamResult result =
        GenerateAll(server_->inference(), GreedyRequest("plain", {1, 2, 3, 4}, kMaxTokens));
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  }
  StreamResult missing =
      GenerateAll(server_->inference(), GreedyRequest("no-such-model", {1, 2}, 2));
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::NOT_FOUND);
  StreamResult invalid = GenerateAll(server_->inference(), GreedyRequest("plain", {1, 2}, -1));
  EXPECT_EQ(invalid.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  const std::string after = Scrape();
  EXPECT_EQ(value(after, ok) - value(before, ok), kRequests) << after;
  EXPECT_EQ(value(after, not_found) - value(before, not_found), 1) << after;
  EXPECT_EQ(value(after, invalid_series) - value(before, invalid_series), 1) << after;
  EXPECT_EQ(after.find("no-such-model"), std::string::npos);  // unknown names make no labels
  EXPECT_EQ(value(after, generated) - value(before, generated), kRequests * kMaxTokens);
  EXPECT_EQ(value(after, prompt) - value(before, prompt), kRequests * 4);
  EXPECT_EQ(value(after, ttft) - value(before, ttft), kRequests);
  EXPECT_EQ(value(after, itl) - value(before, itl), kRequests * (kMaxTokens - 1));
  EXPECT_EQ(value(after, e2e) - value(before, e2e), kRequests);
  EXPECT_EQ(value(after, e2e_inf), value(after, e2e));

  // Scrape-time samples of the registry and the engine.
  EXPECT_EQ(Sample(after, "kiln_models{state=\"READY\"}"), 1);
  EXPECT_EQ(Sample(after, "kiln_models{state=\"FAILED\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_models{state=\"LOADING\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_requests_running{model=\"plain\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_requests_waiting{model=\"plain\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_kv_cache_usage_bytes{model=\"plain\"}"), 0);
  EXPECT_GT(Sample(after, "kiln_engine_steps_total{model=\"plain\"}"), 0);
  EXPECT_GT(Sample(after, "kiln_kv_pool_bytes{model=\"plain\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_kv_cache_usage_ratio{model=\"plain\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_preemptions_total{model=\"plain\"}"), 0);
  // The same 4-token prompt three times: shorter than a block, so nothing is cached.
  EXPECT_GE(Sample(after, "kiln_prefix_cache_queries_tokens_total{model=\"plain\"}"),
            kRequests * 4);
  EXPECT_EQ(Sample(after, "kiln_prefix_cache_hits_tokens_total{model=\"plain\"}"), 0);
  EXPECT_EQ(Sample(after, "kiln_prefix_cache_hit_rate{model=\"plain\"}"), 0);
  for (const char* stage : {"open", "bind", "post_load"}) {
    EXPECT_GE(
        Sample(after, absl::StrCat("kiln_model_load_duration_seconds{model=\"plain\",stage=\"",
                                   stage, "\"}")),
        0)
        << stage << "\n"
        << after;
  }
}

TEST_F(MetricsEndpointTest, RunningRequestsAreSampledAtScrapeTime) {
  // A long generation keeps one sequence running (and its KV cache held) while scraping.
  auto context = Context();
  v1::GenerateRequest request = GreedyRequest("plain", {1, 2, 3}, 2000);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      server_->inference().Generate(context.get(), request);
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  std::string text;
  EXPECT_TRUE(WaitFor([&] {
    text = Scrape();
    return Sample(text, "kiln_requests_running{model=\"plain\"}") == 1 &&
           Sample(text, "kiln_kv_cache_usage_bytes{model=\"plain\"}") > 0;
  })) << text;
  context->TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(MetricsEndpointTest, SpeculativeHook) {
  // Recorded through the hook until the engine reports drafted and accepted tokens itself.
  // The metrics object is internal to the server; a standalone one shows the series.
  ServerMetrics metrics(&server_->registry());
  metrics.RecordSpeculative("plain", 8, 5);
  metrics.RecordSpeculative("plain", 4, 4);
  const std::string text = metrics.Render();
  EXPECT_EQ(Sample(text, "kiln_speculative_drafted_tokens_total{model=\"plain\"}"), 12);
  EXPECT_EQ(Sample(text, "kiln_speculative_accepted_tokens_total{model=\"plain\"}"), 9);
  EXPECT_EQ(Sample(text, "kiln_models{state=\"READY\"}"), 1);
}

TEST(MetricsServerTest, TokenDelayShowsInInterTokenLatency) {
  ServerOptions options = TestServerOptions();
  options.models = {{"plain", "plain", "", ""}};
  options.metrics_listen = "127.0.0.1:0";
  options.token_delay_for_testing = absl::Milliseconds(15);
  auto server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  StreamResult result = GenerateAll(server->inference(), GreedyRequest("plain", {1, 2}, 6));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  const std::string text = HttpGet(server->server().metrics_port(), "/metrics").body;
  const double itl_sum = Sample(text, "kiln_inter_token_latency_seconds_sum{model=\"plain\"}");
  const double itl_count = Sample(text, "kiln_inter_token_latency_seconds_count{model=\"plain\"}");
  ASSERT_EQ(itl_count, 5) << text;
  EXPECT_GE(itl_sum / itl_count, 0.014) << text;
  EXPECT_GE(Sample(text, "kiln_time_to_first_token_seconds_sum{model=\"plain\"}"), 0.014);
  // Every token waits: nothing at or under 10 ms.
  EXPECT_EQ(Sample(text, "kiln_inter_token_latency_seconds_bucket{model=\"plain\",le=\"0.01\"}"),
            0);
}

TEST(MetricsServerTest, OffByDefaultAndBadAddresses) {
  auto server = TestServer::Start(TestServerOptions());
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->server().metrics_port(), 0);
  EXPECT_EQ(server->server().metrics_address(), "");
  EXPECT_EQ(server->server().ReadyLine().find("metrics"), std::string::npos);

  ServerOptions options = TestServerOptions();
  options.metrics_listen = "no-port";
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.metrics_listen = "example.com:9090";
  EXPECT_EQ(StartServer(options).status().code(), absl::StatusCode::kInvalidArgument);

  // A busy port: the first server's metrics port.
  options = TestServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  auto first = TestServer::Start(options);
  ASSERT_NE(first, nullptr);
  options.metrics_listen = first->server().metrics_address();
  absl::StatusOr<std::unique_ptr<RunningServer>> second = StartServer(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();

  // The port is free again once the server has shut down.
  const int port = first->server().metrics_port();
  first.reset();
  EXPECT_EQ(HttpGet(port, "/metrics").status, 0);
}

TEST(MetricsServerTest, ConfigFileSetsMetricsListen) {
  absl::StatusOr<v1::ServerConfig> config =
      ParseServerConfig("listen: \"127.0.0.1:0\"\nmetrics_listen: \"127.0.0.1:9464\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  ServerOptions options;
  ASSERT_TRUE(ApplyServerConfig(*config, "", &options).ok());
  EXPECT_EQ(options.metrics_listen, "127.0.0.1:9464");
}

}  // namespace
}  // namespace kiln::server_test
