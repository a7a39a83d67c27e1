#include "clients/loadgen/socket_channel.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/create_channel_posix.h"
#include "grpcpp/support/channel_arguments.h"

namespace kiln::loadgen {
namespace {

std::string Errno(int error) { return std::strerror(error); }

// A connected, non-blocking TCP socket to `address`, or why not.
absl::StatusOr<int> Connect(const sockaddr_storage& address, socklen_t length,
                            absl::Duration timeout) {
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", Errno(errno)));
  auto fail = [fd](const std::string& why) {
    ::close(fd);
    return absl::UnavailableError(why);
  };
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    if (errno != EINPROGRESS) return fail(absl::StrCat("connect: ", Errno(errno)));
    pollfd poll_fd = {fd, POLLOUT, 0};
    const int ready = ::poll(&poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout) + 1));
    if (ready == 0) return fail("connect: timed out");
    if (ready < 0) return fail(absl::StrCat("poll: ", Errno(errno)));
    int error = 0;
    socklen_t size = sizeof(error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) error = errno;
    if (error != 0) return fail(absl::StrCat("connect: ", Errno(error)));
  }
  const int one = 1;  // tokens are small writes: no Nagle delay, as gRPC's own sockets
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::StatusOr<SocketTarget> ResolveSocketTarget(const std::string& target) {
  auto bad = [&target](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", target, "': ", why, " (dropping connections needs a HOST:PORT target)"));
  };
  absl::string_view rest = target;
  if (absl::StartsWith(rest, "unix:") || absl::StartsWith(rest, "unix-abstract:")) {
    return bad("a unix socket");
  }
  if (!absl::ConsumePrefix(&rest, "dns:///")) {
    if (!absl::ConsumePrefix(&rest, "ipv4:")) absl::ConsumePrefix(&rest, "ipv6:");
  }
  std::string host;
  absl::string_view port;
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("an IPv6 host lacks its ']'");
    host = std::string(rest.substr(0, close));
    rest.remove_prefix(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return bad("no port");
    port = rest;
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return bad("no port");
    host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("write an IPv6 host in brackets");
  }
  int number = 0;
  if (host.empty() || !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return bad("not HOST:PORT");
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.c_str(), std::string(port).c_str(), &hints, &found);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
  }
  SocketTarget out;
  out.authority =
      absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", number);
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    sockaddr_storage address = {};
    std::memcpy(&address, a->ai_addr, a->ai_addrlen);
    out.addresses.push_back(address);
    out.lengths.push_back(a->ai_addrlen);
  }
  ::freeaddrinfo(found);
  if (out.addresses.empty()) return absl::UnavailableError(absl::StrCat("no address for ", host));
  return out;
}

absl::StatusOr<std::unique_ptr<DroppableChannel>> DroppableChannel::Open(const SocketTarget& target,
                                                                         absl::Duration timeout) {
  absl::Status last = absl::UnavailableError("no address");
  for (size_t i = 0; i < target.addresses.size(); ++i) {
    absl::StatusOr<int> fd = Connect(target.addresses[i], target.lengths[i], timeout);
    if (!fd.ok()) {
      last = fd.status();
      continue;
    }
    const int duplicate = ::fcntl(*fd, F_DUPFD_CLOEXEC, 0);
    if (duplicate < 0) {
      ::close(*fd);
      return absl::UnavailableError(absl::StrCat("dup: ", Errno(errno)));
    }
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(64 << 20);
    // gRPC owns *fd from here on.
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomInsecureChannelFromFd(target.authority, *fd, arguments);
    return std::unique_ptr<DroppableChannel>(new DroppableChannel(std::move(channel), duplicate));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", target.authority, ": ", last.message()));
}

DroppableChannel::~DroppableChannel() {
  if (fd_ >= 0) ::close(fd_);
}

void DroppableChannel::Drop() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

}  // namespace kiln::loadgen
