// HandshakeGate: the accept path of baton's TCP listeners (the rendezvous
// store, the driver's cluster listener). One thread, event-driven (poll):
// it accepts, runs each connection's TLS and cluster-token handshakes without
// blocking, and hands a connection to its owner only once the peer has proven
// the token. Until then a connection costs a socket and a few hundred bytes,
// never a thread.
//
// Limits, so that silent or slow connections cannot starve the workers:
//   - at most `max_pending` connections in their handshake at once, and at
//     most `max_pending_per_address` from one peer address; past either, a
//     connection is refused at once with a refusal frame that says why
//     (net/auth.h: a client retries those, net/dial.h);
//   - a handshake not done by `handshake_timeout` is dropped; over TLS, a
//     connection that has sent nothing for 1 s (or half the deadline) is told
//     "TLS required" (what a plain client, which waits for the server, needs
//     to hear; a TLS client speaks first, at once);
//   - when the process is out of file descriptors (EMFILE, ENFILE), accepting
//     pauses, 10 ms doubling to 500 ms, logged once per episode;
//   - refusals and failed handshakes are logged at most 10 lines a second,
//     with a count of those not shown.
//
// Example:
//   HandshakeGate gate(listen_fd, options, [](int fd, std::unique_ptr<auth::Conn> conn) {
//     std::thread(serve, fd, std::move(conn)).detach();  // proven peers only
//   });
//
// Thread safety: counts() from any thread. The callback runs on the gate's
// thread and must not block. Plain C++ (no LibTorch).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "net/auth.h"

namespace baton {

namespace tls {
class Context;
}  // namespace tls

// A log that writes at most `per_second` warning lines a second and counts
// the rest, reported with the next line shown.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(std::string prefix, int per_second = 10)
      : prefix_(std::move(prefix)), per_second_(per_second) {}
  void warn(const std::string& line);
  // Lines shown and not shown so far.
  uint64_t shown() const;
  uint64_t dropped() const;

 private:
  std::string prefix_;
  int per_second_;
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point window_{};
  int lines_ = 0;
  uint64_t shown_ = 0, dropped_ = 0, unreported_ = 0;
};

struct HandshakeGateOptions {
  // Names the listener in log lines ("rendezvous store", "cluster listener").
  std::string name;
  std::string token;
  // Every connection must complete a TLS 1.3 handshake first when set.
  std::shared_ptr<tls::Context> tls;
  std::chrono::milliseconds handshake_timeout{5000};
  int max_pending = 64;
  int max_pending_per_address = 32;
};

class HandshakeGate {
 public:
  // A proven connection: its socket (blocking again for plain TCP) and its
  // Conn; both the callee's from then on.
  using Proven = std::function<void(int fd, std::unique_ptr<auth::Conn> conn)>;

  // Takes the listening socket (closes it when gone) and starts the thread.
  HandshakeGate(int listen_fd, HandshakeGateOptions options, Proven proven);
  // Stops the thread; closes the listener and every connection in its handshake.
  ~HandshakeGate();
  HandshakeGate(const HandshakeGate&) = delete;
  HandshakeGate& operator=(const HandshakeGate&) = delete;

  struct Counts {
    uint64_t accepted = 0;       // connections accepted
    uint64_t authenticated = 0;  // ... that proved the token
    uint64_t rejected = 0;       // ... that failed (wrong token, garbage, silence)
    uint64_t refused = 0;        // refused at once: over a limit
    uint64_t accept_failures = 0;  // accept() failing for want of descriptors
    uint64_t pending = 0;        // in their handshake now
    uint64_t log_lines = 0;      // refusal/rejection lines logged
    uint64_t log_dropped = 0;    // ... and not logged (over the rate)
  };
  Counts counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
