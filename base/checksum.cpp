#include "base/checksum.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace baton {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // Castagnoli's, bit-reversed

struct SliceTables {
  uint32_t t[8][256];
};

// Slicing-by-8: t[0] is the byte-at-a-time table, t[k] advances t[k-1] by one
// more byte, so eight bytes are eight lookups.
constexpr SliceTables make_slice_tables() {
  SliceTables s{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    s.t[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; ++n)
    for (int k = 1; k < 8; ++k) s.t[k][n] = (s.t[k - 1][n] >> 8) ^ s.t[0][s.t[k - 1][n] & 0xff];
  return s;
}
constexpr SliceTables kSlices = make_slice_tables();

uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian, any alignment
  return v;
}

#if defined(__x86_64__)

// The hardware path runs three CRCs over three adjacent stretches of n bytes
// at once (the instruction's latency is 3 cycles, its throughput 1), then
// joins them: CRC(a + b) = shift_n(CRC(a)) ^ CRC_from_zero(b), where shift_n
// is the linear map "append n zero bytes", tabulated per byte of its operand
// (Mark Adler's crc32c.c).
constexpr size_t kLongStretch = 8192;
constexpr size_t kShortStretch = 256;

using ShiftTable = uint32_t[4][256];

uint32_t gf2_times(const uint32_t* matrix, uint32_t vector) {
  uint32_t sum = 0;
  for (; vector != 0; vector >>= 1, ++matrix)
    if (vector & 1) sum ^= *matrix;
  return sum;
}

void gf2_square(uint32_t* square, const uint32_t* matrix) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_times(matrix, matrix[n]);
}

// The table of "append `bytes` zero bytes" (a power of two).
void make_shift_table(ShiftTable& table, size_t bytes) {
  uint32_t odd[32], even[32];
  odd[0] = kPolynomial;  // one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = uint32_t{1} << (n - 1);
  gf2_square(even, odd);  // two zero bits
  gf2_square(odd, even);  // four
  const uint32_t* op = nullptr;
  for (;;) {  // eight zero bits (one byte), then doubling until `bytes` runs out
    gf2_square(even, odd);
    bytes >>= 1;
    if (bytes == 0) {
      op = even;
      break;
    }
    gf2_square(odd, even);
    bytes >>= 1;
    if (bytes == 0) {
      op = odd;
      break;
    }
  }
  for (uint32_t n = 0; n < 256; ++n)
    for (int k = 0; k < 4; ++k) table[k][n] = gf2_times(op, n << (8 * k));
}

struct ShiftTables {
  ShiftTable long_stretch, short_stretch;
  ShiftTables() {
    make_shift_table(long_stretch, kLongStretch);
    make_shift_table(short_stretch, kShortStretch);
  }
};

const ShiftTables& shift_tables() {
  static const ShiftTables tables;
  return tables;
}

uint32_t shift(const ShiftTable& table, uint32_t crc) {
  return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
         table[3][crc >> 24];
}

// Consumes whole groups of three stretches of `n` bytes from p.
__attribute__((target("sse4.2"))) void three_streams(const uint8_t*& p, size_t& size, uint64_t& crc,
                                                     size_t n, const ShiftTable& table) {
  while (size >= 3 * n) {
    uint64_t crc1 = 0, crc2 = 0;
    const uint8_t* end = p + n;
    do {
      crc = _mm_crc32_u64(crc, load64(p));
      crc1 = _mm_crc32_u64(crc1, load64(p + n));
      crc2 = _mm_crc32_u64(crc2, load64(p + 2 * n));
      p += 8;
    } while (p < end);
    crc = shift(table, static_cast<uint32_t>(crc)) ^ crc1;
    crc = shift(table, static_cast<uint32_t>(crc)) ^ crc2;
    p += 2 * n;
    size -= 3 * n;
  }
}

Crc32cPath detect_path() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") ? Crc32cPath::kSse42 : Crc32cPath::kSoftware;
}

#endif  // __x86_64__

}  // namespace

uint32_t crc32c_software(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto& t = kSlices.t;
  crc = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    const uint64_t v = load64(p) ^ crc;
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
          t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; size > 0; ++p, --size) crc = t[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#if defined(__x86_64__)

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t size,
                                                        uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  for (; size > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; ++p, --size)
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  const ShiftTables& tables = shift_tables();
  three_streams(p, size, c, kLongStretch, tables.long_stretch);
  three_streams(p, size, c, kShortStretch, tables.short_stretch);
  for (; size >= 8; p += 8, size -= 8) c = _mm_crc32_u64(c, load64(p));
  for (; size > 0; ++p, --size) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  return ~static_cast<uint32_t>(c);
}

Crc32cPath crc32c_path() {
  static const Crc32cPath path = detect_path();
  return path;
}

#else  // no hardware path on this architecture: crc32c_path() is kSoftware

uint32_t crc32c_sse42(const void* data, size_t size, uint32_t crc) {
  return crc32c_software(data, size, crc);
}

Crc32cPath crc32c_path() { return Crc32cPath::kSoftware; }

#endif

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

const char* to_string(Crc32cPath path) {
  return path == Crc32cPath::kSse42 ? "sse4.2" : "software";
}

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  return crc32c_path() == Crc32cPath::kSse42 ? crc32c_sse42(data, size, crc)
                                             : crc32c_software(data, size, crc);
}

void BlockChecksummer::update(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t n = std::min(size, kChecksumBlockBytes - in_block_);
    crc_ = crc32c(p, n, crc_);
    in_block_ += n;
    sum_.size += n;
    p += n;
    size -= n;
    if (in_block_ == kChecksumBlockBytes) {
      sum_.blocks.push_back(crc_);
      crc_ = 0;
      in_block_ = 0;
    }
  }
}

FileChecksum BlockChecksummer::finish() {
  if (in_block_ > 0) sum_.blocks.push_back(crc_);
  FileChecksum out = std::move(sum_);
  *this = BlockChecksummer();
  return out;
}

FileChecksum checksum_bytes(const void* data, size_t size) {
  BlockChecksummer sum;
  sum.update(data, size);
  return sum.finish();
}

std::optional<BlockMismatch> find_mismatch(const FileChecksum& sum, const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  std::optional<BlockMismatch> out;
  for (uint64_t i = 0; i < sum.blocks.size(); ++i) {
    const uint64_t begin = i * kChecksumBlockBytes;
    const uint32_t found =
        crc32c(bytes + begin, std::min<uint64_t>(kChecksumBlockBytes, size - begin));
    if (found == sum.blocks[i]) continue;
    if (!out) out = BlockMismatch{i, found, 0};
    ++out->count;
  }
  return out;
}

}  // namespace baton
