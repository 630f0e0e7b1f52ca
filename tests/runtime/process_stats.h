// This process's threads and resident memory, from /proc, for tests that bound
// what a flood of connections may cost.
#pragma once

#include <dirent.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace baton::test {

inline int threads_now() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// VmRSS in KiB; -1 when /proc says nothing.
inline int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

}  // namespace baton::test
