// TrainerSettings: every key of a PPO-family config (configs/ppo_trainer.yaml)
// that the trainer uses, read once, before any file is opened or any worker
// starts, and checked (trainer/config/config_validation.h) before it is used.
// The fit loop (trainer/ppo_trainer.cpp) reads only these, never the config,
// so what this file reads is the whole of what a config can change:
// tests/trainer/config_coverage_test.cpp fails when a key of
// ppo_trainer.yaml is read by nothing.
//
// Example:
//   Config config = Config::load("configs/grpo_toy.yaml").resolved();
//   TrainerSettings s = read_trainer_settings(config);  // ConfigError listing every problem
//   ... load the data, then ...
//   set_total_steps(s, batches_per_epoch);  // the schedules' lengths
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/prompt_dataset.h"
#include "engine/rollout/sampling.h"
#include "trainer/async/staleness_policy.h"
#include "trainer/config/config.h"
#include "trainer/dynamic_sampling.h"
#include "trainer/step_profiler.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/kl.h"
#include "workers/algos/rollout_correction.h"
#include "workers/rewards/python_reward.h"
#include "workers/rewards/reward_manager.h"
#include "workers/roles/role_options.h"

namespace baton::trainer {

// A role's packed micro-batches: use_dynamic_bsz and its token budget (a
// ..._max_token_len_per_gpu key), which is read and checked even when off.
struct TokenBudget {
  bool on = false;
  int64_t max_tokens = 1;
  // What the workers are told: the budget, or 0 (micro-batches of rows).
  int64_t for_workers() const { return on ? max_tokens : 0; }
};

// A trained role's (the actor's or the critic's) keys as configured; the
// workers' UpdateOptions and OptimOptions get what follows from them once
// they are checked (read_trainer_settings, set_total_steps).
struct TrainedRoleSettings {
  int64_t mini_batch_prompts = 1;  // ppo_mini_batch_size; a larger one than the batch is capped
  std::optional<int64_t> micro_batch_size;  // ppo_micro_batch_size_per_gpu; null: at most 8
  TokenBudget budget;                       // use_dynamic_bsz, ppo_max_token_len_per_gpu
  int64_t lr_warmup_steps = -1;             // optim.*; < 0: a ratio of the schedule
  double lr_warmup_steps_ratio = 0;
  // ppo_mini_batch_size capped at the batch: prompts per optimizer step.
  int64_t mini_prompts(int64_t train_batch) const {
    return std::min(mini_batch_prompts, train_batch);
  }
};

// async_training.* (fully-async training, trainer/async/async_trainer.h).
struct AsyncTrainingSettings {
  bool enable = false;
  int64_t rollout_world = 1;                // rollout_n_gpus_per_node: RolloutWorker processes
  int64_t trigger_parameter_sync_step = 1;  // trainer steps between weight syncs
  int64_t staleness_threshold = 1;          // steps a trained batch may lag its weights
  StalenessPolicy policy = StalenessPolicy::kWait;  // staleness_policy: wait | drop
  int64_t max_queue_size = 2;                       // finished batches queued at most
  std::optional<double> tis_cap;                    // truncated IS cap; null: no correction
  int64_t max_rollout_restarts = 1;    // a failed rollout group is respawned this often
  bool partial_rollout = false;        // generate in chunks a sync can interrupt
  int64_t partial_rollout_chunk = 32;  // new tokens per generate call then
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
  // data.max_response_length: with dataset.max_prompt_length, the longest
  // sequence a packed micro-batch must hold.
  int64_t max_response_length = 1;
  std::string reward_fn_key;
  std::optional<std::string> custom_reward_fn;  // a C++ registered name (no path)
  // custom_reward_function.path: a Python reward file, its function and pool.
  std::optional<rewards::PythonRewardOptions> python_reward;
  bool zero_on_reward_error = false;  // reward_model.zero_on_error
  // reward_model.reward_manager and reward_model.overlong_buffer.* (its
  // max_resp_len is data.max_response_length, as verl's DAPO sets it).
  rewards::RewardManagerKind reward_manager = rewards::RewardManagerKind::kNaive;
  rewards::OverlongBufferOptions overlong_buffer;

  // Workers and the step.
  int64_t world = 1;  // nnodes x per_node
  int64_t nnodes = 1, per_node = 1;
  // trainer.cluster_listen: where the driver waits for nnodes node agents
  // (runtime/cluster/cluster.h); empty: every worker on this machine.
  std::string cluster_listen;
  bool use_gpu = false;  // trainer.device: cpu | cuda
  // actor_rollout_ref.model.use_remove_padding: the actor's fixed-size
  // micro-batches are packed (derive_worker_options).
  bool remove_padding = false;
  // What a reader of the run's log should know about how a setting was taken
  // (strategy: fsdp run as ZeRO-1 data parallel), one line each.
  std::vector<std::string> notes;
  int64_t train_batch = 1, n = 1, response_length = 1;
  // data.gen_batch_size: prompts per generation batch (the loader's batches);
  // train_batch unless algorithm.filter_groups is on.
  int64_t gen_batch = 1;
  FilterGroupsOptions filter_groups;  // algorithm.filter_groups (DAPO's dynamic sampling)
  bool use_critic = false, use_kl_in_reward = false, use_kl_loss = false, use_ref = false;
  // The update's own forward pass gives the old log-probs (see ppo_trainer.yaml).
  bool old_log_prob_from_update = false;
  std::string adv_estimator, kl_penalty, loss_agg_mode;
  // actor_rollout_ref.rollout's temperature, top_k, top_p and n, or its
  // val_kwargs', in the engine's terms: do_sample false reads as temperature
  // 0 (greedy), top_k -1 (off) as 0. max_new_tokens is response_length; the
  // requests' seeds come from rollout_seed.
  engine::SamplingParams sampling, val_sampling;
  // actor_rollout_ref.rollout.temperature as configured, do_sample or not:
  // the temperature of the log-probs (old, reference, the update's), as verl.
  double logprob_temperature = 1.0;
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
  // trainer.logger_python: the interpreter with the wandb package ("wandb");
  // +trainer.wandb_proxy (verl's, optional): wandb's https proxy ("" if none).
  std::string logger_python, wandb_proxy;
  // verl's dumps of what was generated (trainer/generation_dump.h): a JSONL
  // file per training step / validation, and validation samples printed.
  std::optional<std::string> rollout_data_dir, validation_data_dir;
  int64_t log_val_generations = 0;
  int64_t log_max_bytes = 16 << 20, log_backup_count = 3;  // baton.log's rotation
  int64_t collective_timeout_s = 600;  // every role's ModelOptions::collective_timeout_ms

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
  // algorithm.rollout_correction (verl's decoupled mode): IS weights and
  // rejection from rollout_log_probs against old_log_probs, applied before
  // the advantages (workers/algos/rollout_correction.h); off unless
  // rollout_is or rollout_rs is set.
  algos::RolloutCorrectionOptions rollout_correction;
  // The old-log-prob pass also returns Σπ² per token: the
  // optimal-token-baseline estimators need it
  // (actor_rollout_ref.actor.calculate_sum_pi_squared or adv_estimator).
  bool calculate_sum_pi_squared = false;

  AsyncTrainingSettings async;
  ProfilerSettings profiler;  // global_profiler.*

  // Keys that are only checked: the reference policy's layout (it runs in
  // the actor's, so they must be equal) and the rollout's dtype (the actor's).
  int64_t ref_tp = 1, ref_pp = 1;
  std::string rollout_dtype;

  // As configured, for the checks and for what the workers are told of them
  // (batches, budgets, warm-ups).
  TrainedRoleSettings actor_train, critic_train;
  TokenBudget rollout_log_prob_budget, ref_log_prob_budget, critic_forward_budget, rm_budget;
};

// Reads `config` (interpolations are resolved as keys are read) and checks
// the settings (config_validation.h): throws ConfigError listing every
// problem, one per line, each naming its keys: a key that is missing, null
// or of the wrong type, a name that is not one of its choices, sizes that
// do not split or fit the workers, values out of range. Registry names
// (adv_estimator, policy_loss.loss_mode, custom_reward_function.name) are
// checked where they are looked up, not here.
TrainerSettings read_trainer_settings(const Config& config);

// total_steps (trainer.total_training_steps, else total_epochs ×
// batches_per_epoch) and what depends on it: each optimizer's schedule length
// and warm-up.
void set_total_steps(TrainerSettings& settings, int64_t batches_per_epoch);

}  // namespace baton::trainer
