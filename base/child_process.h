// ChildProcess: a program started with one end of a socket pair as its stdin
// and stdout, spoken to in lines (the Python reward hosts of
// workers/rewards/python_reward.h, the wandb logger of trainer/wandb_writer.h).
// Its stderr is the parent's.
//
// A read waits at most timeout_s and notices the child's death even when a
// grandchild it started still holds the socket open (the child is reaped
// while waiting), so a dead or stuck child never blocks the caller for longer.
//
// Example:
//   ChildProcess p({"python3", "-u", "-c", "import sys; print(sys.stdin.readline(), end='')"});
//   p.send("hello\n");
//   std::string line;
//   if (p.read_line(10.0, line) == ChildProcess::Read::kLine) ...  // line == "hello"
//
// Not thread-safe: one thread uses a ChildProcess at a time.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace baton {

class ChildProcess {
 public:
  // Starts argv[0] (PATH searched) with `argv`. Throws baton::Error naming
  // argv[0] when it cannot start (or argv is empty).
  explicit ChildProcess(std::vector<std::string> argv);
  // Kills (SIGKILL) and reaps the child if it is still running.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Writes `line` (which carries its own '\n'). Blocks while the socket's
  // buffer is full. False when the child has closed its end (it is gone).
  bool send(std::string_view line);

  enum class Read { kLine, kTimeout, kExited };
  // The next line, without its '\n'. kTimeout after timeout_s seconds without
  // one; kExited when the child closed its stdout or exited (exit_reason()
  // says how).
  Read read_line(double timeout_s, std::string& line);

  // Closes our end (the child reads EOF), waits up to timeout_s for the child
  // to exit, then kills it. True when it exited by itself.
  bool close_and_wait(double timeout_s);
  // SIGKILL and reap now.
  void kill();

  // "exited with status 3", "was killed by signal 9", or "is running".
  std::string exit_reason() const;
  pid_t pid() const { return pid_; }

 private:
  // Reaps the child if it has exited; true when it has.
  bool reap(bool block);

  pid_t pid_ = -1;
  int fd_ = -1;  // our end of the socket pair
  int status_ = 0;
  bool exited_ = false;
  std::string buffer_;  // read but not yet returned
};

}  // namespace baton
