// ActorRolloutRefWorker: the actor, rollout and reference roles in one worker
// process (verl's hybrid worker). The actor model trains in the group's
// Megatron layout (tp × dp × pp); for a rollout its weights are resharded into
// a rollout layout (rollout tp × world/tp replicas) by the HybridEngine,
// generate, and are freed again; the reference policy is a frozen copy of the
// initial weights in the actor's layout, built only when asked for. A LoRA
// actor (ModelOptions::lora, as verl's) trains its adapters only, generates
// with them (merged into the rollout's weights when they are resharded), and
// its reference policy is the actor itself with the adapters off.
//
// Methods and their dispatch modes (verl's Megatron worker):
//   init_model()                 ONE_TO_ALL  load the models, build the optimizer and the
//                                            HybridEngine (collective)
//   generate_sequences(prompts)  mesh "rollout": each rollout replica gets its chunk of the
//                                prompts and the replica's tp-rank-0 result is collected
//   compute_log_prob(batch)      MEGATRON_COMPUTE_PROTO  → old_log_probs (and entropys;
//                                with meta `calculate_sum_pi_squared` true also
//                                sum_pi_squared, Σπ² per token: not with a fused LM head)
//   compute_ref_log_prob(batch)  MEGATRON_COMPUTE_PROTO  → ref_log_prob
//   update_actor(batch)          MEGATRON_COMPUTE_PROTO  → meta "metrics" (lists); an
//                                optional `rollout_is_weights` [N, R] multiplies the
//                                per-token policy loss (importance weights of stale samples)
//   save_checkpoint(dir, step, extra_json)   ONE_TO_ALL (collective)
//   load_checkpoint(dir, step) → extra_json  ONE_TO_ALL
//   export_hf(dir)               ONE_TO_ALL: rank 0 writes an HF model directory
//   init_weight_sync(endpoint, name, rollout_world)  ONE_TO_ALL, collective with a
//                                RolloutWorker group's init_weight_sync(endpoint, name)
//   send_weights(version) → seconds  ONE_TO_ALL, collective with its receive_weights()
//
// generate_sequences takes `input_ids` and `attention_mask` [N, P] (prompts
// left-padded) and `request_seed` [N] int64; meta `n`, `temperature`,
// `top_k`, `top_p`, `do_sample`, optional `response_length`,
// `pad_token_id`, `stop_token_ids`. It returns N·n rows in (prompt, sample)
// order, prompts repeated: `prompts` [.., P], `responses` [.., R] (R = the
// response length, padded with pad_token_id), `input_ids`,
// `attention_mask`, `position_ids`, `response_mask`, `rollout_log_probs`.
//
// Spawn it with init argument ActorRolloutRefOptions::to_json() and a layout
// of options.model.tp × dp × options.model.pp; the class name is
// actor_rollout_ref_worker_class().
#pragma once

#include <memory>
#include <string>

#include "dispatch/data_proto.h"
#include "engine/rollout/hybrid_engine.h"
#include "engine/rollout/weight_sync.h"
#include "runtime/method_table.h"
#include "runtime/value.h"
#include "runtime/worker.h"
#include "workers/roles/agent_loop.h"
#include "workers/roles/role_model.h"
#include "workers/roles/role_options.h"
#include "workers/roles/role_update.h"

namespace baton::workers {

class ActorRolloutRefWorker : public Worker {
 public:
  explicit ActorRolloutRefWorker(const List& init_args);

  void init_model();
  DataProto generate_sequences(const DataProto& prompts);
  DataProto compute_log_prob(const DataProto& batch);
  DataProto compute_ref_log_prob(const DataProto& batch);
  DataProto update_actor(const DataProto& batch);
  void save_checkpoint(const std::string& dir, int64_t step, const std::string& extra_json);
  std::string load_checkpoint(const std::string& dir, int64_t step);
  void export_hf(const std::string& dir);
  // Weight sync to a separate rollout group (rollout_worker.h): the sender
  // side, the first data-parallel replica's ranks in the sync group.
  void init_weight_sync(const std::string& endpoint, const std::string& name,
                        int64_t rollout_world);
  double send_weights(int64_t version);

  static void register_methods(MethodTable<ActorRolloutRefWorker>& t);

 private:
  // update_actor's work, the role resident (metrics as lists).
  MetricLists update_actor_resident(const DataProto& batch);
  RoleModel& actor();

  ActorRolloutRefOptions options_;
  std::unique_ptr<RoleModel> actor_;
  std::unique_ptr<RoleModel> ref_;  // null for a LoRA actor (its base is the reference)
  std::unique_ptr<engine::HybridEngine> hybrid_;
  // rollout.multi_turn.enable: the tool agent loop's tokenizer, template and tools.
  std::unique_ptr<AgentLoopResources> agent_;
  std::unique_ptr<engine::WeightSender> sender_;  // init_weight_sync
  int64_t updates_ = 0;  // update_actor calls so far (shuffle seeds without a step)
};

// The name the class is registered under; calling it also makes sure the
// registration is linked into the program (drivers spawn by this name).
const char* actor_rollout_ref_worker_class();

}  // namespace baton::workers
