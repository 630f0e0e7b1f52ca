// The driver's side of a channel never blocks on a peer that does not read.
#include "runtime/internal/channel.h"

#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

namespace baton {
namespace {

// A call message with a ~60 KB method name (the payload is what matters),
// announcing `fds` file descriptors.
Channel::Outgoing call_message(uint64_t id, std::vector<int> fds = {}) {
  SmallMessageBuilder builder;
  auto env = builder.initRoot<wire::Envelope>();
  env.setFdCount(static_cast<uint32_t>(fds.size()));
  auto call = env.initCall();
  call.setCallId(id);
  call.setMethod(std::string(60000, 'm'));
  return {std::make_shared<kj::Array<capnp::word>>(capnp::messageToFlatArray(builder)),
          std::move(fds), nullptr};
}

ino_t inode(int fd) {
  struct stat st {};
  fstat(fd, &st);
  return st.st_ino;
}

TEST(Channel, SendOrQueueNeverBlocksOnAPeerThatDoesNotReadAndKeepsTheOrder) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Channel driver(sv[0]);
  Channel worker(sv[1]);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);

  // Far more than a socket buffers (about 208 KiB): if send_or_queue
  // blocked, this loop would never end, as nobody reads yet.
  constexpr int kMessages = 40;
  std::vector<Channel::Queued> how;
  for (int i = 0; i < kMessages; ++i) {
    std::vector<int> fds;
    if (i == kMessages - 1) fds.push_back(pipe_fds[1]);  // travels with a queued message
    how.push_back(driver.send_or_queue(call_message(static_cast<uint64_t>(i), fds)));
  }
  // Sent while the socket took them, then queued; exactly one message asks
  // its sender to arrange a flush.
  EXPECT_EQ(how.front(), Channel::Queued::kSent);
  EXPECT_EQ(how.back(), Channel::Queued::kQueued);
  EXPECT_EQ(std::count(how.begin(), how.end(), Channel::Queued::kNeedsFlusher), 1);

  // The peer reads; each flush writes what it has room for.
  std::vector<uint64_t> ids;
  std::vector<int> received_fds;
  Channel::FlushStatus flushed = Channel::FlushStatus::kWouldBlock;
  for (int round = 0; round < 100000 && ids.size() < kMessages; ++round) {
    if (flushed == Channel::FlushStatus::kWouldBlock) flushed = driver.flush();
    worker.read_available();
    worker.drain([&](wire::Envelope::Reader env, std::vector<int> fds) {
      ids.push_back(env.getCall().getCallId());
      for (int fd : fds) received_fds.push_back(fd);
    });
  }
  EXPECT_EQ(flushed, Channel::FlushStatus::kDone);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(ids[i], static_cast<uint64_t>(i));
  ASSERT_EQ(received_fds.size(), 1u);
  EXPECT_EQ(inode(received_fds[0]), inode(pipe_fds[1]));  // the same pipe, passed on
  for (int fd : received_fds) close(fd);

  // Nothing queued now: a message goes straight out.
  EXPECT_EQ(driver.send_or_queue(call_message(kMessages)), Channel::Queued::kSent);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(Channel, AQueueForAPeerThatHasGoneIsDroppedNotWaitedOn) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Channel driver(sv[0]);
  {
    Channel worker(sv[1]);
    while (driver.send_or_queue(call_message(0)) == Channel::Queued::kSent) {
    }
  }  // the peer closes with messages still queued
  EXPECT_EQ(driver.flush(), Channel::FlushStatus::kClosed);
  EXPECT_EQ(driver.send_or_queue(call_message(1)), Channel::Queued::kSent);  // dropped
  EXPECT_EQ(driver.flush(), Channel::FlushStatus::kDone);
}

// A list whose elements claim no size costs its sender nothing per element.
// The reader charges a word per element against a traversal limit in
// proportion to the message, so a 100-byte message cannot hand the decoder
// 2^28 Values to build (it could: fuzz_wire_message ran out of memory).
TEST(Channel, AListOfZeroSizedElementsCannotClaimMoreThanTheMessageCarries) {
  SmallMessageBuilder builder;
  auto args = builder.initRoot<wire::Envelope>().initCall().initArgs(3);
  for (auto a : args) a.setInt(7);
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  // The list's tag word: a struct "pointer" whose offset is the element count.
  const auto size = capnp::_::structSize<wire::Value>();
  const uint64_t tag = (uint64_t{3} << 2) | (uint64_t{size.data} << 32) |
                       (uint64_t{size.pointers} << 48);
  auto* raw = reinterpret_cast<uint64_t*>(words.begin());
  size_t patched = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    if (raw[i] == tag) {
      raw[i] = uint64_t{1} << 28 << 2;  // 2^28 elements of no size
      ++patched;
    }
  }
  ASSERT_EQ(patched, 1u);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Channel sender(sv[0]);
  Channel receiver(sv[1]);
  ASSERT_TRUE(sender.send(words.asPtr()));
  receiver.read_blocking();
  size_t messages = 0;
  receiver.drain([&](wire::Envelope::Reader env, std::vector<int>) {
    ++messages;
    EXPECT_ANY_THROW(env.getCall().getArgs());  // kj's "amplified list pointer"
  });
  EXPECT_EQ(messages, 1u);
}

}  // namespace
}  // namespace baton
