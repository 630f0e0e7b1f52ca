// AuthStore: a c10d::Store client of a StoreServer (net/store_server.h),
// over a TCP connection that passed the cluster-token handshake
// (net/auth.h). What the workers' Gloo and NCCL groups rendezvous through,
// in place of c10d's TCPStore.
//
// Example:
//   auto store = c10::make_intrusive<baton::AuthStore>("127.0.0.1", port);
//   auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
//
// Errors: a failed handshake is baton::auth::AuthError; an operation that
// waited past its timeout is c10::DistStoreError (as TCPStore's), naming the
// keys; a lost connection is c10::DistNetworkError naming the server.
//
// Thread safety: one request at a time per AuthStore (serialised inside);
// clone() opens another connection.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace baton {

namespace store {
struct Request;
struct Reply;
}  // namespace store
namespace auth {
class Conn;
}  // namespace auth

class AuthStore : public c10d::Store {
 public:
  // Connects and authenticates, retrying a refused connection until
  // `connect_timeout`. `token` empty: auth::cluster_token(). Over TLS when
  // BATON_TLS_CA names the certificates to trust (net/tls.h).
  AuthStore(std::string host, uint16_t port, std::string token = {},
            std::chrono::milliseconds timeout = kDefaultTimeout,
            std::chrono::milliseconds connect_timeout = std::chrono::seconds(30));
  ~AuthStore() override;

  c10::intrusive_ptr<c10d::Store> clone() override;

  using c10d::Store::compareSet;
  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }

  // "the rendezvous store at 127.0.0.1:41234".
  const std::string& where() const { return where_; }
  // "tcp", or the TLS version ("TLSv1.3").
  std::string protocol() const;

 private:
  store::Reply call(const store::Request& request, std::chrono::milliseconds waits);

  std::string host_;
  uint16_t port_;
  std::string token_;
  std::chrono::milliseconds connect_timeout_;
  std::string where_;
  mutable std::mutex mu_;
  int fd_ = -1;                       // guarded by mu_
  std::unique_ptr<auth::Conn> conn_;  // over fd_; guarded by mu_
};

// Connects to "host:port" (an AuthStore), for a rendezvous outside one's own
// group (e.g. the weight sync between an actor and a rollout group). Throws
// baton::Error naming `endpoint` when it is not host:port.
c10::intrusive_ptr<AuthStore> connect_store(const std::string& endpoint,
                                            std::chrono::milliseconds timeout);

}  // namespace baton
