// Files that cannot silently lie: the CRC-32C of every 1 MiB block of each
// file a directory holds (a checkpoint, an HF export, a sharded model), listed
// in a manifest beside them, `baton-checksums.txt`. The writer computes the
// checksums as it writes (write_file_atomically returns them) and writes the
// manifest last; the readers check every block of a file they read against
// it, so a flipped byte is refused naming the file and the byte range, never
// loaded as garbage. The manifest carries its own checksum on its last line.
//
//   baton-checksums-v1 crc32c 1048576
//   config.json 712 1a2b3c4d
//   model-tp0-pp0.safetensors 3145736 01234567 89abcdef 0badf00d
//   end 3c4d5e6f
//
// Example:
//   ChecksumManifest m;
//   m.add("layout.json", write_file_atomically(dir / "layout.json", text));
//   m.write(dir);                          // dir/baton-checksums.txt, atomically
//   ...
//   verify_file_bytes(dir / "layout.json", bytes.data(), bytes.size());
//
// Verification is on by default; BATON_VERIFY_CHECKSUMS=0 turns it off (for a
// file edited on purpose). A directory without a manifest (an HF model from
// the Hub, a checkpoint written before baton checksummed them) is read
// unverified; checkpoint.h logs a warning for the latter.
//
// Errors: ChecksumError (a FileError) naming the file and the byte range that
// does not match; FileError for a manifest that cannot be read or written.
// Blocking: synchronous file I/O. Thread safety: a ChecksumManifest is a value
// (copy it, no shared state); the free functions may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/checksum.h"
#include "base/errors.h"

namespace baton {

inline constexpr const char* kChecksumManifestFile = "baton-checksums.txt";

// A file's bytes do not match their checksum: what() names the file, the byte
// range [begin, end) and the manifest.
class ChecksumError : public FileError {
 public:
  using FileError::FileError;
};

class ChecksumManifest {
 public:
  // `name` is a path relative to the manifest's directory, without
  // whitespace or control characters (InvalidArgument otherwise). Replaces an
  // entry of the same name.
  void add(const std::string& name, FileChecksum sum);
  // Adds every entry of `other`.
  void merge(const ChecksumManifest& other);
  // Null when the manifest does not list `name`.
  const FileChecksum* find(const std::string& name) const;
  const std::map<std::string, FileChecksum>& files() const { return files_; }

  // The text above, its last line the CRC-32C of the lines before it.
  std::string to_text() const;
  // Parses to_text()'s output; `file` names it in errors: ChecksumError when
  // its own checksum does not match, FileError when it is malformed.
  static ChecksumManifest parse(std::string_view text, const std::filesystem::path& file);

  // Writes dir/`name` atomically (fsynced, the directory too). Another name
  // than the manifest's serves writers that merge several (checkpoint.h).
  void write(const std::filesystem::path& dir,
             const std::string& name = kChecksumManifestFile) const;
  // dir/`name`; none when it does not exist.
  static std::optional<ChecksumManifest> read(const std::filesystem::path& dir,
                                              const std::string& name = kChecksumManifestFile);

  // Checks `size` bytes at `data`, the contents of `file`, against the entry
  // `name`. Throws ChecksumError naming `file`, the first byte range that
  // differs (and how many more blocks do) and `manifest_file`; a size that
  // differs is refused as the range between the two sizes.
  void verify(const std::filesystem::path& file, const std::string& name, const void* data,
              size_t size, const std::filesystem::path& manifest_file) const;

 private:
  std::map<std::string, FileChecksum> files_;
};

// False only when the environment sets BATON_VERIFY_CHECKSUMS to 0, false,
// off or no.
bool checksum_verification_enabled();

// Checks the bytes of `file` (all of them, read by the caller) against the
// manifest of the file's directory, when verification is on and that
// directory has a manifest listing the file; does nothing otherwise. Throws
// ChecksumError as ChecksumManifest::verify does, or for a corrupt manifest.
void verify_file_bytes(const std::filesystem::path& file, const void* data, size_t size);

// Removes dir/kChecksumManifestFile if it exists: a writer about to change
// the directory's files voids its manifest first.
void remove_checksum_manifest(const std::filesystem::path& dir);

}  // namespace baton
