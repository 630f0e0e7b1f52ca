#include "net/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "base/errors.h"
#include "base/log.h"
#include "net/auth.h"
#include "net/handshake_gate.h"
#include "net/store_protocol.h"
#include "net/tls.h"

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

std::string keys_text(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
  return s;
}

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions options;
  std::string address;
  uint16_t port = 0;
  std::unique_ptr<HandshakeGate> gate;

  // One thread per authenticated connection.
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::mutex conn_mu;
  std::list<Connection> connections;  // guarded by conn_mu
  std::atomic<bool> stopping{false};

  mutable std::mutex mu;  // the data
  std::condition_variable changed;
  std::unordered_map<std::string, std::string> data;

  std::atomic<uint64_t> requests{0}, waiting{0}, over_tls{0};
  std::unique_ptr<RateLimitedLog> log_;

  void warn(const std::string& line) { log_->warn(line); }

  void start() {
    log_ = std::make_unique<RateLimitedLog>(options.name);
    std::string why;
    const int listen_fd = auth::tcp_listen(options.bind_address, options.port, &port, why);
    if (listen_fd < 0) {
      throw Error(options.name + ": cannot listen on " + options.bind_address + ":" +
                  std::to_string(options.port) + ": " + why);
    }
    address = options.bind_address;
    HandshakeGateOptions g;
    g.name = options.name;
    g.token = options.token;
    g.tls = options.tls;
    g.handshake_timeout = options.handshake_timeout;
    g.max_pending = options.max_pending;
    g.max_pending_per_address = options.max_pending_per_address;
    gate = std::make_unique<HandshakeGate>(
        listen_fd, std::move(g),
        [this](int fd, std::unique_ptr<auth::Conn> conn) { add(fd, std::move(conn)); });
  }

  // An authenticated connection: served by a thread of its own from now on.
  void add(int fd, std::unique_ptr<auth::Conn> conn) {
    reap();
    if (options.tls) ++over_tls;
    std::lock_guard<std::mutex> lock(conn_mu);
    Connection& c = connections.emplace_back();
    c.fd = fd;
    c.thread = std::thread([this, &c, conn = std::shared_ptr<auth::Conn>(std::move(conn))] {
      serve(*conn, c.fd);
      // The peer sees the end now; reap() closes the fd when it joins this
      // thread.
      ::shutdown(c.fd, SHUT_RDWR);
      c.done.store(true);
    });
  }

  // Joins the threads of connections that have ended.
  void reap() {
    std::lock_guard<std::mutex> lock(conn_mu);
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->done.load()) {
        it->thread.join();
        ::close(it->fd);
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(auth::Conn& conn, int fd) {
    const std::string who = auth::peer_address(fd);
    try {
      for (;;) {
        uint8_t prefix[4];
        if (!conn.read_exact(prefix, 4, Clock::time_point::max())) return;  // hung up
        std::string body(store::frame_length(prefix), '\0');
        if (!conn.read_exact(body.data(), body.size(), Clock::now() + std::chrono::seconds(60))) {
          return;
        }
        const store::Request request = store::decode_request(body);
        const std::string reply = store::encode(handle(request, fd));
        ++requests;
        conn.write_all(reply.data(), reply.size(), Clock::now() + std::chrono::seconds(60));
      }
    } catch (const std::exception& e) {
      if (!stopping.load()) warn("connection from " + who + " dropped: " + e.what());
    }
  }

  // Whether the client has hung up (while its request waits here).
  static bool hung_up(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  // Waits, holding `lock`, until every key is present. False at the timeout
  // (ms; 0: none), when the server stops or the client hangs up.
  bool wait_keys(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                 int64_t timeout_ms, int fd) {
    const auto deadline = timeout_ms > 0 ? Clock::now() + std::chrono::milliseconds(timeout_ms)
                                         : Clock::time_point::max();
    struct Waiting {
      std::atomic<uint64_t>& n;
      explicit Waiting(std::atomic<uint64_t>& c) : n(c) { ++n; }
      ~Waiting() { --n; }
    } counted(waiting);
    for (;;) {
      const bool all = std::all_of(keys.begin(), keys.end(),
                                   [&](const std::string& k) { return data.count(k) != 0; });
      if (all) return true;
      if (stopping.load() || Clock::now() >= deadline) return false;
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(500));
      changed.wait_until(lock, slice);
      if (hung_up(fd)) return false;
    }
  }

  store::Reply handle(const store::Request& r, int fd) {
    using store::Op;
    store::Reply out;
    std::unique_lock<std::mutex> lock(mu);
    auto timed_out = [&] {
      out.status = store::Status::kTimeout;
      out.values = {std::string(store::op_name(r.op)) + " of " + keys_text(r.keys) +
                    " timed out after " + std::to_string(r.number) + " ms on " + options.name};
      return out;
    };
    switch (r.op) {
      case Op::kSet:
        data[r.keys[0]] = r.values[0];
        changed.notify_all();
        break;
      case Op::kAppend:
        data[r.keys[0]] += r.values[0];
        changed.notify_all();
        break;
      case Op::kMultiSet:
        for (size_t i = 0; i < r.keys.size(); ++i) data[r.keys[i]] = r.values[i];
        changed.notify_all();
        break;
      case Op::kCompareSet: {
        // c10d's semantics: a missing key is created only when `expected` is
        // empty; the reply is the value the key holds afterwards (or
        // `expected` when it stays missing).
        auto it = data.find(r.keys[0]);
        if (it == data.end()) {
          if (r.values[0].empty()) {
            data[r.keys[0]] = r.values[1];
            changed.notify_all();
            out.values = {r.values[1]};
          } else {
            out.values = {r.values[0]};
          }
        } else if (it->second == r.values[0]) {
          it->second = r.values[1];
          changed.notify_all();
          out.values = {r.values[1]};
        } else {
          out.values = {it->second};
        }
        break;
      }
      case Op::kGet:
      case Op::kMultiGet:
        if (!wait_keys(lock, r.keys, r.number, fd)) return timed_out();
        for (const std::string& k : r.keys) out.values.push_back(data.at(k));
        break;
      case Op::kWait:
        if (!wait_keys(lock, r.keys, r.number, fd)) return timed_out();
        break;
      case Op::kAdd: {
        int64_t value = 0;
        auto it = data.find(r.keys[0]);
        if (it != data.end()) {
          const std::string& s = it->second;
          const auto res = std::from_chars(s.data(), s.data() + s.size(), value);
          if (res.ec != std::errc() || res.ptr != s.data() + s.size()) {
            out.status = store::Status::kError;
            out.values = {"add: key " + r.keys[0] + " holds a value that is not an integer"};
            return out;
          }
        }
        value += r.number;
        data[r.keys[0]] = std::to_string(value);
        changed.notify_all();
        out.number = value;
        break;
      }
      case Op::kDelete:
        out.number = data.erase(r.keys[0]) > 0 ? 1 : 0;
        break;
      case Op::kCheck:
        out.number = std::all_of(r.keys.begin(), r.keys.end(),
                                 [&](const std::string& k) { return data.count(k) != 0; });
        break;
      case Op::kNumKeys:
        out.number = static_cast<int64_t>(data.size());
        break;
    }
    return out;
  }

  void stop() {
    stopping.store(true);
    gate.reset();  // no new connections
    {
      std::lock_guard<std::mutex> lock(mu);
      changed.notify_all();
    }
    std::lock_guard<std::mutex> lock(conn_mu);
    for (Connection& c : connections) ::shutdown(c.fd, SHUT_RDWR);
    for (Connection& c : connections) {
      c.thread.join();
      ::close(c.fd);
    }
    connections.clear();
  }
};

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  if (impl_->options.token.empty()) impl_->options.token = auth::cluster_token();
  if (!impl_->options.tls) impl_->options.tls = tls::Context::server_from_environment();
  impl_->start();
}

StoreServer::~StoreServer() { impl_->stop(); }

uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::address() const { return impl_->address; }

StoreServer::Counts StoreServer::counts() const {
  Counts c;
  const HandshakeGate::Counts g = impl_->gate->counts();
  c.accepted = g.accepted;
  c.authenticated = g.authenticated;
  c.rejected = g.rejected;
  c.refused = g.refused;
  c.requests = impl_->requests.load();
  c.waiting = impl_->waiting.load();
  c.tls = impl_->over_tls.load();
  std::lock_guard<std::mutex> lock(impl_->mu);
  c.keys = impl_->data.size();
  return c;
}

}  // namespace baton
