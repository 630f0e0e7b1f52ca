// The cluster token and its handshake (net/auth.h): SHA-256 and HMAC
// against the published test vectors, token files, and the handshake over a
// real socket pair.
#include "net/auth.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace baton::auth {
namespace {

std::string hex(const Digest& d) { return to_hex(d.data(), d.size()); }

TEST(Sha256, MatchesTheFips180Vectors) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Padding at the block edges: 55 bytes fit one block, 56 and 64 need two.
  EXPECT_EQ(hex(sha256(std::string(55, 'x'))),
            "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072");
  EXPECT_EQ(hex(sha256(std::string(56, 'x'))),
            "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e");
  EXPECT_EQ(hex(sha256(std::string(64, 'x'))),
            "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c");
}

TEST(Sha256, IncrementalUpdatesEqualOneUpdate) {
  const std::string text(1000, 'q');
  Sha256 s;
  for (size_t at = 0; at < text.size(); at += 37) s.update(text.substr(at, 37));
  EXPECT_EQ(hex(s.finish()), hex(sha256(text)));
}

TEST(HmacSha256, MatchesRfc4231) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than the block is hashed first.
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(ConstantTimeEqual, ComparesEveryByte) {
  uint8_t a[32] = {}, b[32] = {};
  EXPECT_TRUE(constant_time_equal(a, b, 32));
  b[31] = 1;
  EXPECT_FALSE(constant_time_equal(a, b, 32));
  b[31] = 0;
  b[0] = 0x80;
  EXPECT_FALSE(constant_time_equal(a, b, 32));
}

TEST(RandomToken, IsSixtyFourHexCharactersAndFreshEachTime) {
  const std::string a = random_token(), b = random_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

class TokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/baton_token_XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/token";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  void write(const std::string& content, mode_t mode) {
    std::ofstream(path_) << content;
    ASSERT_EQ(::chmod(path_.c_str(), mode), 0);
  }
  std::string dir_, path_;
};

TEST_F(TokenFile, AnOwnerOnlyFileGivesItsTokenWithoutTheTrailingNewline) {
  write("0123456789abcdef0123\n", 0600);
  EXPECT_EQ(read_token_file(path_), "0123456789abcdef0123");
  write("0123456789abcdef0123", 0400);
  EXPECT_EQ(read_token_file(path_), "0123456789abcdef0123");
}

TEST_F(TokenFile, AFileOthersMayReadIsRefusedSayingHowToMendIt) {
  write("0123456789abcdef0123\n", 0644);
  try {
    read_token_file(path_);
    FAIL() << "a 0644 token file was accepted";
  } catch (const AuthError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path_), std::string::npos) << what;
    EXPECT_NE(what.find("mode 0644"), std::string::npos) << what;
    EXPECT_NE(what.find("chmod 600"), std::string::npos) << what;
  }
}

TEST_F(TokenFile, AShortOrMissingTokenIsRefusedNamingTheFile) {
  write("short\n", 0600);
  EXPECT_THROW(
      {
        try {
          read_token_file(path_);
        } catch (const AuthError& e) {
          EXPECT_NE(std::string(e.what()).find("at least 16"), std::string::npos) << e.what();
          throw;
        }
      },
      AuthError);
  try {
    read_token_file(dir_ + "/absent");
    FAIL() << "a missing token file was accepted";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/absent"), std::string::npos) << e.what();
  }
}

// The two sides of the handshake over a socket pair, each in its own thread.
struct Outcome {
  std::string server_error, client_error;
};

Outcome handshake(const std::string& server_token, const std::string& client_token) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Outcome o;
  std::thread server([&] {
    try {
      server_handshake(sv[0], server_token, std::chrono::seconds(10));
    } catch (const std::exception& e) {
      o.server_error = e.what();
    }
    ::close(sv[0]);  // what the server does after a failure
  });
  try {
    client_handshake(sv[1], client_token, std::chrono::seconds(10), "the test server");
  } catch (const std::exception& e) {
    o.client_error = e.what();
  }
  server.join();
  ::close(sv[1]);
  return o;
}

TEST(Handshake, SucceedsWhenBothSidesHoldTheToken) {
  const Outcome o = handshake("the-shared-token-0123", "the-shared-token-0123");
  EXPECT_EQ(o.server_error, "");
  EXPECT_EQ(o.client_error, "");
}

TEST(Handshake, AWrongTokenIsRejectedByTheServerAndTheClientIsToldWhy) {
  const Outcome o = handshake("the-shared-token-0123", "another-jobs-token-456");
  EXPECT_NE(o.server_error.find("wrong cluster token"), std::string::npos) << o.server_error;
  EXPECT_NE(o.client_error.find("rejected this process's cluster token"), std::string::npos)
      << o.client_error;
}

TEST(Handshake, AClientThatSaysNothingIsDroppedAtTheDeadline) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  std::string error;
  try {
    server_handshake(sv[0], "the-shared-token-0123", std::chrono::milliseconds(200));
  } catch (const AuthError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("timed out"), std::string::npos) << error;
  EXPECT_NE(error.find("200 ms"), std::string::npos) << error;
  ::close(sv[0]);
  ::close(sv[1]);
}

}  // namespace
}  // namespace baton::auth
