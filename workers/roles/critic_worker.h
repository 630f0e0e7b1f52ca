// CriticWorker: the value model of PPO (verl's Megatron critic). Its model is
// the engine's Transformer with a value head (hidden → 1) on the last stage,
// in the group's tp × dp × pp layout; built from a causal-LM checkpoint it
// keeps a freshly initialised head and logs a notice saying so.
//
// Methods and their dispatch modes:
//   init_model()               ONE_TO_ALL (collective)
//   compute_values(batch)      MEGATRON_COMPUTE_PROTO → values [N, R]: the value at
//                              the position before each response token
//   update_critic(batch)       MEGATRON_COMPUTE_PROTO → meta "metrics" (critic/vf_loss,
//                              critic/vf_clipfrac, critic/vpred_mean, critic/grad_norm,
//                              critic/lr); needs values, returns, response_mask
//   save_checkpoint(dir, step, extra_json), load_checkpoint(dir, step) → extra_json,
//   export_hf(dir)             ONE_TO_ALL
//
// Spawn with init argument CriticOptions::to_json() (model.value_model is
// forced on); the class name is critic_worker_class().
#pragma once

#include <memory>
#include <string>

#include "dispatch/data_proto.h"
#include "runtime/method_table.h"
#include "runtime/value.h"
#include "runtime/worker.h"
#include "workers/roles/role_model.h"
#include "workers/roles/role_options.h"

namespace baton::workers {

class CriticWorker : public Worker {
 public:
  explicit CriticWorker(const List& init_args);

  void init_model();
  DataProto compute_values(const DataProto& batch);
  DataProto update_critic(const DataProto& batch);
  void save_checkpoint(const std::string& dir, int64_t step, const std::string& extra_json);
  std::string load_checkpoint(const std::string& dir, int64_t step);
  void export_hf(const std::string& dir);

  static void register_methods(MethodTable<CriticWorker>& t);

 private:
  RoleModel& critic();

  CriticOptions options_;
  std::unique_ptr<RoleModel> critic_;
  int64_t updates_ = 0;
};

const char* critic_worker_class();

}  // namespace baton::workers
