// TLS 1.3 under the cluster-token handshake (net/tls.h): the rendezvous
// store served and reached over TLS, and refused to a plain client, to a client
// that does not trust the server's certificate, and to a certificate that names
// another host (certificates from test_certificates.h). Built only when
// OpenSSL's headers are found (tests/runtime/CMakeLists.txt).
#include "net/tls.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "net/auth.h"
#include "net/store_server.h"
#include "runtime/internal/auth_store.h"
#include "tests/runtime/test_certificates.h"

namespace baton {
namespace {

using namespace std::chrono_literals;

constexpr const char* kToken = "tls-test-token-0123456789";

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tls::available()) GTEST_SKIP() << "this build has no TLS";
    char dir[] = "/tmp/baton_tls_XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    test::write_test_certificates(dir_);
  }
  void TearDown() override {
    ::unsetenv("BATON_TLS_CA");
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  StoreServerOptions options(const std::string& cert = "server") {
    StoreServerOptions o;
    o.token = kToken;
    o.name = "tls test store";
    o.handshake_timeout = 1s;
    o.tls = tls::Context::server(path(cert + ".pem"), path(cert + ".key"));
    return o;
  }
  c10::intrusive_ptr<AuthStore> connect(const StoreServer& s, const std::string& token = kToken) {
    return c10::make_intrusive<AuthStore>("127.0.0.1", s.port(), token, 10s, 5s);
  }
  std::string error_connecting(const StoreServer& s, const std::string& token = kToken) {
    try {
      connect(s, token);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  std::string dir_;
};

TEST_F(Tls, TheStoreIsServedOverTls13ToAClientThatTrustsItsCertificate) {
  StoreServer server(options());
  ::setenv("BATON_TLS_CA", path("ca.pem").c_str(), 1);
  auto store = connect(server);
  EXPECT_EQ(store->protocol(), "TLSv1.3");
  store->set("k", std::vector<uint8_t>{'v'});
  EXPECT_EQ(store->get("k"), std::vector<uint8_t>{'v'});
  // A large value crosses several TLS records.
  const std::vector<uint8_t> big(1 << 20, 7);
  store->set("big", big);
  EXPECT_EQ(store->get("big"), big);
  EXPECT_EQ(server.counts().tls, 1u);
}

TEST_F(Tls, APlainClientIsRefusedAndTheServerGoesOn) {
  StoreServer server(options());
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_connecting(server);
  // Told so by the server (a plain client waits for the server to speak; a
  // TLS client speaks first), not left to time out guessing.
  EXPECT_NE(error.find("refused the connection: it requires TLS (set BATON_TLS_CA"),
            std::string::npos)
      << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(server.counts().authenticated, 0u);
  ::setenv("BATON_TLS_CA", path("ca.pem").c_str(), 1);
  EXPECT_EQ(connect(server)->protocol(), "TLSv1.3");
}

TEST_F(Tls, ATlsClientRefusedForLoadIsToldSoAndRetriesUntilItsDeadline) {
  StoreServerOptions o = options();
  o.max_pending = 1;
  o.handshake_timeout = 10s;
  StoreServer server(o);
  // The one slot, held: the start of a TLS record, never finished.
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(server.port());
  ASSERT_EQ(::connect(holder, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  const uint8_t partial[3] = {0x16, 0x03, 0x01};
  ASSERT_EQ(::write(holder, partial, sizeof(partial)), 3);
  for (int i = 0; i < 500 && server.counts().accepted == 0; ++i) ::usleep(10000);
  ::setenv("BATON_TLS_CA", path("ca.pem").c_str(), 1);
  try {
    auto store = c10::make_intrusive<AuthStore>("127.0.0.1", server.port(), kToken, 10s, 1s);
    (void)store;
    FAIL() << "got past a full store";
  } catch (const auth::RefusedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("refused the connection: busy"), std::string::npos) << what;
    EXPECT_NE(what.find(" tries in "), std::string::npos) << what;
  }
  EXPECT_GE(server.counts().refused, 2u);
  ::close(holder);
}

TEST_F(Tls, AClientThatDoesNotTrustTheCertificateRefusesTheServer) {
  StoreServer server(options());
  ::setenv("BATON_TLS_CA", path("other_ca.pem").c_str(), 1);
  const std::string error = error_connecting(server);
  EXPECT_NE(error.find("TLS handshake failed"), std::string::npos) << error;
  EXPECT_NE(error.find("certificate"), std::string::npos) << error;
  EXPECT_EQ(server.counts().authenticated, 0u);
}

TEST_F(Tls, ACertificateForAnotherHostIsRefused) {
  StoreServer server(options("elsewhere"));
  ::setenv("BATON_TLS_CA", path("ca.pem").c_str(), 1);
  const std::string error = error_connecting(server);
  EXPECT_NE(error.find("TLS handshake failed"), std::string::npos) << error;
  EXPECT_NE(error.find("certificate"), std::string::npos) << error;
}

TEST_F(Tls, AWrongTokenIsStillRejectedOverTls) {
  StoreServer server(options());
  ::setenv("BATON_TLS_CA", path("ca.pem").c_str(), 1);
  const std::string error = error_connecting(server, "not-the-token-000000000");
  EXPECT_NE(error.find("rejected this process's cluster token"), std::string::npos) << error;
  EXPECT_EQ(server.counts().authenticated, 0u);
}

TEST_F(Tls, AMissingCertificateFileIsNamed) {
  try {
    tls::Context::server(path("absent.pem"), path("server.key"));
    FAIL() << "a missing certificate was accepted";
  } catch (const auth::AuthError& e) {
    EXPECT_NE(std::string(e.what()).find(path("absent.pem")), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace baton
