// Atomic file replacement: the new contents are written to a temporary file
// beside the target, flushed to disk and renamed over it, so a reader (or a
// crash at any point) sees either the old file or the complete new one.
//
// Example:
//   write_file_atomically(dir / "layout.json", json.dump(2));
//   write_file_atomically(file, [&](const AppendFn& append) {
//     append(header.data(), header.size());
//     append(tensor.data_ptr(), tensor.nbytes());
//   });
//
// Both return the file's block checksums (base/checksum.h), computed from the
// bytes as they are written, for the directory's manifest
// (base/checksum_manifest.h).
//
// Errors: FileError naming the file (the temporary file is removed); a full
// disk (ENOSPC) or a file-size limit (EFBIG) is such an error. An
// exception thrown by `fill` is passed on after the same clean-up. Blocking:
// synchronous I/O including fsync of the file and its directory. Thread
// safety: concurrent calls for the same target do not corrupt it (each writes
// its own temporary file; the last rename wins).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/checksum.h"

namespace baton {

// Appends `size` bytes to the file being written; throws FileError on failure.
using AppendFn = std::function<void(const void* data, size_t size)>;

// Creates the parent directory if missing, then writes `file` through `fill`.
FileChecksum write_file_atomically(const std::filesystem::path& file,
                                   const std::function<void(const AppendFn& append)>& fill);
FileChecksum write_file_atomically(const std::filesystem::path& file, std::string_view contents);

// Copies `from` to `to` through write_file_atomically (read in 1 MiB
// pieces) and returns the checksums of what was written. FileError naming
// the file that could not be read or written.
FileChecksum copy_file_atomically(const std::filesystem::path& from,
                                  const std::filesystem::path& to);

// A pointer file such as a checkpoint root's `latest`, written with
// write_file_atomically: the step number it holds, none when the file does not
// exist. Throws FileError naming the file when it holds anything but one
// step number (at most 18 digits; whitespace around it is allowed, an editor's
// newline).
std::optional<int64_t> read_step_file(const std::filesystem::path& file);
// What such a file says, for the message of a save that failed: "<file>
// still names step 5", "there is no <file> yet (no complete checkpoint)", or
// why it cannot be read. Never throws.
std::string describe_step_file(const std::filesystem::path& file);

// fsync(2) of a directory, so that renames in it are durable. Best effort: an
// unopenable directory is ignored (the rename has happened either way).
void fsync_directory(const std::filesystem::path& dir);

// Removes `path` and, for a directory, everything under it; symbolic links are
// removed, not followed. A missing path is not an error. Returns the entries
// removed; throws FileError naming the entry that could not be removed.
//
// baton's code calls this, never std::filesystem::remove_all: LibTorch 2.11's
// libtorch.so exports a static copy of libstdc++'s filesystem functions, which
// the dynamic linker binds a program's calls to, and its remove_all (either
// overload) calls through a null pointer on a directory: a SIGSEGV seen on an
// H200 and reproduced on the CPU (docs/gpu.md).
// tests/runtime/no_interposed_std_symbols.sh keeps remove_all out.
uintmax_t remove_tree(const std::filesystem::path& path);

}  // namespace baton
