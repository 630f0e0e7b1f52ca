#include "trainer/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <system_error>

#include "base/errors.h"

namespace baton::trainer {
namespace {

// Protobuf's wire format, the few pieces an Event needs.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

template <typename T>
void put_little_endian(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86-64 and every target baton builds for: little endian
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Event { double wall_time = 1; int64 step = 2; ... }
std::string event_header(int64_t step) {
  std::string e;
  put_key(e, 1, kFixed64);
  put_little_endian(e, now_seconds());
  put_key(e, 2, kVarint);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // Castagnoli
      t[i] = c;
    }
    return t;
  }();
  return table;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  const auto& table = crc_table();
  uint32_t c = 0xffffffffu;
  for (unsigned char byte : data) c = table[(c ^ byte) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw Error("TensorBoardWriter: cannot create " + dir.string() + ": " + ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  path_ = dir / ("events.out.tfevents." +
                 std::to_string(static_cast<int64_t>(now_seconds())) + "." + host + "." +
                 std::to_string(::getpid()) + ".0");
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error("TensorBoardWriter: cannot create " + path_.string());
  // Event { ...; string file_version = 3; }
  std::string first = event_header(0);
  put_bytes(first, 3, "brain.Event:2");
  write_record(first);
  flush();
}

void TensorBoardWriter::add(int64_t step, const std::map<std::string, double>& scalars) {
  // Summary { repeated Value value = 1; } Value { string tag = 1; float simple_value = 2; }
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, kFixed32);
    put_little_endian(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  // Event { ...; Summary summary = 5; }
  std::string event = event_header(step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::flush() {
  out_.flush();
  if (!out_) throw Error("TensorBoardWriter: cannot write " + path_.string());
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(data.size()));
  std::string record = length;
  put_little_endian(record, masked_crc32c(length));
  record += data;
  put_little_endian(record, masked_crc32c(data));
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  if (!out_) throw Error("TensorBoardWriter: cannot write " + path_.string());
}

}  // namespace baton::trainer
