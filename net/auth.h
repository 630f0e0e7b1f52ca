// Cluster authentication for baton's TCP listeners.
//
// One job's processes share a secret, the cluster token. A TCP connection is
// used only after a challenge-response handshake in which each side proves it
// holds the token without sending it: HMAC-SHA-256 over both sides' fresh
// random nonces, compared in constant time. A recorded handshake cannot be
// replayed (the server's nonce is new on every connection), and a client learns
// that it reached a holder of the token too.
//
//   server -> client  "BATNAUTH" 0x01 server_nonce[32]
//   client -> server  "BATNAUTH" 0x01 client_nonce[32]
//                     HMAC(token, "baton-auth-v1 client" server_nonce client_nonce)
//   server -> client  HMAC(token, "baton-auth-v1 server" client_nonce server_nonce)
//
// The server sends nothing after a wrong reply: it closes the connection. The
// handshake authenticates the peer; it does not encrypt or sign what follows
// (docs/architecture.md, "Network exposure").
//
// Where the token comes from (cluster_token()): BATON_CLUSTER_TOKEN (the token
// itself), else BATON_CLUSTER_TOKEN_FILE (a file that only its owner may read),
// else a random token made once per driver process; the driver hands the token
// to its workers in their environment.
//
// Plain C++ (no LibTorch): the parsers here are fuzzed on their own.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "base/errors.h"

namespace baton::auth {

using Digest = std::array<uint8_t, 32>;

// SHA-256 (FIPS 180-4), incrementally.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The digest of everything updated so far. REQUIRES: called once.
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t bytes_ = 0;
};

Digest sha256(std::string_view data);
// HMAC-SHA-256 (RFC 2104) of `message` under `key`.
Digest hmac_sha256(std::string_view key, std::string_view message);
// Whether a[0..n) == b[0..n), in time that depends on n only.
bool constant_time_equal(const uint8_t* a, const uint8_t* b, size_t n);
std::string to_hex(const uint8_t* data, size_t n);

// A connection that failed authentication (either side). what() says why and,
// where known, names the peer.
class AuthError : public Error {
 public:
  using Error::Error;
};

// The smallest token accepted, in bytes.
inline constexpr size_t kMinTokenBytes = 16;

// The job's token (see above), read once per process and cached. Throws
// AuthError naming the variable or file: a token shorter than kMinTokenBytes, a
// token file that others may read or that is not a regular file.
std::string cluster_token();
// Reads a token file: its bytes, trailing whitespace dropped. Throws AuthError
// naming the file and what is wrong (missing, a mode other than 0600/0400,
// another owner, too short).
std::string read_token_file(const std::string& path);
// 32 random bytes from the kernel, as 64 hex characters.
std::string random_token();

// Whether the environment names the token (BATON_CLUSTER_TOKEN or
// BATON_CLUSTER_TOKEN_FILE, non-empty) rather than leaving it to a random one.
bool token_configured();

// Which peer a log line or an error names, e.g. "127.0.0.1:41234".
std::string peer_address(int fd);
// The IP address of one end of a connected socket (`local`: this end), e.g.
// "10.0.0.3" or "fe80::1"; "?" when it has none.
std::string socket_host(int fd, bool local);

// A connected stream socket, as the handshake and the protocols behind it
// use it: plain TCP here, TLS when made by net/tls.h. Does not own the fd.
// One reader and one writer at a time.
// What a non-blocking step waits for next.
enum class Want { kNone, kRead, kWrite };

// What a non-blocking read or write moved: `bytes`; `closed` when the peer
// hung up (a read); when nothing moved, `want` says what to wait for.
struct Moved {
  size_t bytes = 0;
  bool closed = false;
  Want want = Want::kNone;
};

class Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {}
  virtual ~Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  int fd() const { return fd_; }
  // As read_exact and write_all below.
  virtual bool read_exact(void* data, size_t n, std::chrono::steady_clock::time_point deadline);
  virtual void write_all(const void* data, size_t n,
                         std::chrono::steady_clock::time_point deadline);
  // "tcp", or the TLS version ("TLSv1.3").
  virtual std::string protocol() const { return "tcp"; }
  // Non-blocking, for an event loop (net/handshake_gate.h): moves what it can
  // now. Throws Error on a socket or TLS error.
  virtual Moved read_some(void* data, size_t n);
  virtual Moved write_some(const void* data, size_t n);
  // One non-blocking step of a TLS server's handshake: Want::kNone once it is
  // done (at once for plain TCP). Throws AuthError when it fails.
  virtual Want handshake_step() { return Want::kNone; }

 protected:
  int fd_;
};

// Runs the server side on a connection. Returns when the client has proven it
// holds `token`; throws AuthError (the peer's address, what was wrong) when it
// has not, did not answer before `deadline`, or hung up. Never reads more
// than the handshake's bytes.
void server_handshake(Conn& conn, std::string_view token, std::chrono::milliseconds deadline);
inline void server_handshake(int fd, std::string_view token, std::chrono::milliseconds deadline) {
  Conn conn(fd);
  server_handshake(conn, token, deadline);
}

// The server side as a state machine, for an event loop: what
// server_handshake does, without blocking.
class ServerHandshake {
 public:
  // `who` names the peer in errors.
  ServerHandshake(std::string_view token, std::string who);
  // Advances on `conn` as far as it can now. Want::kNone once the client has
  // proven the token and this side's proof is sent; throws AuthError as
  // server_handshake does (not a baton client, wrong version or token, hung up).
  Want step(Conn& conn);
  // Whether the client has sent any byte yet.
  bool heard() const { return got_ > 0; }

 private:
  std::string token_, who_;
  uint8_t hello_[41];
  uint8_t reply_[73];
  Digest proof_{};
  size_t sent_ = 0, got_ = 0, proof_sent_ = 0;
  bool proven_ = false;
};

// Why a listener turned a connection away, sent in place of its hello:
// "BATNDENY", the version, the reason, zeros (as long as a hello).
enum class Refusal : uint8_t {
  kBusy = 1,             // too many connections in their handshake
  kBusyFromAddress = 2,  // too many from the peer's address
  kTlsRequired = 3,      // a TLS listener heard nothing: a plain client
};
std::string refusal_frame(Refusal why);
// What a refusal says, e.g. "busy: too many connections are in their handshake".
std::string refusal_text(Refusal why);

// A connection that the listener turned away (Refusal); retryable() for load.
class RefusedError : public AuthError {
 public:
  RefusedError(const std::string& what, Refusal why) : AuthError(what), why_(why) {}
  Refusal reason() const { return why_; }
  bool retryable() const { return why_ != Refusal::kTlsRequired; }

 private:
  Refusal why_;
};
// A listener that closed the connection, or did not answer, before its hello:
// stopping, overloaded, or not listening yet (a client may try again).
class UnansweredError : public AuthError {
 public:
  using AuthError::AuthError;
};
// Throws RefusedError naming `where` when the first `n` bytes a server sent are
// a refusal (n >= 10); returns otherwise.
void throw_if_refused(const uint8_t* first, size_t n, const std::string& where);
// Whether the first `n` bytes a server sent begin a refusal (false for n < 5:
// too few to tell it from a hello).
bool looks_like_refusal(const uint8_t* first, size_t n);

// The client side; `where` names the server in errors ("the rendezvous store
// at 10.0.0.1:29500"). Throws AuthError when the server is not a baton
// listener, did not prove it holds `token`, closed the connection (what a
// server does after a wrong token) or did not answer before `deadline`.
void client_handshake(Conn& conn, std::string_view token, std::chrono::milliseconds deadline,
                      const std::string& where);
inline void client_handshake(int fd, std::string_view token, std::chrono::milliseconds deadline,
                             const std::string& where) {
  Conn conn(fd);
  client_handshake(conn, token, deadline, where);
}

// I/O with a deadline on a stream socket (blocking or not), for the handshake
// and the protocols behind it. read_exact returns false when the peer closed
// the connection before `n` bytes. Both throw Error past the deadline ("timed
// out") and on a socket error; time_point::max() waits without end.
bool read_exact(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline);
void write_all(int fd, const void* data, size_t n,
               std::chrono::steady_clock::time_point deadline);
// Waits until `fd` is readable (or writable); false when the deadline passed.
bool wait_io(int fd, bool for_write, std::chrono::steady_clock::time_point deadline);

// A TCP connection to host:port (TCP_NODELAY, close-on-exec, non-blocking),
// or -1 with `why` set.
int tcp_connect(const std::string& host, uint16_t port,
                std::chrono::steady_clock::time_point deadline, std::string& why);
// A listening TCP socket on host:port (0: any free port; the port it got in
// `*bound_port`), or -1 with `why` set.
int tcp_listen(const std::string& host, uint16_t port, uint16_t* bound_port, std::string& why);
// "host:port" split at its last ':' (brackets around an IPv6 host dropped).
// Throws Error naming `what` when there is no port or it is not a number.
std::pair<std::string, uint16_t> split_host_port(const std::string& endpoint,
                                                 const std::string& what);

}  // namespace baton::auth
