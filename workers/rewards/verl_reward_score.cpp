#include "workers/rewards/verl_reward_score.h"

#include <filesystem>
#include <functional>
#include <vector>

#include "workers/rewards/exact_match_reward.h"
#include "workers/rewards/gsm8k_reward.h"
#include "workers/rewards/math_dapo_reward.h"
#include "workers/rewards/math_reward.h"
#include "workers/rewards/reward_registry.h"

namespace baton::rewards {
namespace {

using nlohmann::json;

// One of verl's functions: its name (module.function), its Python parameter
// list and the built-in that answers it.
struct VerlFunction {
  const char* name;
  const char* params;
  std::function<json(const json& args)> call;
};

const json& arg(const json& args, const char* name) {
  if (!args.is_object() || !args.contains(name))
    throw VerlRewardScoreError("TypeError", detail::cat("missing argument '", name, "'"));
  return args.at(name);
}

std::string string_arg(const json& args, const char* name) {
  const json& v = arg(args, name);
  if (!v.is_string())
    throw VerlRewardScoreError("TypeError", detail::cat(name, " must be a str, got ", v.dump()));
  return v.get<std::string>();
}

double number_arg(const json& args, const char* name) {
  const json& v = arg(args, name);
  if (!v.is_number() && !v.is_boolean())
    throw VerlRewardScoreError("TypeError", detail::cat(name, " must be a number, got ", v.dump()));
  return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
}

// A ground truth as the reward manager passes it: a string, else its JSON text.
std::string truth_arg(const json& args) {
  const json& v = arg(args, "ground_truth");
  return v.is_string() ? v.get<std::string>() : v.dump();
}

Gsm8kMethod gsm8k_method(const json& args) {
  const std::string m = string_arg(args, "method");
  if (m == "strict") return Gsm8kMethod::kStrict;
  if (m == "flexible") return Gsm8kMethod::kFlexible;
  throw VerlRewardScoreError("AssertionError",
                             "method must be 'strict' or 'flexible', got '" + m + "'");
}

json optional_text(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

json math_dapo_result(const std::string& solution, const std::string& truth, const json& args) {
  if (args.contains("pause_tokens_index") && !args["pause_tokens_index"].is_null())
    throw VerlRewardScoreError("NotImplementedError",
                               "baton's math_dapo has no pause_tokens_index (pass None)");
  const MathDapoOptions o{.strict_box_verify = args.value("strict_box_verify", false)};
  const double score = math_dapo_score(solution, truth, o);
  return {{"score", score}, {"acc", score > 0}, {"pred", math_dapo_prediction(solution, o)}};
}

const std::vector<VerlFunction>& functions() {
  static const std::vector<VerlFunction> table = {
      {"default_compute_score",
       "data_source, solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None, "
       "concurrent_semaphore=None, memory_limit_mb=None, **kwargs",
       [](const json& a) -> json {
         const std::string source = string_arg(a, "data_source");
         const std::string name = reward_function_name_for(source);
         if (name.empty()) {
           std::string known;
           for (const std::string& s : reward_data_sources())
             known += (known.empty() ? "" : ", ") + s;
           throw VerlRewardScoreError("NotImplementedError",
                                      "Reward function is not implemented for data_source='" +
                                          source + "' (baton's data sources: " + known + ")");
         }
         const std::string solution = string_arg(a, "solution_str");
         const std::string truth = truth_arg(a);
         if (name == "math_dapo") return math_dapo_result(solution, truth, json::object());
         const json& extra = a.contains("extra_info") ? a["extra_info"] : json(nullptr);
         const std::string extra_text = extra.is_null() ? std::string() : extra.dump();
         return find_reward_function(name)({.data_source = source,
                                            .response = solution,
                                            .ground_truth = truth,
                                            .extra_info = extra_text});
       }},
      {"gsm8k.compute_score",
       "solution_str, ground_truth, method='strict', format_score=0.0, score=1.0",
       [](const json& a) -> json {
         return gsm8k_score(string_arg(a, "solution_str"), truth_arg(a),
                            {.method = gsm8k_method(a),
                             .format_score = number_arg(a, "format_score"),
                             .score = number_arg(a, "score")});
       }},
      {"gsm8k.extract_solution", "solution_str, method='strict'",
       [](const json& a) -> json {
         return optional_text(extract_gsm8k_answer(string_arg(a, "solution_str"), gsm8k_method(a)));
       }},
      {"math_reward.compute_score", "solution_str, ground_truth",
       [](const json& a) -> json {
         return math_score(string_arg(a, "solution_str"), truth_arg(a));
       }},
      {"math_reward.last_boxed_only_string", "string",
       [](const json& a) -> json {
         return optional_text(last_boxed_only_string(string_arg(a, "string")));
       }},
      {"math_reward.remove_boxed", "s",
       [](const json& a) -> json {
         const std::string s = string_arg(a, "s");
         const std::optional<std::string> inside = remove_boxed(s);
         if (!inside)
           throw VerlRewardScoreError("AssertionError", "remove_boxed: not a \\boxed{...}: " + s);
         return *inside;
       }},
      {"math_reward.is_equiv", "str1, str2, verbose=False",
       [](const json& a) -> json {
         const json& x = arg(a, "str1");
         const json& y = arg(a, "str2");
         if (x.is_null() || y.is_null()) return x.is_null() && y.is_null();
         return math_answers_equivalent(string_arg(a, "str1"), string_arg(a, "str2"));
       }},
      {"math_dapo.compute_score",
       "solution_str, ground_truth, strict_box_verify=False, pause_tokens_index=None",
       [](const json& a) -> json {
         return math_dapo_result(string_arg(a, "solution_str"), truth_arg(a), a);
       }},
      {"math_dapo.normalize_final_answer", "final_answer",
       [](const json& a) -> json { return normalize_final_answer(string_arg(a, "final_answer")); }},
      {"search_r1_like_qa_em.compute_score",
       "solution_str, ground_truth, method='strict', format_score=0.0, score=1.0",
       [](const json& a) -> json {
         return exact_match_score(
             string_arg(a, "solution_str"), parse_ground_truths(truth_arg(a)),
             {.format_score = number_arg(a, "format_score"), .score = number_arg(a, "score")});
       }},
  };
  return table;
}

}  // namespace

json call_verl_reward_score(std::string_view function, const json& args) {
  for (const VerlFunction& f : functions())
    if (function == f.name) return f.call(args);
  throw VerlRewardScoreError("AttributeError",
                             detail::cat("verl.utils.reward_score: baton has no ", function,
                                         "; it maps ", verl_reward_score_names()));
}

const json& verl_reward_score_api() {
  static const json api = [] {
    json fns = json::object();
    for (const VerlFunction& f : functions()) fns[f.name] = f.params;
    return json{{"functions", fns}, {"aliases", {{"math", "math_reward"}}}};
  }();
  return api;
}

std::string verl_reward_score_names() {
  std::string out;
  for (const VerlFunction& f : functions()) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out + " (math is math_reward)";
}

std::optional<std::string> builtin_for_verl_reward_file(std::string_view path,
                                                        std::string_view function) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.parent_path();
  if (p.extension() != ".py" || dir.filename() != "reward_score" ||
      dir.parent_path().filename() != "utils" ||
      dir.parent_path().parent_path().filename() != "verl")
    return std::nullopt;
  const std::string module = p.stem().string();
  if (module == "__init__" &&
      (function == "default_compute_score" || function == "_default_compute_score"))
    return std::string();
  if (function == "compute_score") {
    if (module == "gsm8k") return std::string("gsm8k");
    if (module == "math_reward" || module == "math") return std::string("math");
    if (module == "math_dapo") return std::string("math_dapo");
    if (module == "search_r1_like_qa_em") return std::string("exact_match");
  }
  throw InvalidArgument(detail::cat(
      path, " is verl's reward_score module '", module, "', asked for ", function,
      "; baton maps these files of verl's to its built-ins: __init__.py (default_compute_score), "
      "gsm8k.py, math_reward.py (math.py), math_dapo.py, search_r1_like_qa_em.py (compute_score)"));
}

}  // namespace baton::rewards
