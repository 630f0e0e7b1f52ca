// Fuzzes the safetensors reader (engine/io/safetensors.h) on a whole file: the
// 8-byte header length, the JSON header (dtypes, shapes, data_offsets,
// __metadata__) and the data area. A malformed file must throw (EngineError,
// or a LibTorch error), never crash or read outside the file (ASan); a file
// that reads must give tensors whose bytes lie within it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <string>

#include "engine/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.safetensors", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0) __builtin_trap();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) __builtin_trap();
  try {
    std::map<std::string, std::string> metadata;
    baton::engine::TensorMap tensors = baton::engine::read_safetensors(path, &metadata);
    for (const auto& [name, t] : tensors) {
      // Every byte of every tensor is read: ASan sees one outside the file.
      if (t.numel() > 0) (void)t.contiguous().view(at::kByte).sum().item<int64_t>();
    }
  } catch (const std::exception&) {
    // Refused with a message.
  }
  return 0;
}
