// Prometheus metrics for kiln-server (design.md §2):
//   - a small registry of counter, gauge and histogram families with labels, rendered in the
//     Prometheus text exposition format (version 0.0.4);
//   - ServerMetrics: the kiln_* metrics of the server, with gauges sampled from the model
//     registry and the engines at scrape time;
//   - GenerateRecorder: what one Generate call records (TTFT, inter-token latency, end-to-end
//     latency, tokens, how it ended), so that the gRPC handler stays a translator;
//   - MetricsHttpServer: GET /metrics on a port of its own (civetweb); every other path is 404.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "grpcpp/support/status.h"

struct mg_connection;  // civetweb

namespace kiln {

class ModelRegistry;

namespace metrics {

// A monotonically increasing value.
class Counter {
 public:
  void Increment(double amount = 1);  // amount ≥ 0; negative amounts are ignored
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets by upper bound (value ≤ bound), plus their sum and count.
class Histogram {
 public:
  // `bounds`: strictly increasing, finite; the +Inf bucket is implied.
  explicit Histogram(std::vector<double> bounds);

  // Records `value` `times` times (several tokens of one update share one latency).
  void Observe(double value, uint64_t times = 1);

  struct Snapshot {
    std::vector<double> bounds;        // without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; the last one is count
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mutex_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mutex_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mutex_) = 0;
};

enum class Type { kCounter, kGauge, kHistogram };

// Everything a family shares; its samples are rendered by the typed Family below.
class FamilyBase {
 public:
  FamilyBase(Type type, std::string name, std::string help, std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  Type type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends HELP, TYPE and every sample.
  void Render(std::string* out) const;

 protected:
  virtual void RenderSamples(std::string* out) const = 0;
  // `{a="x",b="y"` without the closing brace (so that `le` can follow), or "" without labels.
  std::string LabelPrefix(const std::vector<std::string>& values) const;

 private:
  const Type type_;
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
};

// The metrics of one name, one child per combination of label values.
template <typename T>
class Family final : public FamilyBase {
 public:
  Family(Type type, std::string name, std::string help, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make)
      : FamilyBase(type, std::move(name), std::move(help), std::move(label_names)),
        make_(std::move(make)) {}

  // The child for these label values, in the order of label_names(); made on first use. Its
  // address stays valid until Clear(). A wrong number of values is a programming error: the
  // values are padded with "" or cut.
  T& WithLabels(std::vector<std::string> values) {
    values.resize(label_names().size());
    absl::MutexLock lock(&mutex_);
    std::unique_ptr<T>& child = children_[std::move(values)];
    if (child == nullptr) child = make_();
    return *child;
  }
  // Drops every child: for families sampled at scrape time, where a model that went away must
  // disappear from the output.
  void Clear() {
    absl::MutexLock lock(&mutex_);
    children_.clear();
  }

 protected:
  void RenderSamples(std::string* out) const override;

 private:
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mutex_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mutex_);
};

template <>
void Family<Histogram>::RenderSamples(std::string* out) const;
// Defined in metrics.cc (counters and gauges share one RenderSamples).
extern template class Family<Counter>;
extern template class Family<Gauge>;

// Families in registration order, plus collectors run before each Render.
class Registry {
 public:
  // Names follow Prometheus' rules ([a-zA-Z_:][a-zA-Z0-9_:]*, labels without ':' and not `le`);
  // a name registered twice is a programming error (checked).
  Family<Counter>& AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names);
  Family<Gauge>& AddGauge(std::string name, std::string help, std::vector<std::string> label_names);
  Family<Histogram>& AddHistogram(std::string name, std::string help,
                                  std::vector<std::string> label_names, std::vector<double> bounds);
  // `collect` runs at the start of every Render, e.g. to sample gauges.
  void AddCollector(std::function<void()> collect);

  // The text exposition format of every family.
  std::string Render() const;

 private:
  void Add(std::unique_ptr<FamilyBase> family);

  mutable absl::Mutex mutex_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mutex_);
  mutable absl::Mutex render_mutex_;  // one scrape at a time: collectors clear and refill gauges
};

// Label values escape \, " and newline; HELP text escapes \ and newline.
std::string EscapeLabelValue(absl::string_view value);
std::string EscapeHelp(absl::string_view help);
// Shortest round-trip form; integers without a fraction; +Inf, -Inf, NaN.
std::string FormatValue(double value);
bool IsValidMetricName(absl::string_view name);
bool IsValidLabelName(absl::string_view name);

}  // namespace metrics

// The kiln_* metrics of one server.
class ServerMetrics {
 public:
  // `registry` (may be null) is sampled at every scrape for the per-model gauges, the models by
  // state and the load stage durations; it must outlive this object.
  explicit ServerMetrics(const ModelRegistry* registry);
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  std::string Render() const { return registry_.Render(); }
  metrics::Registry& registry() { return registry_; }

  // Speculative decoding: tokens drafted and accepted for `model`. The engine does not report
  // them yet; the inference service calls this (through GenerateRecorder::OnSpeculative) once
  // GenerationUpdate carries them.
  void RecordSpeculative(const std::string& model, int64_t drafted, int64_t accepted);

 private:
  friend class GenerateRecorder;
  void Collect();

  const ModelRegistry* const model_registry_;
  metrics::Registry registry_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Family<metrics::Counter>& prompt_tokens_;
  metrics::Family<metrics::Counter>& generation_tokens_;
  metrics::Family<metrics::Histogram>& time_to_first_token_;
  metrics::Family<metrics::Histogram>& inter_token_latency_;
  metrics::Family<metrics::Histogram>& e2e_latency_;
  metrics::Family<metrics::Counter>& spec_drafted_;
  metrics::Family<metrics::Counter>& spec_accepted_;
  metrics::Family<metrics::Gauge>& running_;
  metrics::Family<metrics::Gauge>& waiting_;
  metrics::Family<metrics::Gauge>& kv_cache_bytes_;
  metrics::Family<metrics::Gauge>& kv_pool_bytes_;
  metrics::Family<metrics::Gauge>& kv_cache_usage_;
  metrics::Family<metrics::Counter>& preemptions_;
  metrics::Family<metrics::Counter>& prefix_cache_queries_;
  metrics::Family<metrics::Counter>& prefix_cache_hits_;
  metrics::Family<metrics::Gauge>& prefix_cache_hit_rate_;
  metrics::Family<metrics::Counter>& engine_steps_;
  metrics::Family<metrics::Gauge>& models_;
  metrics::Family<metrics::Gauge>& load_seconds_;
};

// What one generation records (a Generate call; one choice of an OpenAI request). Made when the
// request arrives; a null `metrics` makes every method a no-op. Not thread-safe: one thread at a
// time drives it (the gRPC handler; the engine's callbacks).
class GenerateRecorder {
 public:
  // `protocol`: the kiln_requests_total label, "grpc" or "http".
  explicit GenerateRecorder(ServerMetrics* metrics, absl::string_view protocol = "grpc");
  GenerateRecorder(const GenerateRecorder&) = delete;
  GenerateRecorder& operator=(const GenerateRecorder&) = delete;

  // The call names a READY model (registered names only, so label values stay bounded).
  void OnModel(const std::string& model);
  // The engine accepted the request.
  void OnSubmitted(int64_t prompt_tokens);
  // `count` tokens are about to be written to the client: the first ones give the time to
  // first token, later ones the inter-token latency (the gap since the previous tokens, split
  // evenly among them).
  void OnTokens(int64_t count);
  void OnSpeculative(int64_t drafted, int64_t accepted);
  // The stream ended with this finish reason.
  void OnFinish(FinishReason reason);
  // The call returns `status`: counts the request (by model, code, finish reason and protocol)
  // and, for a finished one, its end-to-end latency. Call once.
  void OnEnd(const grpc::Status& status);
  void OnEnd(const absl::Status& status);

 private:
  using Clock = std::chrono::steady_clock;
  ServerMetrics* const metrics_;
  const std::string protocol_;
  const Clock::time_point start_;
  Clock::time_point last_tokens_;
  std::string model_;  // "" until resolved: unknown names must not make label values
  bool first_tokens_ = true;
  FinishReason finish_ = FinishReason::kNone;
  metrics::Counter* generation_tokens_ = nullptr;
  metrics::Histogram* ttft_ = nullptr;
  metrics::Histogram* itl_ = nullptr;
};

// "length", "stop", "eos", "cancelled", "none".
absl::string_view FinishReasonLabel(FinishReason reason);

// GET /metrics over HTTP/1.1 on its own port, served by civetweb's threads. Stops (and frees the
// port) when destroyed.
class MetricsHttpServer {
 public:
  // `listen`: HOST:PORT with a numeric IPv4 host, [IPv6] or "localhost"; port 0 picks a free
  // port. `render` makes the body of each scrape (on civetweb's threads). Unavailable when the
  // address cannot be bound; InvalidArgument when it is malformed.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }
  // HOST:PORT with the bound port.
  const std::string& address() const { return address_; }

 private:
  struct Context;  // the civetweb context
  MetricsHttpServer() = default;
  static int Handle(mg_connection* connection, void* self);

  std::function<std::string()> render_;
  std::unique_ptr<Context> context_;
  int port_ = 0;
  std::string address_;
};

}  // namespace kiln
