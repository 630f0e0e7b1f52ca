// Advantage estimators and policy losses by name: what a config selects with
// algorithm.adv_estimator and actor.policy_loss.loss_mode. The built-in ones
// are registered from the start; a user registers their own C++ estimator or
// loss under a new name before the config is read, and selects it the same way.
//
// Every process of the executable must know a name the config selects: the
// policy loss runs in the worker processes. Register at namespace scope of a
// .cpp file linked into the driver executable with the macros below; they
// run before main() in the driver and in every worker it spawns (the workers
// run the same executable). register_*() called after baton::init reaches
// only the calling process.
//
//   BATON_POLICY_LOSS("scaled_vanilla", [](const at::Tensor& old_lp, const at::Tensor& lp,
//                                         const at::Tensor& adv, const at::Tensor& mask,
//                                         const PolicyLossOptions& o,
//                                         const std::optional<at::Tensor>& w) {
//     return vanilla_policy_loss(old_lp, lp, 0.5 * adv, mask, o, w);
//   });
//
// A custom loss aggregates with agg_loss(per_token, mask, options.agg,
// options.global): the global counts keep its gradient the same however the
// mini-batch is split into micro-batches and DP ranks.
//
// Example:
//   register_advantage_estimator("my_baseline",
//       [](const AdvantageInputs& in, const AdvantageOptions&) {
//         at::Tensor a = in.token_level_rewards.sum(-1, true) * in.response_mask;
//         return AdvantageResult{a, a};
//       });
//   AdvantageResult r = compute_advantage("my_baseline", inputs, options);
//
// Thread safety: registration and lookup may happen from any thread. A lookup
// of an unknown name throws baton::InvalidArgument naming it, the closest known
// name and every known one.
#pragma once

#include "base/errors.h"
#include "base/static_registration.h"

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "workers/algos/advantage.h"
#include "workers/algos/policy_loss.h"

namespace baton::algos {

// What an estimator may need; each built-in uses its own fields and throws
// baton::InvalidArgument naming a missing one.
struct AdvantageInputs {
  at::Tensor token_level_rewards;  // [B, L]
  at::Tensor response_mask;        // [B, L]
  Uids uids;                    // one per row: grpo*, rloo*, opo, gpg, reinforce_plus_plus_baseline
  at::Tensor values;            // [B, L]: gae
  at::Tensor reward_baselines;  // [B]: remax
  // [B, L]: optimal_token_baseline, tir_optimal_token_baseline (the actor's
  // old-log-prob pass gives both; rollout_is_weights only with rollout
  // correction's IS, undefined otherwise).
  at::Tensor old_log_probs, sum_pi_squared, rollout_is_weights;
};

// algorithm.* with verl's defaults.
struct AdvantageOptions {
  double gamma = 1.0;  // gae, reinforce_plus_plus
  double lam = 1.0;    // gae
  // grpo, grpo_vectorized, grpo_passk. All three honour norm_adv_by_std
  // (verl's trainer never passes it to grpo_vectorized, which then always
  // normalises; here the config's choice holds for every GRPO variant).
  GrpoOptions grpo;
  double gpg_f_norm = 1.0;
};

using AdvantageEstimator =
    std::function<AdvantageResult(const AdvantageInputs&, const AdvantageOptions&)>;

using PolicyLossFn = std::function<PolicyLossResult(
    const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
    const at::Tensor& mask, const PolicyLossOptions& options,
    const std::optional<at::Tensor>& rollout_is_weights)>;

// Registers `fn` under `name`. Throws baton::InvalidArgument for an empty name
// or function, or a name already registered (built-ins included).
void register_advantage_estimator(std::string name, AdvantageEstimator fn);
void register_policy_loss(std::string name, PolicyLossFn fn);

// The function registered under `name` (a copy; throws for an unknown name).
AdvantageEstimator find_advantage_estimator(std::string_view name);
PolicyLossFn find_policy_loss(std::string_view name);

// Registered names, sorted.
std::vector<std::string> advantage_estimator_names();
std::vector<std::string> policy_loss_names();

// find_advantage_estimator(name)(inputs, options).
AdvantageResult compute_advantage(std::string_view name, const AdvantageInputs& inputs,
                                  const AdvantageOptions& options = {});

}  // namespace baton::algos

// Registers a policy loss / advantage estimator in every process of the
// executable, before main(). At namespace scope of a .cpp file; the
// function may be a lambda (commas and all) or a function's name.
#define BATON_POLICY_LOSS(name, ...)                                                   \
  static const bool BATON_REGISTRATION_NAME(baton_policy_loss_registered_) =         \
      ::baton::detail::register_at_startup("BATON_POLICY_LOSS", name,                 \
                                           [] { ::baton::algos::register_policy_loss(name, __VA_ARGS__); })
#define BATON_ADVANTAGE_ESTIMATOR(name, ...)                                           \
  static const bool BATON_REGISTRATION_NAME(baton_advantage_estimator_registered_) = \
      ::baton::detail::register_at_startup(                                           \
          "BATON_ADVANTAGE_ESTIMATOR", name,                                          \
          [] { ::baton::algos::register_advantage_estimator(name, __VA_ARGS__); })
