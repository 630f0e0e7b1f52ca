#include "workers/algos/algo_registry.h"

#include <utility>

#include "base/errors.h"
#include "base/registry.h"

namespace baton::algos {
namespace {

const Uids& need_uids(std::string_view name, const AdvantageInputs& in) {
  if (in.uids.empty() && in.token_level_rewards.defined() && in.token_level_rewards.size(0) > 0)
    throw baton::InvalidArgument("advantage estimator '" + std::string(name) +
                                 "' needs AdvantageInputs::uids (one uid per row: the rows of one "
                                 "prompt share it)");
  return in.uids;
}

const at::Tensor& need(std::string_view name, const at::Tensor& t, const char* field,
                       const char* what) {
  if (!t.defined())
    throw baton::InvalidArgument("advantage estimator '" + std::string(name) +
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
  // verl's trainer passes no handle_zero_tail: both use the default (on).
  auto token_baseline_inputs = [](std::string_view name, In in) {
    return TokenBaselineInputs{
        need(name, in.old_log_probs, "old_log_probs", "the actor's old log-probs, [B, L]"),
        need(name, in.sum_pi_squared, "sum_pi_squared",
             "Σπ² of each response position, [B, L]: the actor's compute_log_prob with meta "
             "calculate_sum_pi_squared"),
        in.rollout_is_weights};
  };
  r.add("optimal_token_baseline", [token_baseline_inputs](In in, Opt) {
    return compute_optimal_token_baseline(in.token_level_rewards, in.response_mask,
                                          need_uids("optimal_token_baseline", in),
                                          token_baseline_inputs("optimal_token_baseline", in));
  });
  r.add("tir_optimal_token_baseline", [token_baseline_inputs](In in, Opt) {
    return compute_tir_optimal_token_baseline(
        in.token_level_rewards, in.response_mask, need_uids("tir_optimal_token_baseline", in),
        token_baseline_inputs("tir_optimal_token_baseline", in));
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
  static Registry<AdvantageEstimator> registry(
      "advantage estimator", "register your own with baton::algos::register_advantage_estimator");
  static const bool seeded = (add_builtin_estimators(registry), true);
  (void)seeded;
  return registry;
}

Registry<PolicyLossFn>& policy_losses() {
  static Registry<PolicyLossFn> registry(
      "policy loss", "register your own with baton::algos::register_policy_loss");
  static const bool seeded = (add_builtin_policy_losses(registry), true);
  (void)seeded;
  return registry;
}

}  // namespace

void register_advantage_estimator(std::string name, AdvantageEstimator fn) {
  if (!fn) throw baton::InvalidArgument("register advantage estimator '" + name + "': no function");
  estimators().add(std::move(name), std::move(fn));
}

void register_policy_loss(std::string name, PolicyLossFn fn) {
  if (!fn) throw baton::InvalidArgument("register policy loss '" + name + "': no function");
  policy_losses().add(std::move(name), std::move(fn));
}

AdvantageEstimator find_advantage_estimator(std::string_view name) {
  return estimators().get(name);
}

PolicyLossFn find_policy_loss(std::string_view name) { return policy_losses().get(name); }

std::vector<std::string> advantage_estimator_names() { return estimators().names(); }

std::vector<std::string> policy_loss_names() { return policy_losses().names(); }

AdvantageResult compute_advantage(std::string_view name, const AdvantageInputs& inputs,
                                  const AdvantageOptions& options) {
  return find_advantage_estimator(name)(inputs, options);
}

}  // namespace baton::algos
