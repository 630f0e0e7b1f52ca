// Workers that die, and drivers that die.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/baton.h"
#include "runtime/internal/process_memory.h"

extern char** environ;

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

std::string died_error(const Future<Value>& f, std::chrono::milliseconds within) {
  try {
    f.get(within);
  } catch (const WorkerDiedError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong error: ") + e.what();
  }
  return "no error";
}

// Waits for a process that is not our child to end, without sleeping.
bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, static_cast<int>(timeout.count()));
  close(fd);
  return r == 1;
}

struct DeathCase {
  const char* how;
  const char* expect;
};

class WorkerDeath : public ::testing::TestWithParam<DeathCase> {};

TEST_P(WorkerDeath, FailsPendingCallsWithinTwoSecondsThenLaterCallsAtOnceAndStopsTheGroup) {
  ResourcePool pool = ResourcePool::cpu(3);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
  std::vector<pid_t> pids = g.pids();
  Future<Value> on_others = g.call_rank(0, "block");
  Future<Value> queued_on_victim;
  Future<Value> on_victim;
  auto t0 = Clock::now();
  if (std::string(GetParam().how) == "sigkill") {
    on_victim = g.call_rank(1, "block");
    queued_on_victim = g.call_rank(1, "count");
    kill(pids[1], SIGKILL);
  } else {
    on_victim = g.call_rank(1, "crash", {GetParam().how});
    queued_on_victim = g.call_rank(1, "count");
  }
  std::string err = died_error(on_victim, std::chrono::seconds(2));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_NE(err.find("worker TestWorker rank 1 (pid " + std::to_string(pids[1]) + ")"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(GetParam().expect), std::string::npos) << err;
  EXPECT_NE(died_error(queued_on_victim, std::chrono::seconds(2)).find(GetParam().expect),
            std::string::npos);

  // Policy: the rest of the group is stopped, its calls fail naming the first death.
  std::string other = died_error(on_others, std::chrono::seconds(5));
  EXPECT_NE(other.find("worker TestWorker rank 0"), std::string::npos) << other;
  EXPECT_NE(other.find("failed: worker TestWorker rank 1"), std::string::npos) << other;
  EXPECT_FALSE(g.alive());
  for (pid_t p : pids) EXPECT_TRUE(wait_gone(p, std::chrono::seconds(5))) << p;

  // Later calls fail at once, without a worker to talk to.
  auto t1 = Clock::now();
  std::string later = died_error(g.call_rank(2, "count"), std::chrono::milliseconds(100));
  EXPECT_LT(Clock::now() - t1, std::chrono::milliseconds(100));
  EXPECT_NE(later.find("rank 2"), std::string::npos) << later;
  EXPECT_THROW(g.call("my_rank").get(), WorkerDiedError);
}

INSTANTIATE_TEST_SUITE_P(
    Runtime, WorkerDeath,
    ::testing::Values(DeathCase{"sigkill", "killed by signal 9 (SIGKILL)"},
                      DeathCase{"abort", "killed by signal 6 (SIGABRT)"},
                      DeathCase{"segfault", "killed by signal 11 (SIGSEGV)"},
                      DeathCase{"exit", "exited with status 3"}),
    [](const auto& info) { return std::string(info.param.how); });

// Everything written to this process's stderr (fd 2) while it lives, for a
// test to wait on: the log pump forwards a worker's stderr there.
class StderrTap {
 public:
  StderrTap() {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe");
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard<std::mutex> lock(mu_);
        text_.append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
      close(fd);
    });
  }
  ~StderrTap() {
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);  // the pipe's last writer goes: the reader sees EOF
    close(saved_);
    reader_.join();
    std::fwrite(text_.data(), 1, text_.size(), stderr);  // still shown in the test's log
  }
  // Whether `needle` was written within `timeout`.
  bool wait_for(const std::string& needle, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return text_.find(needle) != std::string::npos; });
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  int saved_ = -1;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
};

// A worker killed by a fatal signal logs where before it dies: the signal,
// its pid and label, and a backtrace whose frames in the executable carry
// function, file and line (addr2line over the -g1 line tables).
TEST(WorkerCrash, FatalSignalLogsASymbolisedBacktraceBeforeTheWorkerDies) {
  // A loaded CI machine may take a while to read the test binary's line tables.
  setenv("BATON_BACKTRACE_TIMEOUT_MS", "20000", 1);
  StderrTap tap;
  {
    ResourcePool pool = ResourcePool::cpu(1);
    WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
    const pid_t pid = g.pids()[0];
    const std::string err = died_error(g.call_rank(0, "crash", {"segfault"}), std::chrono::seconds(30));
    EXPECT_NE(err.find("killed by signal 11 (SIGSEGV)"), std::string::npos) << err;
    ASSERT_TRUE(tap.wait_for("TestWorker::crash", std::chrono::seconds(10))) << tap.text();
    const std::string log = tap.text();
    EXPECT_NE(log.find("[TestWorker:0] baton: fatal signal 11 (SIGSEGV), fault address"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("pid " + std::to_string(pid) + " (TestWorker:0); backtrace:"),
              std::string::npos)
        << log;
    // The frame of the method that raised names its source line.
    EXPECT_NE(log.find("test_workers.cpp:"), std::string::npos) << log;
  }
  unsetenv("BATON_BACKTRACE_TIMEOUT_MS");
}

// A call through a null pointer leaves the unwinder nothing to follow from the
// faulting pc (0): the handler says so and finds the caller on the stack.
TEST(WorkerCrash, NullCallIsTracedToItsCallerByScanningTheStack) {
  setenv("BATON_BACKTRACE_TIMEOUT_MS", "20000", 1);
  StderrTap tap;
  {
    ResourcePool pool = ResourcePool::cpu(1);
    WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
    const std::string err = died_error(g.call_rank(0, "crash", {"null_call"}), std::chrono::seconds(30));
    EXPECT_NE(err.find("killed by signal 11 (SIGSEGV)"), std::string::npos) << err;
    ASSERT_TRUE(tap.wait_for("TestWorker::crash", std::chrono::seconds(10))) << tap.text();
    const std::string log = tap.text();
    EXPECT_NE(log.find("the unwinder stopped at the signal frame; faulting pc (nil)"),
              std::string::npos)
        << log;
  }
  unsetenv("BATON_BACKTRACE_TIMEOUT_MS");
}

constexpr int64_t kMiB = int64_t{1} << 20;

bool write_file(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A memory cgroup of the test's own, removed when it goes: cgroup v2, or the
// v1 memory hierarchy where that is mounted. Needs root and a writable
// cgroup filesystem; ok() is false otherwise, and why() says which.
class TestMemoryCgroup {
 public:
  TestMemoryCgroup() {
    const std::optional<MemoryCgroupMount>& mount = memory_cgroup_mount();
    if (geteuid() != 0) {
      why_ = "making a memory cgroup needs root";
      return;
    }
    if (!mount) {
      why_ = "no memory cgroup controller is mounted";
      return;
    }
    root_ = mount->root;
    v1_ = mount->v1;
    home_ = memory_cgroup_of(getpid());
    std::string parent = home_;
    if (!v1_) {
      // In v2 processes live in leaves: the test's cgroup is a sibling of
      // this process's, and needs the memory controller from their parent.
      parent = home_.substr(0, home_.empty() ? 0 : home_.rfind('/'));
      const std::string controllers = " " + read_text(root_ + parent + "/cgroup.subtree_control");
      if (controllers.find(" memory") == std::string::npos) {
        why_ =
            "cgroup v2 at " + root_ + parent + " does not give its children the memory controller";
        return;
      }
    }
    const std::string path = parent + "/baton-oom-test-" + std::to_string(getpid());
    if (mkdir((root_ + path).c_str(), 0755) != 0) {
      why_ = "cannot make the cgroup " + root_ + path + ": " + std::strerror(errno);
      return;
    }
    path_ = path;
  }

  ~TestMemoryCgroup() {
    if (path_.empty()) return;
    if (memory_cgroup_of(getpid()) == path_) leave();
    // Its processes are the test's workers, reaped by their group by now.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (rmdir((root_ + path_).c_str()) != 0) {
      if (errno != EBUSY || Clock::now() > deadline) {
        ADD_FAILURE() << "left the cgroup " << root_ << path_
                      << " behind: " << std::strerror(errno);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  bool ok() const { return !path_.empty(); }
  const std::string& why() const { return why_; }
  // Below the cgroup mount, as memory_cgroup_of gives it.
  const std::string& path() const { return path_; }

  // Moves this process in (the processes it starts then are born there), or back home.
  bool enter() { return write_file(root_ + path_ + "/cgroup.procs", std::to_string(getpid())); }
  bool leave() { return write_file(root_ + home_ + "/cgroup.procs", std::to_string(getpid())); }

  int64_t usage() const {
    return std::stoll(
        read_text(root_ + path_ + (v1_ ? "/memory.usage_in_bytes" : "/memory.current")));
  }
  // No swap to escape to, where the kernel has swap accounting.
  bool limit(int64_t bytes) {
    const std::string dir = root_ + path_, text = std::to_string(bytes);
    if (v1_) {
      if (!write_file(dir + "/memory.limit_in_bytes", text)) return false;
      write_file(dir + "/memory.memsw.limit_in_bytes", text);
      return true;
    }
    write_file(dir + "/memory.swap.max", "0");
    return write_file(dir + "/memory.max", text);
  }

 private:
  std::string why_, root_, home_, path_;
  bool v1_ = false;
};

// A worker the kernel's OOM killer ends (here for its cgroup's memory limit)
// is reported as out of memory, with the RSS last seen and the method it was
// in; its group is dead, which is what trainer.max_restarts restarts on.
TEST(WorkerOutOfMemory, AnOomKilledWorkerIsReportedWithItsRssAndTheMethodItWasIn) {
  TestMemoryCgroup cgroup;
  if (!cgroup.ok()) GTEST_SKIP() << cgroup.why();
  ResourcePool pool = ResourcePool::cpu(1);
  // Born in the cgroup, the worker is found there by the driver's first
  // sample of it (the cgroup whose OOM kills then count).
  ASSERT_TRUE(cgroup.enter());
  std::optional<WorkerGroup> g = WorkerGroup::spawn("TestWorker", pool);
  ASSERT_TRUE(cgroup.leave());
  ASSERT_EQ(g->call_rank(0, "count").get().as_int(), 1);
  ASSERT_TRUE(cgroup.limit(cgroup.usage() + 64 * kMiB));
  const std::string pid = std::to_string(g->pids()[0]);

  const std::string err =
      died_error(g->call_rank(0, "hog", {"touch", int64_t{1024}}), std::chrono::seconds(30));
  EXPECT_NE(err.find("worker TestWorker rank 0 (pid " + pid +
                     ") was killed: out of memory (RSS "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(" MiB last seen "), std::string::npos) << err;
  EXPECT_NE(err.find("; SIGKILL from the OOM killer of memory cgroup " + cgroup.path() +
                     ") during TestWorker.hog"),
            std::string::npos)
      << err;
  EXPECT_FALSE(g->alive());
  g.reset();
}

// A worker whose allocation fails (here under an address-space limit, as
// `prlimit --as` sets one) fails the call saying out of memory, with its RSS
// and the limit, and serves the next call.
TEST(WorkerOutOfMemory, AFailedAllocationFailsTheCallSayingOutOfMemoryAndTheWorkerGoesOn) {
  ResourcePool pool = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("TestWorker", pool);
  const pid_t pid = g.pids()[0];
  ASSERT_EQ(g.call_rank(0, "count").get().as_int(), 1);
  const std::optional<MemoryUsage> usage = read_memory_usage(pid);
  ASSERT_TRUE(usage.has_value());
  rlimit as{};
  ASSERT_EQ(prlimit(pid, RLIMIT_AS, nullptr, &as), 0) << std::strerror(errno);
  as.rlim_cur = static_cast<rlim_t>(usage->virtual_bytes + 256 * kMiB);  // room for small things
  if (as.rlim_max != RLIM_INFINITY && as.rlim_max < as.rlim_cur)
    GTEST_SKIP() << "the worker's hard RLIMIT_AS is below what it uses";
  ASSERT_EQ(prlimit(pid, RLIMIT_AS, &as, nullptr), 0) << std::strerror(errno);

  for (const std::string how : {"new", "tensor"}) {
    std::string err = "no error";
    try {
      g.call_rank(0, "hog", {how, int64_t{4096}}).get();
    } catch (const RemoteError& e) {
      err = e.what();
    }
    EXPECT_EQ(err.rfind("TestWorker.hog failed on rank 0: out of memory (RSS ", 0), 0u) << err;
    EXPECT_NE(err.find("; address space "), std::string::npos) << err;
    EXPECT_NE(
        err.find(how == "new" ? "): std::bad_alloc" : "DefaultCPUAllocator: can't allocate memory"),
        std::string::npos)
        << err;
  }
  EXPECT_EQ(g.call_rank(0, "count").get().as_int(), 2);
  EXPECT_TRUE(g.alive());
}

int count_dev_shm() {
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

class DriverDeath : public ::testing::TestWithParam<const char*> {};

// A child driver (this binary, see maybe_run_test_driver) spawns two workers
// with tensors in flight, then dies. Its workers must exit too; as a
// subreaper this test inherits them and can wait for them.
TEST_P(DriverDeath, EveryWorkerExitsAndNoSharedMemoryIsLeft) {
  int shm_before = count_dev_shm();
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back(std::string("BATON_TEST_DRIVER=") + GetParam());
  env.push_back("BATON_TEST_PID_FD=" + std::to_string(fds[1]));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, nullptr};
  pid_t driver = -1;
  ASSERT_EQ(posix_spawn(&driver, exe, nullptr, nullptr, argv, envp.data()), 0);
  close(fds[1]);
  std::string pids_text;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) pids_text.append(buf, n);
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(driver, &status, 0), driver);
  if (std::string(GetParam()) == "kill") {
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  } else {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::vector<pid_t> workers;
  for (size_t pos = 0, nl; (nl = pids_text.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    workers.push_back(std::stoi(pids_text.substr(pos, nl - pos)));
  }
  ASSERT_EQ(workers.size(), 2u) << pids_text;
  for (pid_t w : workers) {
    EXPECT_TRUE(wait_gone(w, std::chrono::seconds(10))) << "worker " << w << " outlived its driver";
    waitpid(w, nullptr, WNOHANG);  // reap it if it was handed to us
  }
  EXPECT_EQ(count_dev_shm(), shm_before);
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

INSTANTIATE_TEST_SUITE_P(Runtime, DriverDeath, ::testing::Values("kill", "exit"));

}  // namespace
}  // namespace baton
