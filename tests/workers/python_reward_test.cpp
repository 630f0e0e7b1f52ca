// Python reward files in their subprocess pool (workers/rewards/python_reward.h):
// verl's signature and return forms, extra_info as a dict, and every way a
// function fails (raises, returns no number, hangs, kills its interpreter,
// does not import) reported for its row, the rows after it still scored; the
// reward manager scoring a batch with one.
#include "workers/rewards/python_reward.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/errors.h"
#include "workers/rewards/reward_manager.h"

namespace baton::rewards {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

struct Files {
  fs::path dir = fs::temp_directory_path() / ("baton_python_reward_" + std::to_string(::getpid()));
  Files() { fs::create_directories(dir); }
  ~Files() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  }
};

PythonRewardOptions options(const std::string& path) {
  PythonRewardOptions o;
  o.path = path;
  o.python = BATON_PYTHON;
  o.processes = 2;
  return o;
}

// verl's signature; a dict with "score" is a score too; extra_info is the
// row's JSON object; the user's prints do not disturb the protocol.
TEST(PythonReward, VerlsSignatureScoresEveryRowInOrder) {
  Files f;
  const std::string path = f.write("reward.py", R"(
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0):
    print("scoring", solution_str)  # goes to stderr
    if data_source == "dict":
        return {"score": 0.5, "acc": True}
    base = 1.0 if solution_str.strip().endswith(ground_truth) else 0.0
    if extra_info is not None:
        base += extra_info["index"] / 100
    return base + bonus
)");
  PythonRewardOptions o = options(path);
  o.kwargs = {{"bonus", 10}};
  PythonRewardPool pool(o);
  std::vector<RewardInput> inputs;
  for (int i = 0; i < 7; ++i)
    inputs.push_back({.data_source = "math", .response = i % 2 ? "#### 4" : "#### 5",
                      .ground_truth = "4"});
  inputs.push_back({.data_source = "math", .response = "4", .ground_truth = "4",
                    .extra_info = R"({"index": 3})"});
  inputs.push_back({.data_source = "dict", .response = "x", .ground_truth = "y"});
  const std::vector<PythonRewardResult> r = pool.score(inputs);
  ASSERT_EQ(r.size(), inputs.size());
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(r[i].score) << r[i].error;
    EXPECT_EQ(*r[i].score, (i % 2 ? 1.0 : 0.0) + 10) << i;
  }
  EXPECT_DOUBLE_EQ(*r[7].score, 1.0 + 3.0 / 100 + 10);
  EXPECT_EQ(*r[8].score, 0.5);
}

// A raise, a non-number, a hang past the timeout and a dead interpreter each
// fail their row only, naming the function and the file; the subprocess is
// replaced and the rows after it are scored.
TEST(PythonReward, EachFailureIsItsRowsAndTheRestAreScored) {
  Files f;
  const std::string path = f.write("flaky.py", R"(
import os, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise ValueError("cannot parse " + solution_str)
    if solution_str == "text":
        return "high"
    if solution_str == "nan":
        return float("nan")
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "die":
        os._exit(3)
    return 1.0
)");
  PythonRewardOptions o = options(path);
  o.processes = 1;
  o.timeout_s = 1.0;
  PythonRewardPool pool(o);
  std::vector<std::string> texts = {"ok", "raise", "ok", "text", "nan", "hang", "ok", "die", "ok"};
  std::vector<RewardInput> inputs;
  for (const std::string& t : texts) inputs.push_back({.data_source = "s", .response = t});
  const std::vector<PythonRewardResult> r = pool.score(inputs);
  ASSERT_EQ(r.size(), texts.size());
  for (size_t i : {0u, 2u, 6u, 8u}) {
    ASSERT_TRUE(r[i].score) << i << ": " << r[i].error;
    EXPECT_EQ(*r[i].score, 1.0);
  }
  EXPECT_CONTAINS(r[1].error, "compute_score in " + path + " raised ValueError: cannot parse raise");
  EXPECT_CONTAINS(r[3].error, "returned str 'high', not a number");
  EXPECT_CONTAINS(r[4].error, "not a finite number");
  EXPECT_CONTAINS(r[5].error, "did not return within 1 s");
  EXPECT_CONTAINS(r[7].error, "killed its interpreter");
  for (size_t i : {1u, 3u, 4u, 5u, 7u}) EXPECT_FALSE(r[i].score) << i;
}

TEST(PythonReward, AFileThatDoesNotImportFailsNamingItAndPythonsError) {
  Files f;
  const auto refused = [&](const std::string& path, const std::string& part,
                           const std::string& function = "compute_score") {
    PythonRewardOptions o = options(path);
    o.function = function;
    try {
      PythonRewardPool pool(o);
      ADD_FAILURE() << "accepted " << path;
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), path);
      EXPECT_CONTAINS(e.what(), part);
    }
  };
  refused(f.write("syntax.py", "def compute_score(:\n"), "SyntaxError");
  refused(f.write("imports.py", "import baton_no_such_module\n"), "ModuleNotFoundError");
  refused(f.write("other.py", "def score(a, b, c, d):\n    return 1\n"),
          "no function 'compute_score' in it");
  refused((f.dir / "missing.py").string(), "Error");
}

// The reward manager with a Python file: every row scored by it, a failing
// row named (or, with zero_on_error, scored 0 and counted).
TEST(PythonReward, TheRewardManagerScoresABatchWithIt) {
  Files f;
  const std::string path = f.write("length.py", R"(
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth == "boom":
        raise RuntimeError("boom")
    return float(len(solution_str))
)");
  const data::Tokenizer tok = data::Tokenizer::load(std::string(BATON_FIXTURES_DIR) + "/bpe");
  DataProto batch;
  const std::vector<int32_t> a = tok.encode("abc", false), b = tok.encode("hello world", false);
  const int64_t r = static_cast<int64_t>(std::max(a.size(), b.size()));
  at::Tensor responses = at::zeros({2, r}, at::kInt), mask = at::zeros({2, 1 + r}, at::kLong);
  for (size_t j = 0; j < a.size(); ++j) responses[0][j] = a[j];
  for (size_t j = 0; j < b.size(); ++j) responses[1][j] = b[j];
  mask.slice(1, 0, 1 + static_cast<int64_t>(a.size()))[0].fill_(1);
  mask.slice(1, 0, 1 + static_cast<int64_t>(b.size()))[1].fill_(1);
  batch.set_tensor("prompts", at::zeros({2, 1}, at::kInt));
  batch.set_tensor("responses", responses);
  batch.set_tensor("attention_mask", mask);
  batch.set_column("ground_truth", {Value(std::string("x")), Value(std::string("boom"))});
  batch.set_column("data_source", {Value(std::string("s")), Value(std::string("s"))});
  auto pool = std::make_shared<PythonRewardPool>(options(path));
  const RewardManager strict(tok, RewardManagerOptions().set_python(pool));
  try {
    strict.compute(batch);
    ADD_FAILURE() << "a raising row was accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "row 1");
    EXPECT_CONTAINS(e.what(), "raised RuntimeError: boom");
  }
  const RewardManager lenient(tok, RewardManagerOptions().set_python(pool).set_zero_on_error(true));
  const RewardResult result = lenient.compute(batch);
  EXPECT_EQ(result.scores, (std::vector<double>{3.0, 0.0}));
  EXPECT_EQ(result.errors, 1);
  EXPECT_EQ(result.token_level_scores[0][static_cast<int64_t>(a.size()) - 1].item<float>(), 3.0f);
}

}  // namespace
}  // namespace baton::rewards
