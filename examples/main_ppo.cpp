// verl's `python3 -m verl.trainer.main_ppo`, in baton: PPO, GRPO and the other
// estimators from configs/ppo_trainer.yaml (verl's keys and defaults), with
// verl's command lines as they are (docs/verl-keys.md):
//
//   build/examples/main_ppo algorithm.adv_estimator=grpo data.train_files=... [key=value ...]
//   build/examples/main_ppo --config-path=config --config-name=ppo_megatron_trainer.yaml ...
#include "runtime/baton.h"
#include "trainer/ppo_trainer.h"

int main(int argc, char** argv) {
  baton::init(argc, argv);  // in a worker process this runs the worker and never returns
  return baton::trainer::run_trainer_main(argc, argv, "configs/ppo_trainer.yaml");
}
