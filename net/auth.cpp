#include "net/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

namespace baton::auth {
namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

constexpr char kMagic[8] = {'B', 'A', 'T', 'N', 'A', 'U', 'T', 'H'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonce = 32;
constexpr size_t kHello = sizeof(kMagic) + 1 + kNonce;  // server -> client
constexpr size_t kReply = kHello + 32;                  // client -> server

std::string view(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

Digest proof(std::string_view token, const char* side, const uint8_t* first,
             const uint8_t* second) {
  return hmac_sha256(token, std::string("baton-auth-v1 ") + side + view(first, kNonce) +
                                view(second, kNonce));
}

void fill_random(uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("auth: getrandom failed: ") + std::strerror(errno));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

// Waits until `fd` is ready for `events` or the deadline passes (false).
bool wait_ready(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != std::chrono::steady_clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      ms = static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
  }
}

const char* env_value(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

std::string token_from_environment() {
  if (const char* t = env_value("BATON_CLUSTER_TOKEN")) {
    if (std::strlen(t) < kMinTokenBytes) {
      throw AuthError("BATON_CLUSTER_TOKEN has " + std::to_string(std::strlen(t)) +
                      " bytes; a cluster token needs at least " +
                      std::to_string(kMinTokenBytes) + " (make one with: head -c 32 /dev/urandom | xxd -p -c 64)");
    }
    return t;
  }
  if (const char* f = env_value("BATON_CLUSTER_TOKEN_FILE")) return read_token_file(f);
  return random_token();
}

// host (IPv4), [host] (IPv6) or null for another family; the port in `port`.
std::optional<std::string> format_address(const sockaddr_storage& ss, bool bracket_v6, int& port) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return std::string(host);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return bracket_v6 ? "[" + std::string(host) + "]" : std::string(host);
  }
  return std::nullopt;
}

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
         0x5be0cd19} {}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
           (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
           h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kRound[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  bytes_ += n;
  while (n > 0) {
    const size_t take = std::min(n, sizeof(buf_) - used_);
    std::memcpy(buf_ + used_, p, take);
    used_ += take;
    p += take;
    n -= take;
    if (used_ == sizeof(buf_)) {
      block(buf_);
      used_ = 0;
    }
  }
}

Digest Sha256::finish() {
  const uint64_t bits = bytes_ * 8;
  const uint8_t one = 0x80;
  update(&one, 1);
  const uint8_t zero = 0;
  while (used_ != 56) update(&zero, 1);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(length, 8);
  Digest out;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
  }
  return out;
}

Digest sha256(std::string_view data) {
  Sha256 s;
  s.update(data);
  return s.finish();
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  uint8_t k[64] = {};
  if (key.size() > sizeof(k)) {
    const Digest d = sha256(key);
    std::memcpy(k, d.data(), d.size());
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t pad[64];
  for (size_t i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad, 64);
  inner.update(message);
  const Digest ih = inner.finish();
  for (size_t i = 0; i < 64; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad, 64);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

bool constant_time_equal(const uint8_t* a, const uint8_t* b, size_t n) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

std::string to_hex(const uint8_t* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[data[i] >> 4];
    s[2 * i + 1] = kDigits[data[i] & 15];
  }
  return s;
}

std::string random_token() {
  uint8_t bytes[32];
  fill_random(bytes, sizeof(bytes));
  return to_hex(bytes, sizeof(bytes));
}

std::string read_token_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    throw AuthError("cluster token file " + path + " (BATON_CLUSTER_TOKEN_FILE): cannot open: " +
                    std::strerror(errno));
  }
  struct stat st {};
  std::string token;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = std::string("cannot stat: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = "not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    problem = "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
              std::to_string(::geteuid()) + ")";
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    problem = std::string("has mode ") + mode +
              ": others may read it; it must be readable by its owner only (chmod 600 " + path +
              ")";
  } else {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) problem = std::string("cannot read: ") + std::strerror(errno);
      if (n <= 0) break;
      token.append(buf, static_cast<size_t>(n));
      if (token.size() > (1u << 16)) {
        problem = "is larger than 64 KiB; a token is a short secret";
        break;
      }
    }
  }
  ::close(fd);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' ||
                            token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  if (problem.empty() && token.size() < kMinTokenBytes) {
    problem = "holds " + std::to_string(token.size()) + " bytes; a cluster token needs at least " +
              std::to_string(kMinTokenBytes);
  }
  if (!problem.empty()) {
    throw AuthError("cluster token file " + path + " (BATON_CLUSTER_TOKEN_FILE) " + problem);
  }
  return token;
}

std::string cluster_token() {
  static std::once_flag once;
  static std::string token;
  static std::string error;
  std::call_once(once, [] {
    try {
      token = token_from_environment();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw AuthError(error);
  return token;
}

bool token_configured() {
  return env_value("BATON_CLUSTER_TOKEN") != nullptr ||
         env_value("BATON_CLUSTER_TOKEN_FILE") != nullptr;
}

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  int port = 0;
  const std::optional<std::string> host = format_address(ss, true, port);
  return host ? *host + ":" + std::to_string(port) : "a local peer";
}

std::string socket_host(int fd, bool local) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  const int rc = local ? ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                       : ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  int port = 0;
  const std::optional<std::string> host = rc == 0 ? format_address(ss, false, port) : std::nullopt;
  return host.value_or("?");
}

namespace {

using AddrInfo = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;

// The TCP addresses of host:port (getaddrinfo with `flags`); null, with `why`,
// when the host does not resolve.
AddrInfo resolve_tcp(const std::string& host, uint16_t port, int flags, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) why = std::string("cannot resolve ") + host + ": " + ::gai_strerror(rc);
  return AddrInfo(rc == 0 ? found : nullptr, ::freeaddrinfo);
}

}  // namespace

int tcp_connect(const std::string& host, uint16_t port,
                std::chrono::steady_clock::time_point deadline, std::string& why) {
  const AddrInfo found = resolve_tcp(host, port, 0, why);
  if (!found) return -1;
  int fd = -1;
  for (addrinfo* a = found.get(); a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 1))) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      why = err != 0 ? std::strerror(err) : "connect timed out";
      ::close(fd);
      fd = -1;
    }
  }
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

int tcp_listen(const std::string& host, uint16_t port, uint16_t* bound_port, std::string& why) {
  const AddrInfo found = resolve_tcp(host, port, AI_PASSIVE, why);
  if (!found) return -1;
  why = "no address";
  int listen_fd = -1;
  for (addrinfo* a = found.get(); a != nullptr && listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  if (listen_fd < 0) return -1;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (bound_port != nullptr)
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return listen_fd;
}

std::pair<std::string, uint16_t> split_host_port(const std::string& endpoint,
                                                 const std::string& what) {
  const size_t colon = endpoint.rfind(':');
  long port = -1;
  if (colon != std::string::npos && colon + 1 < endpoint.size() && colon + 6 >= endpoint.size()) {
    port = 0;
    for (size_t i = colon + 1; i < endpoint.size() && port >= 0; ++i) {
      const char c = endpoint[i];
      port = (c >= '0' && c <= '9') ? port * 10 + (c - '0') : -1;
    }
  }
  std::string host = colon == std::string::npos ? "" : endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty() || port < 0 || port > 65535)
    throw Error(what + " '" + endpoint + "' is not host:port");
  return {host, static_cast<uint16_t>(port)};
}

bool wait_io(int fd, bool for_write, std::chrono::steady_clock::time_point deadline) {
  return wait_ready(fd, for_write ? POLLOUT : POLLIN, deadline);
}

bool read_exact(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return false;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return false;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      throw Error(std::string("recv: ") + std::strerror(errno));
    }
    if (!wait_ready(fd, POLLIN, deadline)) throw Error("timed out");
  }
  return true;
}

void write_all(int fd, const void* data, size_t n,
               std::chrono::steady_clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (put > 0) {
      p += put;
      n -= static_cast<size_t>(put);
      continue;
    }
    if (put < 0 && errno == EINTR) continue;
    if (put < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      throw Error(std::string("send: ") + std::strerror(errno));
    }
    if (!wait_ready(fd, POLLOUT, deadline)) throw Error("timed out");
  }
}

Moved Conn::read_some(void* data, size_t n) {
  Moved m;
  for (;;) {
    const ssize_t got = ::recv(fd_, data, n, MSG_DONTWAIT);
    if (got > 0) {
      m.bytes = static_cast<size_t>(got);
    } else if (got == 0 || errno == ECONNRESET) {
      m.closed = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      m.want = Want::kRead;
    } else {
      throw Error(std::string("recv: ") + std::strerror(errno));
    }
    return m;
  }
}

Moved Conn::write_some(const void* data, size_t n) {
  Moved m;
  for (;;) {
    const ssize_t put = ::send(fd_, data, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (put >= 0) {
      m.bytes = static_cast<size_t>(put);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      m.want = Want::kWrite;
    } else {
      throw Error(std::string("send: ") + std::strerror(errno));
    }
    return m;
  }
}

bool Conn::read_exact(void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  return auth::read_exact(fd_, data, n, deadline);
}

void Conn::write_all(const void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  auth::write_all(fd_, data, n, deadline);
}

ServerHandshake::ServerHandshake(std::string_view token, std::string who)
    : token_(token), who_(std::move(who)) {
  static_assert(sizeof(hello_) == kHello && sizeof(reply_) == kReply);
  std::memcpy(hello_, kMagic, sizeof(kMagic));
  hello_[sizeof(kMagic)] = kVersion;
  fill_random(hello_ + sizeof(kMagic) + 1, kNonce);
}

Want ServerHandshake::step(Conn& conn) {
  const auto wanted = [](const Moved& m, Want otherwise) {
    return m.want == Want::kNone ? otherwise : m.want;
  };
  try {
    while (sent_ < kHello) {
      const Moved m = conn.write_some(hello_ + sent_, kHello - sent_);
      if (m.bytes == 0) return wanted(m, Want::kWrite);
      sent_ += m.bytes;
    }
    while (got_ < kReply) {
      // The magic first: a client that speaks another protocol is told apart
      // from one with a wrong token.
      const size_t goal = got_ < sizeof(kMagic) + 1 ? sizeof(kMagic) + 1 : kReply;
      const Moved m = conn.read_some(reply_ + got_, goal - got_);
      if (m.closed) throw AuthError("connection from " + who_ + " closed during the handshake");
      if (m.bytes == 0) return wanted(m, Want::kRead);
      got_ += m.bytes;
      if (got_ != sizeof(kMagic) + 1) continue;
      if (std::memcmp(reply_, kMagic, sizeof(kMagic)) != 0) {
        throw AuthError("connection from " + who_ +
                        " rejected: not a baton client (it did not answer the handshake)");
      }
      if (reply_[sizeof(kMagic)] != kVersion) {
        throw AuthError("connection from " + who_ + " rejected: handshake version " +
                        std::to_string(reply_[sizeof(kMagic)]) + ", this build speaks " +
                        std::to_string(kVersion));
      }
    }
    if (!proven_) {
      const uint8_t* server_nonce = hello_ + sizeof(kMagic) + 1;
      const uint8_t* client_nonce = reply_ + sizeof(kMagic) + 1;
      const Digest expected = proof(token_, "client", server_nonce, client_nonce);
      if (!constant_time_equal(expected.data(), client_nonce + kNonce, expected.size())) {
        throw AuthError("connection from " + who_ + " rejected: wrong cluster token");
      }
      proof_ = proof(token_, "server", client_nonce, server_nonce);
      proven_ = true;
    }
    while (proof_sent_ < proof_.size()) {
      const Moved m = conn.write_some(proof_.data() + proof_sent_, proof_.size() - proof_sent_);
      if (m.bytes == 0) return wanted(m, Want::kWrite);
      proof_sent_ += m.bytes;
    }
    return Want::kNone;
  } catch (const AuthError&) {
    throw;
  } catch (const Error& e) {
    throw AuthError("connection from " + who_ + ": handshake " + e.what());
  }
}

void server_handshake(Conn& conn, std::string_view token, std::chrono::milliseconds deadline_ms) {
  const auto deadline = std::chrono::steady_clock::now() + deadline_ms;
  const std::string who = peer_address(conn.fd());
  ServerHandshake handshake(token, who);
  for (;;) {
    const Want want = handshake.step(conn);
    if (want == Want::kNone) return;
    if (!wait_io(conn.fd(), want == Want::kWrite, deadline)) {
      throw AuthError("connection from " + who + ": handshake timed out (deadline " +
                      std::to_string(deadline_ms.count()) + " ms)");
    }
  }
}

namespace {
constexpr char kDeny[8] = {'B', 'A', 'T', 'N', 'D', 'E', 'N', 'Y'};
}  // namespace

std::string refusal_frame(Refusal why) {
  std::string frame(kHello, '\0');
  std::memcpy(frame.data(), kDeny, sizeof(kDeny));
  frame[sizeof(kDeny)] = static_cast<char>(kVersion);
  frame[sizeof(kDeny) + 1] = static_cast<char>(why);
  return frame;
}

std::string refusal_text(Refusal why) {
  switch (why) {
    case Refusal::kBusy:
      return "busy: its limit of connections in their handshake is reached";
    case Refusal::kBusyFromAddress:
      return "busy: too many connections from this address are in their handshake";
    case Refusal::kTlsRequired:
      return "it requires TLS (set BATON_TLS_CA to the certificates that sign its certificate)";
  }
  return "refused (reason " + std::to_string(static_cast<int>(why)) + ")";
}

bool looks_like_refusal(const uint8_t* first, size_t n) {
  // Five bytes tell a refusal from a hello ("BATNA...").
  return n >= 5 && std::memcmp(first, kDeny, std::min(n, sizeof(kDeny))) == 0;
}

void throw_if_refused(const uint8_t* first, size_t n, const std::string& where) {
  if (n < sizeof(kDeny) + 2 || std::memcmp(first, kDeny, sizeof(kDeny)) != 0) return;
  const auto why = static_cast<Refusal>(first[sizeof(kDeny) + 1]);
  throw RefusedError(where + " refused the connection: " + refusal_text(why), why);
}

void client_handshake(Conn& conn, std::string_view token, std::chrono::milliseconds deadline_ms,
                      const std::string& where) {
  const auto deadline = std::chrono::steady_clock::now() + deadline_ms;
  uint8_t hello[kHello];
  uint8_t reply[kReply];
  Digest theirs;
  try {
    try {
      if (!conn.read_exact(hello, sizeof(hello), deadline)) {
        throw UnansweredError(where + " closed the connection before its handshake");
      }
    } catch (const AuthError&) {
      throw;
    } catch (const Error& e) {
      throw UnansweredError(where + ": no handshake: " + e.what() + " (deadline " +
                            std::to_string(deadline_ms.count()) + " ms)");
    }
    throw_if_refused(hello, sizeof(hello), where);
    if (std::memcmp(hello, kMagic, sizeof(kMagic)) != 0 || hello[sizeof(kMagic)] != kVersion) {
      throw AuthError(where + " is not a baton listener of this version (its first bytes are " +
                      to_hex(hello, sizeof(kMagic) + 1) + ")");
    }
    const uint8_t* server_nonce = hello + sizeof(kMagic) + 1;
    std::memcpy(reply, kMagic, sizeof(kMagic));
    reply[sizeof(kMagic)] = kVersion;
    uint8_t* client_nonce = reply + sizeof(kMagic) + 1;
    fill_random(client_nonce, kNonce);
    const Digest mine = proof(token, "client", server_nonce, client_nonce);
    std::memcpy(client_nonce + kNonce, mine.data(), mine.size());
    conn.write_all(reply, sizeof(reply), deadline);
    if (!conn.read_exact(theirs.data(), theirs.size(), deadline)) {
      throw AuthError(where +
                      " closed the connection: it rejected this process's cluster token (do the "
                      "driver and this process share BATON_CLUSTER_TOKEN?)");
    }
  } catch (const AuthError&) {
    throw;
  } catch (const Error& e) {
    throw AuthError(where + ": handshake " + e.what() + " (deadline " +
                    std::to_string(deadline_ms.count()) + " ms)");
  }
  const uint8_t* server_nonce = hello + sizeof(kMagic) + 1;
  const uint8_t* client_nonce = reply + sizeof(kMagic) + 1;
  const Digest expected = proof(token, "server", client_nonce, server_nonce);
  if (!constant_time_equal(expected.data(), theirs.data(), expected.size())) {
    throw AuthError(where + " did not prove that it holds the cluster token (another job's listener?)");
  }
}

}  // namespace baton::auth
