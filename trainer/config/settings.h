// TrainerSettings: every key of a PPO-family config (configs/ppo_trainer.yaml)
// that the trainer uses, read once, before any file is opened or any worker
// starts. The fit loop (trainer/ppo_trainer.cpp) reads only these, never the
// config, so what this file reads is the whole of what a config can change:
// tests/trainer/config_coverage_test.cpp fails when a key of
// ppo_trainer.yaml is read by nothing (neither here nor in
// validate_ppo_config).
//
// Example:
//   Config config = Config::load("configs/grpo_toy.yaml").resolved();
//   TrainerSettings s = read_trainer_settings(config);
//   ... load the data, then ...
//   set_total_steps(s, batches_per_epoch);  // the schedules' lengths
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/prompt_dataset.h"
#include "trainer/async/staleness_policy.h"
#include "trainer/config/config.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/kl.h"
#include "workers/roles/role_options.h"

namespace baton::trainer {

// actor_rollout_ref.rollout.{do_sample,temperature,top_k,top_p,n}, or its val_kwargs.
struct SamplingSettings {
  bool do_sample = true;
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  int64_t n = 1;
};

// async_training.* (fully-async training, trainer/async/async_trainer.h).
struct AsyncTrainingSettings {
  bool enable = false;
  int64_t rollout_world = 1;                // rollout_n_gpus_per_node: RolloutWorker processes
  int64_t trigger_parameter_sync_step = 1;  // trainer steps between weight syncs
  int64_t staleness_threshold = 1;          // steps a trained batch may lag its weights
  StalenessPolicy policy = StalenessPolicy::kWait;  // staleness_policy: wait | drop
  int64_t max_queue_size = 2;               // finished batches queued at most
  std::optional<double> tis_cap;            // truncated IS cap; null: no correction
  int64_t max_rollout_restarts = 1;         // a failed rollout group is respawned this often
  bool partial_rollout = false;             // generate in chunks a sync can interrupt
  int64_t partial_rollout_chunk = 32;       // new tokens per generate call then
};

struct TrainerSettings {
  // Paths and names.
  std::string model_path, tokenizer_path, out_dir;
  std::string project_name, experiment_name;
  std::vector<std::string> train_files, val_files;  // val_files may be empty

  // Data.
  data::PromptDatasetOptions dataset;
  bool data_shuffle = true;
  uint64_t data_seed = 1;
  std::optional<int64_t> val_batch_size;  // null: every validation prompt at once
  std::string reward_fn_key;
  std::optional<std::string> custom_reward_fn;
  bool zero_on_reward_error = false;  // reward_model.zero_on_error

  // Workers and the step.
  int64_t world = 1;  // nnodes x per_node
  int64_t nnodes = 1, per_node = 1;
  // trainer.cluster_listen: where the driver waits for nnodes node agents
  // (runtime/cluster/cluster.h); empty: every worker on this machine.
  std::string cluster_listen;
  bool use_gpu = false;
  int64_t train_batch = 1, n = 1, response_length = 1;
  bool use_critic = false, use_kl_in_reward = false, use_kl_loss = false, use_ref = false;
  // The update's own forward pass gives the old log-probs (see ppo_trainer.yaml).
  bool old_log_prob_from_update = false;
  std::string adv_estimator, kl_penalty, loss_agg_mode;
  SamplingSettings sampling, val_sampling;
  uint64_t rollout_seed = 0;

  // The run.
  std::optional<int64_t> total_training_steps;  // null: total_epochs passes over the data
  int64_t total_steps = 0;                      // set_total_steps
  int64_t total_epochs = 1, critic_warmup = 0;
  bool balance_batch = true;  // seqlen_balancing.h over the actor's DP ranks
  int64_t test_freq = -1, save_freq = -1;
  bool val_before_train = true;
  std::string resume_mode;
  std::optional<std::string> resume_from_path;
  int64_t max_restarts = 0;  // a dead worker: respawn every group and resume, this often
  std::vector<std::string> loggers;

  // What the workers are told.
  workers::ActorRolloutRefOptions actor;
  workers::CriticOptions critic;
  bool use_rm = false;
  workers::RewardModelOptions rm;
  // One copy of the reward model in processes of its own (tp × pp of them)
  // instead of one per data-parallel replica beside the actor, and its
  // scoring started as soon as a batch is generated, so that it runs while
  // the actor computes log-probs (reward_model.centralized / .prefetch).
  bool rm_centralized = false;
  bool rm_prefetch = false;
  algos::AdvantageOptions adv;
  algos::KLControlOptions kl_ctrl;

  AsyncTrainingSettings async;

  // For set_total_steps: prompts per optimizer step, and the warm-up ratios
  // used when optim.lr_warmup_steps is negative.
  int64_t actor_mini_prompts = 1, critic_mini_prompts = 1;
  std::optional<double> actor_warmup_ratio, critic_warmup_ratio;
};

// Reads `config` (resolved: no interpolations). Throws ConfigError for a key
// that is missing or of the wrong type, or a combination the trainer cannot
// run. REQUIRES: validate_ppo_config(config) passed.
TrainerSettings read_trainer_settings(const Config& config);

// total_steps (trainer.total_training_steps, else total_epochs ×
// batches_per_epoch) and what depends on it: each optimizer's schedule length
// and warm-up.
void set_total_steps(TrainerSettings& settings, int64_t batches_per_epoch);

}  // namespace baton::trainer
