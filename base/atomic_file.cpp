#include "base/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/errors.h"

namespace baton {
namespace fs = std::filesystem;

namespace {

std::string errno_text() { return std::strerror(errno); }

// pid + counter: unique across processes and threads writing the same target.
fs::path temp_path_for(const fs::path& file) {
  static std::atomic<uint64_t> counter{0};
  return fs::path(detail::cat(file.string(), ".tmp.", ::getpid(), ".", counter++));
}

void remove_tree_at(const std::string& path, uintmax_t& removed) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw FileError(detail::cat(path, ": cannot remove: ", errno_text()));
  }
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> names;
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr)
      throw FileError(detail::cat(path, ": cannot list to remove: ", errno_text()));
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    for (const std::string& name : names) remove_tree_at(path + "/" + name, removed);
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT)
      throw FileError(detail::cat(path, ": cannot remove: ", errno_text()));
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    throw FileError(detail::cat(path, ": cannot remove: ", errno_text()));
  }
  ++removed;
}

}  // namespace

uintmax_t remove_tree(const fs::path& path) {
  uintmax_t removed = 0;
  if (!path.empty()) remove_tree_at(path.string(), removed);
  return removed;
}

FileChecksum copy_file_atomically(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  if (!in) throw FileError(detail::cat(from.string(), ": cannot open to copy: ", errno_text()));
  return write_file_atomically(to, [&](const AppendFn& append) {
    std::vector<char> buf(size_t{1} << 20);
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (in.gcount() > 0) append(buf.data(), static_cast<size_t>(in.gcount()));
    }
    if (in.bad()) throw FileError(detail::cat(from.string(), ": cannot read to copy"));
  });
}

std::optional<int64_t> read_step_file(const fs::path& file) {
  std::ifstream in(file);
  if (!in) {
    if (!fs::exists(file)) return std::nullopt;
    throw FileError(detail::cat(file.string(), ": cannot read: ", errno_text()));
  }
  const std::string text(std::istreambuf_iterator<char>(in), {});
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  int64_t step = 0;
  bool ok = begin < end && end - begin <= 18;  // 18 digits cannot overflow
  for (size_t i = begin; ok && i < end; ++i) {
    ok = std::isdigit(static_cast<unsigned char>(text[i])) != 0;
    step = step * 10 + (text[i] - '0');
  }
  if (!ok) throw FileError(file.string() + ": corrupt (expected a step number)");
  return step;
}

std::string describe_step_file(const fs::path& file) {
  try {
    if (const std::optional<int64_t> step = read_step_file(file))
      return detail::cat(file.string(), " still names step ", *step);
    return detail::cat("there is no ", file.string(), " yet (no complete checkpoint)");
  } catch (const std::exception& e) {
    return e.what();
  }
}

void fsync_directory(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename has happened either way
  ::fsync(fd);
  ::close(fd);
}

FileChecksum write_file_atomically(const fs::path& file,
                                   const std::function<void(const AppendFn& append)>& fill) {
  if (!file.parent_path().empty()) {
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    if (ec)
      throw FileError(detail::cat(file.parent_path().string(), ": cannot create: ", ec.message()));
  }
  const fs::path tmp = temp_path_for(file);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw FileError(detail::cat(tmp.string(), ": cannot create: ", errno_text()));
  BlockChecksummer checksum;
  uint64_t written = 0;
  AppendFn append = [&](const void* data, size_t size) {
    checksum.update(data, size);
    auto p = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t n = ::write(fd, p, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw FileError(
            detail::cat(file.string(), ": write failed at byte ", written, ": ", errno_text()));
      }
      written += static_cast<uint64_t>(n);
      p += n;
      size -= static_cast<size_t>(n);
    }
  };
  try {
    fill(append);
    if (::fsync(fd) != 0)
      throw FileError(detail::cat(file.string(), ": fsync failed: ", errno_text()));
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw FileError(detail::cat(file.string(), ": close failed: ", errno_text()));
    if (::rename(tmp.c_str(), file.c_str()) != 0)
      throw FileError(
          detail::cat(file.string(), ": cannot rename ", tmp.string(), " over it: ", errno_text()));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
  fsync_directory(file.parent_path());
  return checksum.finish();
}

FileChecksum write_file_atomically(const fs::path& file, std::string_view contents) {
  return write_file_atomically(
      file, [&](const AppendFn& append) { append(contents.data(), contents.size()); });
}

}  // namespace baton
