#include "workers/algos/algo_registry.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "runtime/did_you_mean.h"

namespace baton::algos {
namespace {

// Name → function, guarded by a mutex; `what` names the kind in errors.
template <typename Fn>
class Registry {
 public:
  Registry(std::string what, std::string register_call)
      : what_(std::move(what)), register_call_(std::move(register_call)) {}

  void add(std::string name, Fn fn) {
    if (name.empty()) throw std::invalid_argument("register " + what_ + ": the name is empty");
    if (!fn) throw std::invalid_argument("register " + what_ + " '" + name + "': no function");
    std::lock_guard lock(mutex_);
    if (entries_.count(name))
      throw std::invalid_argument(what_ + " '" + name +
                                  "' is already registered; choose another name");
    entries_.emplace(std::move(name), std::move(fn));
  }

  Fn find(std::string_view name) const {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(name);
    if (it != entries_.end()) return it->second;
    std::string known;
    std::vector<std::string> keys;
    for (const auto& [key, fn] : entries_) {
      known += (known.empty() ? "" : ", ") + key;
      keys.push_back(key);
    }
    std::string message = "unknown " + what_ + " '" + std::string(name) + "'";
    const std::string closest = closest_match(name, keys, std::max<size_t>(2, name.size() / 3));
    if (!closest.empty()) message += " (did you mean '" + closest + "'?)";
    throw std::invalid_argument(message + "; known: " + known + ". Register your own with " +
                                register_call_);
  }

  std::vector<std::string> names() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& entry : entries_) out.push_back(entry.first);
    return out;
  }

 private:
  std::string what_, register_call_;
  mutable std::mutex mutex_;
  std::map<std::string, Fn, std::less<>> entries_;
};

const Uids& need_uids(std::string_view name, const AdvantageInputs& in) {
  if (in.uids.empty() && in.token_level_rewards.defined() && in.token_level_rewards.size(0) > 0)
    throw std::invalid_argument("advantage estimator '" + std::string(name) +
                                "' needs AdvantageInputs::uids (one uid per row: the rows of one "
                                "prompt share it)");
  return in.uids;
}

const at::Tensor& need(std::string_view name, const at::Tensor& t, const char* field,
                       const char* what) {
  if (!t.defined())
    throw std::invalid_argument("advantage estimator '" + std::string(name) +
                                "' needs AdvantageInputs::" + field + " (" + what + ")");
  return t;
}

void add_builtin_estimators(Registry<AdvantageEstimator>& r) {
  using In = const AdvantageInputs&;
  using Opt = const AdvantageOptions&;
  r.add("gae", [](In in, Opt o) {
    return compute_gae(in.token_level_rewards,
                       need("gae", in.values, "values", "the critic's values, [B, L]"),
                       in.response_mask, o.gamma, o.lam);
  });
  r.add("grpo", [](In in, Opt o) {
    return compute_grpo(in.token_level_rewards, in.response_mask, need_uids("grpo", in), o.grpo);
  });
  r.add("grpo_vectorized", [](In in, Opt o) {
    return compute_grpo_vectorized(in.token_level_rewards, in.response_mask,
                                   need_uids("grpo_vectorized", in), o.grpo);
  });
  r.add("grpo_passk", [](In in, Opt o) {
    return compute_grpo_passk(in.token_level_rewards, in.response_mask, need_uids("grpo_passk", in),
                              o.grpo);
  });
  r.add("rloo", [](In in, Opt) {
    return compute_rloo(in.token_level_rewards, in.response_mask, need_uids("rloo", in));
  });
  r.add("rloo_vectorized", [](In in, Opt) {
    return compute_rloo_vectorized(in.token_level_rewards, in.response_mask,
                                   need_uids("rloo_vectorized", in));
  });
  r.add("reinforce_plus_plus", [](In in, Opt o) {
    return compute_reinforce_plus_plus(in.token_level_rewards, in.response_mask, o.gamma);
  });
  r.add("reinforce_plus_plus_baseline", [](In in, Opt) {
    return compute_reinforce_plus_plus_baseline(in.token_level_rewards, in.response_mask,
                                                need_uids("reinforce_plus_plus_baseline", in));
  });
  r.add("remax", [](In in, Opt) {
    return compute_remax(
        in.token_level_rewards,
        need("remax", in.reward_baselines, "reward_baselines", "the greedy responses' scores, [B]"),
        in.response_mask);
  });
  r.add("opo", [](In in, Opt) {
    return compute_opo(in.token_level_rewards, in.response_mask, need_uids("opo", in));
  });
  r.add("gpg", [](In in, Opt o) {
    return compute_gpg(in.token_level_rewards, in.response_mask, need_uids("gpg", in),
                       o.gpg_f_norm);
  });
}

void add_builtin_policy_losses(Registry<PolicyLossFn>& r) {
  r.add("vanilla", vanilla_policy_loss);
  r.add("gspo", gspo_policy_loss);
  r.add("sapo", sapo_policy_loss);
  r.add("gpg", gpg_policy_loss);
  r.add("cispo", cispo_policy_loss);
  r.add("dro", dro_policy_loss);
  r.add("geo_mean", geo_mean_policy_loss);
  r.add("dppo_tv", dppo_tv_policy_loss);
  r.add("dppo_kl", dppo_kl_policy_loss);
  r.add("clip_cov", clip_cov_policy_loss);
  r.add("kl_cov", kl_cov_policy_loss);
  r.add("reinforce", reinforce_policy_loss);
}

// Built-ins are added on first use, so a static initialiser of the user's
// that registers a name already finds them (and a clash is reported).
Registry<AdvantageEstimator>& estimators() {
  static Registry<AdvantageEstimator> registry("advantage estimator",
                                               "baton::algos::register_advantage_estimator");
  static const bool seeded = (add_builtin_estimators(registry), true);
  (void)seeded;
  return registry;
}

Registry<PolicyLossFn>& policy_losses() {
  static Registry<PolicyLossFn> registry("policy loss", "baton::algos::register_policy_loss");
  static const bool seeded = (add_builtin_policy_losses(registry), true);
  (void)seeded;
  return registry;
}

}  // namespace

void register_advantage_estimator(std::string name, AdvantageEstimator fn) {
  estimators().add(std::move(name), std::move(fn));
}

void register_policy_loss(std::string name, PolicyLossFn fn) {
  policy_losses().add(std::move(name), std::move(fn));
}

AdvantageEstimator find_advantage_estimator(std::string_view name) {
  return estimators().find(name);
}

PolicyLossFn find_policy_loss(std::string_view name) { return policy_losses().find(name); }

std::vector<std::string> advantage_estimator_names() { return estimators().names(); }

std::vector<std::string> policy_loss_names() { return policy_losses().names(); }

AdvantageResult compute_advantage(std::string_view name, const AdvantageInputs& inputs,
                                  const AdvantageOptions& options) {
  return find_advantage_estimator(name)(inputs, options);
}

}  // namespace baton::algos
