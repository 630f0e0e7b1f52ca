// verl's `verl.utils.reward_score` API, answered by baton's built-in reward
// functions (gsm8k_reward.h, math_reward.h, math_dapo_reward.h,
// exact_match_reward.h, reward_registry.h), so that a verl user's Python
// reward file that does
//   from verl.utils.reward_score import gsm8k, default_compute_score
//   gsm8k.compute_score(solution_str, ground_truth)
// runs unchanged in baton's Python reward subprocesses (python_reward.h):
// there a small `verl` package stands in for verl's (when no real verl is
// importable), and each of its functions asks the trainer to run the built-in.
// The scores are exactly the built-ins'.
//
// The functions, with verl's parameters (module "" is the package itself):
//   default_compute_score(data_source, solution_str, ground_truth, extra_info=None, ...)
//                        by data source, as reward_registry.h's compute_score; a
//                        math_dapo source returns math_dapo's dict
//   gsm8k                compute_score(solution_str, ground_truth, method="strict",
//                        format_score=0.0, score=1.0), extract_solution(solution_str, method)
//   math_reward (math)   compute_score(solution_str, ground_truth),
//                        last_boxed_only_string(string), remove_boxed(s), is_equiv(str1, str2)
//   math_dapo            compute_score(solution_str, ground_truth, strict_box_verify=False)
//                        → {"score", "acc", "pred"}, normalize_final_answer(final_answer)
//   search_r1_like_qa_em compute_score(solution_str, ground_truth, method="strict",
//                        format_score=0.0, score=1.0)
// (`math` is verl's older name of math_reward.) Any other module or function
// of verl's raises ImportError or AttributeError naming these.
//
// Example:
//   nlohmann::json r = call_verl_reward_score(
//       "gsm8k.compute_score", {{"solution_str", "#### 7"}, {"ground_truth", "7"}});  // 1.0
//
// Thread safety: any thread (the built-ins are called without a lock).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace baton::rewards {

// A call verl's function would have refused; python_type is the exception
// it raises there ("AssertionError", "NotImplementedError", ...).
class VerlRewardScoreError : public InvalidArgument {
 public:
  VerlRewardScoreError(std::string python_type, const std::string& message)
      : InvalidArgument(message), python_type_(std::move(python_type)) {}
  const std::string& python_type() const { return python_type_; }

 private:
  std::string python_type_;
};

// Runs `function` ("gsm8k.compute_score", "default_compute_score") on `args`,
// a JSON object of its arguments by parameter name (defaults filled in; a
// ground_truth that is not a string is taken as its JSON text, as the reward
// manager passes it). Returns what verl's function returns: a number, a
// string, a bool, null or an object. Throws VerlRewardScoreError for an
// unknown function (naming those above) or arguments verl's would refuse.
nlohmann::json call_verl_reward_score(std::string_view function, const nlohmann::json& args);

// What the Python package is built from: {"functions": {"gsm8k.compute_score":
// "solution_str, ground_truth, method='strict', ...", ...}, "aliases":
// {"math": "math_reward"}}, each function's Python parameter list.
const nlohmann::json& verl_reward_score_api();

// "default_compute_score, gsm8k.compute_score, ...": for messages.
std::string verl_reward_score_names();

// custom_reward_function.path naming one of verl's own reward_score files
// (a path ending in verl/utils/reward_score/<module>.py) with `function`:
// baton scores with the built-in directly, no Python. Returns nullopt for any
// other path; otherwise the built-in's registered name (gsm8k.py:
// "gsm8k", math_reward.py or math.py: "math", math_dapo.py: "math_dapo",
// search_r1_like_qa_em.py: "exact_match"), or "" for __init__.py's
// default_compute_score (each sample by its data source). Throws
// InvalidArgument for another function or module of verl's, naming those
// baton maps.
std::optional<std::string> builtin_for_verl_reward_file(std::string_view path,
                                                        std::string_view function);

}  // namespace baton::rewards
