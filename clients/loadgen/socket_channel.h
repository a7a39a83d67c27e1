// A gRPC channel over one TCP connection that kiln-loadgen opens itself, for a request whose
// connection it drops mid-stream on purpose (--disconnect-fraction). gRPC's asynchronous API has no
// way to close a channel's connection under a live call (destroying the Channel does not: the call
// holds it), so the runner makes the connection, hands gRPC the socket
// (CreateCustomInsecureChannelFromFd) and keeps a duplicate of the descriptor: Drop() shuts the
// socket down under gRPC. The server sees its peer's connection end with no RST_STREAM before it,
// as when a client crashes or its network goes; the call ends UNAVAILABLE on the client's side.
// Plain TCP only (no TLS).
#pragma once

#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"

namespace kiln::loadgen {

// The addresses of a gRPC target "HOST:PORT" (also "[V6]:PORT", "ipv4:", "ipv6:" and "dns:///"
// forms), resolved once.
struct SocketTarget {
  std::string authority;  // what the channel names as its target
  std::vector<sockaddr_storage> addresses;
  std::vector<socklen_t> lengths;
};

// InvalidArgument for a target that is not HOST:PORT (a unix: socket, say); Unavailable when the
// host does not resolve.
absl::StatusOr<SocketTarget> ResolveSocketTarget(const std::string& target);

class DroppableChannel {
 public:
  // Connects to the first address that accepts within `timeout`; Unavailable, saying why, when
  // none does.
  static absl::StatusOr<std::unique_ptr<DroppableChannel>> Open(const SocketTarget& target,
                                                                absl::Duration timeout);
  ~DroppableChannel();  // closes the duplicate; gRPC closes its own descriptor
  DroppableChannel(const DroppableChannel&) = delete;
  DroppableChannel& operator=(const DroppableChannel&) = delete;

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // Shuts the connection down in both directions (the peer gets a FIN; gRPC's reads end).
  void Drop();

 private:
  DroppableChannel(std::shared_ptr<grpc::Channel> channel, int fd)
      : channel_(std::move(channel)), fd_(fd) {}

  std::shared_ptr<grpc::Channel> channel_;
  int fd_ = -1;  // a duplicate of the descriptor gRPC owns
};

}  // namespace kiln::loadgen
