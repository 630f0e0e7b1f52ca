// Fuzzes DataProto files (DataProto::load, what the async trainer's rollout
// ledger and users' saved batches are read with): the magic, the Cap'n Proto
// message, every value a batch holds (inline tensors, columns, meta) and
// DataProto::from_value's checks (row counts, kinds). A malformed file must
// throw baton::Error naming the file, and nothing else: never crash, read
// outside the file's bytes (ASan) or build more than the file can justify
// (the RSS limit). A file that loads must save to bytes that load and save to
// the same bytes again.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "base/errors.h"
#include "dispatch/data_proto.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz.dataproto", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // save() writes beside its path and renames: a real file for the round
  // trip (in TMPDIR, not /dev/shm, whose entries the runtime's tests count).
  static const std::string saved =
      (std::filesystem::temp_directory_path() / ("fuzz_data_proto_" + std::to_string(getpid())))
          .string();
  if (fd < 0 || ftruncate(fd, 0) != 0) __builtin_trap();
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) __builtin_trap();
  baton::DataProto batch;
  try {
    batch = baton::DataProto::load(path);
  } catch (const baton::Error& e) {
    // Refused, naming the file.
    if (std::string(e.what()).find(path) == std::string::npos) __builtin_trap();
    return 0;
  }
  for (const auto& [key, t] : batch.tensors()) {
    // Every byte of every tensor is read: ASan sees one outside the file.
    if (t.numel() > 0) (void)t.contiguous().view(at::kByte).sum().item<int64_t>();
  }
  batch.save(saved);
  const std::string once = read_all(saved);
  baton::DataProto::load(saved).save(saved);
  if (read_all(saved) != once) __builtin_trap();
  std::remove(saved.c_str());
  return 0;
}
