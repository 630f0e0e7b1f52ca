// Fuzzes the rendezvous store's frame decoding (net/store_protocol.h): the
// input is a frame body, as a StoreServer reads it from an authenticated peer
// (a request) or an AuthStore client from the server (a reply). A body that is
// malformed must throw ProtocolError; one that decodes must encode back to the
// same bytes and decode to the same message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/store_protocol.h"

namespace {

using baton::store::ProtocolError;

bool same(const baton::store::Request& a, const baton::store::Request& b) {
  return a.op == b.op && a.number == b.number && a.keys == b.keys && a.values == b.values;
}

bool same(const baton::store::Reply& a, const baton::store::Reply& b) {
  return a.status == b.status && a.number == b.number && a.values == b.values;
}

// encode(decoded) is a whole frame: its prefix must give the body's length and
// its body must be `body` itself (decoding reads every byte, each field once).
template <typename Message, typename Decode>
void check_round_trip(std::string_view body, const Message& decoded, Decode decode) {
  const std::string frame = baton::store::encode(decoded);
  if (frame.size() < 4) __builtin_trap();
  const auto* prefix = reinterpret_cast<const uint8_t*>(frame.data());
  if (baton::store::frame_length(prefix) != frame.size() - 4) __builtin_trap();
  const std::string_view again(frame.data() + 4, frame.size() - 4);
  if (again != body) __builtin_trap();
  if (!same(decode(again), decoded)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  if (size >= 4) {
    try {
      baton::store::frame_length(data);
    } catch (const ProtocolError&) {
    }
  }
  try {
    const baton::store::Request request = baton::store::decode_request(body);
    check_round_trip(body, request, baton::store::decode_request);
  } catch (const ProtocolError&) {
  }
  try {
    const baton::store::Reply reply = baton::store::decode_reply(body);
    check_round_trip(body, reply, baton::store::decode_reply);
  } catch (const ProtocolError&) {
  }
  return 0;
}
