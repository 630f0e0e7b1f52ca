// settings_problems: the checks that TrainerSettings (trainer/config/settings.h)
// read from a PPO-family config (configs/ppo_trainer.yaml and the configs
// based on it) must pass before any worker starts — sizes that cannot be
// split, layouts that do not fit the world, values outside their range,
// settings that contradict each other. read_trainer_settings runs them; what
// a typed value cannot carry (a key's type, an enumeration's choices such as
// data.truncation, loss_agg_mode, the kl types, kl_ctrl.type,
// trainer.resume_mode, trainer.logger) is checked as the key is read.
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
//   - counts are ≥ 1 (batch sizes, n, epochs, lengths, parallel sizes).
//
// Example:
//   Config config = Config::load(path);
//   config.apply_overrides(overrides);
//   TrainerSettings s = read_trainer_settings(config);  // ConfigError listing every problem
#pragma once

#include <string>
#include <vector>

namespace baton::trainer {

struct TrainerSettings;

// The problems of `s` as read_trainer_settings read it (before it derives the
// workers' batch sizes and budgets from it), one message each, naming the
// keys involved and their values. Empty when it can be used.
std::vector<std::string> settings_problems(const TrainerSettings& s);

}  // namespace baton::trainer
