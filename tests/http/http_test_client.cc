#include "tests/http/http_test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace kiln::http_test {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;

std::string Response::Header(const std::string& lower_case_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_case_name) return value;
  }
  return "";
}

nlohmann::ordered_json Response::Json() const {
  nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(body, nullptr, false);
  return parsed.is_discarded() ? nlohmann::ordered_json() : parsed;
}

absl::StatusOr<Response> Request(int port, const std::string& method, const std::string& target,
                                 const std::string& body,
                                 std::vector<std::pair<std::string, std::string>> headers,
                                 absl::Duration timeout) {
  net::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code error;
  stream.expires_after(absl::ToChronoNanoseconds(timeout));
  stream.connect(
      net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)),
      error);
  if (error) return absl::UnavailableError(absl::StrCat("connect: ", error.message()));
  http::request<http::string_body> request{http::string_to_verb(method), target, 11};
  request.set(http::field::host, absl::StrCat("127.0.0.1:", port));
  if (!body.empty()) request.set(http::field::content_type, "application/json");
  for (const auto& [name, value] : headers) request.set(name, value);
  request.body() = body;
  request.prepare_payload();
  http::write(stream, request, error);
  if (error) return absl::UnavailableError(absl::StrCat("write: ", error.message()));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(size_t{1} << 30);
  http::read(stream, buffer, parser, error);
  if (error) return absl::UnavailableError(absl::StrCat("read: ", error.message()));
  const auto& message = parser.get();
  Response response;
  response.status = static_cast<int>(message.result_int());
  for (const auto& field : message) {
    response.headers.emplace_back(absl::AsciiStrToLower(std::string(field.name_string())),
                                  std::string(field.value()));
  }
  response.body = message.body();
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, error);
  return response;
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> data;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    for (absl::string_view line : absl::StrSplit(event, '\n')) {
      if (absl::ConsumePrefix(&line, "data: ")) data.emplace_back(line);
    }
  }
  return data;
}

absl::StatusOr<RawConnection> RawConnection::Open(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return absl::UnavailableError("connect");
  }
  return RawConnection(fd);
}

RawConnection::~RawConnection() { Close(); }

void RawConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool RawConnection::Send(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string RawConnection::ReadUntil(const std::string& needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (needle.empty() || !absl::StrContains(pending_, needle)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd poll_fd = {fd_, POLLIN, 0};
    if (poll(&poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) break;
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    pending_.append(buffer, static_cast<size_t>(n));
  }
  return pending_;
}

std::string RawConnection::ReadAll(absl::Duration timeout) { return ReadUntil("", timeout); }

std::string PostBytes(const std::string& target, const std::string& body, bool keep_alive) {
  return absl::StrCat(
      "POST ", target, " HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n",
      keep_alive ? "" : "Connection: close\r\n", "Content-Length: ", body.size(), "\r\n\r\n", body);
}

}  // namespace kiln::http_test
