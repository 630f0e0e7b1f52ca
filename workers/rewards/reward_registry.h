// Rule-based reward functions by name and by data source, as verl's
// default_compute_score dispatches them: each sample's `data_source` column
// (data.reward_fn_key) selects a function, or the config's
// custom_reward_function.name selects one for every sample.
//
// Built-in functions (workers/*_reward.h):
//   gsm8k           GSM8K, strict `#### n`        gsm8k_flexible  the last number
//   math            \boxed{} with MATH normalisation
//   math_dapo       DAPO's `Answer: x`, Minerva normalisation, 1 or -1
//   exact_match     <answer>...</answer> against one or more ground truths
// Built-in data sources (verl's names):
//   openai/gsm8k → gsm8k
//   lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500 → math
//   math_dapo, aime* (every source starting with "aime") → math_dapo
//   searchR1_nq, searchR1_triviaqa, searchR1_popqa, searchR1_hotpotqa,
//   searchR1_2wikimultihopqa, searchR1_musique, searchR1_bamboogle → exact_match
//
// Example:
//   register_reward_function("length_penalty", [](const RewardInput& in) {
//     return in.response.size() < 200 ? 1.0 : 0.0;
//   });
//   register_reward_data_source("my_task", "length_penalty");  // or "my_task_*" for a prefix
//   double s = compute_score({.data_source = "openai/gsm8k", .response = "#### 4",
//                             .ground_truth = "4"});          // 1.0
//
// In a driver, register at namespace scope with BATON_REWARD_FUNCTION(name,
// fn) (below): it runs before main() in the driver and in every worker
// process of the executable, so a worker that scores (a reward worker of
// yours) knows the name too.
//
// Thread safety: registration and lookup may happen from any thread; the
// functions themselves are called without a lock.
#pragma once

#include "base/errors.h"
#include "base/static_registration.h"

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::rewards {

// One sample, as the reward manager decodes it. The views need to stay valid
// only for the call.
struct RewardInput {
  std::string_view data_source = {};   // the sample's data.reward_fn_key column
  std::string_view response = {};      // the decoded response, special tokens skipped
  std::string_view ground_truth = {};  // reward_model.ground_truth (JSON text if not a string)
  std::string_view extra_info = {};    // the row's extra_info as JSON text ("" if none)
};

// A reward function: the sample's score (the reward at its last token).
using RewardFunction = std::function<double(const RewardInput&)>;

// Registers `fn` under `name`. Throws baton::InvalidArgument for an empty name
// or function, or a name already registered (built-ins included).
void register_reward_function(std::string name, RewardFunction fn);

// Scores samples of `data_source` with the function registered as
// `function_name` (which must exist), replacing any earlier choice for it (a
// built-in source too). A data source ending in '*' matches every source with
// that prefix; an exact name wins over prefixes, a longer prefix over a
// shorter one. Throws baton::InvalidArgument naming an unknown function.
void register_reward_data_source(std::string data_source, std::string function_name);

// The function registered as `name`. Throws baton::InvalidArgument naming it
// and every registered name.
RewardFunction find_reward_function(std::string_view name);

// The function for samples of `data_source`. Throws baton::InvalidArgument
// naming it and every known data source, saying how to register one.
RewardFunction find_reward_function_for(std::string_view data_source);
// The name of that function ("" when none is registered for it).
std::string reward_function_name_for(std::string_view data_source);

// custom_reward_function.name: the named function when set, otherwise a
// function that dispatches each sample by its data source.
RewardFunction select_reward_function(const std::optional<std::string>& name);

// find_reward_function_for(input.data_source)(input): verl's default_compute_score.
double compute_score(const RewardInput& input);

// Registered function names and data sources (prefix patterns with their '*'), sorted.
std::vector<std::string> reward_function_names();
std::vector<std::string> reward_data_sources();

}  // namespace baton::rewards

// Registers a reward function in every process of the executable, before
// main(). At namespace scope of a .cpp file; the function may be a lambda
// (commas and all) or a function's name.
#define BATON_REWARD_FUNCTION(name, ...)                                             \
  static const bool BATON_REGISTRATION_NAME(baton_reward_function_registered_) =   \
      ::baton::detail::register_at_startup(                                         \
          "BATON_REWARD_FUNCTION", name,                                            \
          [] { ::baton::rewards::register_reward_function(name, __VA_ARGS__); })

