// dial: a client's connection to a baton listener (the rendezvous store, the
// driver's cluster listener), authenticated, retried while the listener is
// busy or not there yet.
//
// Example:
//   auth::DialOptions o;
//   o.token = token;
//   o.where = "the rendezvous store at 10.0.0.1:29500";
//   int fd = -1;
//   auto conn = auth::dial("10.0.0.1", 29500, Clock::now() + 30s, o, &fd);
//
// Plain C++ (no LibTorch).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "net/auth.h"

namespace baton::tls {
class Context;
}  // namespace baton::tls

namespace baton::auth {

struct DialOptions {
  std::string token;
  // Names the listener in errors: "the rendezvous store at 10.0.0.1:29500".
  std::string where;
  // For each try's TLS and token handshakes.
  std::chrono::milliseconds handshake_timeout{5000};
  // Over TLS when set (the server's certificate must name the host).
  std::shared_ptr<tls::Context> tls;
};

// Connects to host:port and runs the client handshake. Tries again, after a
// jittered exponential back-off (50 ms doubling to 2 s, times 0.5 to 1.5),
// while the listener cannot be reached, refuses for load
// (RefusedError::retryable) or closes or stays silent before its hello
// (UnansweredError), until `deadline`; then throws the last error, with how
// many tries it made. A wrong token, a refusal that is not for load (TLS
// required) or a failed TLS handshake throw at once. The socket in `*fd_out`
// is the caller's to close, after the Conn is gone.
std::unique_ptr<Conn> dial(const std::string& host, uint16_t port,
                           std::chrono::steady_clock::time_point deadline,
                           const DialOptions& options, int* fd_out);

}  // namespace baton::auth
