// CRC-32C: the known answer, the hardware path against the portable one, and
// block checksums of data appended in pieces.
#include "base/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace baton {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Crc32c, KnownAnswers) {
  // The check value of CRC-32C (RFC 3720, the iSCSI CRC).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_software("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720, B.4: 32 bytes of zeros, of 0xff, and 0..31.
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), up(32);
  for (int i = 0; i < 32; ++i) up[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
}

TEST(Crc32c, HardwarePathEqualsSoftwareOnRandomData) {
  if (crc32c_path() != Crc32cPath::kSse42) GTEST_SKIP() << "no SSE4.2 on this CPU";
  EXPECT_EQ(crc32c_sse42("123456789", 9), 0xE3069283u);
  // Longer than three 8 KiB stretches, so that every path of the hardware
  // loop (alignment bytes, long and short stretches, words, tail) runs.
  const std::vector<uint8_t> data = random_bytes(200000, 20261130);
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const size_t offset = rng() % 64;
    const size_t size = i < 300 ? static_cast<size_t>(i) : rng() % (data.size() - offset);
    const uint32_t start = i % 2 ? rng() : 0;
    ASSERT_EQ(crc32c_sse42(data.data() + offset, size, start),
              crc32c_software(data.data() + offset, size, start))
        << "offset " << offset << ", size " << size;
  }
  EXPECT_EQ(crc32c_sse42(data.data(), data.size()), crc32c_software(data.data(), data.size()));
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::vector<uint8_t> data = random_bytes(100000, 11);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {0, 1, 7, 8, 4096, 24576, 99999, 100000}) {
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, crc32c(data.data(), cut)), whole) << cut;
    EXPECT_EQ(
        crc32c_software(data.data() + cut, data.size() - cut, crc32c_software(data.data(), cut)),
        whole)
        << cut;
  }
}

TEST(BlockChecksummer, BlocksDoNotDependOnHowTheBytesArrive) {
  const size_t n = 2 * kChecksumBlockBytes + 12345;
  const std::vector<uint8_t> data = random_bytes(n, 3);
  const FileChecksum whole = checksum_bytes(data.data(), n);
  EXPECT_EQ(whole.size, n);
  ASSERT_EQ(whole.blocks.size(), 3u);
  EXPECT_EQ(whole.blocks[0], crc32c(data.data(), kChecksumBlockBytes));
  EXPECT_EQ(whole.blocks[2], crc32c(data.data() + 2 * kChecksumBlockBytes, 12345));

  BlockChecksummer pieces;
  std::mt19937 rng(5);
  for (size_t at = 0; at < n;) {
    const size_t len = std::min<size_t>(n - at, rng() % 700000);
    pieces.update(data.data() + at, len);
    at += len;
  }
  EXPECT_EQ(pieces.finish(), whole);
  EXPECT_EQ(pieces.finish(), FileChecksum{});  // finish starts over
  EXPECT_TRUE(checksum_bytes(nullptr, 0).blocks.empty());
  EXPECT_EQ(checksum_bytes(data.data(), kChecksumBlockBytes).blocks.size(), 1u);
}

}  // namespace
}  // namespace baton
