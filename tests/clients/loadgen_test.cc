// kiln-loadgen: percentile math, goodput, length distributions, Poisson arrivals, prompts, flags,
// the async runner against an in-process server whose tokens are paced at a known delay, and the
// JSON, CSV, SVG and text outputs. (Client-side faults and the latency series: in
// loadgen_faults_test.cc.)
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "clients/loadgen/http_runner.h"
#include "clients/loadgen/options.h"
#include "clients/loadgen/report.h"
#include "clients/loadgen/runner.h"
#include "clients/loadgen/stats.h"
#include "clients/loadgen/svg_chart.h"
#include "clients/loadgen/workload.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/clients/paced_server_fixture.h"
#include "tests/server/server_test_util.h"

namespace kiln::loadgen {
namespace {

using server_test::TestServer;
using server_test::TestServerOptions;

// ---- stats ------------------------------------------------------------------------------------

TEST(LoadgenStatsTest, PercentilesInterpolateBetweenRanks) {
  EXPECT_TRUE(std::isnan(Percentile({}, 50)));
  EXPECT_EQ(Percentile({7}, 0), 7);
  EXPECT_EQ(Percentile({7}, 99), 7);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 0), 1);
  EXPECT_EQ(Percentile({1, 2, 3, 4}, 100), 4);
  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(ten, 50), 5.5);
  EXPECT_DOUBLE_EQ(Percentile(ten, 90), 9.1);
  EXPECT_DOUBLE_EQ(Percentile(ten, 95), 9.55);
  EXPECT_DOUBLE_EQ(Percentile(ten, 99), 9.91);
  std::vector<double> hundred(101);
  std::iota(hundred.begin(), hundred.end(), 0.0);  // 0..100: the p-th percentile is p
  for (double p : {0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 100.0})
    EXPECT_DOUBLE_EQ(Percentile(hundred, p), p);

  const LatencySummary s = Summarize({4, 1, 3, 2});  // unsorted input
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.mean, 2.5);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 4);
  EXPECT_EQ(s.p50, 2.5);
  EXPECT_DOUBLE_EQ(s.p90, 3.7);
  EXPECT_EQ(Summarize({}).count, 0);
}

TEST(LoadgenStatsTest, GoodputAndPhaseSummary) {
  absl::StatusOr<GoodputLimits> limits = ParseGoodput("ttft=0.5, itl=50ms,e2e=10");
  ASSERT_TRUE(limits.ok()) << limits.status();
  EXPECT_EQ(*limits->ttft, 0.5);
  EXPECT_DOUBLE_EQ(*limits->itl, 0.05);
  EXPECT_EQ(*limits->e2e, 10);
  EXPECT_FALSE(ParseGoodput("ttft").ok());
  EXPECT_FALSE(ParseGoodput("speed=1").ok());
  EXPECT_FALSE(ParseGoodput("ttft=-1").ok());
  EXPECT_FALSE(ParseGoodput("").ok());

  RequestRecord fast;  // ttft 0.1, 5 tokens in 0.3 s: tpot 0.05
  fast.ttft_seconds = 0.1, fast.e2e_seconds = 0.3, fast.output_tokens = 5, fast.input_tokens = 3;
  fast.itl_seconds = {0.05, 0.05, 0.05, 0.05};
  RequestRecord slow = fast;
  slow.ttft_seconds = 0.9, slow.e2e_seconds = 1.1;
  RequestRecord failed;
  failed.code = 5, failed.error = "model 'x' is not loaded";
  RequestRecord warm = fast;
  warm.warmup = true;
  EXPECT_DOUBLE_EQ(fast.tpot_seconds(), 0.05);
  EXPECT_TRUE(IsGood(fast, *limits));
  EXPECT_FALSE(IsGood(slow, *limits));  // ttft
  EXPECT_FALSE(IsGood(failed, GoodputLimits{}));

  const PhaseSummary s = SummarizePhase({fast, slow, failed, warm}, 2.0, *limits);
  EXPECT_EQ(s.requests, 3);  // not the warm-up one
  EXPECT_EQ(s.succeeded, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.good, 1);
  EXPECT_EQ(s.errors_by_code.at("NOT_FOUND"), 1);
  EXPECT_EQ(s.error_examples.at("NOT_FOUND"), "model 'x' is not loaded");
  EXPECT_EQ(s.output_tokens, 10);
  EXPECT_EQ(s.input_tokens, 6);
  EXPECT_DOUBLE_EQ(s.requests_per_second, 1.0);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_second, 5.0);
  EXPECT_DOUBLE_EQ(s.goodput_requests_per_second, 0.5);
  EXPECT_EQ(s.ttft.count, 2);
  EXPECT_DOUBLE_EQ(s.ttft.p50, 0.5);
  EXPECT_EQ(s.itl.count, 8);
  EXPECT_EQ(StatusCodeName(14), "UNAVAILABLE");
}

// ---- workload -----------------------------------------------------------------------------------

TEST(LoadgenWorkloadTest, LengthDistributions) {
  const LengthDistribution fallback = LengthDistribution::Fixed(64);
  absl::StatusOr<LengthDistribution> fixed = LengthDistribution::Parse("fixed", fallback);
  ASSERT_TRUE(fixed.ok());
  std::mt19937_64 rng(1);
  EXPECT_EQ(fixed->Sample(rng), 64);
  EXPECT_EQ(LengthDistribution::Parse("fixed:9", fallback)->Sample(rng), 9);
  absl::StatusOr<LengthDistribution> uniform = LengthDistribution::Parse("uniform:10:20", fallback);
  ASSERT_TRUE(uniform.ok());
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[uniform->Sample(rng)];
  EXPECT_EQ(seen.begin()->first, 10);
  EXPECT_EQ(seen.rbegin()->first, 20);
  EXPECT_EQ(seen.size(), 11u);
  absl::StatusOr<LengthDistribution> normal = LengthDistribution::Parse("normal:100:10", fallback);
  ASSERT_TRUE(normal.ok());
  double sum = 0;
  for (int i = 0; i < 4000; ++i) sum += normal->Sample(rng);
  EXPECT_NEAR(sum / 4000, 100, 1.5);
  // Draws never go below 1.
  absl::StatusOr<LengthDistribution> wide = LengthDistribution::Parse("normal:2:50", fallback);
  for (int i = 0; i < 500; ++i) EXPECT_GE(wide->Sample(rng), 1);
  for (const char* bad :
       {"uniform:5", "uniform:9:3", "normal:1", "fixed:0", "gauss:1:2", "uniform:a:b"}) {
    EXPECT_FALSE(LengthDistribution::Parse(bad, fallback).ok()) << bad;
  }
}

TEST(LoadgenWorkloadTest, PoissonArrivalsHaveTheRequestedMean) {
  PoissonArrivals arrivals(/*rate_per_second=*/10, /*seed=*/42);
  constexpr int kDraws = 20000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double gap = arrivals.NextGapSeconds();
    ASSERT_GE(gap, 0);
    sum += gap;
    sum_sq += gap * gap;
  }
  const double mean = sum / kDraws;
  EXPECT_NEAR(mean, 0.1, 0.003);  // ~4 standard errors
  // Exponential: the standard deviation equals the mean.
  EXPECT_NEAR(std::sqrt(sum_sq / kDraws - mean * mean), 0.1, 0.005);
  // The same seed gives the same arrivals.
  PoissonArrivals a(3, 7), b(3, 7);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.NextGapSeconds(), b.NextGapSeconds());
}

TEST(LoadgenWorkloadTest, SyntheticPrompts) {
  WorkloadOptions options;
  options.input = LengthDistribution::Fixed(12);
  options.output = LengthDistribution::Fixed(7);
  options.vocab_size = 50;
  absl::StatusOr<PromptSource> ids = PromptSource::Create(options);
  ASSERT_TRUE(ids.ok());
  const RequestSpec spec = ids->Next();
  EXPECT_FALSE(spec.is_text);
  ASSERT_EQ(spec.ids.size(), 12u);
  for (int32_t id : spec.ids) EXPECT_TRUE(id >= 0 && id < 50) << id;
  EXPECT_EQ(spec.max_tokens, 7);
  EXPECT_EQ(spec.input_tokens, 12);
  EXPECT_EQ(PromptSource::Create(options)->Next().ids, spec.ids);  // deterministic per seed

  options.prompt_kind = PromptKind::kText;
  const RequestSpec text = PromptSource::Create(options)->Next();
  EXPECT_TRUE(text.is_text);
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(text.text, ' ')).size(), 12u);
}

TEST(LoadgenWorkloadTest, PromptsFile) {
  testing_util::ScratchDir scratch;
  const std::string path = (scratch / "prompts.jsonl").string();
  std::ofstream(path) << "{\"prompt\": \"hello world\", \"max_tokens\": 3}\n"
                         "\n"
                         "{\"prompt_ids\": [5, 6, 7]}\n";
  WorkloadOptions options;
  options.prompts_file = path;
  options.output = LengthDistribution::Fixed(9);
  absl::StatusOr<PromptSource> source = PromptSource::Create(options);
  ASSERT_TRUE(source.ok()) << source.status();
  RequestSpec first = source->Next(), second = source->Next(), third = source->Next();
  EXPECT_TRUE(first.is_text);
  EXPECT_EQ(first.text, "hello world");
  EXPECT_EQ(first.max_tokens, 3);
  EXPECT_EQ(second.ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(second.max_tokens, 9);       // from the output distribution
  EXPECT_EQ(third.text, "hello world");  // used again from the start

  std::ofstream(path) << "{\"prompt\": \"ok\"}\n{\"prompt_ids\": \"nope\"}\n";
  absl::StatusOr<std::vector<FilePrompt>> bad = LoadPromptsFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "prompts.jsonl:2")) << bad.status();
  std::ofstream(path) << "not json\n";
  EXPECT_FALSE(LoadPromptsFile(path).ok());
  EXPECT_EQ(LoadPromptsFile((scratch / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// ---- flags
// ---------------------------------------------------------------------------------------

absl::StatusOr<LoadgenOptions> Parse(std::vector<const char*> args) {
  args.insert(args.begin(), "kiln-loadgen");
  return ParseOptions(static_cast<int>(args.size()), args.data());
}

TEST(LoadgenOptionsTest, DefaultsAndFlags) {
  absl::StatusOr<LoadgenOptions> o = Parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->target, "127.0.0.1:50051");
  EXPECT_EQ(o->model, "default");
  EXPECT_EQ(o->concurrency, 1);
  EXPECT_EQ(o->requests, 100);

  // The container smoke test's invocation.
  o = Parse({"--target", "127.0.0.1:9000", "--model", "default", "--concurrency", "4", "--duration",
             "20s", "--json", "out.json"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->concurrency, 4);
  EXPECT_EQ(o->duration, absl::Seconds(20));
  EXPECT_EQ(o->requests, 0);
  EXPECT_EQ(o->json_path, "out.json");

  o = Parse({"--rates=1,2,4", "--max_concurrency=8", "--warmup=500ms", "--input-tokens=32",
             "--input-tokens-stddev=4", "--output-tokens-dist=uniform:8:16", "--prompt-kind=text",
             "--goodput", "ttft=0.5", "--ignore-eos=false", "--seed=9", "--requests=5"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->concurrency, 0);
  EXPECT_EQ(o->rates, (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(o->max_concurrency, 8);
  EXPECT_EQ(o->warmup, absl::Milliseconds(500));
  EXPECT_EQ(o->workload.input.kind, LengthDistribution::Kind::kNormal);
  EXPECT_EQ(o->workload.input.a, 32);
  EXPECT_EQ(o->workload.input.b, 4);
  EXPECT_EQ(o->workload.output.kind, LengthDistribution::Kind::kUniform);
  EXPECT_EQ(o->workload.prompt_kind, PromptKind::kText);
  EXPECT_FALSE(o->ignore_eos);
  EXPECT_EQ(o->workload.seed, 9u);

  for (std::vector<const char*> bad : {std::vector<const char*>{"--concurrency", "0"},
                                       {"--concurrency=2", "--rate=1"},
                                       {"--rate=1,2"},
                                       {"--rate=-1"},
                                       {"--duration=soon"},
                                       {"--bogus"},
                                       {"--concurrency"},
                                       {"positional"},
                                       {"--max-concurrency=2"},
                                       {"--input-tokens-dist=normal:5"},
                                       {"--prompt-kind=words"},
                                       {"--goodput=ttft"}}) {
    EXPECT_FALSE(Parse(bad).ok()) << bad[0];
  }
}

TEST(LoadgenOptionsTest, HelpDocumentsEveryFlag) {
  const std::string help = HelpText();
  for (const char* flag : {"--target",
                           "--model",
                           "--tls",
                           "--tls-ca",
                           "--concurrency",
                           "--rate ",
                           "--rates",
                           "--duration",
                           "--requests",
                           "--warmup",
                           "--input-tokens",
                           "--input-tokens-stddev",
                           "--input-tokens-dist",
                           "--output-tokens",
                           "--prompt-kind",
                           "--prompts-file",
                           "--goodput",
                           "--progress",
                           "--json",
                           "--csv",
                           "--svg",
                           "--seed",
                           "--cancel-fraction F",
                           "--disconnect-fraction F",
                           "--window DURATION",
                           "TryCancel",
                           "--help"}) {
    EXPECT_TRUE(absl::StrContains(help, flag)) << flag;
  }
  EXPECT_TRUE(Parse({"--help"})->help);
}

// ---- the runner against a server -----------------------------------------------------------

class LoadgenRunnerTest : public PacedServerTest {};

TEST_F(LoadgenRunnerTest, ClosedLoopMeasuresThePacedTokens) {
  constexpr int kRequests = 8, kMaxTokens = 5;
  PhaseConfig config;
  config.model = "plain";
  config.concurrency = 4;
  config.requests = kRequests;
  PromptSource prompts = Prompts(4, kMaxTokens);
  LiveCounters live;
  absl::StatusOr<PhaseResult> result = RunPhase(Channels(), config, prompts, &live);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->records.size(), static_cast<size_t>(kRequests));
  EXPECT_EQ(live.completed.load(), kRequests);
  EXPECT_EQ(live.in_flight.load(), 0);
  EXPECT_EQ(live.output_tokens.load(), kRequests * kMaxTokens);

  const PhaseSummary s = SummarizePhase(result->records, result->measured_seconds, {});
  EXPECT_EQ(s.requests, kRequests);
  EXPECT_EQ(s.succeeded, kRequests);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.output_tokens, kRequests * kMaxTokens);
  EXPECT_EQ(s.input_tokens, kRequests * 4);  // the server's usage.prompt_tokens
  const double delay = absl::ToDoubleSeconds(kPacedTokenDelay);
  // The machine is noisy: tight lower bounds, loose upper ones.
  EXPECT_GE(s.itl.p50, 0.9 * delay);
  EXPECT_LT(s.itl.p50, 3 * delay);
  EXPECT_EQ(s.itl.count, kRequests * (kMaxTokens - 1));
  EXPECT_GE(s.ttft.min, delay);
  EXPECT_GE(s.e2e.min, kMaxTokens * delay);
  EXPECT_GE(s.tpot.p50, 0.9 * delay);
  for (const RequestRecord& r : result->records) {
    EXPECT_EQ(r.finish_reason, "LENGTH");
    EXPECT_FALSE(r.warmup);
  }
  // 8 requests of ≥ 100 ms, 4 at a time: at least two rounds.
  EXPECT_GE(result->measured_seconds, 2 * kMaxTokens * delay);
  EXPECT_GT(s.requests_per_second, 0);
}

TEST_F(LoadgenRunnerTest, OpenLoopAndWarmup) {
  PhaseConfig config;
  config.model = "plain";
  config.rate = 40;
  config.requests = 6;
  config.warmup = absl::Milliseconds(150);
  config.seed = 3;
  PromptSource prompts = Prompts(3, 2);
  absl::StatusOr<PhaseResult> result = RunPhase(Channels(), config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  int counted = 0;
  for (const RequestRecord& r : result->records) {
    EXPECT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.output_tokens, 2);
    if (r.warmup) {
      EXPECT_LT(r.start_seconds, 0.15 + 0.05);
    } else {
      ++counted;
      EXPECT_GE(r.start_seconds, 0.15);
    }
  }
  EXPECT_EQ(counted, 6);
  EXPECT_EQ(SummarizePhase(result->records, result->measured_seconds, {}).requests, 6);

  // A duration instead of a count: arrivals stop after it, and what is in flight completes.
  config.requests = 0;
  config.warmup = absl::ZeroDuration();
  config.duration = absl::Milliseconds(300);
  result = RunPhase(Channels(), config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  for (const RequestRecord& r : result->records) {
    EXPECT_LT(r.start_seconds, 0.3 + 0.05);
    EXPECT_TRUE(r.ok()) << r.error;
  }
}

TEST_F(LoadgenRunnerTest, ErrorsAreCountedByCode) {
  PhaseConfig config;
  config.model = "no-such-model";
  config.concurrency = 2;
  config.requests = 5;
  PromptSource prompts = Prompts(3, 2);
  absl::StatusOr<PhaseResult> result = RunPhase(Channels(), config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  const PhaseSummary s = SummarizePhase(result->records, result->measured_seconds, {});
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.failed, 5);
  EXPECT_EQ(s.succeeded, 0);
  ASSERT_EQ(s.errors_by_code.size(), 1u);
  EXPECT_EQ(s.errors_by_code.at("NOT_FOUND"), 5);
  EXPECT_TRUE(absl::StrContains(s.error_examples.at("NOT_FOUND"), "no-such-model"));

  // Bad configs are refused before anything is sent.
  config.rate = 1;
  EXPECT_EQ(RunPhase(Channels(), config, prompts).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.rate = 0;
  config.requests = 0;
  EXPECT_EQ(RunPhase(Channels(), config, prompts).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- outputs ---------------------------------------------------------------------------------

// Tags open and close in order (a small well-formedness check: no attribute holds '<' or '>').
bool WellFormed(const std::string& xml, std::string* why) {
  std::vector<std::string> open;
  size_t pos = 0;
  while ((pos = xml.find('<', pos)) != std::string::npos) {
    const size_t end = xml.find('>', pos);
    if (end == std::string::npos) return *why = "unclosed '<'", false;
    const std::string tag = xml.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag.back() == '/') continue;
    const std::string name =
        tag.substr(tag[0] == '/' ? 1 : 0, tag.find_first_of(" \n/", 1) - (tag[0] == '/' ? 1 : 0));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name) return *why = "mismatched </" + name + ">", false;
      open.pop_back();
    } else {
      open.push_back(name);
    }
  }
  if (!open.empty()) return *why = "unclosed <" + open.back() + ">", false;
  return true;
}

RunReport SmallReport(TestServer& server, const std::vector<PhaseConfig>& configs) {
  RunReport report;
  report.target = server.server().address();
  report.model = "plain";
  report.settings = {{"concurrency", "2"}};
  report.goodput.ttft = 1.0;
  WorkloadOptions workload;
  workload.input = LengthDistribution::Fixed(3);
  workload.output = LengthDistribution::Fixed(4);
  PromptSource prompts = *PromptSource::Create(workload);
  for (const PhaseConfig& config : configs) {
    absl::StatusOr<PhaseResult> result = RunPhase({server.channel()}, config, prompts);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) continue;
    PhaseSummary summary =
        SummarizePhase(result->records, result->measured_seconds, report.goodput);
    summary.label = config.concurrency > 0 ? "concurrency 2"
                                           : "rate " + std::to_string(int(config.rate)) + "/s";
    report.summaries.push_back(summary);
    report.phases.push_back(*std::move(result));
  }
  return report;
}

TEST_F(LoadgenRunnerTest, JsonCsvSvgAndText) {
  PhaseConfig config;
  config.model = "plain";
  config.concurrency = 2;
  config.requests = 4;
  RunReport report = SmallReport(*server_, {config});
  ASSERT_EQ(report.phases.size(), 1u);
  testing_util::ScratchDir scratch;

  const std::string json_path = (scratch / "out.json").string();
  ASSERT_TRUE(WriteJson(report, json_path).ok());
  std::ifstream json_in(json_path);
  nlohmann::json json = nlohmann::json::parse(json_in, nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_EQ(json["model"], "plain");
  ASSERT_EQ(json["phases"].size(), 1u);
  EXPECT_EQ(json["phases"][0]["requests"], 4);
  EXPECT_EQ(json["phases"][0]["failed"], 0);
  EXPECT_EQ(json["phases"][0]["output_tokens"], 16);
  EXPECT_GT(json["phases"][0]["ttft_s"]["p99"].get<double>(), 0);
  ASSERT_EQ(json["requests"].size(), 4u);
  EXPECT_EQ(json["requests"][0]["code"], "OK");
  EXPECT_EQ(json["requests"][0]["itl_s"].size(), 3u);
  EXPECT_EQ(json["goodput_limits"]["ttft_s"], 1.0);

  const std::string csv_path = (scratch / "out.csv").string();
  ASSERT_TRUE(WriteCsv(report, csv_path).ok());
  std::ifstream csv_in(csv_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv_in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_TRUE(absl::StartsWith(lines[0], "phase,label,id,warmup,start_s,ttft_s,e2e_s"));
  const size_t columns = std::vector<std::string>(absl::StrSplit(lines[0], ',')).size();
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ',')).size(), columns) << lines[i];
    EXPECT_TRUE(absl::StrContains(lines[i], ",OK,LENGTH,")) << lines[i];
  }

  const std::string svg_path = (scratch / "out.svg").string();
  ASSERT_TRUE(WriteSvg(report, svg_path, "a <title> & more").ok());
  std::ifstream svg_in(svg_path);
  const std::string svg((std::istreambuf_iterator<char>(svg_in)), std::istreambuf_iterator<char>());
  std::string why;
  EXPECT_TRUE(WellFormed(svg, &why)) << why;
  EXPECT_TRUE(absl::StartsWith(svg, "<?xml")) << svg.substr(0, 100);
  EXPECT_TRUE(absl::StrContains(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::StrContains(svg, "a &lt;title&gt; &amp; more"));
  for (const char* series :
       {"data-name=\"TTFT\"", "data-name=\"ITL\"", "data-name=\"E2E\"", "Time to first token",
        "Inter-token latency", "<polyline", "class=\"xtick\"", "class=\"legend\""}) {
    EXPECT_TRUE(absl::StrContains(svg, series)) << series;
  }

  std::ostringstream text;
  PrintSummary(report, text);
  for (const char* part : {"concurrency 2", "Request throughput", "Output token throughput",
                           "Goodput", "TTFT", "ITL", "TPOT", "E2E", "p99"}) {
    EXPECT_TRUE(absl::StrContains(text.str(), part)) << part << "\n" << text.str();
  }
}

TEST_F(LoadgenRunnerTest, SweepChartPlotsLatencyAgainstThroughput) {
  PhaseConfig slow, fast;
  slow.model = fast.model = "plain";
  slow.requests = fast.requests = 3;
  slow.rate = 20;
  fast.rate = 60;
  RunReport report = SmallReport(*server_, {slow, fast});
  ASSERT_EQ(report.phases.size(), 2u);
  const std::string svg = RenderChart("sweep", ReportPanels(report));
  std::string why;
  EXPECT_TRUE(WellFormed(svg, &why)) << why;
  for (const char* part :
       {"Latency vs throughput", "data-name=\"TTFT p50\"", "data-name=\"E2E p99\"",
        "data-name=\"rate 20/s\"", "data-name=\"rate 60/s\"", "<circle"}) {
    EXPECT_TRUE(absl::StrContains(svg, part)) << part;
  }
  std::ostringstream text;
  PrintSummary(report, text);
  EXPECT_TRUE(absl::StrContains(text.str(), "sweep")) << text.str();
}

TEST(LoadgenChartTest, NiceTicks) {
  EXPECT_EQ(NiceTicks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1}));
  const std::vector<double> ticks = NiceTicks(0, 87);
  EXPECT_EQ(ticks.front(), 0);
  EXPECT_GE(ticks.back(), 87);
  EXPECT_LE(ticks.size(), 8u);
  const std::vector<double> flat = NiceTicks(5, 5);  // an empty range still gets two ticks
  EXPECT_GE(flat.size(), 2u);
  // An empty chart still renders its axes.
  std::string why;
  EXPECT_TRUE(WellFormed(RenderChart("empty", {ChartPanel{"p", "x", "y", true, {}}}), &why)) << why;
}

// ---- the OpenAI HTTP runner against kiln's own HTTP API ------------------------------------

TEST(LoadgenKilnHttpTest, CompletionsStreamsAreMeasuredAndChatErrorsCounted) {
  ServerOptions options = TestServerOptions();
  options.http_listen = "127.0.0.1:0";
  options.models = {{"plain", "plain", "", ""}, {"text", "text", "", ""}};
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<HttpUrl> url =
      ParseHttpUrl(absl::StrCat("http://127.0.0.1:", server->server().http_port()));
  ASSERT_TRUE(url.ok()) << url.status();
  OpenAiTarget target;
  target.url = *url;
  ASSERT_TRUE(ProbeHttpTarget(target.url, absl::Seconds(5)).ok());

  constexpr int kRequests = 12, kMaxTokens = 6, kInput = 5;
  PhaseConfig config;
  config.model = "text";
  config.concurrency = 4;
  config.requests = kRequests;
  WorkloadOptions workload;
  workload.input = LengthDistribution::Fixed(kInput);
  workload.output = LengthDistribution::Fixed(kMaxTokens);
  PromptSource prompts = *PromptSource::Create(workload);
  absl::StatusOr<PhaseResult> result = RunHttpPhase(target, config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  const PhaseSummary s = SummarizePhase(result->records, result->measured_seconds, {});
  EXPECT_EQ(s.succeeded, kRequests);
  EXPECT_EQ(s.failed, 0);
  EXPECT_EQ(s.output_tokens, kRequests * kMaxTokens);  // the server's usage
  EXPECT_EQ(s.input_tokens, kRequests * kInput);
  // TTFT needs a chunk with text; a random-weight model's tokens may all decode to nothing
  // (reserved special tokens), so not every request has one.
  EXPECT_GT(s.ttft.count, 0);
  EXPECT_LE(s.ttft.count, kRequests);
  for (const RequestRecord& r : result->records) EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(server_test::StatsOf(server->registry(), "text").running, 0);

  // "plain" has neither tokenizer nor chat template: every chat request is a counted 400.
  target.api = OpenAiApi::kChat;
  config.model = "plain";
  config.requests = 3;
  config.failure_backoff = absl::ZeroDuration();
  result = RunHttpPhase(target, config, prompts);
  ASSERT_TRUE(result.ok()) << result.status();
  const PhaseSummary chat = SummarizePhase(result->records, result->measured_seconds, {});
  EXPECT_EQ(chat.succeeded, 0);
  EXPECT_EQ(chat.failed, 3);
  EXPECT_EQ(chat.errors_by_code.count("http_400"), 1u);
}

}  // namespace
}  // namespace kiln::loadgen
