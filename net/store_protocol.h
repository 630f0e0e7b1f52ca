// The rendezvous store's messages (internal to the runtime): what an
// AuthStore client (runtime/internal/auth_store.h) asks a StoreServer
// (net/store_server.h) once the connection is authenticated
// (net/auth.h).
//
// Every message is a frame: a little-endian u32 body length, then the body.
//   request body: op u8, number i64, key count u32, keys, value count u32, values
//   reply body:   status u8, number i64, value count u32, values
// where each key or value is a u32 length and its bytes. `number` is the
// delta of kAdd, the timeout in milliseconds of the operations that wait (0:
// without end), the result of kAdd/kDelete/kCheck/kNumKeys. A reply's error
// text is its one value.
//
// Decoding never trusts a length: a frame above kMaxFrameBytes, a count or a
// length past the body's end, a wrong number of keys or values for the op,
// trailing bytes — each is a ProtocolError naming it.
//
// Plain C++ (no LibTorch): fuzzed on its own (tests/fuzz).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.h"

namespace baton::store {

enum class Op : uint8_t {
  kSet = 1,
  kCompareSet = 2,  // keys {k}, values {expected, desired}
  kGet = 3,         // waits for the key
  kAdd = 4,
  kDelete = 5,
  kCheck = 6,
  kNumKeys = 7,
  kWait = 8,
  kAppend = 9,
  kMultiGet = 10,  // waits for every key
  kMultiSet = 11,
};

enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

struct Request {
  Op op = Op::kSet;
  int64_t number = 0;
  std::vector<std::string> keys;
  std::vector<std::string> values;
};

struct Reply {
  Status status = Status::kOk;
  int64_t number = 0;
  std::vector<std::string> values;
};

class ProtocolError : public Error {
 public:
  using Error::Error;
};

// The largest frame body either side sends or accepts: 64 MiB.
inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

const char* op_name(Op op);

// A whole frame (length prefix included). Throws ProtocolError when the body
// would exceed kMaxFrameBytes.
std::string encode(const Request& r);
std::string encode(const Reply& r);

// The body's length from a frame's 4-byte prefix. Throws ProtocolError past
// kMaxFrameBytes.
uint32_t frame_length(const uint8_t prefix[4]);

// Decodes a frame's body. Throws ProtocolError naming what is malformed.
Request decode_request(std::string_view body);
Reply decode_reply(std::string_view body);

}  // namespace baton::store
