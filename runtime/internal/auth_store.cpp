#include "runtime/internal/auth_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "base/errors.h"
#include "net/auth.h"
#include "net/dial.h"
#include "net/store_protocol.h"
#include "net/tls.h"

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

// A reply to a request that does not wait is due at once; one that waits is
// due by its timeout. Past either plus this margin the server is taken for lost.
constexpr std::chrono::seconds kReplyMargin{60};

std::string bytes_to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> string_to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }


}  // namespace

AuthStore::AuthStore(std::string host, uint16_t port, std::string token,
                     std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout)
    : c10d::Store(timeout),
      host_(std::move(host)),
      port_(port),
      token_(token.empty() ? auth::cluster_token() : std::move(token)),
      connect_timeout_(connect_timeout),
      where_("the rendezvous store at " + host_ + ":" + std::to_string(port_)) {
  // Retried while the store is not there yet (another host starting) or
  // refuses for load (net/dial.h).
  auth::DialOptions o;
  o.token = token_;
  o.where = where_;
  o.handshake_timeout = std::min(connect_timeout_, std::chrono::milliseconds(10000));
  o.tls = tls::Context::client_from_environment();
  conn_ = auth::dial(host_, port_, Clock::now() + connect_timeout_, o, &fd_);
}

AuthStore::~AuthStore() {
  conn_.reset();
  if (fd_ >= 0) ::close(fd_);
}

std::string AuthStore::protocol() const {
  std::lock_guard<std::mutex> lock(mu_);
  return conn_ ? conn_->protocol() : "closed";
}

c10::intrusive_ptr<c10d::Store> AuthStore::clone() {
  return c10::make_intrusive<AuthStore>(host_, port_, token_, timeout_, connect_timeout_);
}

store::Reply AuthStore::call(const store::Request& request, std::chrono::milliseconds waits) {
  const std::string frame = store::encode(request);
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    C10_THROW_ERROR(DistNetworkError, "the connection to " + where_ + " was lost earlier");
  }
  const auto deadline = waits.count() > 0 ? Clock::now() + waits + kReplyMargin
                                          : (request.op == store::Op::kGet ||
                                             request.op == store::Op::kWait ||
                                             request.op == store::Op::kMultiGet)
                                                ? Clock::time_point::max()
                                                : Clock::now() + kReplyMargin;
  std::string body;
  try {
    conn_->write_all(frame.data(), frame.size(), deadline);
    uint8_t prefix[4];
    bool whole = conn_->read_exact(prefix, 4, deadline);
    if (whole) {
      body.resize(store::frame_length(prefix));
      whole = conn_->read_exact(body.data(), body.size(), deadline);
    }
    if (!whole) throw Error("it closed the connection");
  } catch (const std::exception& e) {
    conn_.reset();
    ::close(fd_);
    fd_ = -1;
    C10_THROW_ERROR(DistNetworkError, std::string(store::op_name(request.op)) + " on " + where_ +
                                          " failed: " + e.what());
  }
  store::Reply reply = store::decode_reply(body);
  if (reply.status == store::Status::kTimeout) {
    C10_THROW_ERROR(DistStoreError, reply.values.at(0));
  }
  if (reply.status == store::Status::kError) {
    C10_THROW_ERROR(DistStoreError, where_ + ": " + reply.values.at(0));
  }
  return reply;
}

void AuthStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  call({store::Op::kSet, 0, {key}, {bytes_to_string(value)}}, {});
}

std::vector<uint8_t> AuthStore::compareSet(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  const store::Reply r =
      call({store::Op::kCompareSet, 0, {key}, {bytes_to_string(expected), bytes_to_string(desired)}},
           {});
  return string_to_bytes(r.values.at(0));
}

std::vector<uint8_t> AuthStore::get(const std::string& key) {
  const store::Reply r = call({store::Op::kGet, timeout_.count(), {key}, {}}, timeout_);
  return string_to_bytes(r.values.at(0));
}

int64_t AuthStore::add(const std::string& key, int64_t value) {
  return call({store::Op::kAdd, value, {key}, {}}, {}).number;
}

bool AuthStore::deleteKey(const std::string& key) {
  return call({store::Op::kDelete, 0, {key}, {}}, {}).number != 0;
}

bool AuthStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  return call({store::Op::kCheck, 0, keys, {}}, {}).number != 0;
}

int64_t AuthStore::getNumKeys() { return call({store::Op::kNumKeys, 0, {}, {}}, {}).number; }

void AuthStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void AuthStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  call({store::Op::kWait, timeout.count(), keys, {}}, timeout);
}

void AuthStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  call({store::Op::kAppend, 0, {key}, {bytes_to_string(value)}}, {});
}

std::vector<std::vector<uint8_t>> AuthStore::multiGet(const std::vector<std::string>& keys) {
  std::vector<std::vector<uint8_t>> out;
  if (keys.empty()) return out;
  const store::Reply r = call({store::Op::kMultiGet, timeout_.count(), keys, {}}, timeout_);
  for (const std::string& v : r.values) out.push_back(string_to_bytes(v));
  return out;
}

void AuthStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::vector<uint8_t>>& values) {
  if (keys.size() != values.size()) {
    C10_THROW_ERROR(DistStoreError, "multiSet on " + where_ + ": " + std::to_string(keys.size()) +
                                        " keys but " + std::to_string(values.size()) + " values");
  }
  if (keys.empty()) return;
  std::vector<std::string> vs;
  vs.reserve(values.size());
  for (const auto& v : values) vs.push_back(bytes_to_string(v));
  call({store::Op::kMultiSet, 0, keys, std::move(vs)}, {});
}

c10::intrusive_ptr<AuthStore> connect_store(const std::string& endpoint,
                                            std::chrono::milliseconds timeout) {
  auto [host, port] = auth::split_host_port(endpoint, "rendezvous endpoint");
  if (port == 0) throw Error("rendezvous endpoint '" + endpoint + "' is not host:port");
  return c10::make_intrusive<AuthStore>(host, port,
                                        std::string(), timeout);
}

}  // namespace baton
