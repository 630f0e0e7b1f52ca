// Faults injected into files, for the tests that a flipped byte is refused
// (base/checksum_manifest.h, DataProto files) and that a save into a full
// disk fails cleanly: flip one byte, the byte range an error names for it, a
// file-size limit. Header-only, no baton library.
#pragma once

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace baton::testing {

// XORs the byte at `offset` of `file` with 0x01 (flipping it twice restores it).
inline void flip_byte(const std::filesystem::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) throw std::runtime_error(file.string() + ": cannot open to flip a byte");
  char c = 0;
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(&c, 1);
  if (!f) throw std::runtime_error(file.string() + ": no byte at " + std::to_string(offset));
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// "bytes [begin, end)" of the `block`-byte block of a `size`-byte file that
// holds `offset`, as checksum errors name it.
inline std::string block_range(uint64_t offset, uint64_t size, uint64_t block) {
  const uint64_t begin = offset / block * block;
  return "bytes [" + std::to_string(begin) + ", " + std::to_string(std::min(begin + block, size)) +
         ")";
}

// A file-size limit (RLIMIT_FSIZE) on this process for the life of the
// object, with SIGXFSZ ignored: a write past `bytes` fails with EFBIG, as one
// on a full disk fails with ENOSPC.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = std::min(bytes, saved_.rlim_max);
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0)
      throw std::runtime_error("FileSizeLimit: setrlimit(RLIMIT_FSIZE) failed");
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
};

}  // namespace baton::testing
