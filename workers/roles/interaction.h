// Interactions of multi-turn rollouts (verl's interaction_config_path): an
// environment or simulated user that answers the model's turns, for tasks
// where the world replies rather than a tool. After an assistant turn with no
// tool call, the agent loop (workers/roles/agent_loop.h) asks the row's
// interaction what follows: it ends the trajectory, or gives a user turn
// (feedback) the model answers next; either way it may score the turn.
//
// A row takes part through its extra_info's `interaction_kwargs` (verl's
// field): {"name": <a configured interaction>, ...its own settings}; `name`
// may be left out when one interaction is configured. A row without
// interaction_kwargs ends at its first turn without a tool call.
//
// Built-in interaction:
//   answer_check   verl's Gsm8kInteraction, for any rule-based reward: scores
//                  the turn's text with the reward function `reward_function`
//                  (default "gsm8k", workers/rewards/reward_registry.h)
//                  against the kwargs' `ground_truth`; a score >= `pass_score`
//                  (default 1) ends the trajectory, anything less answers
//                  `feedback` (default verl's "Your response is incorrect! You
//                  need to reflect on your answer and try again."). The turn's
//                  reward is the score.
//
// The config file, in verl's format:
//   interaction:
//     - name: arithmetic                  # what rows' interaction_kwargs.name select
//       class_name: answer_check          # a registered interaction (verl: a Python
//                                         # class path, whose last part may be one)
//       config: {reward_function: exact_match}
//
// Example: a user of baton writes an environment in a driver:
//   BATON_INTERACTION("guess", [](const baton::workers::InteractionInput& in) {
//     const int64_t target = in.kwargs.at("target");
//     const int64_t guess = std::atoll(std::string(in.response).c_str());
//     if (guess == target) return baton::workers::InteractionReply{.terminate = true, .reward = 1};
//     return baton::workers::InteractionReply{
//         .terminate = false, .text = guess < target ? "higher" : "lower", .reward = 0};
//   });
//
// Thread safety: registration and lookup may happen from any thread; the
// agent loop calls interactions from its pool, several at once (an
// interaction with state guards it itself; per-trajectory state belongs in
// the messages it is given).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/static_registration.h"

namespace baton::workers {

struct InteractionInput {
  // The configured config, overridden key by key by the row's
  // interaction_kwargs (less `name`).
  const nlohmann::json& kwargs;
  // This assistant turn's text, special tokens skipped.
  std::string_view response;
  // The trajectory after the prompt, as chat messages: each assistant turn's
  // text, the tool results and the user turns given so far; the last is
  // this assistant turn.
  const nlohmann::ordered_json& messages;
  int64_t user_turns = 0;  // user turns this interaction gave the trajectory so far
};

struct InteractionReply {
  bool terminate = true;  // end the trajectory here
  std::string text;       // the user turn's content (unused when terminating)
  double reward = 0;      // this turn's score (verl's turn score)
};

// May throw: the rollout then fails with an error naming the interaction and
// the row (an environment's failure is a bug, not something to train on).
using InteractionFunction = std::function<InteractionReply(const InteractionInput&)>;

// Registers an interaction. Throws baton::InvalidArgument for an empty name or
// function, or a name already registered (built-ins included).
void register_interaction(std::string name, InteractionFunction fn);

// The interaction registered as `name`. Throws baton::InvalidArgument naming
// it and every registered interaction.
const InteractionFunction& find_interaction(std::string_view name);

// Registered interaction names, sorted.
std::vector<std::string> interaction_names();

// One entry of the interaction config.
struct ConfiguredInteraction {
  std::string name;        // what rows select it by
  std::string class_name;  // the registered interaction it runs
  nlohmann::json config;   // {} if absent
};

// The interactions of the config file at `path`. class_name selects a
// registered interaction by its whole text or, failing that, by its last
// dot-separated part (verl's "verl.interactions.gsm8k_interaction.
// Gsm8kInteraction" selects one registered as "Gsm8kInteraction"). Throws
// baton::FileError when the file cannot be read, and baton::InvalidArgument
// naming the file, the entry's index and the key for bad YAML, a missing
// `interaction` list, an entry without name or class_name, a config that is
// not a mapping, a name listed twice, or a class_name no interaction is
// registered as (listing the registered ones).
std::vector<ConfiguredInteraction> load_interaction_config(const std::filesystem::path& path);

}  // namespace baton::workers

// Registers an interaction in every process of the executable, before main().
// At namespace scope of a .cpp file; the function may be a lambda.
#define BATON_INTERACTION(name, ...)                                                \
  static const bool BATON_REGISTRATION_NAME(baton_interaction_registered_) =       \
      ::baton::detail::register_at_startup("BATON_INTERACTION", name, [] {          \
        ::baton::workers::register_interaction(name, __VA_ARGS__);                  \
      })
