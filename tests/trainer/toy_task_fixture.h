// The toy task (examples/toy_task: data and a tiny Qwen2) made once per test
// suite in a temporary directory, and configs pointed at it: what the
// trainer's end-to-end tests start from.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/engine/temp_dir.h"
#include "trainer/config.h"

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

}  // namespace baton::trainer
