// PPO on the toy task (or any verl-format dataset and HF model, through
// overrides): the trainer of trainer/ppo_trainer.h with configs/ppo_toy.yaml.
//
//   build/examples/ppo --config configs/ppo_toy.yaml [key=value ...]
#include "runtime/baton.h"
#include "trainer/ppo_trainer.h"

int main(int argc, char** argv) {
  baton::init(argc, argv);  // in a worker process this runs the worker and never returns
  return baton::trainer::run_trainer_main(argc, argv, "configs/ppo_toy.yaml");
}
