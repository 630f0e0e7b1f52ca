// RewardModelWorker: scores whole sequences with a value model (an HF
// <Family>ForTokenClassification checkpoint with one label, or the critic's
// export): the score of a response is the model's value at its last valid
// token, placed there in `rm_scores` [N, R] (0 elsewhere; an empty response
// gets none), as verl's Megatron reward model does.
//
// Methods and their dispatch modes:
//   init_model()              ONE_TO_ALL (collective)
//   compute_rm_score(batch)   MEGATRON_COMPUTE_PROTO → rm_scores; needs input_ids,
//                             attention_mask, responses and response_mask
//
// Spawn with init argument RewardModelOptions::to_json(); the class name is
// reward_model_worker_class(). The trainer uses its scores as the
// token-level scores instead of the rule rewards when reward_model.enable.
#pragma once

#include <memory>

#include "dispatch/data_proto.h"
#include "runtime/method_table.h"
#include "runtime/value.h"
#include "runtime/worker.h"
#include "workers/roles/role_model.h"
#include "workers/roles/role_options.h"

namespace baton::workers {

class RewardModelWorker : public Worker {
 public:
  explicit RewardModelWorker(const List& init_args);

  void init_model();
  DataProto compute_rm_score(const DataProto& batch);
  // Bytes of this rank's shard of the model's parameters (what a training
  // rank saves when the reward model is centralized).
  int64_t param_bytes();

  static void register_methods(MethodTable<RewardModelWorker>& t);

 private:
  RewardModelOptions options_;
  std::unique_ptr<RoleModel> model_;
};

const char* reward_model_worker_class();

// `values` [N, R] (a value at each response token) → each row's value at its
// last valid token (response_mask), in place there, 0 elsewhere.
at::Tensor last_token_scores(const at::Tensor& values, const at::Tensor& response_mask);

}  // namespace baton::workers
