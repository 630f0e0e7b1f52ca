// Optional TLS 1.3 for baton's TCP connections (OpenSSL), under the
// cluster-token handshake (net/auth.h): the token proves who the peer is,
// TLS keeps what follows private and untampered.
//
// Turned on by the environment, read when a server or a client is made:
//   BATON_TLS_CERT, BATON_TLS_KEY  the server's certificate chain and key (PEM)
//   BATON_TLS_CA                   the certificates a client trusts (PEM); a
//                                  client with it connects only over TLS and
//                                  verifies the server's certificate
// A server with a certificate accepts TLS only. A build without OpenSSL
// (BATON_HAVE_TLS undefined) refuses these variables with an error that says so.
//
// Plain C++ (no LibTorch).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "net/auth.h"

namespace baton::tls {

// Whether this build has TLS.
bool available();

// An OpenSSL context: a server's (certificate and key) or a client's (trusted
// certificates). Thread-safe once made.
class Context {
 public:
  // Throws auth::AuthError naming the file that cannot be used.
  static std::shared_ptr<Context> server(const std::string& cert_file, const std::string& key_file);
  static std::shared_ptr<Context> client(const std::string& ca_file);
  // From BATON_TLS_CERT/BATON_TLS_KEY (server) or BATON_TLS_CA (client); null
  // when unset. Made once per process and file, then shared.
  static std::shared_ptr<Context> server_from_environment();
  static std::shared_ptr<Context> client_from_environment();
  ~Context();

  // The TLS handshake on a connected socket, before `deadline`. Throws
  // auth::AuthError naming `where` (the peer or the server) and OpenSSL's
  // reason. A client checks that the server's certificate names `host` (an
  // IP address or a DNS name) and was issued by a trusted certificate.
  std::unique_ptr<auth::Conn> accept(int fd, std::chrono::steady_clock::time_point deadline,
                                     const std::string& where);
  std::unique_ptr<auth::Conn> connect(int fd, std::chrono::steady_clock::time_point deadline,
                                      const std::string& host, const std::string& where);
  // A server's connection whose TLS handshake has not begun: the caller
  // drives it with handshake_step() (net/handshake_gate.h). Sets O_NONBLOCK.
  std::unique_ptr<auth::Conn> accept_async(int fd, const std::string& where);

 private:
  struct Impl;
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::tls
