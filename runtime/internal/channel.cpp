#include "runtime/internal/channel.h"

#include <capnp/serialize.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/errors.h"

namespace baton {

namespace {

constexpr size_t kMaxFdsPerRead = 253;  // SCM_MAX_FD
constexpr size_t kReadChunk = 256 * 1024;

void wait_fd(int fd, short events) {
  pollfd p{fd, events, 0};
  while (poll(&p, 1, -1) < 0 && errno == EINTR) {
  }
}

}  // namespace

OwnedFds::~OwnedFds() {
  for (int fd : fds_) close(fd);
}

Channel::Channel(int fd) : fd_(fd) {
  int flags = fcntl(fd_, F_GETFL);
  fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  buf_.resize(kReadChunk / sizeof(capnp::word));
}

Channel::~Channel() {
  close(fd_);
  for (int fd : fds_) close(fd);
}

Channel::WriteStatus Channel::write_some(const char* data, size_t size, const std::vector<int>& fds,
                                         size_t& offset) {
  iovec iov{const_cast<char*>(data + offset), size - offset};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (offset == 0 && !fds.empty()) {  // the fds travel with the message's first byte
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      offset += static_cast<size_t>(n);
      return WriteStatus::kWrote;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return WriteStatus::kWouldBlock;
    return WriteStatus::kClosed;  // EPIPE, ECONNRESET: the peer is gone
  }
}

bool Channel::send(kj::ArrayPtr<const capnp::word> message, const std::vector<int>& fds) {
  const char* data = reinterpret_cast<const char*>(message.begin());
  const size_t size = message.size() * sizeof(capnp::word);
  std::lock_guard<std::mutex> lock(send_mu_);
  for (size_t offset = 0; offset < size;) {
    switch (write_some(data, size, fds, offset)) {
      case WriteStatus::kWrote: break;
      case WriteStatus::kWouldBlock: wait_fd(fd_, POLLOUT); break;
      case WriteStatus::kClosed: return false;
    }
  }
  return true;
}

Channel::Queued Channel::send_or_queue(Outgoing message) {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (dropped_) return Queued::kSent;
  out_.push_back(std::move(message));
  if (flushing_) return Queued::kQueued;
  // Nothing was ahead of it: write now, as far as the socket takes it. A
  // closed socket drops it; the reader notices the close and reports the death.
  if (flush_locked() != FlushStatus::kWouldBlock) return Queued::kSent;
  flushing_ = true;
  return Queued::kNeedsFlusher;
}

Channel::FlushStatus Channel::flush() {
  std::lock_guard<std::mutex> lock(send_mu_);
  FlushStatus s = flush_locked();
  if (s != FlushStatus::kWouldBlock) flushing_ = false;
  return s;
}

Channel::FlushStatus Channel::flush_locked() {
  while (!out_.empty()) {
    const Outgoing& m = out_.front();
    const char* data = reinterpret_cast<const char*>(m.words->begin());
    const size_t size = m.words->size() * sizeof(capnp::word);
    WriteStatus s = write_some(data, size, m.fds, out_offset_);
    if (s == WriteStatus::kClosed) {
      out_.clear();
      out_offset_ = 0;
      dropped_ = true;
      return FlushStatus::kClosed;
    }
    if (out_offset_ == size) {
      out_.pop_front();
      out_offset_ = 0;
    } else if (s == WriteStatus::kWouldBlock) {
      return FlushStatus::kWouldBlock;
    }
  }
  return FlushStatus::kDone;
}

void Channel::drop_queue() {
  std::lock_guard<std::mutex> lock(send_mu_);
  out_.clear();
  out_offset_ = 0;
  dropped_ = true;
}

Channel::ReadStatus Channel::read_available() {
  bool got = false;
  for (;;) {
    // Keep at least one chunk of room after end_.
    size_t cap = buf_.size() * sizeof(capnp::word);
    if (cap - end_ < kReadChunk) {
      if (begin_ > 0) {
        // Move the unconsumed tail to the front (word-aligned: begin_ is a
        // message boundary, so a multiple of 8).
        auto* bytes = reinterpret_cast<char*>(buf_.data());
        std::memmove(bytes, bytes + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (cap - end_ < kReadChunk) buf_.resize((end_ + 2 * kReadChunk) / sizeof(capnp::word));
    }
    auto* bytes = reinterpret_cast<char*>(buf_.data());
    size_t room = buf_.size() * sizeof(capnp::word) - end_;
    iovec iov{bytes + end_, room};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return got ? ReadStatus::kData : ReadStatus::kWouldBlock;
      return ReadStatus::kClosed;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const auto* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (size_t i = 0; i < count; ++i) fds_.push_back(fds[i]);
    }
    if (n == 0) return got ? ReadStatus::kData : ReadStatus::kClosed;
    end_ += static_cast<size_t>(n);
    got = true;
    if (static_cast<size_t>(n) < room) return ReadStatus::kData;
  }
}

Channel::ReadStatus Channel::read_blocking() {
  for (;;) {
    ReadStatus s = read_available();
    if (s != ReadStatus::kWouldBlock) return s;
    wait_fd(fd_, POLLIN);
  }
}

capnp::ReaderOptions wire_reader_options(size_t message_words) {
  capnp::ReaderOptions options;
  options.nestingLimit = 128;
  options.traversalLimitInWords =
      std::max<uint64_t>(8 * uint64_t{message_words}, uint64_t{1} << 16);
  return options;
}

void Channel::drain(const Handler& handle) {
  drain_raw([&handle](kj::ArrayPtr<const capnp::word>, wire::Envelope::Reader env,
                      std::vector<int> fds) { handle(env, std::move(fds)); });
}

void Channel::drain_raw(const RawHandler& handle) {
  for (;;) {
    size_t avail_words = (end_ - begin_) / sizeof(capnp::word);
    if (avail_words == 0) break;
    kj::ArrayPtr<const capnp::word> avail(
        reinterpret_cast<const capnp::word*>(buf_.data()) + begin_ / sizeof(capnp::word),
        avail_words);
    size_t need = capnp::expectedSizeInWordsFromPrefix(avail);
    if (need > avail_words) break;
    capnp::FlatArrayMessageReader reader(avail.slice(0, need), wire_reader_options(need));
    auto env = reader.getRoot<wire::Envelope>();
    uint32_t nfds = env.getFdCount();
    if (nfds > fds_.size()) {
      throw Error("channel: a message announces " + std::to_string(nfds) +
                  " file descriptors but only " + std::to_string(fds_.size()) + " arrived");
    }
    std::vector<int> fds(fds_.begin(), fds_.begin() + nfds);
    fds_.erase(fds_.begin(), fds_.begin() + nfds);
    begin_ += need * sizeof(capnp::word);
    handle(avail.slice(0, need), env, std::move(fds));
  }
  if (begin_ == end_) begin_ = end_ = 0;
}

}  // namespace baton
