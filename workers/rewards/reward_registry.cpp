#include "workers/rewards/reward_registry.h"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/errors.h"
#include "base/registry.h"
#include "workers/rewards/exact_match_reward.h"
#include "workers/rewards/gsm8k_reward.h"
#include "workers/rewards/math_dapo_reward.h"
#include "workers/rewards/math_reward.h"

namespace baton::rewards {
namespace {

Registry<RewardFunction>& functions() {
  static Registry<RewardFunction>* registry = [] {
    auto* r = new Registry<RewardFunction>(
        "reward function", "register your own with baton::rewards::register_reward_function");
    r->add("gsm8k",
           [](const RewardInput& in) { return gsm8k_score(in.response, in.ground_truth); });
    r->add("gsm8k_flexible", [](const RewardInput& in) {
      return gsm8k_score(in.response, in.ground_truth, {.method = Gsm8kMethod::kFlexible});
    });
    r->add("math", [](const RewardInput& in) { return math_score(in.response, in.ground_truth); });
    r->add("math_dapo",
           [](const RewardInput& in) { return math_dapo_score(in.response, in.ground_truth); });
    r->add("exact_match", [](const RewardInput& in) {
      return exact_match_score(in.response, parse_ground_truths(in.ground_truth));
    });
    return r;
  }();
  return *registry;
}

// Data source or "prefix*" → function name. Not a Registry: a source is
// looked up by prefix too, and registering one replaces an earlier choice.
struct Sources {
  std::mutex mutex;
  std::map<std::string, std::string, std::less<>> by_source;  // GUARDED_BY(mutex)

  Sources() {
    by_source["openai/gsm8k"] = "gsm8k";
    for (const char* s :
         {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
      by_source[s] = "math";
    by_source["math_dapo"] = "math_dapo";
    by_source["aime*"] = "math_dapo";
    for (const char* s : {"searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                          "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"})
      by_source[s] = "exact_match";
  }
};

Sources& sources() {
  static Sources* s = new Sources();
  return *s;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The function name for `data_source`, or nullptr. REQUIRES: s.mutex is held.
const std::string* lookup_source(const Sources& s, std::string_view data_source) {
  if (const auto it = s.by_source.find(data_source); it != s.by_source.end()) return &it->second;
  const std::string* best = nullptr;
  size_t best_length = 0;
  for (const auto& [pattern, name] : s.by_source) {
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
  if (!fn)
    throw baton::InvalidArgument("register_reward_function: empty function for '" + name + "'");
  functions().add(std::move(name), std::move(fn));
}

void register_reward_data_source(std::string data_source, std::string function_name) {
  if (data_source.empty() || data_source == "*")
    throw baton::InvalidArgument("register_reward_data_source: empty data source");
  functions().get(function_name);  // throws naming an unknown function
  Sources& s = sources();
  std::lock_guard lock(s.mutex);
  s.by_source[std::move(data_source)] = std::move(function_name);
}

RewardFunction find_reward_function(std::string_view name) { return functions().get(name); }

std::string reward_function_name_for(std::string_view data_source) {
  Sources& s = sources();
  std::lock_guard lock(s.mutex);
  const std::string* name = lookup_source(s, data_source);
  return name ? *name : std::string();
}

RewardFunction find_reward_function_for(std::string_view data_source) {
  std::string name;
  {
    Sources& s = sources();
    std::lock_guard lock(s.mutex);
    const std::string* found = lookup_source(s, data_source);
    if (!found) {
      std::vector<std::string> known;
      for (const auto& entry : s.by_source) known.push_back(entry.first);
      throw baton::InvalidArgument(
          "no reward function for data_source '" + std::string(data_source) +
          "' (known data sources: " + join(known) +
          "); map it with baton::rewards::register_reward_data_source, or name a function for "
          "every sample with custom_reward_function.name");
    }
    name = *found;
  }
  return functions().get(name);
}

RewardFunction select_reward_function(const std::optional<std::string>& name) {
  if (name) return find_reward_function(*name);
  return [](const RewardInput& in) { return compute_score(in); };
}

double compute_score(const RewardInput& input) {
  return find_reward_function_for(input.data_source)(input);
}

std::vector<std::string> reward_function_names() { return functions().names(); }

std::vector<std::string> reward_data_sources() {
  Sources& s = sources();
  std::lock_guard lock(s.mutex);
  std::vector<std::string> out;
  for (const auto& entry : s.by_source) out.push_back(entry.first);
  return out;
}

}  // namespace baton::rewards
