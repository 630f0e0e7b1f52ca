// The relay between machines (runtime/cluster/relay.h), on socket pairs in one
// process: a message and its memfds go in on one side's Unix socket, cross a
// stream socket as a frame, and come out on the other side's with new memfds
// holding the same bytes; malformed frames stop the relay with a message.
#include "runtime/cluster/relay.h"

#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runtime/internal/channel.h"

namespace baton {
namespace {

// A memfd of `bytes` bytes, each `fill`.
int memfd_of(size_t bytes, char fill) {
  int fd = memfd_create("relay-test", MFD_CLOEXEC);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  std::vector<char> data(bytes, fill);
  EXPECT_EQ(pwrite(fd, data.data(), bytes, 0), static_cast<ssize_t>(bytes));
  return fd;
}

std::string contents(int fd, size_t bytes) {
  std::string s(bytes, '\0');
  EXPECT_EQ(pread(fd, s.data(), bytes, 0), static_cast<ssize_t>(bytes));
  return s;
}

ino_t inode(int fd) {
  struct stat st {};
  fstat(fd, &st);
  return st.st_ino;
}

// An envelope naming a segment of which the message uses `used` bytes, and
// `extra` more fds (shared tensors' memories).
kj::Array<capnp::word> message(uint64_t call_id, uint64_t segment, uint64_t used, unsigned extra) {
  SmallMessageBuilder b;
  auto env = b.initRoot<wire::Envelope>();
  env.setFdCount((used > 0 ? 1 : 0) + extra);
  env.setSharedBytes(used);
  env.setSegment(segment);
  env.initCall().setCallId(call_id);
  return capnp::messageToFlatArray(b);
}

struct Received {
  uint64_t call_id;
  std::vector<int> fds;
};

// Sender's Unix socket -> pump_to_tcp -> a stream pair -> pump_to_unix ->
// receiver's Unix socket, each pump on a thread of its own.
class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int in[2], wire[2], out[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, in), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, wire), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, out), 0);
    sender_ = std::make_unique<Channel>(in[0]);
    relay_in_ = std::make_unique<Channel>(in[1]);
    wire_out_ = wire[0];
    wire_in_ = wire[1];
    relay_out_ = std::make_unique<Channel>(out[0]);
    receiver_ = std::make_unique<Channel>(out[1]);
    out_conn_ = std::make_unique<auth::Conn>(wire_out_);
    in_conn_ = std::make_unique<auth::Conn>(wire_in_);
    to_tcp_ = std::thread([this] { to_tcp_why_ = relay::pump_to_tcp(*relay_in_, *out_conn_); });
    to_unix_ = std::thread(
        [this] { to_unix_why_ = relay::pump_to_unix(*in_conn_, *relay_out_, "test relay"); });
  }

  void TearDown() override {
    shutdown(wire_out_, SHUT_RDWR);
    shutdown(wire_in_, SHUT_RDWR);
    shutdown(relay_in_->fd(), SHUT_RDWR);
    if (to_tcp_.joinable()) to_tcp_.join();
    if (to_unix_.joinable()) to_unix_.join();
    if (wire_out_ >= 0) close(wire_out_);
    if (wire_in_ >= 0) close(wire_in_);
    wire_out_ = wire_in_ = -1;
  }

  Received receive() {
    Received r{};
    bool got = false;
    while (!got) {
      if (receiver_->read_blocking() == Channel::ReadStatus::kClosed) break;
      receiver_->drain([&](wire::Envelope::Reader env, std::vector<int> fds) {
        r.call_id = env.getCall().getCallId();
        r.fds = std::move(fds);
        got = true;
      });
    }
    return r;
  }

  std::unique_ptr<Channel> sender_, relay_in_, relay_out_, receiver_;
  std::unique_ptr<auth::Conn> out_conn_, in_conn_;
  int wire_out_ = -1, wire_in_ = -1;
  std::thread to_tcp_, to_unix_;
  std::string to_tcp_why_, to_unix_why_;
};

TEST_F(RelayTest, MessagesArriveWithTheBytesBehindTheirFdsAndASegmentIsReusedUntilItGrows) {
  const size_t kSegment = 3 << 20;
  int segment = memfd_of(kSegment, 'a');
  int shared = memfd_of(100000, 's');
  // The message uses 1 MiB + 5 of its 3 MiB segment, and passes a shared memory.
  auto m1 = message(1, 7, (1 << 20) + 5, 1);
  ASSERT_TRUE(sender_->send(m1.asPtr(), {segment, shared}));
  Received r1 = receive();
  EXPECT_EQ(r1.call_id, 1u);
  ASSERT_EQ(r1.fds.size(), 2u);
  EXPECT_NE(inode(r1.fds[0]), inode(segment));  // a copy on the far side
  EXPECT_EQ(contents(r1.fds[0], (1 << 20) + 5), std::string((1 << 20) + 5, 'a'));
  EXPECT_EQ(contents(r1.fds[1], 100000), std::string(100000, 's'));

  // The sender reuses segment 7 with other bytes: the same memfd over there,
  // with the new bytes.
  ASSERT_EQ(pwrite(segment, std::string(1000, 'b').data(), 1000, 0), 1000);
  auto m2 = message(2, 7, 1000, 0);
  ASSERT_TRUE(sender_->send(m2.asPtr(), {segment}));
  Received r2 = receive();
  ASSERT_EQ(r2.fds.size(), 1u);
  EXPECT_EQ(inode(r2.fds[0]), inode(r1.fds[0]));
  EXPECT_EQ(contents(r2.fds[0], 1000), std::string(1000, 'b'));

  // More than the kept copy holds: a new memfd.
  auto m3 = message(3, 7, kSegment, 0);
  ASSERT_TRUE(sender_->send(m3.asPtr(), {segment}));
  Received r3 = receive();
  ASSERT_EQ(r3.fds.size(), 1u);
  EXPECT_NE(inode(r3.fds[0]), inode(r1.fds[0]));
  const std::string all = contents(r3.fds[0], kSegment);
  EXPECT_EQ(all.substr(0, 1000), std::string(1000, 'b'));
  EXPECT_EQ(all.substr(1000), std::string(kSegment - 1000, 'a'));

  // A shared memory is never kept: a new copy each time.
  auto m4 = message(4, 0, 0, 1);
  ASSERT_TRUE(sender_->send(m4.asPtr(), {shared}));
  Received r4 = receive();
  ASSERT_EQ(r4.fds.size(), 1u);
  EXPECT_NE(inode(r4.fds[0]), inode(r1.fds[1]));
  for (auto* r : {&r1, &r2, &r3, &r4})
    for (int fd : r->fds) close(fd);
  close(segment);
  close(shared);

  // The sender goes: the relay stops without complaint, and so does the far side.
  sender_.reset();
  to_tcp_.join();
  EXPECT_EQ(to_tcp_why_, "");
  shutdown(wire_out_, SHUT_RDWR);
  to_unix_.join();
  EXPECT_EQ(to_unix_why_, "");
}

TEST_F(RelayTest, AMessageUsingMoreThanItsSegmentStopsTheRelayNamingIt) {
  int segment = memfd_of(4096, 'a');
  auto m = message(1, 7, 8192, 0);
  ASSERT_TRUE(sender_->send(m.asPtr(), {segment}));
  to_tcp_.join();
  EXPECT_NE(to_tcp_why_.find("uses 8192 bytes of a segment of 4096"), std::string::npos)
      << to_tcp_why_;
  close(segment);
}

TEST_F(RelayTest, MalformedFramesStopTheReceivingRelayNamingWhatIsWrong) {
  struct Case {
    std::vector<uint8_t> bytes;
    std::string want;
  };
  auto frame = [](uint32_t magic, uint32_t fds, uint64_t words) {
    std::vector<uint8_t> b(16);
    std::memcpy(b.data(), &magic, 4);
    std::memcpy(b.data() + 4, &fds, 4);
    std::memcpy(b.data() + 8, &words, 8);
    return b;
  };
  const uint32_t magic = 0x31465442;
  // One case per relay: the first malformed frame ends it.
  const std::vector<Case> cases = {
      {frame(0x12345678, 0, 1), "not a relay frame (bad magic)"},
      {frame(magic, 1000, 1), "a frame with 1000 payloads (at most 253)"},
      {frame(magic, 0, uint64_t{1} << 40), "a frame of 1099511627776 words"},
      {frame(magic, 0, 0), "a frame of 0 words"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    if (i > 0) {  // a fresh relay
      TearDown();
      SetUp();
    }
    auth::write_all(wire_out_, cases[i].bytes.data(), cases[i].bytes.size(),
                    std::chrono::steady_clock::now() + std::chrono::seconds(5));
    to_unix_.join();
    EXPECT_EQ(to_unix_why_, "test relay: " + cases[i].want);
  }
}

}  // namespace
}  // namespace baton
