#include "net/store_protocol.h"

#include <cstring>

namespace baton::store {
namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_i64(std::string& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

void put_strings(std::string& out, const std::vector<std::string>& items) {
  if (items.size() > kMaxFrameBytes) throw ProtocolError("store message: too many items");
  put_u32(out, static_cast<uint32_t>(items.size()));
  for (const std::string& s : items) {
    if (s.size() > kMaxFrameBytes) {
      throw ProtocolError("store message: an item of " + std::to_string(s.size()) +
                          " bytes exceeds the frame limit of " + std::to_string(kMaxFrameBytes));
    }
    put_u32(out, static_cast<uint32_t>(s.size()));
    out += s;
  }
}

std::string frame(std::string body) {
  if (body.size() > kMaxFrameBytes) {
    throw ProtocolError("store message of " + std::to_string(body.size()) +
                        " bytes exceeds the frame limit of " + std::to_string(kMaxFrameBytes));
  }
  std::string out;
  out.reserve(4 + body.size());
  put_u32(out, static_cast<uint32_t>(body.size()));
  out += body;
  return out;
}

// Reads a body front to back; every read checks what is left.
struct Reader {
  std::string_view body;
  size_t at = 0;
  const char* what;

  [[noreturn]] void fail(const std::string& why) const {
    throw ProtocolError(std::string("malformed store ") + what + ": " + why + " (at byte " +
                        std::to_string(at) + " of " + std::to_string(body.size()) + ")");
  }
  void need(size_t n) const {
    if (body.size() - at < n) fail("it ends early");
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(body[at++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(body[at + i])} << (8 * i);
    at += 4;
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(body[at + i])} << (8 * i);
    at += 8;
    return static_cast<int64_t>(v);
  }
  std::vector<std::string> strings(const char* which) {
    const uint32_t n = u32();
    // Each item takes at least its 4-byte length: a count the rest of the body
    // cannot hold is rejected before anything is reserved.
    if (n > (body.size() - at) / 4) fail(std::string("a ") + which + " count of " + std::to_string(n) + " exceeds the body");
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t len = u32();
      if (len > body.size() - at) fail(std::string("a ") + which + " length of " + std::to_string(len) + " exceeds the body");
      out.emplace_back(body.substr(at, len));
      at += len;
    }
    return out;
  }
  void end() const {
    if (at != body.size()) fail(std::to_string(body.size() - at) + " trailing bytes");
  }
};

// How many keys and values each op takes; -1: any number (at least one).
struct Shape {
  int keys;
  int values;
};

Shape shape_of(Op op) {
  switch (op) {
    case Op::kSet:
    case Op::kAppend:
      return {1, 1};
    case Op::kCompareSet:
      return {1, 2};
    case Op::kGet:
    case Op::kAdd:
    case Op::kDelete:
      return {1, 0};
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return {-1, 0};
    case Op::kNumKeys:
      return {0, 0};
    case Op::kMultiSet:
      return {-1, -1};
  }
  return {0, 0};
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet: return "set";
    case Op::kCompareSet: return "compareSet";
    case Op::kGet: return "get";
    case Op::kAdd: return "add";
    case Op::kDelete: return "deleteKey";
    case Op::kCheck: return "check";
    case Op::kNumKeys: return "getNumKeys";
    case Op::kWait: return "wait";
    case Op::kAppend: return "append";
    case Op::kMultiGet: return "multiGet";
    case Op::kMultiSet: return "multiSet";
  }
  return "unknown";
}

std::string encode(const Request& r) {
  std::string body;
  body.push_back(static_cast<char>(r.op));
  put_i64(body, r.number);
  put_strings(body, r.keys);
  put_strings(body, r.values);
  return frame(std::move(body));
}

std::string encode(const Reply& r) {
  std::string body;
  body.push_back(static_cast<char>(r.status));
  put_i64(body, r.number);
  put_strings(body, r.values);
  return frame(std::move(body));
}

uint32_t frame_length(const uint8_t prefix[4]) {
  const uint32_t n = uint32_t{prefix[0]} | (uint32_t{prefix[1]} << 8) |
                     (uint32_t{prefix[2]} << 16) | (uint32_t{prefix[3]} << 24);
  if (n > kMaxFrameBytes) {
    throw ProtocolError("store frame of " + std::to_string(n) + " bytes exceeds the limit of " +
                        std::to_string(kMaxFrameBytes));
  }
  return n;
}

Request decode_request(std::string_view body) {
  Reader in{body, 0, "request"};
  Request r;
  const uint8_t op = in.u8();
  if (op < static_cast<uint8_t>(Op::kSet) || op > static_cast<uint8_t>(Op::kMultiSet)) {
    in.fail("unknown op " + std::to_string(op));
  }
  r.op = static_cast<Op>(op);
  r.number = in.i64();
  r.keys = in.strings("key");
  r.values = in.strings("value");
  in.end();
  const Shape s = shape_of(r.op);
  const bool keys_ok = s.keys < 0 ? !r.keys.empty() : r.keys.size() == static_cast<size_t>(s.keys);
  const bool values_ok = s.values < 0 ? r.values.size() == r.keys.size()
                                      : r.values.size() == static_cast<size_t>(s.values);
  if (!keys_ok || !values_ok) {
    in.fail(std::string(op_name(r.op)) + " with " + std::to_string(r.keys.size()) + " keys and " +
            std::to_string(r.values.size()) + " values");
  }
  return r;
}

Reply decode_reply(std::string_view body) {
  Reader in{body, 0, "reply"};
  Reply r;
  const uint8_t status = in.u8();
  if (status > static_cast<uint8_t>(Status::kError)) in.fail("unknown status " + std::to_string(status));
  r.status = static_cast<Status>(status);
  r.number = in.i64();
  r.values = in.strings("value");
  in.end();
  if (r.status != Status::kOk && r.values.size() != 1) in.fail("an error reply without its text");
  return r;
}

}  // namespace baton::store
