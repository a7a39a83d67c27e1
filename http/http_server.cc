#include "http/http_server.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/thread_pool.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace kiln {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = boost::asio::ip::tcp;

absl::string_view HttpRequest::Header(absl::string_view lower_case_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_case_name) return value;
  }
  return {};
}

class HttpSession;

struct HttpServer::Core {
  explicit Core(HttpHandler handler_in, HttpServerOptions options_in)
      : options(options_in),
        handler(std::move(handler_in)),
        handler_pool(static_cast<size_t>(std::max(1, options.handler_threads))),
        acceptor(net::make_strand(io)) {}

  // Queues `work` on `executor` unless the server has stopped: then nothing runs it, and
  // nothing must be left queued (a queued handler owning a connection would keep it alive).
  template <typename Executor, typename Work>
  bool Post(const Executor& executor, Work&& work) {
    std::lock_guard<std::mutex> lock(post_mutex);
    if (stopped) return false;
    net::post(executor, std::forward<Work>(work));
    return true;
  }

  void Register(const std::shared_ptr<HttpSession>& session) {
    std::lock_guard<std::mutex> lock(sessions_mutex);
    std::erase_if(sessions, [](const std::weak_ptr<HttpSession>& s) { return s.expired(); });
    sessions.push_back(session);
  }
  std::vector<std::shared_ptr<HttpSession>> Sessions() {
    std::lock_guard<std::mutex> lock(sessions_mutex);
    std::vector<std::shared_ptr<HttpSession>> out;
    for (const std::weak_ptr<HttpSession>& weak : sessions) {
      if (std::shared_ptr<HttpSession> session = weak.lock()) out.push_back(std::move(session));
    }
    return out;
  }

  const HttpServerOptions options;
  const HttpHandler handler;
  net::io_context io;
  net::thread_pool handler_pool;
  tcp::acceptor acceptor;  // on a strand of its own: accepts and the close do not race
  std::vector<std::thread> io_threads;
  std::atomic<int> open_connections{0};
  std::atomic<int> active_requests{0};
  std::atomic<bool> accepting{true};

  std::mutex post_mutex;
  bool stopped = false;  // guarded by post_mutex

  std::mutex sessions_mutex;
  std::vector<std::weak_ptr<HttpSession>> sessions;  // guarded by sessions_mutex

  std::mutex shutdown_mutex;
  bool shut_down = false;  // guarded by shutdown_mutex
};

namespace {

std::string StatusLine(int status) {
  const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  return absl::StrCat("HTTP/1.1 ", status, " ",
                      reason.empty() ? "Unknown" : std::string(reason.data(), reason.size()),
                      "\r\n");
}

}  // namespace

// One request's answer: forwards to its connection's strand. It holds the connection; the
// connection only observes it, so that an exchange every holder dropped is destroyed (and then
// answers for the handler that forgot to).
class HttpExchange final : public ResponseStream {
 public:
  HttpExchange(std::shared_ptr<HttpServer::Core> core, std::shared_ptr<HttpSession> session)
      : core_(std::move(core)), session_(std::move(session)) {}
  ~HttpExchange() override;

  void Respond(HttpResponse response) override;
  void StartStream(int status, std::string content_type) override;
  void Write(std::string data) override;
  void End() override;
  void OnDisconnect(std::function<void()> on_disconnect) override;

  // From the connection (on its strand).
  void ClientGone();

 private:
  enum class Phase { kNew, kStreaming, kDone };

  const std::shared_ptr<HttpServer::Core> core_;
  const std::shared_ptr<HttpSession> session_;
  std::mutex mutex_;
  Phase phase_ = Phase::kNew;            // guarded by mutex_
  bool gone_ = false;                    // guarded by mutex_
  std::function<void()> on_disconnect_;  // guarded by mutex_
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(std::shared_ptr<HttpServer::Core> core, tcp::socket socket)
      : core_(std::move(core)), stream_(std::move(socket)), body_timer_(stream_.get_executor()) {
    core_->open_connections.fetch_add(1);
  }
  ~HttpSession() {
    if (!closed_) core_->open_connections.fetch_sub(1);
  }

  auto executor() { return stream_.get_executor(); }

  void Start() {
    core_->Post(executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }

  // On the strand: bytes of the current answer; `last` completes it.
  void Queue(std::string bytes, bool last) {
    if (closed_ || !answering_) return;
    if (!bytes.empty()) pending_.push_back(std::move(bytes));
    if (last) answer_complete_ = true;
    Flush();
  }

  // On the strand: what the exchange knows about the request (keep-alive, HTTP/1.0).
  bool keep_alive() const { return keep_alive_; }
  bool http10() const { return http10_; }

  // On the strand: the server stops. Idle connections close now, answering ones after their
  // answer; `force` closes every one.
  void OnShutdown(bool force) {
    keep_alive_ = false;
    if (force || !answering_) Close();
  }

 private:
  void ReadHeader() {
    if (closed_) return;
    if (!core_->accepting.load()) return Close();
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(core_->options.max_header_bytes));
    parser_->body_limit(core_->options.max_body_bytes);
    stream_.expires_after(absl::ToChronoNanoseconds(core_->options.idle_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnHeader(error); });
  }

  void OnHeader(beast::error_code error) {
    if (error) return OnReadError(error);
    const auto& header = parser_->get();
    if (beast::iequals(header[http::field::expect], "100-continue")) {
      // curl sends larger bodies only after this (or after waiting a second for it).
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      net::async_write(stream_, net::buffer(*interim),
                       [self = shared_from_this(), interim](beast::error_code write_error, size_t) {
                         if (write_error) return self->Close();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  // The body has read_timeout from the end of the header; a client that stalls past it is
  // answered 408 (beast's own timeout would close the socket before an answer could go out).
  void ReadBody() {
    stream_.expires_never();
    body_timer_.expires_after(absl::ToChronoNanoseconds(core_->options.read_timeout));
    body_timer_.async_wait([self = shared_from_this()](beast::error_code error) {
      if (error || self->closed_ || self->parser_ == std::nullopt) return;
      self->body_timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code error, size_t) {
                       self->body_timer_.cancel();
                       self->OnRequest(error);
                     });
  }

  void OnReadError(beast::error_code error) {
    if (std::exchange(body_timed_out_, false)) {
      return AnswerAndClose(
          408, absl::StrCat("the request body did not arrive within this server's read timeout of ",
                            absl::FormatDuration(core_->options.read_timeout),
                            Setting(core_->options.read_timeout_setting)));
    }
    if (error == http::error::end_of_stream || error == net::error::eof ||
        error == beast::error::timeout || error == net::error::operation_aborted ||
        error == net::error::connection_reset) {
      return Close();
    }
    // A malformed or oversized request gets an answer before the connection closes.
    const bool too_large = error == http::error::body_limit || error == http::error::header_limit;
    std::string message =
        too_large ? absl::StrCat(
                        "the request is larger than this server accepts (",
                        error == http::error::body_limit
                            ? absl::StrCat(core_->options.max_body_bytes, "-byte body limit",
                                           Setting(core_->options.max_body_setting))
                            : absl::StrCat(core_->options.max_header_bytes, "-byte header limit"),
                        ")")
                  : absl::StrCat("malformed HTTP request: ", error.message());
    AnswerAndClose(too_large ? 413 : 400, message);
  }

  static std::string Setting(const std::string& name) {
    return name.empty() ? "" : absl::StrCat(", ", name);
  }

  // An error answer to a request that could not be read; the connection closes after it.
  void AnswerAndClose(int status, const std::string& message) {
    std::string body =
        absl::StrCat(R"({"error":{"message":")", message,
                     R"(","type":"invalid_request_error","param":null,"code":)", status, "}}");
    std::string bytes =
        absl::StrCat(StatusLine(status), "Server: kiln\r\nContent-Type: application/json\r\n",
                     "Content-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
    keep_alive_ = false;
    answering_ = true;
    core_->active_requests.fetch_add(1);
    Queue(std::move(bytes), /*last=*/true);
  }

  void OnRequest(beast::error_code error) {
    if (error) return OnReadError(error);
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    stream_.expires_never();  // an answer may take minutes; the watch notices a departed client
    HttpRequest request;
    request.method = std::string(message.method_string());
    const std::string target(message.target());
    const size_t question = target.find('?');
    request.path = target.substr(0, question);
    if (question != std::string::npos) request.query = target.substr(question + 1);
    for (const auto& field : message) {
      request.headers.emplace_back(absl::AsciiStrToLower(std::string(field.name_string())),
                                   std::string(field.value()));
    }
    request.body = std::move(message.body());
    keep_alive_ = message.keep_alive() && core_->accepting.load();
    http10_ = message.version() < 11;

    answering_ = true;
    answer_complete_ = false;
    core_->active_requests.fetch_add(1);
    auto exchange = std::make_shared<HttpExchange>(core_, shared_from_this());
    exchange_ = exchange;
    Watch();
    std::shared_ptr<ResponseStream> response = std::move(exchange);
    core_->Post(core_->handler_pool.get_executor(),
                [core = core_, request = std::move(request), response]() mutable {
                  try {
                    core->handler(std::move(request), std::move(response));
                  } catch (const std::exception& e) {
                    LOG(ERROR) << "HTTP handler threw: " << e.what();
                  } catch (...) {
                    LOG(ERROR) << "HTTP handler threw";
                  }
                });
  }

  // While answering, a read notices the client going away (EOF or a reset). Bytes that arrive
  // meanwhile (a pipelined request) stay in the buffer for the next read.
  void Watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code error, size_t bytes) {
                              self->OnWatch(error, bytes);
                            });
  }

  void OnWatch(beast::error_code error, size_t bytes) {
    watching_ = false;
    if (closed_) return;
    const bool resume = std::exchange(resume_after_watch_, false);
    if (error == net::error::operation_aborted && resume) return ReadHeader();
    if (error) return Close();
    buffer_.commit(bytes);
    if (buffer_.size() > core_->options.max_header_bytes + core_->options.max_body_bytes) {
      return Close();
    }
    if (answering_) return Watch();
    ReadHeader();
  }

  void Flush() {
    if (writing_ || closed_) return;
    if (pending_.empty()) {
      if (answer_complete_) Completed();
      return;
    }
    writing_ = true;
    outgoing_.clear();
    for (std::string& piece : pending_) outgoing_ += piece;
    pending_.clear();
    // A client that stops reading must not hold the connection (and its queue) forever.
    stream_.expires_after(absl::ToChronoNanoseconds(core_->options.idle_timeout));
    net::async_write(stream_, net::buffer(outgoing_),
                     [self = shared_from_this()](beast::error_code error, size_t) {
                       self->writing_ = false;
                       if (self->closed_) return;
                       self->stream_.expires_never();
                       if (error) return self->Close();
                       self->Flush();
                     });
  }

  // The answer is out: the next request, or the end of the connection.
  void Completed() {
    answering_ = false;
    answer_complete_ = false;
    exchange_.reset();
    core_->active_requests.fetch_sub(1);
    if (!keep_alive_ || !core_->accepting.load()) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      return Close();
    }
    if (watching_) {
      resume_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    ReadHeader();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    core_->open_connections.fetch_sub(1);  // an exchange may keep this object for a while
    if (answering_) {
      answering_ = false;
      core_->active_requests.fetch_sub(1);
    }
    if (std::shared_ptr<HttpExchange> exchange = exchange_.lock()) exchange->ClientGone();
    exchange_.reset();
    pending_.clear();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  const std::shared_ptr<HttpServer::Core> core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::weak_ptr<HttpExchange> exchange_;  // the request being answered
  std::deque<std::string> pending_;
  std::string outgoing_;
  bool closed_ = false;
  bool answering_ = false;
  bool answer_complete_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool keep_alive_ = true;
  bool http10_ = false;
  net::steady_timer body_timer_;
  bool body_timed_out_ = false;
};

HttpExchange::~HttpExchange() {
  // mutex_ is not needed: no one else holds this object any more.
  if (phase_ == Phase::kDone || gone_) return;
  if (phase_ == Phase::kStreaming) {
    LOG(ERROR) << "HTTP stream dropped without End; ending it";
    core_->Post(session_->executor(), [session = session_] {
      session->Queue(session->http10() ? std::string() : std::string("0\r\n\r\n"), true);
    });
    return;
  }
  // Dropped without an answer (a handler bug): the client still gets one, and the connection
  // its next request.
  LOG(ERROR) << "HTTP request dropped without an answer; answering 500";
  const std::string body =
      R"({"error":{"message":"the server dropped this request without an answer","type":"server_error","param":null,"code":500}})";
  std::string bytes =
      absl::StrCat(StatusLine(500), "Server: kiln\r\nContent-Type: application/json\r\n",
                   "Content-Length: ", body.size(), "\r\n\r\n", body);
  core_->Post(session_->executor(), [session = session_, bytes = std::move(bytes)]() mutable {
    session->Queue(std::move(bytes), true);
  });
}

void HttpExchange::Respond(HttpResponse response) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ != Phase::kNew || gone_) return;
    phase_ = Phase::kDone;
  }
  // keep_alive() is read on the strand; a Connection header is decided there too.
  core_->Post(session_->executor(), [session = session_, response = std::move(response)] {
    http::response<http::string_body> message{static_cast<http::status>(response.status),
                                              session->http10() ? 10 : 11};
    message.set(http::field::server, "kiln");
    message.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) message.set(name, value);
    message.body() = response.body;
    message.keep_alive(session->keep_alive());
    message.prepare_payload();
    std::ostringstream out;
    out << message;
    session->Queue(out.str(), /*last=*/true);
  });
}

void HttpExchange::StartStream(int status, std::string content_type) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ != Phase::kNew || gone_) return;
    phase_ = Phase::kStreaming;
  }
  core_->Post(session_->executor(),
              [session = session_, status, content_type = std::move(content_type)] {
                std::string head =
                    absl::StrCat(StatusLine(status), "Server: kiln\r\nContent-Type: ", content_type,
                                 "\r\nCache-Control: no-cache\r\n");
                // HTTP/1.0 has no chunked encoding: the body ends when the connection closes.
                if (session->http10()) {
                  absl::StrAppend(&head, "Connection: close\r\n\r\n");
                } else {
                  absl::StrAppend(&head, "Transfer-Encoding: chunked\r\n",
                                  session->keep_alive() ? "" : "Connection: close\r\n", "\r\n");
                }
                session->Queue(std::move(head), false);
              });
}

void HttpExchange::Write(std::string data) {
  if (data.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ != Phase::kStreaming || gone_) return;
  }
  core_->Post(session_->executor(), [session = session_, data = std::move(data)]() mutable {
    if (session->http10()) return session->Queue(std::move(data), false);
    session->Queue(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"), false);
  });
}

void HttpExchange::End() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ != Phase::kStreaming || gone_) return;
    phase_ = Phase::kDone;
  }
  core_->Post(session_->executor(), [session = session_] {
    if (session->http10()) session->OnShutdown(false);  // the close ends the body
    session->Queue(session->http10() ? std::string() : std::string("0\r\n\r\n"), true);
  });
}

void HttpExchange::OnDisconnect(std::function<void()> on_disconnect) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!gone_) {
      on_disconnect_ = std::move(on_disconnect);
      return;
    }
  }
  on_disconnect();
}

void HttpExchange::ClientGone() {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gone_ || phase_ == Phase::kDone) {
      gone_ = true;
      return;
    }
    gone_ = true;
    callback = std::move(on_disconnect_);
  }
  if (callback) callback();
}

namespace {

void Accept(const std::shared_ptr<HttpServer::Core>& core) {
  core->acceptor.async_accept(
      net::make_strand(core->io), [core](beast::error_code error, tcp::socket socket) {
        if (error == net::error::operation_aborted || !core->acceptor.is_open()) return;
        if (!error) {
          if (!core->accepting.load() ||
              core->open_connections.load() >= core->options.max_connections) {
            beast::error_code ignored;
            socket.close(ignored);
          } else {
            // Each streamed token is a small write: without this, Nagle's algorithm holds it
            // back until the client's delayed ACK, bunching tokens and inflating TTFT.
            beast::error_code ignored;
            socket.set_option(tcp::no_delay(true), ignored);
            auto session = std::make_shared<HttpSession>(core, std::move(socket));
            core->Register(session);
            session->Start();
          }
        } else {
          VLOG(1) << "HTTP accept: " << error.message();
        }
        Accept(core);
      });
}

absl::StatusOr<tcp::endpoint> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "' is not HOST:PORT"));
  }
  std::string host = listen.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", listen, "': bad port"));
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") host = "127.0.0.1";
  beast::error_code error;
  const net::ip::address address = net::ip::make_address(host, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", listen, "': the host must be a numeric address or localhost"));
  }
  return tcp::endpoint(address, static_cast<unsigned short>(port));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              HttpHandler handler,
                                                              HttpServerOptions options) {
  absl::StatusOr<tcp::endpoint> endpoint = ParseListen(listen);
  if (!endpoint.ok()) return endpoint.status();
  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  server->core_ = std::make_shared<Core>(std::move(handler), options);
  Core& core = *server->core_;
  beast::error_code error;
  core.acceptor.open(endpoint->protocol(), error);
  if (!error) core.acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) core.acceptor.bind(*endpoint, error);
  if (!error) core.acceptor.listen(net::socket_base::max_listen_connections, error);
  if (error) {
    core.handler_pool.join();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ", error.message()));
  }
  server->port_ = core.acceptor.local_endpoint().port();
  server->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", server->port_);
  Accept(server->core_);
  for (int i = 0; i < std::max(1, options.io_threads); ++i) {
    core.io_threads.emplace_back([&core] { core.io.run(); });
  }
  return server;
}

int HttpServer::port() const { return port_; }
const std::string& HttpServer::address() const { return address_; }
int HttpServer::open_connections() const { return core_->open_connections.load(); }
int HttpServer::active_requests() const { return core_->active_requests.load(); }

void HttpServer::StopAccepting() {
  if (!core_->accepting.exchange(false)) return;
  net::post(core_->acceptor.get_executor(), [core = core_] {
    beast::error_code ignored;
    core->acceptor.close(ignored);
  });
  for (const std::shared_ptr<HttpSession>& session : core_->Sessions()) {
    core_->Post(session->executor(), [session] { session->OnShutdown(false); });
  }
}

void HttpServer::Shutdown(absl::Duration grace) {
  {
    std::lock_guard<std::mutex> lock(core_->shutdown_mutex);
    if (core_->shut_down) return;
    core_->shut_down = true;
  }
  StopAccepting();
  const absl::Time deadline = absl::Now() + grace;
  while (core_->active_requests.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (const std::shared_ptr<HttpSession>& session : core_->Sessions()) {
    core_->Post(session->executor(), [session] { session->OnShutdown(true); });
  }
  // Let the closes run, then stop: from here on nothing is queued, and what was is run below.
  const absl::Time close_deadline = absl::Now() + absl::Seconds(2);
  while (core_->open_connections.load() > 0 && absl::Now() < close_deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  {
    std::lock_guard<std::mutex> lock(core_->post_mutex);
    core_->stopped = true;
  }
  core_->handler_pool.join();
  core_->io.stop();
  for (std::thread& thread : core_->io_threads) thread.join();
  core_->io_threads.clear();
  // Handlers still queued hold connections, which hold the core: run them (their sockets are
  // closed) so that nothing is left to keep the cycle.
  core_->io.restart();
  core_->io.poll();
}

HttpServer::~HttpServer() {
  if (core_ != nullptr) Shutdown(absl::ZeroDuration());
}

}  // namespace kiln
