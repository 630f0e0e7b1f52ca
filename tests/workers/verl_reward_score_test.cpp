// verl's reward_score API on baton's built-ins (workers/rewards/verl_reward_score.h):
// the calls themselves, and Python reward files that import verl's modules
// in the subprocess pool (python_reward.h), scoring exactly as the built-ins
// do; unmapped names refused naming what baton maps; a real verl left alone.
#include "workers/rewards/verl_reward_score.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/errors.h"
#include "workers/rewards/gsm8k_reward.h"
#include "workers/rewards/math_dapo_reward.h"
#include "workers/rewards/math_reward.h"
#include "workers/rewards/python_reward.h"
#include "workers/rewards/reward_registry.h"

namespace baton::rewards {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

struct Files {
  fs::path dir = fs::temp_directory_path() / ("baton_verl_reward_" + std::to_string(::getpid()));
  Files() { fs::create_directories(dir); }
  ~Files() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    fs::create_directories((dir / name).parent_path());
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

// The exception type verl's function raises, and the message.
std::pair<std::string, std::string> refusal(std::string_view function, const json& args) {
  try {
    call_verl_reward_score(function, args);
  } catch (const VerlRewardScoreError& e) {
    return {e.python_type(), e.what()};
  }
  return {"(none)", ""};
}

TEST(VerlRewardScore, CallsAnswerWithTheBuiltIns) {
  const json strict = {{"solution_str", "so\n#### 1,234"},
                       {"ground_truth", "1234"},
                       {"method", "strict"},
                       {"format_score", 0.0},
                       {"score", 1.0}};
  EXPECT_EQ(call_verl_reward_score("gsm8k.compute_score", strict), 1.0);
  json flexible = strict;
  flexible["solution_str"] = "it is 12";
  flexible["method"] = "flexible";
  flexible["format_score"] = 0.25;
  EXPECT_EQ(call_verl_reward_score("gsm8k.compute_score", flexible), 0.25);
  EXPECT_EQ(call_verl_reward_score("gsm8k.extract_solution",
                                   {{"solution_str", "no answer"}, {"method", "strict"}}),
            json(nullptr));
  EXPECT_EQ(call_verl_reward_score(
                "math_reward.compute_score",
                {{"solution_str", "$\\boxed{\\dfrac{1}{2}}$"}, {"ground_truth", "0.5"}}),
            1.0);
  EXPECT_EQ(call_verl_reward_score("math_reward.is_equiv",
                                   {{"str1", nullptr}, {"str2", nullptr}, {"verbose", false}}),
            true);
  const json dapo =
      call_verl_reward_score("math_dapo.compute_score", {{"solution_str", "6 * 7\nAnswer: $42$"},
                                                         {"ground_truth", "42"},
                                                         {"strict_box_verify", false},
                                                         {"pause_tokens_index", nullptr}});
  EXPECT_EQ(dapo, json({{"score", 1.0}, {"acc", true}, {"pred", "42"}}));
  // default_compute_score dispatches by data source; math_dapo's gives its dict.
  EXPECT_EQ(call_verl_reward_score("default_compute_score", {{"data_source", "openai/gsm8k"},
                                                             {"solution_str", "#### 3"},
                                                             {"ground_truth", "3"}}),
            1.0);
  EXPECT_EQ(call_verl_reward_score("default_compute_score", {{"data_source", "aime2024"},
                                                             {"solution_str", "Answer: 7"},
                                                             {"ground_truth", "8"}})["score"],
            -1.0);
  // A ground truth that is not a string counts as its JSON text, as in the reward manager.
  EXPECT_EQ(call_verl_reward_score("search_r1_like_qa_em.compute_score",
                                   {{"solution_str", "<answer>Paris</answer>"},
                                    {"ground_truth", {{"target", {"paris"}}}},
                                    {"format_score", 0.0},
                                    {"score", 1.0}}),
            1.0);
}

TEST(VerlRewardScore, RefusalsAreVerlsExceptions) {
  EXPECT_EQ(refusal("math_reward.remove_boxed", {{"s", "no box"}}).first, "AssertionError");
  EXPECT_EQ(refusal("gsm8k.compute_score", {{"solution_str", "x"},
                                            {"ground_truth", "1"},
                                            {"method", "loose"},
                                            {"format_score", 0},
                                            {"score", 1}})
                .first,
            "AssertionError");
  const auto [type, message] =
      refusal("default_compute_score",
              {{"data_source", "my/task"}, {"solution_str", "x"}, {"ground_truth", "1"}});
  EXPECT_EQ(type, "NotImplementedError");
  EXPECT_CONTAINS(message, "data_source='my/task'");
  EXPECT_CONTAINS(message, "openai/gsm8k");
  const auto [unknown_type, unknown] = refusal("prime_math.compute_score", json::object());
  EXPECT_EQ(unknown_type, "AttributeError");
  EXPECT_CONTAINS(unknown, "prime_math.compute_score");
  EXPECT_CONTAINS(unknown, "gsm8k.compute_score");
  EXPECT_EQ(refusal("gsm8k.compute_score", {{"solution_str", "x"}}).first, "TypeError");
}

// A verl user's reward file, unchanged: verl's modules imported every way,
// their scores the built-ins' on every row.
TEST(VerlRewardScore, APythonFileImportingVerlsModulesScoresAsTheBuiltIns) {
  Files f;
  const std::string path = f.write("verl_user_reward.py", R"(
from verl.utils.reward_score import default_compute_score, gsm8k, math
from verl.utils.reward_score import math_dapo
import verl.utils.reward_score.math_reward as math_reward
from verl.utils.reward_score.gsm8k import compute_score as gsm8k_score
SELF_TEST = gsm8k.compute_score("#### 1", "1")  # at import time too

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert SELF_TEST == 1.0
    fn = extra_info["fn"]
    if fn == "gsm8k":
        return gsm8k_score(solution_str, ground_truth)
    if fn == "gsm8k_flexible":
        return gsm8k.compute_score(solution_str, ground_truth, method="flexible", format_score=0.1)
    if fn == "math":
        assert math.compute_score(solution_str, ground_truth) == math_reward.compute_score(
            solution_str, ground_truth)
        return math.compute_score(solution_str, ground_truth)
    if fn == "math_dapo":
        result = math_dapo.compute_score(solution_str, ground_truth)
        assert set(result) == {"score", "acc", "pred"} and result["acc"] == (result["score"] > 0)
        return result
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
)");
  struct Row {
    std::string fn, source, response, truth;
  };
  const std::vector<Row> rows = {
      {"gsm8k", "s", "3 + 4 = 7\n#### 7", "7"},
      {"gsm8k", "s", "so 7", "7"},
      {"gsm8k", "s", "#### 1,234", "1234"},
      {"gsm8k", "s", "#### 5", "6"},
      {"gsm8k_flexible", "s", "it is 72.", "72"},
      {"gsm8k_flexible", "s", "it is 71", "72"},
      {"math", "s", "so $\\boxed{\\dfrac{1}{2}}$", "0.5"},
      {"math", "s", "\\boxed{3}", "4"},
      {"math_dapo", "s", "6 * 7 = 42\nAnswer: $42$", "42"},
      {"math_dapo", "s", "6 * 7 = 42", "42"},
      {"default", "openai/gsm8k", "#### 9", "9"},
      {"default", "lighteval/MATH", "\\boxed{10}", "10"},
      {"default", "math_dapo", "Answer: 11", "12"},
      {"default", "searchR1_nq", "<answer>The Eiffel Tower.</answer>",
       R"({"target": ["eiffel tower"]})"},
  };
  std::vector<std::string> extra;
  for (const Row& r : rows) extra.push_back(json{{"fn", r.fn}}.dump());
  std::vector<RewardInput> inputs;
  for (size_t i = 0; i < rows.size(); ++i)
    inputs.push_back({.data_source = rows[i].source,
                      .response = rows[i].response,
                      .ground_truth = rows[i].truth,
                      .extra_info = extra[i]});
  PythonRewardPool pool(options(path));
  const std::vector<PythonRewardResult> got = pool.score(inputs);
  ASSERT_EQ(got.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    double want = 0;
    if (r.fn == "gsm8k") want = gsm8k_score(r.response, r.truth);
    if (r.fn == "gsm8k_flexible")
      want =
          gsm8k_score(r.response, r.truth, {.method = Gsm8kMethod::kFlexible, .format_score = 0.1});
    if (r.fn == "math") want = math_score(r.response, r.truth);
    if (r.fn == "math_dapo") want = math_dapo_score(r.response, r.truth);
    if (r.fn == "default") want = compute_score(inputs[i]);
    ASSERT_TRUE(got[i].score) << i << ": " << got[i].error;
    EXPECT_EQ(*got[i].score, want) << "row " << i << " (" << r.fn << ", " << r.response << ")";
  }
  // Both outcomes occur, so a constant would not pass.
  EXPECT_EQ(*got[0].score, 1.0);
  EXPECT_EQ(*got[1].score, 0.0);
  EXPECT_EQ(*got[9].score, -1.0);
}

// The helpers return Python's types (None, str, bool) and raise verl's
// exceptions; the file asserts each and returns 1.0.
TEST(VerlRewardScore, HelpersReturnPythonTypesAndRaiseVerlsExceptions) {
  Files f;
  const std::string path = f.write("helpers.py", R"(
from verl.utils.reward_score import gsm8k, math_reward, math_dapo, default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert gsm8k.extract_solution("#### -3") == "-3"
    assert gsm8k.extract_solution("none") is None
    assert gsm8k.extract_solution("it was 4.", method="flexible") == "4."
    assert math_reward.last_boxed_only_string("a \\boxed{x+1} b") == "\\boxed{x+1}"
    assert math_reward.last_boxed_only_string("nothing") is None
    assert math_reward.remove_boxed("\\boxed{x+1}") == "x+1"
    assert math_reward.is_equiv("\\frac{1}{2}", "0.5") is True
    assert math_reward.is_equiv("1", None) is False
    assert math_dapo.normalize_final_answer("$1,000$") == "1000"
    for call, kind in [(lambda: math_reward.remove_boxed("x"), AssertionError),
                       (lambda: gsm8k.compute_score("x", "1", method="loose"), AssertionError),
                       (lambda: default_compute_score("my/task", "x", "1"), NotImplementedError)]:
        try:
            call()
            raise RuntimeError("no exception from %r" % call)
        except kind:
            pass
    return 1.0
)");
  PythonRewardPool pool(options(path));
  const std::vector<PythonRewardResult> got = pool.score({{.data_source = "s"}});
  ASSERT_TRUE(got[0].score) << got[0].error;
  EXPECT_EQ(*got[0].score, 1.0);
}

TEST(VerlRewardScore, UnmappedNamesAreRefusedNamingWhatBatonMaps) {
  Files f;
  const auto refused = [&](const std::string& name, const std::string& code,
                           const std::string& part) {
    const std::string path = f.write(name, code + "\ndef compute_score(*a):\n    return 1\n");
    try {
      PythonRewardPool pool(options(path));
      ADD_FAILURE() << "imported " << code;
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), path);
      EXPECT_CONTAINS(e.what(), part);
      EXPECT_CONTAINS(e.what(), "gsm8k.compute_score");
    }
  };
  refused("module.py", "from verl.utils.reward_score import prime_math",
          "ImportError: baton runs verl reward files without verl: "
          "verl.utils.reward_score.prime_math is not provided");
  refused("trainer.py", "import verl.trainer.main_ppo", "verl.trainer is not provided");
  refused("function.py", "from verl.utils.reward_score import gsm8k\ngsm8k.extract_answer",
          "AttributeError: module 'verl.utils.reward_score.gsm8k' has no attribute "
          "'extract_answer' in baton");
}

// A verl the interpreter can import is verl's own: no stand-in.
TEST(VerlRewardScore, ARealVerlIsLeftAlone) {
  Files f;
  f.write("verl/__init__.py", "");
  f.write("verl/utils/__init__.py", "");
  f.write("verl/utils/reward_score/__init__.py",
          "def default_compute_score(*args, **kwargs):\n    return 42.0\n");
  const std::string path = f.write("uses_verl.py", R"(
from verl.utils.reward_score import default_compute_score
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return default_compute_score(data_source, solution_str, ground_truth)
)");
  PythonRewardPool pool(options(path));
  const std::vector<PythonRewardResult> got =
      pool.score({{.data_source = "openai/gsm8k", .response = "#### 1", .ground_truth = "1"}});
  ASSERT_TRUE(got[0].score) << got[0].error;
  EXPECT_EQ(*got[0].score, 42.0);
}

TEST(VerlRewardScore, VerlsOwnFilesMapToTheirBuiltIns) {
  EXPECT_EQ(builtin_for_verl_reward_file("/x/verl/utils/reward_score/gsm8k.py", "compute_score"),
            "gsm8k");
  EXPECT_EQ(
      builtin_for_verl_reward_file("verl/utils/reward_score/__init__.py", "default_compute_score"),
      "");
  EXPECT_FALSE(builtin_for_verl_reward_file("mine/reward_score/gsm8k.py", "compute_score"));
  EXPECT_THROW(builtin_for_verl_reward_file("verl/utils/reward_score/geo3k.py", "compute_score"),
               InvalidArgument);
}

}  // namespace
}  // namespace baton::rewards
