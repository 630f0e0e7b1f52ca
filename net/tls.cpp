#include "net/tls.h"

#include <cstdlib>
#include <map>
#include <mutex>

#if defined(BATON_HAVE_TLS)
#include <fcntl.h>
#include <openssl/err.h>
#include <sys/socket.h>
#include <openssl/ssl.h>
#endif

namespace baton::tls {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// One context per file set, made on first use.
template <typename Make>
std::shared_ptr<Context> cached(const std::string& key, Make make) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Context>> made;
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find(key);
  if (it == made.end()) it = made.emplace(key, make()).first;
  return it->second;
}

}  // namespace

#if defined(BATON_HAVE_TLS)

namespace {

std::string openssl_reason() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no reason given" : out;
}

class TlsConn : public auth::Conn {
 public:
  // `accepting`: a server whose handshake handshake_step() drives; `what`
  // names the peer in its errors.
  TlsConn(int fd, SSL* ssl, bool accepting = false, std::string what = {})
      : Conn(fd), ssl_(ssl), accepting_(accepting), what_(std::move(what)) {}
  ~TlsConn() override { SSL_free(ssl_); }

  auth::Want handshake_step() override {
    if (!accepting_) return auth::Want::kNone;
    const int r = SSL_accept(ssl_);
    if (r == 1) {
      accepting_ = false;
      return auth::Want::kNone;
    }
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) return auth::Want::kRead;
    if (e == SSL_ERROR_WANT_WRITE) return auth::Want::kWrite;
    throw auth::AuthError(what_ + ": TLS handshake failed: " + openssl_reason());
  }

  auth::Moved read_some(void* data, size_t n) override {
    auth::Moved m;
    const int got = SSL_read(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    if (got > 0) {
      m.bytes = static_cast<size_t>(got);
      return m;
    }
    const int e = SSL_get_error(ssl_, got);
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) {
      m.closed = true;
    } else if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      m.want = e == SSL_ERROR_WANT_READ ? auth::Want::kRead : auth::Want::kWrite;
    } else {
      throw Error("TLS read: " + openssl_reason());
    }
    return m;
  }

  auth::Moved write_some(const void* data, size_t n) override {
    auth::Moved m;
    const int put = SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    if (put > 0) {
      m.bytes = static_cast<size_t>(put);
      return m;
    }
    const int e = SSL_get_error(ssl_, put);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      throw Error("TLS write: " + openssl_reason());
    }
    m.want = e == SSL_ERROR_WANT_READ ? auth::Want::kRead : auth::Want::kWrite;
    return m;
  }

  bool read_exact(void* data, size_t n, std::chrono::steady_clock::time_point deadline) override {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const int got = SSL_read(ssl_, p, static_cast<int>(std::min<size_t>(n, 1 << 30)));
      if (got > 0) {
        p += got;
        n -= static_cast<size_t>(got);
        continue;
      }
      const int e = SSL_get_error(ssl_, got);
      if (e == SSL_ERROR_ZERO_RETURN) return false;
      if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) return false;  // EOF without close_notify
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        throw Error("TLS read: " + openssl_reason());
      }
      if (!auth::wait_io(fd_, e == SSL_ERROR_WANT_WRITE, deadline)) throw Error("timed out");
    }
    return true;
  }

  void write_all(const void* data, size_t n,
                 std::chrono::steady_clock::time_point deadline) override {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const int put = SSL_write(ssl_, p, static_cast<int>(std::min<size_t>(n, 1 << 30)));
      if (put > 0) {
        p += put;
        n -= static_cast<size_t>(put);
        continue;
      }
      const int e = SSL_get_error(ssl_, put);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        throw Error("TLS write: " + openssl_reason());
      }
      if (!auth::wait_io(fd_, e == SSL_ERROR_WANT_WRITE, deadline)) throw Error("timed out");
    }
  }

  std::string protocol() const override { return SSL_get_version(ssl_); }

 private:
  SSL* ssl_;
  bool accepting_;
  std::string what_;
};

}  // namespace

struct Context::Impl {
  SSL_CTX* ctx = nullptr;
  ~Impl() { SSL_CTX_free(ctx); }
};

namespace {

void configure(SSL_CTX* ctx) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // A peer that closes without close_notify has ended the connection (what
  // a server does after a wrong token): reads see the end, not an error.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
}

}  // namespace

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

bool available() { return true; }

std::shared_ptr<Context> Context::server(const std::string& cert_file, const std::string& key_file) {
  auto impl = std::make_unique<Impl>();
  impl->ctx = SSL_CTX_new(TLS_server_method());
  if (impl->ctx == nullptr) throw auth::AuthError("TLS: " + openssl_reason());
  configure(impl->ctx);
  if (SSL_CTX_use_certificate_chain_file(impl->ctx, cert_file.c_str()) != 1) {
    throw auth::AuthError("TLS certificate " + cert_file + " (BATON_TLS_CERT): " + openssl_reason());
  }
  if (SSL_CTX_use_PrivateKey_file(impl->ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(impl->ctx) != 1) {
    throw auth::AuthError("TLS key " + key_file + " (BATON_TLS_KEY) for " + cert_file + ": " +
                          openssl_reason());
  }
  return std::shared_ptr<Context>(new Context(std::move(impl)));
}

std::shared_ptr<Context> Context::client(const std::string& ca_file) {
  auto impl = std::make_unique<Impl>();
  impl->ctx = SSL_CTX_new(TLS_client_method());
  if (impl->ctx == nullptr) throw auth::AuthError("TLS: " + openssl_reason());
  configure(impl->ctx);
  if (SSL_CTX_load_verify_locations(impl->ctx, ca_file.c_str(), nullptr) != 1) {
    throw auth::AuthError("TLS trusted certificates " + ca_file + " (BATON_TLS_CA): " +
                          openssl_reason());
  }
  SSL_CTX_set_verify(impl->ctx, SSL_VERIFY_PEER, nullptr);
  return std::shared_ptr<Context>(new Context(std::move(impl)));
}

namespace {

// SSL_accept or SSL_connect until done or the deadline.
// A refusal that a TLS client read. "TLS required" means its hello came late
// (it is a TLS client): a try that may be made again.
void throw_refusal(const uint8_t* frame, const std::string& what) {
  try {
    auth::throw_if_refused(frame, 41, what);
  } catch (const auth::RefusedError& e) {
    if (e.reason() != auth::Refusal::kTlsRequired) throw;
    throw auth::UnansweredError(what + " heard no TLS hello from this client in time");
  }
}

// A client's check, before each step, for a listener's refusal (plain bytes,
// net/auth.h) in place of TLS: a TLS record never begins with them.
void check_refusal(int fd, std::chrono::steady_clock::time_point deadline, const std::string& what) {
  uint8_t first[8];
  const ssize_t got = ::recv(fd, first, sizeof(first), MSG_PEEK | MSG_DONTWAIT);
  if (got <= 0 || !auth::looks_like_refusal(first, static_cast<size_t>(got))) return;
  uint8_t frame[41];
  if (!auth::read_exact(fd, frame, sizeof(frame), deadline)) return;
  throw_refusal(frame, what);
}

// Whether a record header that OpenSSL read began a refusal (the race that
// check_refusal cannot see: the refusal arrived inside a step).
void note_record_header(int write_p, int, int content_type, const void* buf, size_t len, SSL*,
                        void* arg) {
  if (write_p == 0 && content_type == SSL3_RT_HEADER &&
      auth::looks_like_refusal(static_cast<const uint8_t*>(buf), len)) {
    *static_cast<bool*>(arg) = true;
  }
}

template <typename Step>
void drive(SSL* ssl, int fd, std::chrono::steady_clock::time_point deadline, Step step,
           const std::string& what, bool client) {
  bool refused_inside = false;
  if (client) {
    SSL_set_msg_callback(ssl, note_record_header);
    SSL_set_msg_callback_arg(ssl, &refused_inside);
  }
  for (;;) {
    if (client) check_refusal(fd, deadline, what);
    const int r = step(ssl);
    if (r == 1) {
      if (client) SSL_set_msg_callback(ssl, nullptr);
      return;
    }
    const int e = SSL_get_error(ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      if (refused_inside) {
        // The rest of the frame is still in the socket: its reason.
        ERR_clear_error();
        uint8_t rest[41] = {'B', 'A', 'T', 'N', 'D'};
        if (auth::read_exact(fd, rest + 5, sizeof(rest) - 5, deadline)) throw_refusal(rest, what);
        throw auth::RefusedError(what + " refused the connection", auth::Refusal::kBusy);
      }
      std::string reason = openssl_reason();
      if (const long v = SSL_get_verify_result(ssl); v != X509_V_OK) {
        reason += " (certificate: " + std::string(X509_verify_cert_error_string(v)) + ")";
      }
      throw auth::AuthError(what + ": TLS handshake failed: " + reason);
    }
    if (!auth::wait_io(fd, e == SSL_ERROR_WANT_WRITE, deadline)) {
      throw auth::AuthError(what + ": TLS handshake timed out");
    }
  }
}

std::unique_ptr<auth::Conn> start(SSL_CTX* ctx, int fd, bool server,
                                  std::chrono::steady_clock::time_point deadline,
                                  const std::string& host, const std::string& what) {
  // Non-blocking, so that every step waits in poll with the deadline.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    throw auth::AuthError(what + ": TLS: " + openssl_reason());
  }
  if (!server) {
    // The certificate must name the host the client asked for: its IP
    // address, or its DNS name (also sent as SNI).
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    const bool ip = X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1;
    if (!ip && (SSL_set1_host(ssl, host.c_str()) != 1 ||
                SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)) {
      SSL_free(ssl);
      throw auth::AuthError(what + ": TLS: cannot verify against host " + host + ": " +
                            openssl_reason());
    }
  }
  try {
    if (server) {
      drive(ssl, fd, deadline, [](SSL* s) { return SSL_accept(s); }, what, false);
    } else {
      drive(ssl, fd, deadline, [](SSL* s) { return SSL_connect(s); }, what, true);
    }
  } catch (...) {
    SSL_free(ssl);
    throw;
  }
  return std::make_unique<TlsConn>(fd, ssl);
}

}  // namespace

std::unique_ptr<auth::Conn> Context::accept(int fd, std::chrono::steady_clock::time_point deadline,
                                            const std::string& where) {
  return start(impl_->ctx, fd, true, deadline, "", "connection from " + where);
}

std::unique_ptr<auth::Conn> Context::connect(int fd,
                                             std::chrono::steady_clock::time_point deadline,
                                             const std::string& host, const std::string& where) {
  return start(impl_->ctx, fd, false, deadline, host, where);
}

std::unique_ptr<auth::Conn> Context::accept_async(int fd, const std::string& where) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  SSL* ssl = SSL_new(impl_->ctx);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    throw auth::AuthError("connection from " + where + ": TLS: " + openssl_reason());
  }
  return std::make_unique<TlsConn>(fd, ssl, true, "connection from " + where);
}

#else  // !BATON_HAVE_TLS

struct Context::Impl {};
Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

bool available() { return false; }

namespace {
[[noreturn]] void no_tls(const std::string& what) {
  throw auth::AuthError(what + ": this build of baton has no TLS (OpenSSL's headers were not "
                        "found when it was configured; install libssl-dev and reconfigure)");
}
}  // namespace

std::shared_ptr<Context> Context::server(const std::string& cert_file, const std::string&) {
  no_tls("TLS certificate " + cert_file);
}
std::shared_ptr<Context> Context::client(const std::string& ca_file) {
  no_tls("TLS trusted certificates " + ca_file);
}
std::unique_ptr<auth::Conn> Context::accept(int, std::chrono::steady_clock::time_point,
                                            const std::string& where) {
  no_tls(where);
}
std::unique_ptr<auth::Conn> Context::connect(int, std::chrono::steady_clock::time_point,
                                             const std::string&, const std::string& where) {
  no_tls(where);
}
std::unique_ptr<auth::Conn> Context::accept_async(int, const std::string& where) { no_tls(where); }

#endif

std::shared_ptr<Context> Context::server_from_environment() {
  const std::string cert = env("BATON_TLS_CERT"), key = env("BATON_TLS_KEY");
  if (cert.empty() && key.empty()) return nullptr;
  if (cert.empty() || key.empty()) {
    throw auth::AuthError("TLS: BATON_TLS_CERT and BATON_TLS_KEY go together (only " +
                          std::string(cert.empty() ? "BATON_TLS_KEY" : "BATON_TLS_CERT") +
                          " is set)");
  }
  return cached("server\n" + cert + "\n" + key, [&] { return server(cert, key); });
}

std::shared_ptr<Context> Context::client_from_environment() {
  const std::string ca = env("BATON_TLS_CA");
  if (ca.empty()) return nullptr;
  return cached("client\n" + ca, [&] { return client(ca); });
}

}  // namespace baton::tls
