// The PPO trainer's state, shared by its parts: ppo_trainer.cpp (setup,
// validation, the fit loop) and checkpointing.cpp (save and resume). Internal
// to baton::trainer: a driver uses PpoTrainer (trainer/ppo_trainer.h).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "data/prompt_dataset.h"
#include "data/prompt_loader.h"
#include "runtime/resource_pool.h"
#include "runtime/worker_group.h"
#include "text/tokenizer/tokenizer.h"
#include "trainer/async/rollout_ledger.h"
#include "trainer/config/config.h"
#include "trainer/config/settings.h"
#include "trainer/metrics.h"
#include "trainer/ppo_trainer.h"
#include "trainer/step_profiler.h"
#include "workers/algos/kl.h"
#include "workers/rewards/reward_manager.h"

namespace baton::trainer {

struct PpoTrainer::State {
  Config config;
  TrainerSettings s;
  std::optional<data::Tokenizer> tokenizer;
  std::optional<data::PromptDataset> train_data, val_data;
  std::unique_ptr<data::PromptLoader> loader;
  std::unique_ptr<rewards::RewardManager> reward, val_reward;
  std::unique_ptr<algos::KLController> kl_ctrl;
  // trainer.cluster_listen: the node agents every pool places workers on
  // (kept across restarts; the pools hold it too).
  std::shared_ptr<Cluster> cluster;
  std::optional<ResourcePool> pool;
  std::optional<WorkerGroup> group;         // the actor's (and colocated critic's) processes
  std::optional<WorkerGroup> critic_group;  // a critic with a layout of its own
  std::optional<WorkerGroup> actor;         // views: the actor role of `group`,
  std::optional<WorkerGroup> critic;        // the critic's role or critic_group
  std::optional<ResourcePool> rm_pool;      // a centralized reward model's processes
  std::optional<WorkerGroup> rm_group;      // a reward model with a layout of its own
  std::optional<WorkerGroup> rm;            // the reward model's role (colocated)
  std::optional<ResourcePool> rollout_pool;  // async_training: the RolloutWorker group's
  std::optional<WorkerGroup> rollout;        // processes (async_trainer.h)
  double rm_param_bytes_per_rank = 0;       // its parameter bytes per training device

  WorkerGroup& reward_model() { return rm ? *rm : *rm_group; }
  WorkerGroup& critic_role() { return critic ? *critic : *critic_group; }
  std::unique_ptr<MetricsLogger> logger;
  std::unique_ptr<StepProfiler> profiler;  // global_profiler.steps
  int64_t global_step = 0;
  // async_training: the rollout ledger of the checkpoint resumed from (its
  // queued and in-flight batches), for fit_async to take.
  std::vector<LedgerEntry> restored_ledger;
};

// trainer.default_local_dir/global_step_N/{actor,critic}/ (the workers'
// sharded checkpoints: model, optimizer, RNG) and trainer_state.json (the
// data loader's position, the KL controller); latest_checkpointed_iteration.txt
// names N once all of it is on disk. The async trainer passes its rollout
// ledger's snapshot (taken after the workers saved): its loader position
// replaces st.loader's, its entries go to global_step_N/rollout_ledger/.
// trainer_state.json's checksums go to global_step_N/baton-checksums.txt
// (the workers' and the ledger's directories have their own). A save that
// fails (a full disk) removes global_step_N, logs and throws baton::Error
// naming the step, the checkpoint latest_checkpointed_iteration.txt still
// names and the cause: the run stops rather than train on with nothing newer
// to resume from.
void save_trainer_checkpoint(PpoTrainer::State& st,
                             const std::function<LedgerSnapshot()>& ledger = {});
// As trainer.resume_mode says (auto: the latest checkpoint if there is one;
// resume_path: trainer.resume_from_path; disable): restores the workers, the
// loader and the KL controller, and reads a rollout ledger into
// st.restored_ledger. Returns whether it resumed.
bool resume_trainer_checkpoint(PpoTrainer::State& st);
// Whether `out_dir` names a complete checkpoint (latest_checkpointed_iteration.txt).
bool has_trainer_checkpoint(const std::string& out_dir);

}  // namespace baton::trainer
