#include "workers/rewards/reward_registry.h"

#include <map>
#include <mutex>
#include <stdexcept>

#include "workers/rewards/exact_match_reward.h"
#include "workers/rewards/gsm8k_reward.h"
#include "workers/rewards/math_dapo_reward.h"
#include "workers/rewards/math_reward.h"

namespace baton::rewards {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, RewardFunction, std::less<>> functions;
  std::map<std::string, std::string, std::less<>> sources;  // data source or "prefix*" → name

  Registry() {
    functions["gsm8k"] = [](const RewardInput& in) {
      return gsm8k_score(in.response, in.ground_truth);
    };
    functions["gsm8k_flexible"] = [](const RewardInput& in) {
      return gsm8k_score(in.response, in.ground_truth, {.method = Gsm8kMethod::kFlexible});
    };
    functions["math"] = [](const RewardInput& in) {
      return math_score(in.response, in.ground_truth);
    };
    functions["math_dapo"] = [](const RewardInput& in) {
      return math_dapo_score(in.response, in.ground_truth);
    };
    functions["exact_match"] = [](const RewardInput& in) {
      return exact_match_score(in.response, parse_ground_truths(in.ground_truth));
    };
    sources["openai/gsm8k"] = "gsm8k";
    for (const char* s :
         {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
      sources[s] = "math";
    sources["math_dapo"] = "math_dapo";
    sources["aime*"] = "math_dapo";
    for (const char* s : {"searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                          "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"})
      sources[s] = "exact_match";
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

template <typename Map>
std::vector<std::string> keys_of(const Map& map) {
  std::vector<std::string> out;
  for (const auto& [key, value] : map) out.push_back(key);
  return out;
}

// The function name for `data_source`, or nullptr. REQUIRES: the lock is held.
const std::string* lookup_source(Registry& r, std::string_view data_source) {
  if (const auto it = r.sources.find(data_source); it != r.sources.end()) return &it->second;
  const std::string* best = nullptr;
  size_t best_length = 0;
  for (const auto& [pattern, name] : r.sources) {
    if (pattern.empty() || pattern.back() != '*') continue;
    const std::string_view prefix(pattern.data(), pattern.size() - 1);
    if (data_source.substr(0, prefix.size()) == prefix && (!best || prefix.size() > best_length)) {
      best = &name;
      best_length = prefix.size();
    }
  }
  return best;
}

}  // namespace

void register_reward_function(std::string name, RewardFunction fn) {
  if (name.empty()) throw std::invalid_argument("register_reward_function: empty name");
  if (!fn)
    throw std::invalid_argument("register_reward_function: empty function for '" + name + "'");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.functions.count(name))
    throw std::invalid_argument("register_reward_function: a reward function named '" + name +
                                "' is already registered; choose another name");
  r.functions.emplace(std::move(name), std::move(fn));
}

void register_reward_data_source(std::string data_source, std::string function_name) {
  if (data_source.empty() || data_source == "*")
    throw std::invalid_argument("register_reward_data_source: empty data source");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.functions.count(function_name))
    throw std::invalid_argument("register_reward_data_source: no reward function named '" +
                                function_name + "' (registered: " + join(keys_of(r.functions)) +
                                ")");
  r.sources[std::move(data_source)] = std::move(function_name);
}

RewardFunction find_reward_function(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const auto it = r.functions.find(name);
  if (it == r.functions.end())
    throw std::invalid_argument("no reward function named '" + std::string(name) +
                                "' (registered: " + join(keys_of(r.functions)) +
                                "); register one with baton::rewards::register_reward_function");
  return it->second;
}

std::string reward_function_name_for(std::string_view data_source) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const std::string* name = lookup_source(r, data_source);
  return name ? *name : std::string();
}

RewardFunction find_reward_function_for(std::string_view data_source) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const std::string* name = lookup_source(r, data_source);
  if (!name)
    throw std::invalid_argument(
        "no reward function for data_source '" + std::string(data_source) +
        "' (known data sources: " + join(keys_of(r.sources)) +
        "); map it with baton::rewards::register_reward_data_source, or name a function for "
        "every sample with custom_reward_function.name");
  return r.functions.at(*name);
}

RewardFunction select_reward_function(const std::optional<std::string>& name) {
  if (name) return find_reward_function(*name);
  return [](const RewardInput& in) { return compute_score(in); };
}

double compute_score(const RewardInput& input) {
  return find_reward_function_for(input.data_source)(input);
}

std::vector<std::string> reward_function_names() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return keys_of(r.functions);
}

std::vector<std::string> reward_data_sources() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return keys_of(r.sources);
}

}  // namespace baton::rewards
