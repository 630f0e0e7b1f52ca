// baton::init forgotten: spawning without it fails in the driver and starts
// nothing, and a worker process never starts workers of its own (no fork
// bomb). The drivers that get init wrong are forgets_init_driver, run as
// programs; a worker method that spawns runs in this binary's workers.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/baton.h"

extern char** environ;

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;

// Spawns a group from inside a worker method.
class Spawner : public Worker {
 public:
  std::string spawn_group() {
    ResourcePool pool = ResourcePool::cpu(1);
    WorkerGroup g = WorkerGroup::spawn("Spawner", pool);
    return "spawned";
  }
  static void register_methods(MethodTable<Spawner>& t) {
    t.def("spawn_group", &Spawner::spawn_group);
  }
};
BATON_WORKER(Spawner);

// Waits for a process to end (it need not be our child), without sleeping.
bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, static_cast<int>(timeout.count()));
  close(fd);
  return r == 1;
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    size_t paren = text.rfind(')');  // the command name may hold spaces
    if (paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(text.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
      out.push_back(pid);
    }
  }
  closedir(d);
  return out;
}

struct DriverRun {
  bool finished = false;  // within the deadline; otherwise its process group was killed
  int status = 0;         // wait status
  std::string output;     // stdout and stderr
  std::vector<pid_t> started;      // every process that ran its main()
  std::vector<std::string> errors;  // "<pid> <message>" of each that failed to spawn
  bool processes_left = true;      // any process of its process group alive at the end
};

// Runs forgets_init_driver `mode` in a process group of its own, as a
// subreaper so that its orphaned workers are handed to us, and kills the
// whole group if it has not finished within `deadline`.
DriverRun run_driver(const std::string& mode, std::chrono::seconds deadline) {
  DriverRun run;
  const std::string log = ::testing::TempDir() + "baton_init_test_" + mode + "_" +
                          std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  EXPECT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int out[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("BATON_TEST_PROCESS_LOG=" + log);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = BATON_FORGETS_INIT_DRIVER;
  std::vector<char*> argv{exe.data(), const_cast<char*>(mode.c_str()), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t driver = -1;
  int rc = posix_spawn(&driver, exe.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  EXPECT_EQ(rc, 0) << exe;
  if (rc != 0) {
    close(out[0]);
    return run;
  }

  // Output until the driver and everything holding its stdout have gone.
  auto until = Clock::now() + deadline;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    pollfd p{out[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    run.output.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  run.finished = left.count() > 0 && wait_gone(driver, left);
  if (!run.finished) kill(-driver, SIGKILL);
  waitpid(driver, &run.status, 0);

  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("start ", 0) == 0) run.started.push_back(std::stoi(line.substr(6)));
    if (line.rfind("error ", 0) == 0) run.errors.push_back(line.substr(6));
  }
  std::remove(log.c_str());
  // Workers outlive their driver only briefly (parent-death signal); reap the
  // ones handed to us, then nothing of the driver's process group may remain.
  for (pid_t p : run.started) {
    if (p == driver) continue;
    if (!wait_gone(p, std::chrono::seconds(10))) kill(p, SIGKILL);
    waitpid(p, nullptr, WNOHANG);
  }
  run.processes_left = !(kill(-driver, 0) == -1 && errno == ESRCH);
  if (run.processes_left) {
    kill(-driver, SIGKILL);
    while (waitpid(-driver, nullptr, WNOHANG) > 0) {
    }
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  return run;
}

TEST(Init, SpawningWithoutInitThrowsSayingToCallItAndStartsNoProcess) {
  DriverRun run = run_driver("no-init", std::chrono::seconds(60));
  ASSERT_TRUE(run.finished) << "killed after 60 s; output:\n" << run.output;
  EXPECT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3) << run.output;
  EXPECT_NE(run.output.find("cannot spawn WorkerGroup of Echo: baton::init(argc, argv) was not "
                            "called. Call it first thing in main()"),
            std::string::npos)
      << run.output;
  // Only the driver ran main(): no worker was started.
  EXPECT_EQ(run.started.size(), 1u) << run.output;
  EXPECT_EQ(run.errors.size(), 1u) << run.output;
  EXPECT_FALSE(run.processes_left);
}

TEST(Init, AWorkerThatSkipsInitRefusesToSpawnAndTheDriverFailsToStartTheGroup) {
  DriverRun run = run_driver("driver-only", std::chrono::seconds(60));
  ASSERT_TRUE(run.finished) << "killed after 60 s; output:\n" << run.output;
  EXPECT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3) << run.output;
  EXPECT_NE(run.output.find("failed to start"), std::string::npos) << run.output;
  // The driver and its workers ran main(); no worker started one. The first
  // worker to refuse exits, and fail-stop then kills the other, which may not
  // have reached main() (or logged its refusal) yet: 1 or 2 workers ran it,
  // never more, and at least the first refused.
  ASSERT_GE(run.started.size(), 2u) << run.output;
  ASSERT_LE(run.started.size(), 3u) << run.output;
  ASSERT_GE(run.errors.size(), 2u) << run.output;  // the driver's and the first worker's
  ASSERT_LE(run.errors.size(), run.started.size()) << run.output;
  int worker_errors = 0;
  for (const std::string& e : run.errors) {
    if (e.find("cannot spawn WorkerGroup of Echo in a worker process (worker Echo rank ") !=
        std::string::npos) {
      ++worker_errors;
      EXPECT_NE(e.find("workers do not start workers"), std::string::npos) << e;
      EXPECT_NE(e.find("call baton::init(argc, argv) first thing in main()"), std::string::npos)
          << e;
    }
  }
  EXPECT_GE(worker_errors, 1) << run.output;
  EXPECT_EQ(worker_errors, static_cast<int>(run.errors.size()) - 1) << run.output;
  EXPECT_FALSE(run.processes_left);
}

TEST(Init, AWorkerMethodThatSpawnsAGroupFailsAndStartsNoProcess) {
  ResourcePool pool = ResourcePool::cpu(1);
  WorkerGroup g = WorkerGroup::spawn("Spawner", pool);
  try {
    g.call_rank(0, "spawn_group").get(std::chrono::seconds(60));
    ADD_FAILURE() << "a worker spawned a group";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot spawn WorkerGroup of Spawner in a worker "
                                         "process (worker Spawner rank 0 of group " +
                                         g.name()),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(children_of(g.pids()[0]).empty());
  EXPECT_TRUE(g.alive());
}

}  // namespace
}  // namespace baton
