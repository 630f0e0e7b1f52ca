// GRPO on the toy task (or any verl-format dataset and HF model, through
// overrides): the trainer of trainer/ppo_trainer.h with configs/grpo_toy.yaml.
//
//   build/examples/grpo --config configs/grpo_toy.yaml [key=value ...]
#include "runtime/baton.h"
#include "trainer/ppo_trainer.h"

int main(int argc, char** argv) {
  baton::init(argc, argv);  // in a worker process this runs the worker and never returns
  return baton::trainer::run_trainer_main(argc, argv, "configs/grpo_toy.yaml");
}
