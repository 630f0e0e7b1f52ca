// Relaying the runtime's messages between machines (internal).
//
// On one machine a worker's messages travel over a Unix socket, and their
// large tensors as memfds passed beside them (channel.h, shm_pool.h). Between
// machines there is no fd to pass, so a relay at each end turns one into the
// other: it reads a message and its fds from a Unix socket and writes a frame
// to TCP holding the message's words and, inline, the bytes behind each fd;
// the relay at the other end reads the frame, writes each payload straight
// into a new memfd and passes those with the words to its Unix socket. Each
// side copies the tensor bytes once (the kernel's copy between the socket and
// the mapped memfd); the message itself is forwarded unchanged, so neither the
// driver nor the worker knows that a network is in between.
//
//   frame: "BTF1" u32 fd_count, u64 words, {u64 bytes, u64 segment}[fd_count],
//          the message's words, then each payload in order
//
// A message's own segment (fd 0 when the envelope says sharedBytes > 0) sends
// only the bytes the message uses, with the sender's id of it: the receiving
// relay keeps one memfd per such id and writes the next message in that
// segment over it (the sender reuses a segment only after the receiver
// released it), so a steady stream of calls touches no fresh pages. A shared
// tensor's memfd (segment 0 in the frame) is sent whole and arrives as a new
// copy: across machines, shared tensors have copy semantics.
//
// The control messages between the driver and a node agent (wire.capnp,
// AgentMessage) travel as plain Cap'n Proto stream framing (write_message,
// read_message).
//
// Every TCP connection here is used in one direction only, by one thread
// (a TLS connection may not be read and written from two threads at once):
// a worker has one connection towards it and one from it.
#pragma once

#include <capnp/common.h>
#include <capnp/message.h>
#include <kj/array.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "net/auth.h"

namespace baton {

class Channel;

namespace relay {

// The largest control message read_message accepts.
inline constexpr size_t kMaxControlBytes = size_t{64} << 20;

// Writes `builder`'s message. Throws baton::Error when the connection fails
// or the peer has not taken it all by `deadline`.
void write_message(auth::Conn& conn, capnp::MessageBuilder& builder,
                   std::chrono::steady_clock::time_point deadline =
                       std::chrono::steady_clock::time_point::max());

// Reads one message of at most `max_bytes`. Returns false when the peer closed
// the connection between messages. Throws baton::Error on a truncated or
// oversized message, naming `where`.
bool read_message(auth::Conn& conn, kj::Array<capnp::word>& out, const std::string& where,
                  size_t max_bytes = kMaxControlBytes);

// Forwards every message from the Unix socket behind `from` to `to` until
// either side closes or fails. Returns why it stopped ("" when `from` closed).
std::string pump_to_tcp(Channel& from, auth::Conn& to);

// Forwards every frame from `from` to the Unix socket behind `to` until either
// side closes or fails. Returns why it stopped ("" when `from` closed between
// frames). A malformed frame (a bad magic, more fds than a socket passes, a
// size past the limits) stops it with a message naming `where`.
std::string pump_to_unix(auth::Conn& from, Channel& to, const std::string& where);

}  // namespace relay
}  // namespace baton
