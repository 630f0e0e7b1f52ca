#include "engine/parallel/local_world.h"

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "base/atomic_file.h"
#include "engine/errors.h"

extern char** environ;

namespace baton::engine {
namespace {

constexpr const char* kRankEnv = "BATON_LOCAL_RANK";
constexpr const char* kWorldEnv = "BATON_LOCAL_WORLD";
constexpr const char* kStoreEnv = "BATON_LOCAL_STORE";

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

}  // namespace

std::optional<LocalRank> local_world_rank() {
  const char* rank = std::getenv(kRankEnv);
  const char* world = std::getenv(kWorldEnv);
  const char* store = std::getenv(kStoreEnv);
  if (!rank || !world || !store) return std::nullopt;
  LocalRank me;
  me.rank = std::stoll(rank);
  me.world_size = std::stoll(world);
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(std::max<int64_t>(1, cores / me.world_size)));
  me.store = c10::make_intrusive<c10d::FileStore>(store, static_cast<int>(me.world_size));
  return me;
}

int launch_local_world(int argc, char** argv, int64_t world_size, std::chrono::seconds timeout) {
  auto dir = std::filesystem::temp_directory_path() / ("baton-world-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto store = (dir / "store").string();
  std::vector<pid_t> pids;
  for (int64_t r = 0; r < world_size; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    env_strings.push_back(std::string(kRankEnv) + "=" + std::to_string(r));
    env_strings.push_back(std::string(kWorldEnv) + "=" + std::to_string(world_size));
    env_strings.push_back(std::string(kStoreEnv) + "=" + store);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    if (int err = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data())) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      throw EngineError("launch_local_world: cannot start rank " + std::to_string(r) + ": " +
                        std::strerror(err));
    }
    pids.push_back(pid);
  }
  (void)argc;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int result = 0;
  size_t alive = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (alive > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != pid || done[r]) continue;
        done[r] = true;
        --alive;
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && result == 0) {
          std::fprintf(stderr, "rank %zu %s; stopping the other ranks\n", r,
                       describe(status).c_str());
          result = 1;
          for (size_t o = 0; o < pids.size(); ++o)
            if (!done[o]) ::kill(pids[o], SIGKILL);
        }
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline && result == 0) {
      std::fprintf(stderr, "launch_local_world: timed out after %llds; stopping every rank\n",
                   static_cast<long long>(timeout.count()));
      result = 1;
      for (size_t o = 0; o < pids.size(); ++o)
        if (!done[o]) ::kill(pids[o], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  remove_tree(dir);
  return result;
}

}  // namespace baton::engine
