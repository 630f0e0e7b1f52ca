// run_program: run a command line through the shell and capture its exit
// status and combined stdout+stderr. For tests of the command-line tools.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace baton::engine::test {

struct ProgramRun {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out;  // stdout and stderr
};

inline ProgramRun run_program(const std::string& command) {
  ProgramRun r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int raw = ::pclose(p);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

}  // namespace baton::engine::test
