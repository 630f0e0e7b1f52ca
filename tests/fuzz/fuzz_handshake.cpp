// Fuzzes the cluster-token handshake (net/auth.h) with whatever a peer may
// send: the input is written to one end of a socketpair, which is then shut
// down for writing, and the other end runs server_handshake (and, with the
// same bytes from a "server", client_handshake). Each must return or throw
// AuthError; nothing else may escape, and no input may pass (the fuzzer cannot
// know the HMAC over a fresh random nonce).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "net/auth.h"

namespace {

constexpr std::string_view kToken = "fuzz-cluster-token-0123456789abcdef";
constexpr std::chrono::milliseconds kDeadline{50};
// More than the handshake ever reads and less than a socket's buffer, so the
// write below never blocks.
constexpr size_t kMaxSent = 4096;

enum class Side { kServer, kClient };

// Whether the handshake accepted the peer.
bool handshake(Side side, const uint8_t* data, size_t size) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) __builtin_trap();
  const size_t n = std::min(size, kMaxSent);
  if (n > 0 && ::write(fds[1], data, n) != static_cast<ssize_t>(n)) __builtin_trap();
  ::shutdown(fds[1], SHUT_WR);
  bool accepted = false;
  try {
    if (side == Side::kServer) {
      baton::auth::server_handshake(fds[0], kToken, kDeadline);
    } else {
      baton::auth::client_handshake(fds[0], kToken, kDeadline, "the fuzzed server");
    }
    accepted = true;
  } catch (const baton::auth::AuthError&) {
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return accepted;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (handshake(Side::kServer, data, size)) __builtin_trap();
  if (handshake(Side::kClient, data, size)) __builtin_trap();
  return 0;
}
