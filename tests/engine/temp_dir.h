// A fresh directory under the system temp dir, removed with its contents when
// the object goes out of scope. For tests.
#pragma once

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace baton::engine::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "baton_test_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    // nftw, not std::filesystem::remove_all: LibTorch 2.11's libtorch.so
    // replaces that with a copy that crashes (base/atomic_file.h); this
    // header also serves tests that link no engine.
    ::nftw(
        path_.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) {
          ::remove(p);  // best effort: go on with the rest
          return 0;
        },
        16, FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace baton::engine::testing
