#include "clients/loadgen/http_runner.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "clients/loadgen/sse.h"

namespace kiln::loadgen {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = PhaseLedger::Clock;
using ErrorCode = boost::system::error_code;

// An error body is kept up to this size for its message; the rest is read and dropped.
constexpr size_t kMaxErrorBody = 64 << 10;

// After a cancel (an orderly close), what the server still sends is drained for at most this
// long, waiting for it to close its side.
constexpr absl::Duration kCancelDrain = absl::Seconds(2);

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

Clock::duration ToClock(absl::Duration duration) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(duration));
}

absl::string_view View(beast::string_view text) { return {text.data(), text.size()}; }

absl::StatusOr<tcp::resolver::results_type> Resolve(asio::io_context& io, const HttpUrl& url) {
  tcp::resolver resolver(io);
  ErrorCode ec;
  tcp::resolver::results_type endpoints =
      resolver.resolve(url.host, std::to_string(url.port), tcp::resolver::numeric_service, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", url.host, ": ", ec.message()));
  }
  return endpoints;
}

// Which failure a read error is: past the deadline, a malformed response, or the connection
// ending (before the header: a connection error; after it: a stream cut short).
absl::string_view ReadFailure(const ErrorCode& ec, bool have_header) {
  if (ec == beast::error::timeout) return kTimeout;
  if (ec.category() == http::make_error_code(http::error::bad_version).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return kBadResponse;
  }
  return have_header ? kTruncated : kConnectionError;
}

// What a connection kept from an earlier request reports when the server closed it meanwhile.
bool IsStaleConnection(const ErrorCode& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted;
}

struct Connection {
  explicit Connection(asio::io_context& io) : stream(io) {}
  beast::tcp_stream stream;
  beast::flat_buffer buffer;  // bytes read past the last parsed message
};

// One I/O thread and what only it touches.
struct Worker {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{io.get_executor()};
  std::vector<std::unique_ptr<Connection>> idle;  // kept alive, waiting for a request
  std::thread thread;
};

class HttpPhase {
 public:
  HttpPhase(const OpenAiTarget& target, tcp::resolver::results_type endpoints,
            const PhaseConfig& config, PromptSource& prompts, LiveCounters* live);
  PhaseResult Run();

 private:
  // One streamed request. It runs on its worker's thread, with one asynchronous operation
  // pending at a time; the handlers own it, and Complete deletes it.
  struct Request {
    explicit Request(Worker* worker) : worker(worker), backoff(worker->io) {}
    Worker* const worker;
    asio::steady_timer backoff;
    std::unique_ptr<Connection> connection;
    bool reused = false;   // the connection served an earlier request
    bool retried = false;  // a stale kept connection was replaced once
    http::request<http::string_body> message;
    std::optional<http::response_parser<http::buffer_body>> parser;
    int status = 0;          // the response's, once its header arrived
    std::string error_body;  // of a status outside 2xx
    std::string content_type;
    SseParser sse;
    std::vector<SseEvent> events;
    OpenAiStream stream;
    RequestRecord record;
    Clock::time_point start, deadline;
    int64_t live_tokens = 0;  // added to the live counter so far
    bool fault_due = false;   // received its planned number of tokens: end it now
    std::array<char, 16 << 10> chunk;
  };

  // A new request, reserved in flight at once, admitted and begun on `worker` after `delay`.
  void Schedule(Worker* worker, absl::Duration delay);
  // Admits a reserved request and builds its message; false (and the request deleted) when the
  // phase issues no more.
  bool Admit(Request* r);
  void Begin(Request* r);
  void Connect(Request* r);
  void Send(Request* r);
  void ReadHeader(Request* r);
  void ReadBody(Request* r);
  void OnEvents(Request* r, Clock::time_point now);
  void EndOfBody(Request* r);
  // A failure before any byte of a response on a kept connection gets one more try on a fresh
  // one: the server may have closed the connection while it was idle. Returns whether it did.
  bool MaybeRetry(Request* r, const ErrorCode& ec);
  void Fail(Request* r, absl::string_view label, std::string message);
  // Ends a request that received its planned number of tokens: a cancel closes the connection in
  // order (FIN) and drains it until the server closes too (CancelDrain); a disconnect resets it
  // (RST) and reads nothing more.
  void Fault(Request* r);
  void CancelDrain(Request* r);
  // The record's outcome, from the status and the stream.
  void Settle(Request* r);
  void Complete(Request* r);

  const OpenAiTarget target_;
  const std::string path_, host_;
  const tcp::resolver::results_type endpoints_;
  PhaseLedger ledger_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<size_t> next_worker_{0};
};

HttpPhase::HttpPhase(const OpenAiTarget& target, tcp::resolver::results_type endpoints,
                     const PhaseConfig& config, PromptSource& prompts, LiveCounters* live)
    : target_(target),
      path_(RequestPath(target.url, target.api)),
      host_(target.url.HostHeader()),
      endpoints_(std::move(endpoints)),
      ledger_(config, prompts, live) {
  for (int i = 0; i < std::max(1, config.threads); ++i) {
    workers_.push_back(std::make_unique<Worker>());
  }
}

PhaseResult HttpPhase::Run() {
  ledger_.Start();
  for (const std::unique_ptr<Worker>& worker : workers_) {
    worker->thread = std::thread([io = &worker->io] {
      // The handlers throw nothing by design; should one throw anyway, its request would never
      // end and the phase would wait for ever, so stop loudly instead.
      try {
        io->run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kiln-loadgen: fatal: %s\n", e.what());
        std::abort();
      }
    });
  }
  const PhaseConfig& config = ledger_.config();
  if (config.concurrency > 0) {
    for (int i = 0; i < config.concurrency; ++i) {
      Schedule(workers_[i % workers_.size()].get(), absl::ZeroDuration());
    }
  } else {
    ledger_.RunArrivals([this] {
      Worker* worker = workers_[next_worker_.fetch_add(1) % workers_.size()].get();
      auto* r = new Request(worker);
      if (!Admit(r)) return false;
      asio::post(worker->io, [this, r] { Begin(r); });
      return true;
    });
  }
  ledger_.AwaitIdle();
  // Nothing is in flight, so nothing is pending but idle connections.
  for (const std::unique_ptr<Worker>& worker : workers_) {
    worker->guard.reset();
    worker->io.stop();
  }
  for (const std::unique_ptr<Worker>& worker : workers_) worker->thread.join();
  for (const std::unique_ptr<Worker>& worker : workers_) worker->idle.clear();
  return ledger_.TakeResult();
}

void HttpPhase::Schedule(Worker* worker, absl::Duration delay) {
  ledger_.Reserve();
  auto* r = new Request(worker);
  auto begin = [this, r] {
    if (Admit(r)) Begin(r);
  };
  if (delay > absl::ZeroDuration()) {
    r->backoff.expires_after(ToClock(delay));
    r->backoff.async_wait([begin](const ErrorCode&) { begin(); });
  } else {
    asio::post(worker->io, begin);
  }
}

bool HttpPhase::Admit(Request* r) {
  RequestSpec spec;
  if (!ledger_.Admit(&spec, &r->record)) {
    delete r;
    return false;
  }
  const PhaseConfig& config = ledger_.config();
  http::request<http::string_body>& m = r->message;
  m.method(http::verb::post);
  m.target(path_);
  m.version(11);
  m.set(http::field::host, host_);
  m.set(http::field::user_agent, "kiln-loadgen");
  m.set(http::field::content_type, "application/json");
  m.set(http::field::accept, "text/event-stream");
  if (!target_.api_key.empty()) {
    m.set(http::field::authorization, absl::StrCat("Bearer ", target_.api_key));
  }
  m.keep_alive(true);
  m.body() =
      BuildRequestBody(target_.api, config.model, spec, config.ignore_eos, config.temperature);
  m.prepare_payload();
  return true;
}

void HttpPhase::Begin(Request* r) {
  r->start = Clock::now();
  r->deadline = r->start + ToClock(ledger_.config().request_timeout);
  std::vector<std::unique_ptr<Connection>>& idle = r->worker->idle;
  if (idle.empty()) {
    Connect(r);
    return;
  }
  r->connection = std::move(idle.back());
  idle.pop_back();
  r->reused = true;
  Send(r);
}

void HttpPhase::Connect(Request* r) {
  r->connection = std::make_unique<Connection>(r->worker->io);
  r->reused = false;
  r->connection->stream.expires_at(
      std::min(r->deadline, Clock::now() + ToClock(target_.connect_timeout)));
  r->connection->stream.async_connect(
      endpoints_, [this, r](const ErrorCode& ec, const tcp::endpoint&) {
        if (ec) {
          const bool late = Clock::now() >= r->deadline;
          Fail(r, late ? kTimeout : kConnectFailed,
               absl::StrCat("cannot connect to ", target_.url.ToString(), ": ",
                            ec == beast::error::timeout ? "timed out" : ec.message()));
          return;
        }
        ErrorCode ignored;  // tokens are small writes: no Nagle delay on the request
        r->connection->stream.socket().set_option(tcp::no_delay(true), ignored);
        Send(r);
      });
}

void HttpPhase::Send(Request* r) {
  r->connection->stream.expires_at(r->deadline);
  http::async_write(r->connection->stream, r->message, [this, r](const ErrorCode& ec, size_t) {
    if (!ec) {
      ReadHeader(r);
    } else if (!MaybeRetry(r, ec)) {
      Fail(r, ec == beast::error::timeout ? kTimeout : kConnectionError,
           absl::StrCat("sending the request: ", ec.message()));
    }
  });
}

void HttpPhase::ReadHeader(Request* r) {
  r->parser.emplace();
  // A stream is as long as the server makes it. (Not boost::none: Boost 1.74 compares a
  // Content-Length against an empty optional and finds every length over the limit.)
  r->parser->body_limit(std::numeric_limits<std::uint64_t>::max());
  http::async_read_header(r->connection->stream, r->connection->buffer, *r->parser,
                          [this, r](const ErrorCode& ec, size_t) {
                            if (ec) {
                              if (!MaybeRetry(r, ec)) {
                                Fail(r, ReadFailure(ec, /*have_header=*/false),
                                     absl::StrCat("reading the response header: ", ec.message()));
                              }
                              return;
                            }
                            r->status = r->parser->get().result_int();
                            r->content_type =
                                std::string(View(r->parser->get()[http::field::content_type]));
                            ReadBody(r);
                          });
}

void HttpPhase::ReadBody(Request* r) {
  if (r->parser->is_done()) {
    EndOfBody(r);
    return;
  }
  http::buffer_body::value_type& body = r->parser->get().body();
  body.data = r->chunk.data();
  body.size = r->chunk.size();
  http::async_read_some(
      r->connection->stream, r->connection->buffer, *r->parser, [this, r](ErrorCode ec, size_t) {
        const Clock::time_point now = Clock::now();
        if (ec == http::error::need_buffer) ec = {};  // the chunk buffer is full: not an error
        const size_t bytes = r->chunk.size() - r->parser->get().body().size;
        const std::string_view data(r->chunk.data(), bytes);
        if (r->status >= 200 && r->status < 300) {
          r->events.clear();
          r->sse.Feed(data, &r->events);
          OnEvents(r, now);
          if (r->fault_due) {
            Fault(r);
            return;
          }
        } else if (r->error_body.size() < kMaxErrorBody) {
          r->error_body.append(data.substr(0, kMaxErrorBody - r->error_body.size()));
        }
        if (ec) {
          Fail(r, ReadFailure(ec, /*have_header=*/true),
               absl::StrCat("reading the response: ", ec.message()));
          return;
        }
        ReadBody(r);
      });
}

void HttpPhase::OnEvents(Request* r, Clock::time_point now) {
  const double seconds = Seconds(now - r->start);
  for (const SseEvent& event : r->events) {
    if (event.event == "error") {
      r->stream.Fail(kStreamError, ErrorBodyMessage(event.data));
      continue;
    }
    const int tokens = r->stream.OnEvent(event.data, seconds);
    if (tokens > 0) {
      r->live_tokens += tokens;
      ledger_.AddOutputTokens(tokens);
    }
    const RequestRecord& record = r->record;
    if (record.planned_fault != ClientFault::kNone && !r->stream.failed() && !r->stream.done() &&
        r->live_tokens >= record.fault_after_tokens) {
      r->fault_due = true;  // the events after it are not looked at
      return;
    }
  }
}

void HttpPhase::EndOfBody(Request* r) {
  const Clock::time_point now = Clock::now();
  if (r->status >= 200 && r->status < 300) {
    r->events.clear();
    r->sse.Finish(&r->events);
    OnEvents(r, now);
  }
  r->record.e2e_seconds = Seconds(now - r->start);
  Settle(r);
  // A body that ends with the connection leaves nothing to reuse, whatever the headers say.
  if (r->parser->get().keep_alive() && !r->parser->need_eof()) {
    r->connection->stream.expires_never();
    r->worker->idle.push_back(std::move(r->connection));
  }
  Complete(r);
}

bool HttpPhase::MaybeRetry(Request* r, const ErrorCode& ec) {
  if (!r->reused || r->retried || !IsStaleConnection(ec)) return false;
  r->retried = true;
  r->connection.reset();
  Connect(r);
  return true;
}

void HttpPhase::Fail(Request* r, absl::string_view label, std::string message) {
  r->stream.Fail(label, std::move(message));
  r->record.e2e_seconds = Seconds(Clock::now() - r->start);
  r->connection.reset();  // its state is unknown: never reused
  Settle(r);
  Complete(r);
}

void HttpPhase::Fault(Request* r) {
  RequestRecord& record = r->record;
  record.fault = record.planned_fault;
  record.e2e_seconds = Seconds(Clock::now() - r->start);
  const std::string label = ClientFaultLabel(record.fault);
  r->stream.Fail(label, absl::StrCat(label, " by the client after ", r->live_tokens, " tokens"));
  Settle(r);
  tcp::socket& socket = r->connection->stream.socket();
  ErrorCode ignored;
  if (record.fault == ClientFault::kDisconnect) {
    socket.set_option(asio::socket_base::linger(true, 0), ignored);  // close() sends a RST
    r->connection.reset();
    Complete(r);
    return;
  }
  socket.shutdown(tcp::socket::shutdown_send, ignored);  // FIN: nothing more is asked
  r->connection->stream.expires_at(std::min(r->deadline, Clock::now() + ToClock(kCancelDrain)));
  CancelDrain(r);
}

void HttpPhase::CancelDrain(Request* r) {
  r->connection->stream.async_read_some(asio::buffer(r->chunk),
                                        [this, r](const ErrorCode& ec, size_t) {
                                          if (!ec) {
                                            CancelDrain(r);
                                            return;
                                          }
                                          // The server closed its side (or the drain timed out):
                                          // the connection is done.
                                          r->connection.reset();
                                          Complete(r);
                                        });
}

void HttpPhase::Settle(Request* r) {
  RequestRecord& record = r->record;
  if (r->status != 0 && (r->status < 200 || r->status >= 300)) {
    // An HTTP error, even if its body was then cut short: the status says what happened.
    record.code = GrpcCodeForHttpStatus(r->status);
    record.code_label = HttpStatusLabel(r->status);
    record.error = r->error_body.empty() ? std::string(View(r->parser->get().reason()))
                                         : ErrorBodyMessage(r->error_body);
    if (record.error.empty()) record.error = absl::StrCat("HTTP ", r->status);
    return;
  }
  r->stream.Finish(&record, r->content_type.empty() ? "(none)" : r->content_type);
}

void HttpPhase::Complete(Request* r) {
  const Clock::time_point now = Clock::now();
  // The live counter took one token per chunk; the usage may have said otherwise.
  ledger_.AddOutputTokens(r->record.output_tokens - r->live_tokens);
  const bool failed = r->record.failed();
  Worker* const worker = r->worker;
  ledger_.Finish(std::move(r->record), now);
  delete r;
  // The replacement is in flight before this request stops counting, so nothing in flight
  // means nothing more will be issued. It runs on this worker, which keeps the connection.
  if (ledger_.config().concurrency > 0) {
    Schedule(worker, failed ? ledger_.config().failure_backoff : absl::ZeroDuration());
  }
  ledger_.Release();
}

}  // namespace

absl::StatusOr<PhaseResult> RunHttpPhase(const OpenAiTarget& target, const PhaseConfig& config,
                                         PromptSource& prompts, LiveCounters* live) {
  if (absl::Status valid = ValidatePhaseConfig(config); !valid.ok()) return valid;
  asio::io_context io;
  absl::StatusOr<tcp::resolver::results_type> endpoints = Resolve(io, target.url);
  if (!endpoints.ok()) return endpoints.status();
  HttpPhase phase(target, *std::move(endpoints), config, prompts, live);
  return phase.Run();
}

absl::Status ProbeHttpTarget(const HttpUrl& url, absl::Duration timeout) {
  asio::io_context io;
  absl::StatusOr<tcp::resolver::results_type> endpoints = Resolve(io, url);
  if (!endpoints.ok()) return endpoints.status();
  beast::tcp_stream stream(io);
  stream.expires_after(ToClock(timeout));
  ErrorCode result = asio::error::timed_out;
  stream.async_connect(*endpoints,
                       [&result](const ErrorCode& ec, const tcp::endpoint&) { result = ec; });
  io.run();
  if (result) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to ", url.ToString(), " within ", absl::FormatDuration(timeout), ": ",
        result == beast::error::timeout ? "timed out" : result.message()));
  }
  return absl::OkStatus();
}

}  // namespace kiln::loadgen
