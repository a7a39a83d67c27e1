// A blocking HTTP/1.1 client for tests (Boost.Beast): whole requests, server-sent-event
// streams, and raw sockets for what well-behaved clients never do (leave mid-stream, send
// garbage).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace kiln::http_test {

struct Response {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  std::string Header(const std::string& lower_case_name) const;
  nlohmann::ordered_json Json() const;  // the body parsed; null when it is not JSON
};

// One request on a new connection. `headers` are added as given.
absl::StatusOr<Response> Request(int port, const std::string& method, const std::string& target,
                                 const std::string& body = "",
                                 std::vector<std::pair<std::string, std::string>> headers = {},
                                 absl::Duration timeout = absl::Seconds(60));
inline absl::StatusOr<Response> Post(
    int port, const std::string& target, const nlohmann::ordered_json& body,
    std::vector<std::pair<std::string, std::string>> headers = {}) {
  return Request(port, "POST", target, body.dump(), std::move(headers));
}

// A streamed response's events: the `data:` payloads in order ("[DONE]" included).
std::vector<std::string> SseData(const std::string& body);

// A connection whose bytes the test writes and reads itself.
class RawConnection {
 public:
  static absl::StatusOr<RawConnection> Open(int port);
  RawConnection(RawConnection&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  RawConnection& operator=(RawConnection&&) = delete;
  ~RawConnection();

  bool Send(const std::string& bytes);
  // Reads until `needle` is in what was read (returns everything read so far), the peer closes
  // or the timeout passes.
  std::string ReadUntil(const std::string& needle, absl::Duration timeout = absl::Seconds(30));
  // Everything until the peer closes (or the timeout).
  std::string ReadAll(absl::Duration timeout = absl::Seconds(30));
  void Close();

 private:
  explicit RawConnection(int fd) : fd_(fd) {}
  int fd_ = -1;
  std::string pending_;
};

// "POST <target> HTTP/1.1" with a JSON body and Content-Length.
std::string PostBytes(const std::string& target, const std::string& body, bool keep_alive = true);

}  // namespace kiln::http_test
