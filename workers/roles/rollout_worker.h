// RolloutWorker: generation only, in worker processes of its own
// (disaggregated rollout, what fully-async training runs its rollouter on).
// Its model is the actor's in the rollout layout (rollout tp × replicas,
// pp = 1), frozen; new weights arrive from the actor's group through
// engine::WeightSender / WeightReceiver (weight_sync.h) over a Gloo sync group
// whose rendezvous is this group's store.
//
// Methods and their dispatch modes:
//   init_model()                 ONE_TO_ALL  load the model (the actor's HF path) in the
//                                            rollout layout and the generation engine
//   weight_sync_endpoint()       ONE_TO_ALL  → "host:port" of this group's rendezvous store
//   init_weight_sync(endpoint, name)  ONE_TO_ALL  join the sync group (collective with the
//                                actor group's init_weight_sync(endpoint, name, world))
//   receive_weights() → version  ONE_TO_ALL  (collective with the actor's send_weights)
//   param_version() → version    ONE_TO_ALL  the version of the weights held (0 before any
//                                receive); a cheap call that also checks the worker answers
//   generate_sequences(prompts)  mesh "rollout", as ActorRolloutRefWorker's
//                                (rollout_batch.h), plus meta `param_version`: the
//                                version of the weights that generated the batch
//
// Spawn it with init arguments {ActorRolloutRefOptions::to_json() of the
// actor, the actor group's world size} and a layout of rollout.tp × dp × 1;
// the class name is rollout_worker_class().
//
// Example (a driver):
//   auto rollout = WorkerGroup::spawn(rollout_worker_class(), pool, {actor.to_json(), 2}, ...);
//   rollout.call("init_model", {}).get();
//   const std::string ep = rollout.call("weight_sync_endpoint", {}).get().as_list()[0].as_string();
//   auto a = actor.call("init_weight_sync", {ep, "sync", rollout_world});
//   rollout.call("init_weight_sync", {ep, "sync"}).get();  a.get();
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <string>

#include "dispatch/data_proto.h"
#include "engine/rollout/generation.h"
#include "engine/rollout/weight_sync.h"
#include "runtime/method_table.h"
#include "runtime/value.h"
#include "runtime/worker.h"
#include "workers/roles/agent_loop.h"
#include "workers/roles/role_model.h"
#include "workers/roles/role_options.h"

namespace baton::workers {

class RolloutWorker : public Worker {
 public:
  explicit RolloutWorker(const List& init_args);

  void init_model();
  std::string weight_sync_endpoint();
  void init_weight_sync(const std::string& endpoint, const std::string& name);
  int64_t receive_weights();
  int64_t param_version() const { return version_; }
  DataProto generate_sequences(const DataProto& prompts);

  static void register_methods(MethodTable<RolloutWorker>& t);

 private:
  ActorRolloutRefOptions options_;   // the actor's
  engine::ParallelConfig training_;  // the actor group's layout (the sender's)
  std::unique_ptr<RoleModel> model_;
  std::unique_ptr<engine::GenerationEngine> engine_;
  std::unique_ptr<engine::WeightReceiver> receiver_;
  // rollout.multi_turn.enable: the agent loop's tokenizer, template, tools
  // and interactions, as the ActorRolloutRefWorker's.
  std::unique_ptr<AgentLoopResources> agent_;
  int64_t version_ = 0;
};

// The name the class is registered under (and a link-time anchor, as
// actor_rollout_ref_worker_class()).
const char* rollout_worker_class();

// A weight-sync group of `size` ranks with rendezvous at `endpoint`
// ("host:port" of an AuthStore server, e.g. a worker group's), under `name`, its
// forming and every operation limited to `timeout_ms` (the role's
// ModelOptions::collective_timeout_ms). Collective and blocking
// (engine::make_sync_group); baton::Error for a malformed endpoint.
c10::intrusive_ptr<c10d::ProcessGroup> connect_weight_sync_group(const std::string& endpoint,
                                                                 const std::string& name,
                                                                 int64_t rank, int64_t size,
                                                                 int64_t timeout_ms);

}  // namespace baton::workers
