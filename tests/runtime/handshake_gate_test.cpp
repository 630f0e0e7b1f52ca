// The accept path of baton's listeners (net/handshake_gate.h) and its clients
// (net/dial.h): silent connections cost no thread and cannot starve a proven
// client; past the total and per-address limits a connection is refused with a
// frame that says why, and a client retries it within its deadline; an
// exhausted descriptor table pauses accepting instead of spinning; refusals are
// logged at a bounded rate.
#include "net/handshake_gate.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net/auth.h"
#include "net/dial.h"
#include "tests/runtime/process_stats.h"

namespace baton {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "gate-test-token-0123456789abcdef";

// A gate on a loopback port that keeps every proven connection.
class Gate {
 public:
  explicit Gate(HandshakeGateOptions o = {}) {
    std::string why;
    const int fd = auth::tcp_listen("127.0.0.1", 0, &port_, why);
    EXPECT_GE(fd, 0) << why;
    if (o.name.empty()) o.name = "test gate";
    o.token = kToken;
    gate_ = std::make_unique<HandshakeGate>(fd, o, [this](int fd, std::unique_ptr<auth::Conn> c) {
      std::lock_guard<std::mutex> lock(mu_);
      proven_.push_back(fd);
      conns_.push_back(std::move(c));
    });
  }
  ~Gate() {
    gate_.reset();
    for (int fd : proven_) ::close(fd);
  }
  uint16_t port() const { return port_; }
  HandshakeGate::Counts counts() const { return gate_->counts(); }
  size_t proven() {
    std::lock_guard<std::mutex> lock(mu_);
    return proven_.size();
  }

 private:
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<int> proven_;
  std::vector<std::unique_ptr<auth::Conn>> conns_;
  std::unique_ptr<HandshakeGate> gate_;
};

// A connection that sends nothing, from `source` (any 127.x address).
int silent_connection(uint16_t port, const char* source = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0) << std::strerror(errno);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0) << std::strerror(errno);
  return fd;
}

// A client's handshake from `source`; returns the error, or "" when it got in.
std::string handshake_from(uint16_t port, const char* source) {
  const int fd = silent_connection(port, source);
  std::string error;
  try {
    auth::client_handshake(fd, kToken, 5s, "the test gate");
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::close(fd);
  return error;
}

auth::DialOptions dial_options() {
  auth::DialOptions o;
  o.token = kToken;
  o.where = "the test gate";
  o.handshake_timeout = 5s;
  return o;
}

template <typename Get>
bool eventually(Get get, std::chrono::milliseconds within = 10s) {
  const auto deadline = Clock::now() + within;
  while (Clock::now() < deadline) {
    if (get()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return get();
}

double cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Raises the soft descriptor limit to `want` (or the hard limit); restores it.
class FdLimit {
 public:
  explicit FdLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit r = saved_;
    r.rlim_cur = std::min(soft, saved_.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  ~FdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  rlim_t soft() const {
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    return r.rlim_cur;
  }

 private:
  rlimit saved_{};
};

TEST(HandshakeGate, AThousandSilentConnectionsCostNoThreadAndAProvenClientStillGetsIn) {
  FdLimit limit(4096);
  if (limit.soft() < 1200) GTEST_SKIP() << "needs 1,200 descriptors; the limit is " << limit.soft();
  HandshakeGateOptions o;
  o.handshake_timeout = 1500ms;
  Gate gate(o);
  const int threads = test::threads_now();
  const int64_t rss = test::rss_kib();
  std::vector<int> silent;
  for (int i = 0; i < 1000; ++i) silent.push_back(silent_connection(gate.port()));
  ASSERT_TRUE(eventually([&] { return gate.counts().accepted >= 1000; }));
  const auto c = gate.counts();
  // No thread per connection: the gate's one thread runs every handshake.
  EXPECT_EQ(test::threads_now(), threads);
  EXPECT_LE(c.pending, 64u);
  EXPECT_GE(c.refused, 1000u - 64u);
  // 1,000 connections: their sockets, not a thread stack (8 MiB of address
  // space, ~250 KiB resident) each.
  EXPECT_LT(test::rss_kib() - rss, 16 * 1024) << "KiB";
  // Refusals are logged at a bounded rate, the rest counted.
  EXPECT_LE(c.log_lines, 40u);
  EXPECT_GE(c.log_dropped, 900u);
  // A proven client gets in within its deadline: refused while the silent
  // ones fill the gate, then let in when they time out.
  int fd = -1;
  auto conn = auth::dial("127.0.0.1", gate.port(), Clock::now() + 10s, dial_options(), &fd);
  EXPECT_TRUE(eventually([&] { return gate.proven() == 1; }));
  conn.reset();
  ::close(fd);
  for (int s : silent) ::close(s);
}

TEST(HandshakeGate, PastTheLimitAClientIsToldTheGateIsBusyAndItsFinalErrorSaysSo) {
  HandshakeGateOptions o;
  o.max_pending = 2;
  o.handshake_timeout = 10s;
  Gate gate(o);
  const int a = silent_connection(gate.port(), "127.0.0.2");
  const int b = silent_connection(gate.port(), "127.0.0.3");
  ASSERT_TRUE(eventually([&] { return gate.counts().pending == 2; }));
  const std::string refused = handshake_from(gate.port(), "127.0.0.4");
  EXPECT_NE(refused.find("refused the connection: busy"), std::string::npos) << refused;
  // dial() retries a refusal for load until its deadline, then says what the
  // server said, and how often.
  int fd = -1;
  const auto start = Clock::now();
  try {
    auth::dial("127.0.0.1", gate.port(), Clock::now() + 800ms, dial_options(), &fd);
    FAIL() << "got in past a full gate";
  } catch (const auth::RefusedError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(what.find("the test gate refused the connection: busy"), std::string::npos) << what;
    EXPECT_NE(what.find(" tries in "), std::string::npos) << what;
    EXPECT_EQ(what.find("TLS"), std::string::npos) << what;
  }
  EXPECT_GE(Clock::now() - start, 800ms);
  EXPECT_GE(gate.counts().refused, 3u);
  ::close(a);
  ::close(b);
}

TEST(HandshakeGate, OneAddressCannotTakeEverySlot) {
  HandshakeGateOptions o;
  o.max_pending_per_address = 3;
  o.handshake_timeout = 10s;
  Gate gate(o);
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(silent_connection(gate.port(), "127.0.0.2"));
  ASSERT_TRUE(eventually([&] { return gate.counts().accepted == 10; }));
  EXPECT_EQ(gate.counts().pending, 3u);
  EXPECT_EQ(gate.counts().refused, 7u);
  const std::string same = handshake_from(gate.port(), "127.0.0.2");
  EXPECT_NE(same.find("too many connections from this address"), std::string::npos) << same;
  // Another address is served at once.
  EXPECT_EQ(handshake_from(gate.port(), "127.0.0.5"), "");
  EXPECT_TRUE(eventually([&] { return gate.proven() == 1; }));
  for (int s : silent) ::close(s);
}

TEST(HandshakeGate, ASilentConnectionIsDroppedAtTheDeadlineAndItsSlotFreed) {
  HandshakeGateOptions o;
  o.max_pending = 1;
  o.handshake_timeout = 500ms;
  Gate gate(o);
  const int silent = silent_connection(gate.port());
  ASSERT_TRUE(eventually([&] { return gate.counts().pending == 1; }));
  EXPECT_TRUE(eventually([&] { return gate.counts().rejected == 1 && gate.counts().pending == 0; }, 3s));
  EXPECT_EQ(handshake_from(gate.port(), "127.0.0.1"), "");
  ::close(silent);
}

TEST(HandshakeGate, OutOfDescriptorsItPausesAcceptingInsteadOfSpinningAndResumes) {
  Gate gate;
  // Sockets made now, connected once no descriptor is left: the gate's
  // accept() then fails with EMFILE for as long as the limit holds.
  std::vector<int> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(clients.back(), 0);
  }
  {
    // A new descriptor takes the lowest free number: none below the limit.
    const int lowest_free = ::dup(0);
    ASSERT_GE(lowest_free, 0);
    ::close(lowest_free);
    FdLimit none(static_cast<rlim_t>(lowest_free));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(gate.port());
    for (int fd : clients) {
      ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0) << std::strerror(errno);
    }
    ASSERT_TRUE(eventually([&] { return gate.counts().accept_failures >= 1; }));
    const double cpu = cpu_seconds();
    const uint64_t failures = gate.counts().accept_failures;
    std::this_thread::sleep_for(1s);
    // Before the back-off: thousands of failed accepts a second, a core busy.
    EXPECT_LT(gate.counts().accept_failures - failures, 30u);
    EXPECT_LT(cpu_seconds() - cpu, 0.2) << "CPU seconds in one second out of descriptors";
    EXPECT_EQ(gate.counts().accepted, 0u);
  }
  // Descriptors again: the queued connections are accepted.
  EXPECT_TRUE(eventually([&] { return gate.counts().accepted == 8; }, 5s));
  for (int fd : clients) ::close(fd);
}

TEST(RateLimitedLog, ShowsTenLinesASecondAndCountsTheRest) {
  RateLimitedLog log("test");
  for (int i = 0; i < 500; ++i) log.warn("line " + std::to_string(i));
  EXPECT_LE(log.shown(), 20u);  // two windows at most, on a slow machine
  EXPECT_EQ(log.shown() + log.dropped(), 500u);
}

TEST(Refusal, AFrameIsAsLongAsAHelloAndSaysWhy) {
  const std::string frame = auth::refusal_frame(auth::Refusal::kBusyFromAddress);
  EXPECT_EQ(frame.size(), 41u);
  const auto* p = reinterpret_cast<const uint8_t*>(frame.data());
  EXPECT_TRUE(auth::looks_like_refusal(p, 5));
  EXPECT_FALSE(auth::looks_like_refusal(p, 4));  // too few to tell
  try {
    auth::throw_if_refused(p, frame.size(), "the store at h:1");
    FAIL() << "a refusal was not seen";
  } catch (const auth::RefusedError& e) {
    EXPECT_EQ(e.reason(), auth::Refusal::kBusyFromAddress);
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("the store at h:1 refused the connection: busy"),
              std::string::npos);
  }
  const std::string tls = auth::refusal_frame(auth::Refusal::kTlsRequired);
  try {
    auth::throw_if_refused(reinterpret_cast<const uint8_t*>(tls.data()), tls.size(), "x");
    FAIL();
  } catch (const auth::RefusedError& e) {
    EXPECT_FALSE(e.retryable());
  }
  const uint8_t hello[10] = {'B', 'A', 'T', 'N', 'A', 'U', 'T', 'H', 1, 0};
  EXPECT_FALSE(auth::looks_like_refusal(hello, 5));
  EXPECT_FALSE(auth::looks_like_refusal(hello, 10));
  auth::throw_if_refused(hello, sizeof(hello), "x");  // a hello: no throw
}

}  // namespace
}  // namespace baton
