// What the driver's side of a cluster (cluster.cpp) and the node agent
// (agent.cpp) share: the protocol's version and deadlines, and the socket
// helpers both ends use on their control connections. Internal: not installed.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "net/auth.h"
#include "runtime/cluster/relay.h"

namespace baton::agent_protocol {

using Clock = std::chrono::steady_clock;
inline constexpr uint32_t kAgentProtocol = 1;
inline constexpr auto kHandshakeTimeout = std::chrono::seconds(5);
inline constexpr auto kWriteTimeout = std::chrono::seconds(30);

inline std::string errno_text() { return std::strerror(errno); }

// Notices a peer that vanished without closing (its machine down, the
// network cut) within about 20 s, where TCP alone would wait for hours.
inline void keep_alive(int fd) {
  const int on = 1, idle = 5, interval = 5, count = 3;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

inline capnp::ReaderOptions reader_options() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = relay::kMaxControlBytes / sizeof(capnp::word);
  o.nestingLimit = 16;
  return o;
}

// A control message the peer must take within kWriteTimeout.
inline void write_with_deadline(auth::Conn& conn, capnp::MessageBuilder& builder) {
  relay::write_message(conn, builder, Clock::now() + kWriteTimeout);
}

inline void write_fully(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return;  // the reader is gone: the output has nowhere to go
    p += put;
    n -= static_cast<size_t>(put);
  }
}

inline void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace baton::agent_protocol
