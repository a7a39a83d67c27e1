// An asynchronous HTTP/1.1 server (Boost.Beast on Boost.Asio) for the OpenAI API. A few I/O
// threads carry every connection: a streaming response is a queue of chunks on the connection's
// strand, not a blocked thread, so hundreds of concurrent server-sent-event streams cost memory,
// not threads. Handlers run on a small pool of their own (they tokenize and render templates),
// and answer through a ResponseStream that any thread may write to (an engine's callback, say).
// While a request is being answered the connection is watched: a client that goes away is
// reported to the request (OnDisconnect), so that its generation is cancelled.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln {

struct HttpRequest {
  std::string method;  // as sent: "GET", "POST", ...
  std::string path;    // the target without its query, e.g. "/v1/chat/completions"
  std::string query;   // after '?'; "" when there is none
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;

  // The first header of that (lower-case) name; "" when absent.
  absl::string_view Header(absl::string_view lower_case_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// One request's way back to its client. Thread-safe; bytes go out in call order. A request is
// answered either by one Respond, or by StartStream, any number of Write and one End. Calls
// after the answer is complete, or after the client went away, are ignored. A stream dropped
// without an answer answers 500.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  virtual void Respond(HttpResponse response) = 0;
  // The status line and headers now; the body follows in chunks (chunked transfer encoding).
  virtual void StartStream(int status, std::string content_type) = 0;
  virtual void Write(std::string data) = 0;  // empty data is skipped
  virtual void End() = 0;
  // `on_disconnect` runs once if the client goes away before the answer is complete, on an I/O
  // thread (keep it short), or at once if it already has. At most one callback; a second one
  // replaces the first.
  virtual void OnDisconnect(std::function<void()> on_disconnect) = 0;
};

using HttpHandler =
    std::function<void(HttpRequest request, std::shared_ptr<ResponseStream> response)>;

struct HttpServerOptions {
  int io_threads = 2;       // run every socket
  int handler_threads = 2;  // run the handler of each request
  size_t max_body_bytes = size_t{32} << 20;
  size_t max_header_bytes = size_t{64} << 10;
  // A connection that sends no (complete) request header for this long is closed; so is one
  // whose client does not take a response's bytes for this long.
  absl::Duration idle_timeout = absl::Seconds(60);
  // A request whose body has not fully arrived this long after its header is answered 408 and
  // its connection closed, so that a slow client cannot hold a connection's reader.
  absl::Duration read_timeout = absl::Seconds(30);
  // What sets max_body_bytes and read_timeout ("--max-request-bytes"), named in the 413 and 408
  // answers; empty: nothing is named.
  std::string max_body_setting;
  std::string read_timeout_setting;
  int max_connections = 8192;  // more are closed as soon as they are accepted
};

class HttpServer {
 public:
  // `listen`: HOST:PORT with a numeric IPv4 host, [IPv6] or "localhost"; port 0 picks a free
  // one. InvalidArgument for a malformed address, Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           HttpHandler handler,
                                                           HttpServerOptions options = {});
  ~HttpServer();  // Shutdown(zero grace)
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  const std::string& address() const;  // HOST:PORT with the bound port
  int open_connections() const;
  int active_requests() const;  // read and not yet completely answered

  // New connections are refused; idle keep-alive connections are closed, and those answering
  // close once their answer is complete.
  void StopAccepting();
  // StopAccepting, then up to `grace` for the answers in progress to complete, then every
  // connection is closed and the threads are joined. Idempotent.
  void Shutdown(absl::Duration grace);

  struct Core;  // shared with the connections, which may outlive the server object

 private:
  HttpServer() = default;
  std::shared_ptr<Core> core_;
  int port_ = 0;
  std::string address_;
};

}  // namespace kiln
