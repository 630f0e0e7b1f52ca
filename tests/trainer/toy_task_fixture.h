// The toy task (examples/toy_task: data and a tiny Qwen2) made once per test
// suite in a temporary directory, and configs pointed at it: what the
// trainer's end-to-end tests start from.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tests/engine/temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/ppo_trainer.h"

namespace baton::trainer {

class ToyTaskTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    toy_ = new engine::testing::TempDir();
    const std::string cmd = std::string("'") + TOY_TASK_EXE + "' --out '" + toy_->path().string() +
                            "' --val-size 16 >/dev/null 2>&1";
    const int raw = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 0) << cmd;
  }
  static void TearDownTestSuite() {
    delete toy_;
    toy_ = nullptr;
  }

  // configs/<name>.yaml on the toy data and model, writing under `out`, with
  // the file logger only, then `overrides`.
  static Config toy_config(const std::string& name, const std::filesystem::path& out,
                           const std::vector<std::string>& overrides) {
    Config c = Config::load(std::filesystem::path(BATON_CONFIGS_DIR) / (name + ".yaml"));
    const std::string toy = toy_->path().string();
    c.apply_overrides({
        "data.train_files=[" + toy + "/data/train.jsonl]",
        "data.val_files=[" + toy + "/data/val.jsonl]",
        "actor_rollout_ref.model.path=" + toy + "/model",
        "trainer.default_local_dir=" + out.string(),
        "trainer.logger=[file]",
    });
    c.apply_overrides(overrides);
    return c;
  }

  inline static engine::testing::TempDir* toy_ = nullptr;
};

// Training steps logged so far to out/metrics.jsonl: whole lines (the run
// may be writing it) with a "timing_s/step" key.
inline size_t logged_steps(const std::filesystem::path& out) {
  std::ifstream in(out / "metrics.jsonl");
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  size_t n = 0;
  for (size_t begin = 0, end; (end = all.find('\n', begin)) != std::string::npos; begin = end + 1)
    n += all.substr(begin, end - begin).find("\"timing_s/step\"") != std::string::npos;
  return n;
}

// Children of this process that run worker class `cls` (BATON_CLASS in
// their environment; a colocated group's is "A+B").
inline std::vector<pid_t> workers_of_class(const std::string& cls) {
  std::vector<pid_t> pids;
  for (const auto& d : std::filesystem::directory_iterator("/proc")) {
    const std::string name = d.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(d.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: the fields after the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != ::getpid()) continue;
    std::ifstream env(d.path() / "environ");
    const std::string all((std::istreambuf_iterator<char>(env)), {});
    if (all.find("BATON_CLASS=" + cls) != std::string::npos)
      pids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return pids;
}

// Once `steps` training steps are logged under `out`, SIGKILLs one worker of
// class `cls` (the run is `run`, on another thread). False when the run
// ended first or no such worker was found within a minute.
inline bool kill_a_worker_once_logged(const std::filesystem::path& out, const std::string& cls,
                                      size_t steps, std::future<FitResult>& run) {
  for (int i = 0; i < 6000; ++i) {
    if (run.wait_for(std::chrono::milliseconds(10)) == std::future_status::ready) return false;
    if (logged_steps(out) < steps) continue;
    const std::vector<pid_t> pids = workers_of_class(cls);
    if (!pids.empty()) return ::kill(pids.front(), SIGKILL) == 0;
  }
  return false;
}

}  // namespace baton::trainer
