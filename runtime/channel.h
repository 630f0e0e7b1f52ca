// Channel: one end of a driver <-> worker connection (internal to the runtime).
// A connected Unix stream socket carrying Cap'n Proto messages in the standard
// stream framing, with file descriptors (shared-memory segments) passed as
// SCM_RIGHTS alongside the message that needs them.
//
// Thread safety: send() may be called from any thread (serialised inside);
// reading (read_available / read_blocking / drain) belongs to one thread.
#pragma once

#include <capnp/common.h>
#include <capnp/message.h>
#include <kj/array.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "runtime/wire.capnp.h"

namespace baton {

// A message builder whose first segment is inline: building a small message
// allocates nothing until it is flattened.
struct ZeroedScratch {
  static constexpr size_t kWords = 128;
  capnp::word words[kWords]{};  // Cap'n Proto requires a zeroed first segment
};

class SmallMessageBuilder : private ZeroedScratch, public capnp::MallocMessageBuilder {
 public:
  SmallMessageBuilder() : capnp::MallocMessageBuilder(kj::arrayPtr(words, kWords)) {}
};

class Channel {
 public:
  // Takes ownership of `fd` and makes it non-blocking.
  explicit Channel(int fd);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  int fd() const { return fd_; }

  // Sends one flattened message (see capnp::messageToFlatArray) with `fds`
  // (not taken over: the caller still owns them). Blocks while the socket is
  // full. Returns false if the peer has gone.
  bool send(kj::ArrayPtr<const capnp::word> message, const std::vector<int>& fds = {});

  enum class ReadStatus { kData, kWouldBlock, kClosed };
  // Reads whatever is available without blocking.
  ReadStatus read_available();
  // Waits until something is readable, then reads it.
  ReadStatus read_blocking();

  // Calls `handle` for each complete buffered message with the fds that came
  // with it; the handler owns (must close) those fds. Throws baton::Error on a
  // malformed message.
  using Handler = std::function<void(wire::Envelope::Reader, std::vector<int> fds)>;
  void drain(const Handler& handle);

 private:
  int fd_;
  std::mutex send_mu_;
  std::vector<capnp::word> buf_;  // words: messages stay 8-byte aligned
  size_t begin_ = 0;              // first unconsumed byte
  size_t end_ = 0;                // one past the last received byte
  std::deque<int> fds_;           // received, not yet claimed by a message
};

}  // namespace baton
