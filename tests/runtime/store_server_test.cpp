// The rendezvous store (net/store_server.h, runtime/internal/auth_store.h): c10d's
// store semantics through AuthStore, and a server that only serves clients
// holding the cluster token — while clients with a wrong token, no token, a
// replayed handshake, garbage or silence are dropped without holding up the
// others.
#include "net/store_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "net/auth.h"
#include "net/store_protocol.h"
#include "runtime/internal/auth_store.h"

namespace baton {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "store-test-token-0123456789";

StoreServerOptions test_options() {
  StoreServerOptions o;
  o.token = kToken;
  o.name = "test store";
  return o;
}

c10::intrusive_ptr<AuthStore> client(const StoreServer& s, const std::string& token = kToken,
                                     std::chrono::milliseconds timeout = 10s) {
  return c10::make_intrusive<AuthStore>("127.0.0.1", s.port(), token, timeout, 5s);
}

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// A plain TCP connection to the server, speaking nothing yet.
int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  return fd;
}

// Reads until the peer closes or `deadline`; true if it closed.
bool closed_by_peer(int fd, Clock::time_point deadline) {
  char buf[256];
  try {
    while (auth::read_exact(fd, buf, 1, deadline)) {
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Waits for a count to reach `at_least` (the server counts as it goes).
template <typename Get>
bool eventually(Get get, uint64_t at_least, std::chrono::milliseconds within = 10s) {
  const auto deadline = Clock::now() + within;
  while (Clock::now() < deadline) {
    if (get() >= at_least) return true;
    std::this_thread::sleep_for(5ms);
  }
  return get() >= at_least;
}

// The client's half of the handshake by hand, so that a test can keep its bytes.
std::string handshake_reply(int fd, const std::string& token) {
  uint8_t hello[41];
  EXPECT_TRUE(auth::read_exact(fd, hello, sizeof(hello), Clock::now() + 5s));
  std::string reply(reinterpret_cast<char*>(hello), 9);
  std::string nonce(32, '\0');
  std::mt19937 rng(7);
  for (char& c : nonce) c = static_cast<char>(rng());
  reply += nonce;
  const auth::Digest mac = auth::hmac_sha256(
      token, "baton-auth-v1 client" + std::string(reinterpret_cast<char*>(hello) + 9, 32) + nonce);
  reply.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return reply;
}

TEST(StoreServer, ServesC10dStoreSemanticsThroughAuthStore) {
  StoreServer server(test_options());
  auto store = client(server);
  store->set("a", bytes("1"));
  EXPECT_EQ(text(store->get("a")), "1");
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_EQ(text(store->get("n")), "3");
  EXPECT_TRUE(store->check({"a", "n"}));
  EXPECT_FALSE(store->check({"a", "missing"}));
  EXPECT_EQ(store->getNumKeys(), 2);
  // compareSet as c10d defines it.
  EXPECT_EQ(text(store->compareSet("c", bytes(""), bytes("x"))), "x");   // created
  EXPECT_EQ(text(store->compareSet("c", bytes("y"), bytes("z"))), "x");  // mismatch
  EXPECT_EQ(text(store->compareSet("c", bytes("x"), bytes("z"))), "z");  // swapped
  EXPECT_EQ(text(store->compareSet("d", bytes("e"), bytes("f"))), "e");  // stays missing
  EXPECT_FALSE(store->check({"d"}));
  store->append("c", bytes("++"));
  EXPECT_EQ(text(store->get("c")), "z++");
  store->multiSet({"m1", "m2"}, {bytes("one"), bytes("two")});
  const auto both = store->multiGet({"m1", "m2"});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(text(both[0]), "one");
  EXPECT_EQ(text(both[1]), "two");
  EXPECT_TRUE(store->deleteKey("a"));
  EXPECT_FALSE(store->deleteKey("a"));
  // A clone is another connection to the same data.
  auto other = store->clone();
  EXPECT_EQ(text(other->get("m2")), "two");
  EXPECT_GE(server.counts().authenticated, 2u);
}

TEST(StoreServer, GetWaitsForAKeyAnotherClientSetsLater) {
  StoreServer server(test_options());
  std::string got;
  std::thread getter([&] { got = text(client(server)->get("late")); });
  ASSERT_TRUE(eventually([&] { return server.counts().waiting; }, 1));
  EXPECT_FALSE(client(server)->check({"late"}));
  client(server)->set("late", bytes("value"));
  getter.join();
  EXPECT_EQ(got, "value");
  EXPECT_EQ(server.counts().waiting, 0u);
}

TEST(StoreServer, AWaitPastItsTimeoutThrowsDistStoreErrorNamingTheKeys) {
  StoreServer server(test_options());
  auto store = client(server);
  try {
    store->wait({"never", "set"}, 200ms);
    FAIL() << "a wait for keys nobody sets returned";
  } catch (const c10::DistStoreError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("never, set"), std::string::npos) << what;
    EXPECT_NE(what.find("200 ms"), std::string::npos) << what;
  }
  // The connection stays usable.
  store->set("k", bytes("v"));
  EXPECT_EQ(text(store->get("k")), "v");
}

TEST(StoreServer, AClientWithAWrongTokenIsRejectedAndTheServerKeepsServing) {
  StoreServer server(test_options());
  try {
    client(server, "another-jobs-token-987654");
    FAIL() << "a client with a wrong token connected";
  } catch (const auth::AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("rejected this process's cluster token"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(eventually([&] { return server.counts().rejected; }, 1));
  auto good = client(server);
  good->set("after", bytes("ok"));
  EXPECT_EQ(text(good->get("after")), "ok");
  EXPECT_EQ(server.counts().authenticated, 1u);
}

TEST(StoreServer, AClientWithoutATokenIsRejected) {
  StoreServer server(test_options());
  // The same handshake with an empty key.
  int fd = raw_connect(server.port());
  const std::string reply = handshake_reply(fd, "");
  auth::write_all(fd, reply.data(), reply.size(), Clock::now() + 5s);
  EXPECT_TRUE(closed_by_peer(fd, Clock::now() + 10s));
  ::close(fd);
  // c10d's own TCPStore client, which knows nothing of tokens.
  c10d::TCPStoreOptions o;
  o.port = server.port();
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = 2s;
  EXPECT_ANY_THROW({
    auto tcp = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    tcp->set("stolen", bytes("x"));
  });
  EXPECT_TRUE(eventually([&] { return server.counts().rejected; }, 2));
  EXPECT_EQ(server.counts().authenticated, 0u);
  EXPECT_EQ(server.counts().keys, 0u);
}

TEST(StoreServer, AReplayedHandshakeIsRejected) {
  StoreServer server(test_options());
  int first = raw_connect(server.port());
  const std::string reply = handshake_reply(first, kToken);
  auth::write_all(first, reply.data(), reply.size(), Clock::now() + 5s);
  uint8_t proof[32];
  ASSERT_TRUE(auth::read_exact(first, proof, sizeof(proof), Clock::now() + 5s))
      << "the genuine handshake failed";
  ASSERT_TRUE(eventually([&] { return server.counts().authenticated; }, 1));
  // The same reply on a new connection answers an old challenge.
  int second = raw_connect(server.port());
  uint8_t hello[41];
  ASSERT_TRUE(auth::read_exact(second, hello, sizeof(hello), Clock::now() + 5s));
  auth::write_all(second, reply.data(), reply.size(), Clock::now() + 5s);
  EXPECT_TRUE(closed_by_peer(second, Clock::now() + 10s));
  EXPECT_TRUE(eventually([&] { return server.counts().rejected; }, 1));
  EXPECT_EQ(server.counts().authenticated, 1u);
  ::close(first);
  ::close(second);
}

TEST(StoreServer, GarbageIsDroppedAtItsFirstWrongBytes) {
  StoreServer server(test_options());
  int fd = raw_connect(server.port());
  std::string garbage(4096, '\0');
  std::mt19937 rng(11);
  for (char& c : garbage) c = static_cast<char>(rng());
  try {
    auth::write_all(fd, garbage.data(), garbage.size(), Clock::now() + 5s);
  } catch (const std::exception&) {
    // The server may close before taking it all.
  }
  EXPECT_TRUE(closed_by_peer(fd, Clock::now() + 10s));
  EXPECT_TRUE(eventually([&] { return server.counts().rejected; }, 1));
  ::close(fd);
}

TEST(StoreServer, ASilentClientHoldsUpNobodyAndIsDroppedAtTheHandshakeDeadline) {
  StoreServerOptions o = test_options();
  o.handshake_timeout = 1500ms;
  StoreServer server(o);
  const int silent = raw_connect(server.port());
  ASSERT_TRUE(eventually([&] { return server.counts().accepted; }, 1));
  // Served while the silent connection is still in its handshake.
  const auto start = Clock::now();
  auto store = client(server);
  store->set("k", bytes("v"));
  EXPECT_EQ(text(store->get("k")), "v");
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_EQ(server.counts().rejected, 0u);
  EXPECT_TRUE(closed_by_peer(silent, Clock::now() + 10s));
  EXPECT_TRUE(eventually([&] { return server.counts().rejected; }, 1));
  ::close(silent);
}

TEST(StoreServer, ConnectionsBeyondMaxPendingAreRefusedAtAccept) {
  StoreServerOptions o = test_options();
  o.max_pending = 2;
  o.handshake_timeout = 3s;
  StoreServer server(o);
  std::vector<int> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(raw_connect(server.port()));
  EXPECT_TRUE(eventually([&] { return server.counts().refused; }, 3));
  EXPECT_EQ(server.counts().refused, 3u);
  for (int fd : silent) ::close(fd);
}

TEST(StoreServer, AMalformedFrameFromAnAuthenticatedClientDropsOnlyThatConnection) {
  StoreServer server(test_options());
  int fd = raw_connect(server.port());
  const std::string reply = handshake_reply(fd, kToken);
  auth::write_all(fd, reply.data(), reply.size(), Clock::now() + 5s);
  uint8_t proof[32];
  ASSERT_TRUE(auth::read_exact(fd, proof, sizeof(proof), Clock::now() + 5s));
  const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};  // a 4 GiB frame
  auth::write_all(fd, huge, sizeof(huge), Clock::now() + 5s);
  EXPECT_TRUE(closed_by_peer(fd, Clock::now() + 10s));
  ::close(fd);
  auto store = client(server);
  store->set("still", bytes("serving"));
  EXPECT_EQ(text(store->get("still")), "serving");
}

TEST(StoreServer, ListensOnLoopbackUnlessAnAddressIsConfigured) {
  StoreServer server(test_options());
  EXPECT_EQ(server.address(), "127.0.0.1");
  StoreServerOptions bad = test_options();
  bad.bind_address = "203.0.113.9";  // TEST-NET-3: not an address of this host
  try {
    StoreServer s(bad);
    FAIL() << "listened on an address this host does not have";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("203.0.113.9"), std::string::npos) << e.what();
  }
}

TEST(StoreProtocol, DecodingRejectsWhatIsMalformedNamingIt) {
  store::Request r;
  r.op = store::Op::kSet;
  r.keys = {"k"};
  r.values = {"v"};
  const std::string frame = store::encode(r);
  const std::string body = frame.substr(4);
  EXPECT_EQ(store::decode_request(body).values.at(0), "v");
  auto error_of = [](const std::string& b) {
    try {
      store::decode_request(b);
    } catch (const store::ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(body.substr(0, 5)).find("ends early"), std::string::npos);
  EXPECT_NE(error_of(body.substr(0, body.size() - 1)).find("value length of 1 exceeds"),
            std::string::npos);
  EXPECT_NE(error_of(body + "x").find("trailing"), std::string::npos);
  std::string unknown = body;
  unknown[0] = 99;
  EXPECT_NE(error_of(unknown).find("unknown op 99"), std::string::npos);
  std::string wrong_shape = body;
  wrong_shape[0] = static_cast<char>(store::Op::kNumKeys);
  EXPECT_NE(error_of(wrong_shape).find("getNumKeys with 1 keys"), std::string::npos);
  std::string huge_count = body;
  huge_count[9] = '\xff';  // the key count's low byte
  EXPECT_NE(error_of(huge_count).find("count"), std::string::npos);
  const uint8_t too_big[4] = {0, 0, 0, 0x10};  // 256 MiB
  EXPECT_THROW(store::frame_length(too_big), store::ProtocolError);
}

}  // namespace
}  // namespace baton
