// examples/sft, run as a program on a tiny toy task: the loss falls, the
// checkpoint it writes loads back, the loss and gradient norm of a step do not
// depend on how many workers share the batch (the loss is a mean over the whole
// step's response tokens), and an unknown config key stops it before anything
// runs.
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/parallel/parallel_state.h"
#include "tests/engine/temp_dir.h"
#include "tests/tolerance.h"
#include "text/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using baton::engine::testing::TempDir;

struct Outcome {
  int status = -1;
  std::string out;            // stdout and stderr
  std::vector<double> loss;   // per logged step
  std::vector<double> grad_norm;
};

Outcome run_program(const std::string& cmd, const fs::path& log) {
  const int raw = std::system((cmd + " >'" + log.string() + "' 2>&1").c_str());
  Outcome r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(log);
  r.out.assign(std::istreambuf_iterator<char>(in), {});
  static const std::regex step(R"(step \d+/\d+ .* loss ([0-9.]+) .* grad_norm ([0-9.]+))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), step), end; it != end; ++it) {
    r.loss.push_back(std::stod((*it)[1]));
    r.grad_norm.push_back(std::stod((*it)[2]));
  }
  return r;
}

// One small task (operands below 10: 80 training rows, 20 validation rows).
class Sft : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const Outcome r = run_program(std::string("'") + TOY_TASK_EXE + "' --out '" +
                                  (*dir_ / "task").string() +
                                  "' --seed 2 --max-operand 10 --val-size 20",
                              *dir_ / "toy_task.log");
    ASSERT_EQ(r.status, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // sft on the task with `overrides`, its output under `name`.
  static Outcome sft(const std::string& name, const std::string& overrides) {
    const fs::path task = *dir_ / "task";
    const std::string cmd =
        std::string("'") + SFT_EXE + "' --config '" + SFT_CONFIG + "'" +
        " data.train_files=[" + (task / "data/sft.jsonl").string() + "]" +
        " data.val_files=[" + (task / "data/val.jsonl").string() + "]" +
        " model.path=" + (task / "model").string() +
        " trainer.default_local_dir=" + (*dir_ / name).string() +
        " trainer.log_every=1 data.train_batch_size=16 " + overrides;
    return run_program(cmd, *dir_ / (name + ".log"));
  }
  static fs::path path(const std::string& name) { return *dir_ / name; }
  static TempDir* dir_;
};
TempDir* Sft::dir_ = nullptr;

TEST_F(Sft, LossFallsAndTheCheckpointLoads) {
  const Outcome r = sft("two_workers",
                    "trainer.total_training_steps=10 trainer.n_gpus_per_node=2 "
                    "data.micro_batch_size_per_gpu=4 optim.lr=3e-3");
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(r.loss.size(), 10u) << r.out;
  // From a random init (loss near ln 19 ≈ 2.9) ten steps at lr 3e-3 learn at
  // least the "#### " prefix and the eos, most of the response tokens.
  EXPECT_LT(r.loss.back(), 0.75 * r.loss.front()) << r.out;
  EXPECT_NE(r.out.find("base accuracy: "), std::string::npos) << r.out;

  const fs::path model = path("two_workers") / "model";
  const auto cfg = baton::engine::ModelConfig::load(model);
  const auto tok = baton::data::Tokenizer::load(model);
  EXPECT_EQ(cfg.vocab_size, tok.vocab_size());
  auto trained = std::make_shared<baton::engine::Transformer>(
      cfg, baton::engine::ParallelState::single());
  trained->load_state_dict(baton::engine::hf_to_shard(baton::engine::read_hf_weights(model), cfg,
                                                      trained->shard_spec()));
  // The weights moved away from the generated initialisation.
  const auto before = baton::engine::read_hf_weights(path("task") / "model");
  const auto after = baton::engine::read_hf_weights(model);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_FALSE(at::equal(before.at("model.embed_tokens.weight"),
                         after.at("model.embed_tokens.weight")));

  std::ifstream in(path("two_workers") / "eval.json");
  const auto eval = nlohmann::json::parse(in);
  EXPECT_EQ(eval["total"], 20);
  EXPECT_GE(eval["accuracy"].get<double>(), 0.0);
  EXPECT_LE(eval["accuracy"].get<double>(), 1.0);
  EXPECT_EQ(eval["steps"], 10);
}

TEST_F(Sft, FirstStepLossAndGradNormDoNotDependOnTheWorkerCount) {
  const Outcome two = sft("split_two", "trainer.total_training_steps=1 trainer.n_gpus_per_node=2 "
                                   "data.micro_batch_size_per_gpu=3");
  const Outcome one = sft("split_one", "trainer.total_training_steps=1 trainer.n_gpus_per_node=1 "
                                   "data.micro_batch_size_per_gpu=16");
  ASSERT_EQ(two.status, 0) << two.out;
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(two.loss.size(), 1u);
  ASSERT_EQ(one.loss.size(), 1u);
  // Same weights, same 16 rows: only the summation order differs (a few
  // hundred response tokens of O(1) log-probs), plus the 6 printed decimals.
  const double tol = baton::test::Tolerance::fp32(512, 3.0).atol + 1e-6;
  EXPECT_NEAR(two.loss[0], one.loss[0], tol);
  // The norm of a sum over the same tokens in another order (relative fp32
  // error), plus the printed decimals. Per-rank means summed over two ranks
  // would double it.
  const double rel = baton::test::Tolerance::fp32(512, 1.0).rtol;
  EXPECT_NEAR(two.grad_norm[0], one.grad_norm[0], rel * one.grad_norm[0] + 1e-6);
}

TEST_F(Sft, AnUnknownKeyFailsNamingTheClosestOne) {
  const Outcome r = sft("typo", "optim.learning_rate=1e-3");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("optim.learning_rate"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("typo")));
}

}  // namespace
