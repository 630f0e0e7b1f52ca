// StoreServer: the driver's rendezvous store, a key-value store that the
// workers' c10d groups (Gloo, NCCL) meet through. It replaces c10d's TCPStore,
// which takes anyone's connection: every connection here must first pass the
// cluster-token handshake (net/auth.h), and only then may send requests
// (net/store_protocol.h). Workers reach it through AuthStore
// (runtime/internal/auth_store.h), a c10d::Store.
//
// Connections reach it through a HandshakeGate (net/handshake_gate.h): one
// event-driven thread runs every handshake, so a client that connects and
// sends nothing, or garbage, holds up nobody and costs no thread: it is
// dropped at the handshake's deadline or at its first wrong byte, with a
// (rate-limited) log line naming its address. At most `max_pending`
// connections may be in their handshake at once, `max_pending_per_address`
// from one address; more are refused as they arrive, with a frame that says
// so (clients retry: net/dial.h), and counted. An authenticated connection is
// served by a thread of its own.
//
// Example:
//   StoreServerOptions o;
//   o.name = "WorkerGroup Actor_0";
//   StoreServer server(o);             // 127.0.0.1, a free port
//   spawn workers with server.port() and the cluster token
//
// Thread safety: every member may be called from any thread. The destructor
// closes every connection and waits for their threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace baton {

namespace tls {
class Context;
}  // namespace tls

struct StoreServerOptions {
  // The address to listen on. The default keeps the store on this host; a
  // multi-host job names an interface (or "0.0.0.0").
  std::string bind_address = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port
  // The shared secret; empty: auth::cluster_token().
  std::string token;
  // A client that has not completed the handshake by then is dropped.
  std::chrono::milliseconds handshake_timeout{5000};
  // Connections allowed in their handshake at once, and from one address.
  int max_pending = 64;
  int max_pending_per_address = 32;
  // Names the server in log lines and errors ("WorkerGroup Actor_0").
  std::string name = "rendezvous store";
  // TLS (net/tls.h): this context when set; otherwise the environment's
  // (BATON_TLS_CERT, BATON_TLS_KEY), if any. With TLS, every connection must
  // complete a TLS 1.3 handshake before the token's.
  std::shared_ptr<tls::Context> tls;
};

class StoreServer {
 public:
  // Listens at once. Throws baton::Error naming the address when it cannot.
  explicit StoreServer(StoreServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  const std::string& address() const;

  struct Counts {
    uint64_t accepted = 0;       // connections accepted
    uint64_t authenticated = 0;  // ... that passed the handshake
    uint64_t rejected = 0;       // ... that failed it (wrong token, garbage, silence)
    uint64_t refused = 0;        // refused at accept: too many pending handshakes
    uint64_t requests = 0;       // requests served
    uint64_t keys = 0;           // keys held now
    uint64_t waiting = 0;        // requests waiting for keys now
    uint64_t tls = 0;            // connections authenticated over TLS
  };
  Counts counts() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace baton
