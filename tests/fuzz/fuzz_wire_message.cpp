// Fuzzes the runtime's receive path on both ends of a worker's socket: the
// input is the bytes as they would arrive on the driver's side (results from
// a worker) or a worker's (calls and constructor arguments from the driver),
// with two memfds passed beside the first byte as a sender passes its
// segments. The channel cuts them into Cap'n Proto messages and hands each
// message the fds it announces; then the value decoder turns every argument
// or result into Values and tensors, reading tensor bytes inline or from the
// memfds. A malformed input must end in an exception (baton::Error, a
// Cap'n Proto or LibTorch error), never in a crash, a hang or a read outside
// the memfds (ASan).
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "runtime/internal/channel.h"
#include "runtime/internal/shm_pool.h"
#include "runtime/internal/value_codec.h"

namespace {

// A memfd of `bytes` bytes of a fixed pattern.
int pattern_memfd(size_t bytes) {
  int fd = memfd_create("fuzz-segment", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) __builtin_trap();
  std::vector<uint8_t> b(bytes);
  for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 131 + 7);
  if (pwrite(fd, b.data(), bytes, 0) != static_cast<ssize_t>(bytes)) __builtin_trap();
  return fd;
}

void decode_list(capnp::List<baton::wire::Value>::Reader values, std::vector<int> fds,
                 uint64_t shared_bytes, baton::ShmRegionCache& regions) {
  baton::ValueDecoder decoder(std::move(fds), shared_bytes, regions, [](baton::SegmentId) {});
  baton::List out = decoder.decode(values);
  (void)out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The socket's buffer holds it all before anyone reads (scripts/fuzz.sh caps -max_len).
  if (size > 100000) return 0;
  static const int segment = pattern_memfd(1 << 20);
  static const int shared = pattern_memfd(1 << 12);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) __builtin_trap();
  if (size > 0) {
    // Both fds go with the first byte, as a sender passes them.
    int fds[2] = {segment, shared};
    iovec iov{const_cast<uint8_t*>(data), size};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
    if (sendmsg(sv[0], &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(size)) __builtin_trap();
  }
  close(sv[0]);
  baton::Channel channel(sv[1]);  // owns sv[1]
  baton::ShmRegionCache regions;
  try {
    for (;;) {
      const baton::Channel::ReadStatus status = channel.read_available();
      channel.drain([&](baton::wire::Envelope::Reader env, std::vector<int> received) {
        // As the runtime's handlers do: closed if the message's reader throws
        // before a decoder owns them (they leaked, and the run ran out of fds).
        baton::OwnedFds owned(std::move(received));
        for (uint64_t id : env.getReleased()) (void)id;
        const uint64_t shared_bytes = env.getSharedBytes();
        switch (env.which()) {
          case baton::wire::Envelope::CALL: {  // a worker reads a call
            auto args = env.getCall().getArgs();
            decode_list(args, owned.take(), shared_bytes, regions);
            (void)env.getCall().getMethod();
            break;
          }
          case baton::wire::Envelope::INIT: {  // ... or its constructors' arguments
            const std::vector<int> fds = owned.take();
            baton::OwnedFds originals(fds);
            for (auto role : env.getInit().getRoles()) {
              (void)role.getClassName();
              std::vector<int> copies;
              for (int fd : fds) copies.push_back(dup(fd));
              baton::OwnedFds held(copies);
              auto args = role.getInitArgs();
              decode_list(args, held.take(), shared_bytes, regions);
            }
            break;
          }
          case baton::wire::Envelope::RESULT: {  // the driver reads a result
            auto r = env.getResult();
            if (r.isValue()) {
              baton::ValueDecoder decoder(owned.take(), shared_bytes, regions,
                                          [](baton::SegmentId) {});
              baton::Value v = decoder.decode(r.getValue());
              (void)v;
            } else {
              (void)r.getError().getMessage();
            }
            break;
          }
          default:
            break;
        }
      });
      if (status != baton::Channel::ReadStatus::kData) break;
    }
  } catch (const std::exception&) {
    // A malformed message: the runtime drops the peer that sent it.
  }
  return 0;
}
