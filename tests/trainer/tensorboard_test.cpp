// TensorBoard event files (trainer/tensorboard_writer.h): CRC-32C against its
// published check value, and a MetricsLogger with "tensorboard" whose files
// TensorBoard's own reader (the venv's tensorboard package, EventAccumulator)
// loads back with every scalar at its step.
#include "trainer/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/errors.h"
#include "trainer/metrics.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;

TEST(TensorBoard, Crc32cIsCastagnolis) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);  // the standard check value
  EXPECT_EQ(crc32c(""), 0u);
}

// What TensorBoard's reader finds in `dir`: {tag: [[step, value], ...]}.
nlohmann::json read_with_tensorboard(const fs::path& dir, const fs::path& work) {
  const fs::path script = work / "read.py";
  std::ofstream(script) << R"(import json, sys
from tensorboard.backend.event_processing import event_accumulator
ea = event_accumulator.EventAccumulator(sys.argv[1])
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
)";
  const fs::path out = work / "read.json";
  const std::string cmd = std::string("'") + BATON_PYTHON + "' '" + script.string() + "' '" +
                          dir.string() + "' >'" + out.string() + "' 2>'" +
                          (work / "read.err").string() + "'";
  const int status = std::system(cmd.c_str());
  std::ifstream err(work / "read.err");
  std::stringstream err_text;
  err_text << err.rdbuf();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "TensorBoard's reader failed (scripts/setup_python.sh installs it): " << err_text.str();
  std::ifstream in(out);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

TEST(TensorBoard, TheLoggersEventFilesLoadInTensorBoard) {
  const fs::path work =
      fs::temp_directory_path() / ("baton_tensorboard_" + std::to_string(::getpid()));
  fs::remove_all(work);
  {
    MetricsLoggerOptions o;
    o.loggers = {"tensorboard"};
    o.tensorboard_dir = work / "tb";
    MetricsLogger logger(o);
    logger.log(0, {{"val-core/openai/gsm8k/reward/mean@1", 0.25}});
    logger.log(1, {{"critic/score/mean", 0.5}, {"actor/pg_loss", -0.125}});
    logger.log(2, {{"critic/score/mean", 0.75}, {"actor/pg_loss", 1e6}});
  }
  const nlohmann::json got = read_with_tensorboard(work / "tb", work);
  const nlohmann::json expected = {
      {"val-core/openai/gsm8k/reward/mean@1", {{0, 0.25}}},
      {"critic/score/mean", {{1, 0.5}, {2, 0.75}}},
      {"actor/pg_loss", {{1, -0.125}, {2, 1e6}}}};
  EXPECT_EQ(got, expected);
  fs::remove_all(work);
}

TEST(TensorBoard, TheDirectoryDefaultsToVerlsPlace) {
  const fs::path work =
      fs::temp_directory_path() / ("baton_tensorboard_dir_" + std::to_string(::getpid()));
  fs::remove_all(work);
  ASSERT_EQ(setenv("TENSORBOARD_DIR", (work / "env").c_str(), 1), 0);
  {
    MetricsLoggerOptions o;
    o.loggers = {"tensorboard"};
    o.set_names("p", "e");
    MetricsLogger logger(o);
  }
  unsetenv("TENSORBOARD_DIR");
  EXPECT_FALSE(fs::is_empty(work / "env")) << "$TENSORBOARD_DIR holds the event file";
  const fs::path cwd = fs::current_path();
  fs::create_directories(work / "cwd");
  fs::current_path(work / "cwd");
  {
    MetricsLoggerOptions o;
    o.loggers = {"tensorboard"};
    o.set_names("p", "e");
    MetricsLogger logger(o);
  }
  fs::current_path(cwd);
  EXPECT_TRUE(fs::exists(work / "cwd" / "tensorboard_log" / "p" / "e"));
  fs::remove_all(work);
  EXPECT_THROW(MetricsLogger(MetricsLoggerOptions().set_loggers({"wandb"})), Error);
}

}  // namespace
}  // namespace baton::trainer
