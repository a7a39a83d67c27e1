#include "server/metrics.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "server/registry.h"

namespace kiln {
namespace metrics {
namespace {

absl::string_view TypeName(Type type) {
  switch (type) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

bool IsNameStart(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) {
  return IsNameStart(c) || absl::ascii_isdigit(static_cast<unsigned char>(c));
}

}  // namespace

void Counter::Increment(double amount) {
  if (!(amount > 0)) return;  // also drops NaN: a counter never goes down
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void Gauge::Add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  CHECK(std::is_sorted(bounds_.begin(), bounds_.end()) &&
        std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end())
      << "histogram bounds must increase strictly";
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::Observe(double value, uint64_t times) {
  if (times == 0 || std::isnan(value)) return;
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();  // value ≤ bound
  absl::MutexLock lock(&mutex_);
  counts_[bucket] += times;
  sum_ += value * static_cast<double>(times);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  absl::MutexLock lock(&mutex_);
  uint64_t running = 0;
  for (uint64_t count : counts_) {
    running += count;
    snapshot.cumulative.push_back(running);
  }
  snapshot.sum = sum_;
  snapshot.count = running;
  return snapshot;
}

FamilyBase::FamilyBase(Type type, std::string name, std::string help,
                       std::vector<std::string> label_names)
    : type_(type),
      name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)) {
  CHECK(IsValidMetricName(name_)) << "bad metric name '" << name_ << "'";
  for (const std::string& label : label_names_) {
    CHECK(IsValidLabelName(label) && !(type_ == Type::kHistogram && label == "le"))
        << "metric " << name_ << ": bad label name '" << label << "'";
  }
}

void FamilyBase::Render(std::string* out) const {
  absl::StrAppend(out, "# HELP ", name_, " ", EscapeHelp(help_), "\n# TYPE ", name_, " ",
                  TypeName(type_), "\n");
  RenderSamples(out);
}

std::string FamilyBase::LabelPrefix(const std::vector<std::string>& values) const {
  if (label_names_.empty()) return "";
  std::string prefix = "{";
  for (size_t i = 0; i < label_names_.size(); ++i) {
    absl::StrAppend(&prefix, i == 0 ? "" : ",", label_names_[i], "=\"",
                    EscapeLabelValue(i < values.size() ? values[i] : ""), "\"");
  }
  return prefix;
}

// Counters and gauges: one sample per label set.
template <typename T>
void Family<T>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mutex_);
  for (const auto& [values, child] : children_) {
    const std::string prefix = LabelPrefix(values);
    absl::StrAppend(out, name(), prefix, prefix.empty() ? "" : "}", " ",
                    FormatValue(child->value()), "\n");
  }
}

template class Family<Counter>;
template class Family<Gauge>;

template <>
void Family<Histogram>::RenderSamples(std::string* out) const {
  absl::MutexLock lock(&mutex_);
  for (const auto& [values, child] : children_) {
    const Histogram::Snapshot snapshot = child->snapshot();
    const std::string prefix = LabelPrefix(values);
    const std::string le_prefix = prefix.empty() ? "{le=\"" : absl::StrCat(prefix, ",le=\"");
    const std::string close = prefix.empty() ? "" : "}";
    for (size_t i = 0; i <= snapshot.bounds.size(); ++i) {
      const std::string le = i < snapshot.bounds.size() ? FormatValue(snapshot.bounds[i]) : "+Inf";
      absl::StrAppend(out, name(), "_bucket", le_prefix, le, "\"} ", snapshot.cumulative[i], "\n");
    }
    absl::StrAppend(out, name(), "_sum", prefix, close, " ", FormatValue(snapshot.sum), "\n");
    absl::StrAppend(out, name(), "_count", prefix, close, " ", snapshot.count, "\n");
  }
}

Family<Counter>& Registry::AddCounter(std::string name, std::string help,
                                      std::vector<std::string> label_names) {
  auto family = std::make_unique<Family<Counter>>(Type::kCounter, std::move(name), std::move(help),
                                                  std::move(label_names),
                                                  [] { return std::make_unique<Counter>(); });
  Family<Counter>& ref = *family;
  Add(std::move(family));
  return ref;
}

Family<Gauge>& Registry::AddGauge(std::string name, std::string help,
                                  std::vector<std::string> label_names) {
  auto family = std::make_unique<Family<Gauge>>(Type::kGauge, std::move(name), std::move(help),
                                                std::move(label_names),
                                                [] { return std::make_unique<Gauge>(); });
  Family<Gauge>& ref = *family;
  Add(std::move(family));
  return ref;
}

Family<Histogram>& Registry::AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds) {
  for (double bound : bounds) CHECK(std::isfinite(bound)) << name << ": bounds must be finite";
  auto family = std::make_unique<Family<Histogram>>(
      Type::kHistogram, std::move(name), std::move(help), std::move(label_names),
      [bounds = std::move(bounds)] { return std::make_unique<Histogram>(bounds); });
  Family<Histogram>& ref = *family;
  Add(std::move(family));
  return ref;
}

void Registry::Add(std::unique_ptr<FamilyBase> family) {
  absl::MutexLock lock(&mutex_);
  for (const std::unique_ptr<FamilyBase>& existing : families_) {
    CHECK(existing->name() != family->name()) << "metric " << family->name() << " added twice";
  }
  families_.push_back(std::move(family));
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mutex_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() const {
  absl::MutexLock render_lock(&render_mutex_);
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mutex_);
    collectors = collectors_;
  }
  for (const std::function<void()>& collect : collectors) collect();
  std::string out;
  absl::MutexLock lock(&mutex_);
  for (const std::unique_ptr<FamilyBase>& family : families_) family->Render(&out);
  return out;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  std::array<char, 32> buffer;
  const std::to_chars_result result =
      std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return std::string(buffer.data(), result.ptr);
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || !(IsNameStart(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsNameChar(c) || c == ':'; });
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || !IsNameStart(name[0]) || absl::StartsWith(name, "__")) return false;
  return std::all_of(name.begin(), name.end(), IsNameChar);
}

}  // namespace metrics

namespace {

using metrics::Counter;
using metrics::Histogram;

// LLM latencies span milliseconds (a decode step) to minutes (a long generation under load).
const std::vector<double>& TtftBuckets() {
  static const std::vector<double> bounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                             0.1,   0.25,  0.5,  0.75, 1,    2.5,  5,
                                             7.5,   10,    20,   40,   80};
  return bounds;
}

const std::vector<double>& ItlBuckets() {
  static const std::vector<double> bounds = {0.001, 0.0025, 0.005, 0.01,  0.015, 0.02, 0.025,
                                             0.03,  0.04,   0.05,  0.075, 0.1,   0.15, 0.2,
                                             0.3,   0.4,    0.5,   0.75,  1,     2.5};
  return bounds;
}

const std::vector<double>& E2eBuckets() {
  static const std::vector<double> bounds = {0.1, 0.25, 0.5, 1,  2.5, 5,   10,  15, 20,
                                             30,  40,   50,  60, 120, 240, 480, 960};
  return bounds;
}

double Seconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

}  // namespace

absl::string_view FinishReasonLabel(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

ServerMetrics::ServerMetrics(const ModelRegistry* registry)
    : model_registry_(registry),
      requests_(registry_.AddCounter(
          "kiln_requests_total",
          "Generation requests that ended (gRPC Generate calls; OpenAI HTTP choices), by model "
          "(\"\" when the name did not resolve to a READY model), status code (gRPC's names), "
          "finish reason (none: ended without one) and protocol (grpc, http).",
          {"model", "code", "finish_reason", "protocol"})),
      prompt_tokens_(registry_.AddCounter(
          "kiln_prompt_tokens_total", "Prompt tokens of requests the engine accepted.", {"model"})),
      generation_tokens_(registry_.AddCounter("kiln_generation_tokens_total",
                                              "Generated tokens streamed to clients.", {"model"})),
      time_to_first_token_(registry_.AddHistogram(
          "kiln_time_to_first_token_seconds",
          "From the arrival of a Generate call to its first token being sent.", {"model"},
          TtftBuckets())),
      inter_token_latency_(
          registry_.AddHistogram("kiln_inter_token_latency_seconds",
                                 "Time between successive tokens sent on one stream (per token).",
                                 {"model"}, ItlBuckets())),
      e2e_latency_(registry_.AddHistogram(
          "kiln_e2e_request_latency_seconds",
          "From the arrival of a Generate call to its end, for calls that finished.", {"model"},
          E2eBuckets())),
      spec_drafted_(registry_.AddCounter("kiln_speculative_drafted_tokens_total",
                                         "Speculative decoding: tokens drafted.", {"model"})),
      spec_accepted_(registry_.AddCounter("kiln_speculative_accepted_tokens_total",
                                          "Speculative decoding: drafted tokens accepted.",
                                          {"model"})),
      running_(registry_.AddGauge("kiln_requests_running",
                                  "Sequences in the engine's running batch.", {"model"})),
      waiting_(registry_.AddGauge("kiln_requests_waiting",
                                  "Requests queued for the engine, not yet running.", {"model"})),
      kv_cache_bytes_(registry_.AddGauge("kiln_kv_cache_usage_bytes",
                                         "KV pool bytes held by running sequences.", {"model"})),
      kv_pool_bytes_(registry_.AddGauge("kiln_kv_pool_bytes", "Size of the model's paged KV pool.",
                                        {"model"})),
      kv_cache_usage_(registry_.AddGauge(
          "kiln_kv_cache_usage_ratio",
          "Fraction of the KV pool's blocks held by running sequences (0 to 1).", {"model"})),
      preemptions_(registry_.AddCounter(
          "kiln_preemptions_total",
          "Running sequences preempted for want of KV blocks (recomputed when resumed).",
          {"model"})),
      prefix_cache_queries_(registry_.AddCounter(
          "kiln_prefix_cache_queries_tokens_total",
          "Prompt tokens of admitted requests (looked up in the prefix cache).", {"model"})),
      prefix_cache_hits_(registry_.AddCounter(
          "kiln_prefix_cache_hits_tokens_total",
          "Prompt tokens served from the prefix cache instead of being prefilled.", {"model"})),
      prefix_cache_hit_rate_(registry_.AddGauge(
          "kiln_prefix_cache_hit_rate",
          "Prompt tokens served from the prefix cache over prompt tokens, since load.", {"model"})),
      engine_steps_(registry_.AddCounter("kiln_engine_steps_total",
                                         "Batched steps the model's engine has run.", {"model"})),
      models_(registry_.AddGauge("kiln_models", "Registered models by state.", {"state"})),
      load_seconds_(registry_.AddGauge(
          "kiln_model_load_duration_seconds",
          "Wall time of each load stage of a READY model (open: read and map the checkpoint, "
          "bind: bind and restore, post_load: pack the weights for the backend).",
          {"model", "stage"})) {
  registry_.AddCollector([this] { Collect(); });
}

void ServerMetrics::RecordSpeculative(const std::string& model, int64_t drafted, int64_t accepted) {
  spec_drafted_.WithLabels({model}).Increment(static_cast<double>(drafted));
  spec_accepted_.WithLabels({model}).Increment(static_cast<double>(accepted));
}

void ServerMetrics::Collect() {
  // Sampled afresh each scrape, so that unloaded models disappear.
  running_.Clear();
  waiting_.Clear();
  kv_cache_bytes_.Clear();
  kv_pool_bytes_.Clear();
  kv_cache_usage_.Clear();
  preemptions_.Clear();
  prefix_cache_queries_.Clear();
  prefix_cache_hits_.Clear();
  prefix_cache_hit_rate_.Clear();
  engine_steps_.Clear();
  load_seconds_.Clear();
  std::map<ModelState, int> by_state = {{ModelState::kLoading, 0},
                                        {ModelState::kReady, 0},
                                        {ModelState::kUnloading, 0},
                                        {ModelState::kFailed, 0}};
  if (model_registry_ != nullptr) {
    for (const ModelSnapshot& model : model_registry_->List()) {
      ++by_state[model.state];
      const std::string& name = model.spec.name;
      if (model.state == ModelState::kReady && model.engine != nullptr) {
        const EngineStats stats = model.engine->stats();
        running_.WithLabels({name}).Set(stats.running);
        waiting_.WithLabels({name}).Set(stats.waiting);
        kv_cache_bytes_.WithLabels({name}).Set(static_cast<double>(stats.kv_cache_bytes));
        engine_steps_.WithLabels({name}).Increment(static_cast<double>(stats.steps));
        preemptions_.WithLabels({name}).Increment(static_cast<double>(stats.preemptions));
        prefix_cache_queries_.WithLabels({name}).Increment(
            static_cast<double>(stats.prompt_tokens));
        prefix_cache_hits_.WithLabels({name}).Increment(
            static_cast<double>(stats.cached_prompt_tokens));
        prefix_cache_hit_rate_.WithLabels({name}).Set(
            stats.prompt_tokens == 0 ? 0.0
                                     : static_cast<double>(stats.cached_prompt_tokens) /
                                           static_cast<double>(stats.prompt_tokens));
        if (model.model != nullptr) {
          const KvPool& pool = model.model->kv_pool();
          kv_pool_bytes_.WithLabels({name}).Set(static_cast<double>(pool.bytes()));
          kv_cache_usage_.WithLabels({name}).Set(
              pool.num_blocks() == 0 ? 0.0
                                     : static_cast<double>(pool.stats().used_blocks) /
                                           static_cast<double>(pool.num_blocks()));
        }
      }
      if (model.model != nullptr) {
        const StageTimings& timings = model.model->timings();
        load_seconds_.WithLabels({name, "open"}).Set(timings.open_seconds);
        load_seconds_.WithLabels({name, "bind"}).Set(timings.bind_seconds);
        load_seconds_.WithLabels({name, "post_load"}).Set(timings.post_load_seconds);
      }
    }
  }
  for (const auto& [state, count] : by_state) {
    models_.WithLabels({std::string(ModelStateName(state))}).Set(count);
  }
}

GenerateRecorder::GenerateRecorder(ServerMetrics* metrics, absl::string_view protocol)
    : metrics_(metrics), protocol_(protocol), start_(Clock::now()), last_tokens_(start_) {}

void GenerateRecorder::OnModel(const std::string& model) {
  if (metrics_ == nullptr) return;
  model_ = model;
  generation_tokens_ = &metrics_->generation_tokens_.WithLabels({model});
  ttft_ = &metrics_->time_to_first_token_.WithLabels({model});
  itl_ = &metrics_->inter_token_latency_.WithLabels({model});
}

void GenerateRecorder::OnSubmitted(int64_t prompt_tokens) {
  if (metrics_ == nullptr || model_.empty()) return;
  metrics_->prompt_tokens_.WithLabels({model_}).Increment(static_cast<double>(prompt_tokens));
}

void GenerateRecorder::OnTokens(int64_t count) {
  if (generation_tokens_ == nullptr || count <= 0) return;
  const Clock::time_point now = Clock::now();
  generation_tokens_->Increment(static_cast<double>(count));
  if (first_tokens_) {
    ttft_->Observe(Seconds(now - start_));
    first_tokens_ = false;
  } else {
    itl_->Observe(Seconds(now - last_tokens_) / static_cast<double>(count),
                  static_cast<uint64_t>(count));
  }
  last_tokens_ = now;
}

void GenerateRecorder::OnSpeculative(int64_t drafted, int64_t accepted) {
  if (metrics_ == nullptr || model_.empty()) return;
  metrics_->RecordSpeculative(model_, drafted, accepted);
}

void GenerateRecorder::OnFinish(FinishReason reason) { finish_ = reason; }

void GenerateRecorder::OnEnd(const grpc::Status& status) {
  OnEnd(absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message()));
}

void GenerateRecorder::OnEnd(const absl::Status& status) {
  if (metrics_ == nullptr) return;
  const std::string code = absl::StatusCodeToString(status.code());
  metrics_->requests_.WithLabels({model_, code, std::string(FinishReasonLabel(finish_)), protocol_})
      .Increment();
  if (status.ok() && finish_ != FinishReason::kNone && !model_.empty()) {
    metrics_->e2e_latency_.WithLabels({model_}).Observe(Seconds(Clock::now() - start_));
  }
}

// ---- HTTP endpoint ----------------------------------------------------------------------------

namespace {

// Opens and closes a TCP connection to the endpoint, which wakes civetweb's listener. `host` is
// a numeric address: "127.0.0.1" or "[::1]".
void Poke(const std::string& host, int port) {
  const bool ipv6 = !host.empty() && host.front() == '[';
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (ipv6) {
    sockaddr_in6 address = {};
    address.sin6_family = AF_INET6;
    address.sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &address.sin6_addr) == 1) {
      connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    }
  } else {
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) == 1) {
      connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    }
  }
  close(fd);
}

}  // namespace

struct MetricsHttpServer::Context {
  mg_context* context = nullptr;
  std::string host;  // where to connect to reach the listener
  int port = 0;

  ~Context() {
    if (context == nullptr) return;
    // civetweb's listener polls in 2 s quanta, and mg_stop waits for it to notice. A connection
    // ends the wait at once; it is repeated until mg_stop returns because one that arrives
    // before the stop flag is set is simply served.
    std::atomic<bool> stopped{false};
    std::thread waker;
    if (port > 0) {
      waker = std::thread([this, &stopped] {
        while (!stopped.load()) {
          Poke(host, port);
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      });
    }
    mg_stop(context);  // waits for civetweb's threads
    stopped = true;
    if (waker.joinable()) waker.join();
  }
};

namespace {

int LogCivetweb(const mg_connection* /*connection*/, const char* message) {
  VLOG(1) << "metrics endpoint: " << message;
  return 1;  // handled: civetweb prints nothing itself
}

// civetweb's listening_ports syntax: "127.0.0.1:9090", "[::1]:9090".
absl::StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: '", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  const bool ipv6 = host.size() > 2 && host.front() == '[' && host.back() == ']';
  const bool ipv4 = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '.';
  });
  if (!ipv4 && !ipv6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_listen: '", listen,
        "': the host must be a numeric address (127.0.0.1, 0.0.0.0, [::1]) or localhost"));
  }
  return std::make_pair(host, port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render) {
  auto parsed = ParseListen(listen);
  if (!parsed.ok()) return parsed.status();
  const auto& [host, port] = *parsed;
  static std::once_flag init_once;
  std::call_once(init_once, [] { mg_init_library(0); });

  auto server = std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer());
  server->render_ = std::move(render);
  server->context_ = std::make_unique<Context>();
  const std::string ports = absl::StrCat(host, ":", port);
  // Scrapes are rare and short: two threads suffice, and no files are ever served.
  const char* options[] = {"listening_ports",    ports.c_str(), "num_threads", "2",
                           "request_timeout_ms", "10000",       nullptr};
  mg_callbacks callbacks = {};
  callbacks.log_message = LogCivetweb;
  mg_init_data init = {};
  init.callbacks = &callbacks;
  init.user_data = nullptr;
  init.configuration_options = options;
  unsigned error_code = 0;
  char error_text[256] = "";
  mg_error_data error = {};
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  server->context_->context = mg_start2(&init, &error);
  if (server->context_->context == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ",
                                               error_text[0] != '\0' ? error_text : "unknown",
                                               " (address in use or not available?)"));
  }
  mg_set_request_handler(server->context_->context, "/", &MetricsHttpServer::Handle, server.get());
  mg_server_port bound = {};
  if (mg_get_server_ports(server->context_->context, 1, &bound) != 1 || bound.port <= 0) {
    return absl::InternalError(absl::StrCat("metrics endpoint on ", listen, ": no bound port"));
  }
  server->port_ = bound.port;
  server->context_->port = bound.port;
  server->context_->host = host == "0.0.0.0" ? "127.0.0.1" : host == "[::]" ? "[::1]" : host;
  server->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", bound.port);
  return server;
}

MetricsHttpServer::~MetricsHttpServer() = default;

int MetricsHttpServer::Handle(mg_connection* connection, void* self) {
  // A C callback: no exception may leave it.
  try {
    const mg_request_info* request = mg_get_request_info(connection);
    const absl::string_view uri = request->local_uri != nullptr ? request->local_uri : "";
    const absl::string_view method =
        request->request_method != nullptr ? request->request_method : "";
    if (uri != "/metrics") {
      mg_send_http_error(connection, 404, "%s", "not found; metrics are at /metrics\n");
      return 404;
    }
    if (method != "GET" && method != "HEAD") {
      mg_send_http_error(connection, 405, "%s", "only GET and HEAD\n");
      return 405;
    }
    const std::string body = static_cast<MetricsHttpServer*>(self)->render_();
    mg_send_http_ok(connection, "text/plain; version=0.0.4; charset=utf-8",
                    static_cast<long long>(body.size()));
    if (method == "GET") mg_write(connection, body.data(), body.size());
    return 200;
  } catch (const std::exception& e) {
    LOG(ERROR) << "metrics endpoint: " << e.what();
  } catch (...) {
    LOG(ERROR) << "metrics endpoint: unknown exception";
  }
  mg_send_http_error(connection, 500, "%s", "internal error\n");
  return 500;
}

}  // namespace kiln
