// PpoTrainer: verl's PPO fit loop on baton's workers, for every advantage
// estimator (GAE with a critic = PPO; grpo, rloo, ... without one). One step:
//
//   generate (HybridEngine, n samples per prompt) → reward (rule-based
//   reward manager) → old log-probs → ref log-probs (only when a KL is used)
//   → values (critic) → KL penalty in the reward (fixed or adaptive) →
//   advantages → critic update → actor update (after trainer.critic_warmup)
//   → metrics (console table, metrics.jsonl)
//
// with validation before training (trainer.val_before_train) and every
// trainer.test_freq steps, checkpoints every trainer.save_freq steps under
// trainer.default_local_dir/global_step_N (actor and critic with optimizer and
// RNG, the data loader's position), resume (trainer.resume_mode), and at the
// end the actor exported in HF format to default_local_dir/actor_hf and a PNG
// of the curves.
//
// With algorithm.filter_groups (DAPO's dynamic sampling), generate → reward
// repeats on batches of data.gen_batch_size prompts until
// data.train_batch_size groups whose metric varies are kept
// (trainer/dynamic_sampling.h); the rest of the step runs on those.
//
// The workers run on trainer.nnodes × trainer.n_gpus_per_node slots (CPU
// processes when trainer.device is cpu): the actor/rollout/ref roles in one
// group laid out as actor_rollout_ref.actor.megatron.*; the critic colocated
// in the same processes when its layout is the same, else a group of its own.
// With async_training.enable, fit() runs the fully-async loop instead
// (trainer/async/async_trainer.h: a RolloutWorker group of its own, a bounded queue).
//
// Example (a driver):
//   int main(int argc, char** argv) {
//     baton::init(argc, argv);
//     auto cl = baton::trainer::config_from_command_line(argc, argv, "configs/grpo_toy.yaml");
//     baton::trainer::PpoTrainer trainer(cl.config);
//     trainer.fit();
//   }
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "trainer/config/config.h"

namespace baton::trainer {

// What fit() did, for drivers and tests.
struct FitResult {
  int64_t steps = 0;                              // global steps reached
  std::map<std::string, double> last_metrics;     // the last step's metrics
  std::map<std::string, double> first_validation; // the first validation's, if any
  std::map<std::string, double> last_validation;  // the last validation's, if any
  std::string hf_dir;                             // where the final actor was exported
  std::string plot;                               // the PNG, if drawn
  int64_t restarts = 0;  // worker groups respawned after a death (trainer.max_restarts)
};

class PpoTrainer {
 public:
  // Validates `config` (ConfigError listing every problem), writes the
  // resolved config to trainer.default_local_dir/config.yaml, loads the
  // tokenizer and the datasets and spawns the workers (init_model on each).
  explicit PpoTrainer(Config config);
  ~PpoTrainer();
  PpoTrainer(const PpoTrainer&) = delete;
  PpoTrainer& operator=(const PpoTrainer&) = delete;

  // Trains to trainer.total_training_steps. When a worker process dies, up to
  // trainer.max_restarts times: every group is respawned and the run resumes
  // from the latest checkpoint of default_local_dir (or starts over), as a
  // new fit() would; past that (or for any other error) it throws.
  FitResult fit();
  // One validation pass over data.val_files with actor_rollout_ref.rollout.val_kwargs:
  // val-core/<data_source>/reward/mean@<n> (and val-aux/... for more); with
  // the dapo reward manager its per-row values too, acc as the core one
  // (val-core/<data_source>/acc/mean@<n>) and the reward under val-aux.
  std::map<std::string, double> validate();

  struct State;  // the implementation's (ppo_trainer.cpp)

 private:
  FitResult fit_once();  // the synchronous loop, once

  std::unique_ptr<State> s_;
};

// The main() of a trainer driver (examples/grpo.cpp, examples/ppo.cpp): the
// config from the command line (`--config FILE`, else `default_config`, then
// key=value overrides), fit(), and a summary: the first and last validation
// scores, where the HF export and the plot went. Returns the exit status (2
// for a config error, 1 for another failure, each printed to stderr).
// REQUIRES: baton::init(argc, argv) has run.
int run_trainer_main(int argc, char** argv, const std::string& default_config);

}  // namespace baton::trainer
