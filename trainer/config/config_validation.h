// validate_ppo_config: the checks a PPO-family config (configs/ppo_trainer.yaml
// and the configs based on it) must pass before any worker starts — sizes that
// cannot be split, layouts that do not fit the world, values outside their
// range, names that are not one of the choices.
//
// With W = trainer.nnodes × trainer.n_gpus_per_node workers:
//   - W is divisible by TP × PP of the actor, the reference policy, the critic
//     (when enabled) and the reward model (when enabled), and by the rollout's
//     TP; DP of each = W / (TP × PP).
//   - data.train_batch_size is divisible by actor.ppo_mini_batch_size (a larger
//     mini-batch is capped at the batch); mini-batch × rollout.n sequences
//     split evenly over the actor's (and critic's) DP ranks, and that share
//     over ppo_micro_batch_size_per_gpu when it is set; train_batch_size ×
//     rollout.n sequences split evenly over the rollout's DP ranks.
//   - counts are ≥ 1 (batch sizes, n, epochs, lengths, parallel sizes), and
//     enumerations are one of their values (data.truncation, loss_agg_mode,
//     kl types, kl_ctrl.type, trainer.resume_mode, trainer.logger, ...).
//
// Example:
//   Config config = Config::load(path);
//   config.apply_overrides(overrides);
//   validate_ppo_config(config);   // throws ConfigError listing every problem
#pragma once

#include "trainer/config/config.h"

namespace baton::trainer {

// Throws ConfigError whose message lists every problem found, one per line,
// each naming the keys involved and their values. Registry names
// (adv_estimator, policy_loss.loss_mode, custom_reward_function.name) are
// checked where they are looked up, not here.
void validate_ppo_config(const Config& config);

// Whether the config runs a critic: critic.enable, or when that is null,
// whether algorithm.adv_estimator is gae.
bool critic_enabled(const Config& config);

}  // namespace baton::trainer
