// A trainer checkpoint's small files (checkpoint_files.h), as resume reads
// them before it calls a worker: the latest-step file and trainer_state.json,
// each refusal naming its file.
#include "trainer/checkpoint_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/errors.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/temp_dir.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
using engine::testing::expect_error;
using engine::testing::TempDir;

const char* kLoader =
    R"({"epoch": 1, "batch": 2, "seed": 7, "shuffle": true, "batch_size": 4, "dataset_size": 64})";

TEST(TrainerCheckpointFiles, TheLatestStepFileNamesAnExistingCheckpointAndNothingElse) {
  TempDir out;
  EXPECT_FALSE(latest_trainer_checkpoint(out.path()));  // no checkpoint yet
  fs::create_directories(out / "global_step_12");
  const fs::path latest = out / kLatestTrainerCheckpointFile;
  std::ofstream(latest) << "12\n";  // written by hand, with a newline
  EXPECT_EQ(latest_trainer_checkpoint(out.path()), out / "global_step_12");
  for (const char* text : {"../../etc", "12abc", "", "-1", "99999999999999999999"}) {
    std::ofstream(latest, std::ios::trunc) << text;
    expect_error<Error>([&] { latest_trainer_checkpoint(out.path()); },
                        {latest.string() + ": corrupt (expected a step number)"});
  }
  std::ofstream(latest, std::ios::trunc) << "13";
  expect_error<Error>(
      [&] { latest_trainer_checkpoint(out.path()); },
      {"names step 13 but " + (out / "global_step_13").string() + " does not exist"});
}

TEST(TrainerCheckpointFiles, TrainerStateIsReadWholeOrRefusedNamingTheFile) {
  TempDir dir;
  const fs::path file = dir / "trainer_state.json";
  expect_error<Error>([&] { read_trainer_state(dir.path()); }, {"does not exist"});
  std::ofstream(file) << R"({"global_step": 5, "kl_coef": 0.25, "loader": )" << kLoader << "}";
  const TrainerStateFile state = read_trainer_state(dir.path());
  EXPECT_EQ(state.global_step, 5);
  EXPECT_EQ(state.kl_coef, 0.25);
  EXPECT_EQ(state.loader.epoch, 1);
  EXPECT_EQ(state.loader.batch, 2);
  EXPECT_EQ(state.loader.dataset_size, 64);
  const std::string loader = kLoader;
  for (const std::string& text :
       {std::string("{"), std::string(R"({"global_step": 5, "kl_coef": 0.25})"),
        R"({"global_step": -5, "kl_coef": 0.25, "loader": )" + loader + "}",
        R"({"global_step": 5, "kl_coef": -1, "loader": )" + loader + "}",
        R"({"global_step": "5", "kl_coef": 0.25, "loader": )" + loader + "}",
        std::string(R"({"global_step": 5, "kl_coef": 0.25, "loader": {"epoch": 1}})")}) {
    std::ofstream(file, std::ios::trunc) << text;
    SCOPED_TRACE(text);
    expect_error<Error>([&] { read_trainer_state(dir.path()); }, {file.string()});
  }
  // Said once: "resume: <file>: ...", not wrapped twice.
  std::ofstream(file, std::ios::trunc)
      << R"({"global_step": 1e48, "kl_coef": 0.25, "loader": )" << kLoader << "}";
  try {
    read_trainer_state(dir.path());
    ADD_FAILURE() << "a global_step of 1e48 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "resume: " + file.string() + ": \"global_step\" is missing or not an integer");
  }
}

}  // namespace
}  // namespace baton::trainer
