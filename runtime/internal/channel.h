// Channel: one end of a driver <-> worker connection (internal to the runtime).
// A connected Unix stream socket carrying Cap'n Proto messages in the standard
// stream framing, with file descriptors (shared-memory segments) passed as
// SCM_RIGHTS alongside the message that needs them.
//
// Two ways to send. A worker replies with send(), which blocks while the
// socket is full (the driver's I/O thread always reads, so it drains). The
// driver must never block on a worker that does not read (one inside a long
// method, or stopped), so it uses send_or_queue(): the message goes out at
// once if nothing is queued and the socket takes it, otherwise it waits in
// the channel's outgoing queue, in order, for flush() (run by the driver's
// I/O thread when the socket is writable).
//
// Thread safety: send(), send_or_queue(), flush() and drop_queue() may be
// called from any thread (serialised inside); reading (read_available /
// read_blocking / drain) belongs to one thread.
#pragma once

#include <capnp/common.h>
#include <capnp/message.h>
#include <kj/array.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/internal/wire.capnp.h"

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

// File descriptors received with a message, closed when this goes out of
// scope unless taken first: a handler that throws before it hands them on (a
// malformed message's reader throws) leaks none.
class OwnedFds {
 public:
  explicit OwnedFds(std::vector<int> fds = {}) : fds_(std::move(fds)) {}
  ~OwnedFds();
  OwnedFds(const OwnedFds&) = delete;
  OwnedFds& operator=(const OwnedFds&) = delete;
  // One more to close.
  void add(int fd) { fds_.push_back(fd); }
  const std::vector<int>& fds() const { return fds_; }
  // The fds, now the caller's to close.
  std::vector<int> take() {
    std::vector<int> out;
    out.swap(fds_);
    return out;
  }

 private:
  std::vector<int> fds_;
};

// Reader options for a wire message of `message_words` words: what a reader
// may traverse is in proportion to the message (8x, at least 64 Ki words),
// nested at most 128 deep. A list of zero-sized elements counts a word per
// element against it, so a few bytes cannot claim billions of Values for a
// decoder to build (found by fuzz_wire_message). The runtime's decoders read
// each object once or twice.
capnp::ReaderOptions wire_reader_options(size_t message_words);

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
  // REQUIRES: send_or_queue() is not used on this channel.
  bool send(kj::ArrayPtr<const capnp::word> message, const std::vector<int>& fds = {});

  // A message for send_or_queue. The words are shared: one encoding of a
  // call goes to every worker that runs it.
  struct Outgoing {
    std::shared_ptr<const kj::Array<capnp::word>> words;
    // Not owned. REQUIRES: they stay open until the message is written or
    // dropped (the driver holds the segment behind them for the peer; `keep`
    // holds shared tensors' memory).
    std::vector<int> fds;
    std::shared_ptr<void> keep;
  };
  enum class Queued {
    kSent,          // written (or dropped: the peer is gone)
    kQueued,        // queued behind others; a flush is already expected
    kNeedsFlusher,  // queued, and the queue was idle: arrange for flush() to
                    // run once the socket is writable
  };
  // Never blocks. Preserves the order of messages on this channel.
  Queued send_or_queue(Outgoing message);

  enum class FlushStatus { kDone, kWouldBlock, kClosed };
  // Writes queued messages until the queue is empty (kDone) or the socket is
  // full (kWouldBlock: call again once it is writable). kClosed: the peer is
  // gone and the queue was dropped. Never blocks.
  FlushStatus flush();

  // Drops what is queued, and everything sent from now on (the peer is gone
  // or being killed).
  void drop_queue();

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
  // As drain, and the handler also gets the message's words as they arrived
  // (valid during the call): what a relay forwards (runtime/cluster/relay.h).
  using RawHandler = std::function<void(kj::ArrayPtr<const capnp::word> words,
                                        wire::Envelope::Reader, std::vector<int> fds)>;
  void drain_raw(const RawHandler& handle);

 private:
  enum class WriteStatus { kWrote, kWouldBlock, kClosed };
  // One non-blocking sendmsg of data[offset, size); the fds go with byte 0.
  // Advances `offset` by what the socket took. REQUIRES: send_mu_ held.
  WriteStatus write_some(const char* data, size_t size, const std::vector<int>& fds,
                         size_t& offset);
  // flush() without the lock and without touching flushing_ (the callers
  // decide). REQUIRES: send_mu_ held.
  FlushStatus flush_locked();

  int fd_;
  std::mutex send_mu_;
  std::deque<Outgoing> out_;  // guarded by send_mu_
  size_t out_offset_ = 0;     // bytes of out_.front() already written
  bool flushing_ = false;     // a flush() is expected (the owner waits for POLLOUT)
  bool dropped_ = false;      // the peer is gone: sending is a no-op
  // Words (8-byte aligned messages), held as uint64_t: capnp::word cannot be
  // moved, which a growing vector needs under some standard libraries.
  std::vector<uint64_t> buf_;
  size_t begin_ = 0;              // first unconsumed byte
  size_t end_ = 0;                // one past the last received byte
  std::deque<int> fds_;           // received, not yet claimed by a message
};

}  // namespace baton
