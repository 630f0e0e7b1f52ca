// CRC-32C (Castagnoli), the checksum of baton's files: checkpoints, HF
// exports and saved DataProtos carry it so that a flipped byte is refused
// instead of loaded (checksum_manifest.h). The same CRC as iSCSI, ext4's
// metadata and LevelDB's blocks; x86-64 computes it with SSE4.2's `crc32`
// instruction, three streams interleaved (docs/benchmarks.md: its cost per GB
// against xxHash's).
//
// Example:
//   uint32_t c = crc32c("123456789", 9);            // 0xE3069283
//   uint32_t d = crc32c(tail, n, crc32c(head, m));  // the CRC of head + tail
//   BlockChecksummer sum;                           // a file's, block by block
//   sum.update(header, 8);
//   sum.update(data, size);
//   FileChecksum f = sum.finish();
//
// Thread safety: every function may be called from any thread. Blocking: no
// I/O; each call runs on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace baton {

// The CRC-32C of `size` bytes at `data`, continuing `crc` (the CRC of the
// bytes before them; 0 to start). Uses the fastest path this CPU has.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// "e3069283": a CRC as eight lower-case hex digits, as baton's files and
// messages write it.
std::string crc32c_hex(uint32_t crc);

// The two paths crc32c chooses between at run time, each callable directly
// for tests and benchmarks: they return the same values.
enum class Crc32cPath { kSoftware, kSse42 };
// kSse42 on an x86-64 CPU that has SSE4.2, else kSoftware.
Crc32cPath crc32c_path();
const char* to_string(Crc32cPath path);
// Portable: eight lookup tables, eight bytes per step.
uint32_t crc32c_software(const void* data, size_t size, uint32_t crc = 0);
// SSE4.2's crc32 instruction. REQUIRES: crc32c_path() == Crc32cPath::kSse42
// (an illegal instruction otherwise).
uint32_t crc32c_sse42(const void* data, size_t size, uint32_t crc = 0);

// A file is checksummed in blocks of this size, so that a mismatch names the
// byte range it lies in (checksum_manifest.h).
inline constexpr size_t kChecksumBlockBytes = size_t{1} << 20;  // 1 MiB

// The blocks of a file of `size` bytes: size / kChecksumBlockBytes, rounded up.
inline uint64_t checksum_blocks(uint64_t size) {
  return size / kChecksumBlockBytes + (size % kChecksumBlockBytes != 0);
}

// A file's size and the CRC-32C of each of its kChecksumBlockBytes blocks
// (the last one may be shorter; an empty file has none).
struct FileChecksum {
  uint64_t size = 0;
  std::vector<uint32_t> blocks;
  bool operator==(const FileChecksum&) const = default;
};

// The FileChecksum of bytes appended in pieces of any size.
class BlockChecksummer {
 public:
  void update(const void* data, size_t size);
  // The checksum of everything appended; the object starts over.
  FileChecksum finish();

 private:
  FileChecksum sum_;
  uint32_t crc_ = 0;
  size_t in_block_ = 0;  // bytes of the current block so far
};

// The FileChecksum of `size` bytes at `data`.
FileChecksum checksum_bytes(const void* data, size_t size);

// The blocks of `size` bytes at `data` whose CRC-32C is not the one `sum`
// lists: the first (its index and the CRC found) and how many there are.
// REQUIRES: sum.size == size.
struct BlockMismatch {
  uint64_t block = 0;
  uint32_t found = 0;
  uint64_t count = 0;
};
std::optional<BlockMismatch> find_mismatch(const FileChecksum& sum, const void* data, size_t size);

}  // namespace baton
