#include "base/child_process.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/errors.h"

extern char** environ;

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// How long one poll() waits before the child is checked for having exited:
// a grandchild holding the socket would otherwise hide its death until the
// caller's timeout.
constexpr int kReapEveryMs = 100;

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv) {
  if (argv.empty()) throw Error("ChildProcess: no program to start (argv is empty)");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw Error(detail::cat("cannot start ", argv[0], ": socketpair: ", std::strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int rc = posix_spawnp(&pid_, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(sv[1]);
  fd_ = sv[0];
  if (rc != 0) {
    pid_ = -1;
    close(fd_);
    fd_ = -1;
    throw Error(detail::cat("cannot start ", argv[0], ": ", std::strerror(rc)));
  }
}

ChildProcess::~ChildProcess() { kill(); }

bool ChildProcess::send(std::string_view line) {
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

ChildProcess::Read ChildProcess::read_line(double timeout_s, std::string& line) {
  const auto start = Clock::now();
  for (;;) {
    const size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return Read::kLine;
    }
    if (fd_ < 0) return Read::kExited;
    const double left = timeout_s - seconds_since(start);
    if (left <= 0) return Read::kTimeout;
    pollfd p{fd_, POLLIN, 0};
    const int wait_ms = std::min(kReapEveryMs, static_cast<int>(left * 1000) + 1);
    const int ready = poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      // Nothing to read: whatever it wrote before exiting would be.
      if (reap(false)) return Read::kExited;
      continue;
    }
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // Closed: give the exit a moment to be reaped so exit_reason() can tell it.
      for (int i = 0; i < 50 && !reap(false); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return Read::kExited;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

bool ChildProcess::close_and_wait(double timeout_s) {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  const auto start = Clock::now();
  while (!reap(false) && seconds_since(start) < timeout_s)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool by_itself = exited_ || pid_ <= 0;
  kill();
  return by_itself;
}

void ChildProcess::kill() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (pid_ > 0 && !exited_) {
    ::kill(pid_, SIGKILL);
    reap(true);
  }
  buffer_.clear();
}

bool ChildProcess::reap(bool block) {
  if (pid_ <= 0 || exited_) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    exited_ = true;
    status_ = r == pid_ ? status : 0;
    return true;
  }
  return false;
}

std::string ChildProcess::exit_reason() const {
  if (!exited_) return "is running";
  if (WIFEXITED(status_)) return detail::cat("exited with status ", WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) return detail::cat("was killed by signal ", WTERMSIG(status_));
  return "exited";
}

}  // namespace baton
