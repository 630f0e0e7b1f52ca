#include "workers/roles/rollout_worker.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "base/errors.h"
#include "base/log.h"
#include "dispatch/dispatch_modes.h"
#include "runtime/internal/auth_store.h"
#include "workers/roles/rollout_batch.h"

namespace baton::workers {
namespace {

// free_cache_engine: the engine's KV cache allocated for a scope — woken at
// its start (sized anew: with gpu_memory_utilization, by the device's memory
// in use then) and freed at its end, also when generate throws. Off: nothing.
class AwakeCache {
 public:
  AwakeCache(engine::GenerationEngine& engine, bool on) : engine_(engine), on_(on) {
    if (on_) engine_.wake();
  }
  ~AwakeCache() {
    if (!on_) return;
    try {
      engine_.sleep();
    } catch (const std::exception& e) {
      log(LogLevel::kWarn,
          std::string("RolloutWorker: the KV cache could not be freed after generate: ") +
              e.what());
    }
  }
  AwakeCache(const AwakeCache&) = delete;
  AwakeCache& operator=(const AwakeCache&) = delete;

 private:
  engine::GenerationEngine& engine_;
  bool on_;
};

}  // namespace

RolloutWorker::RolloutWorker(const List& init_args) {
  if (init_args.size() != 2 || init_args[0].kind() != ValueKind::kString ||
      init_args[1].kind() != ValueKind::kInt) {
    throw Error(
        "RolloutWorker: expected two init arguments, the actor's "
        "ActorRolloutRefOptions::to_json() and the actor group's world size");
  }
  options_ = ActorRolloutRefOptions::from_json(init_args[0].as_string());
  const int64_t trainer_world = init_args[1].as_int();
  const ModelOptions& m = options_.model;
  if (m.tp < 1 || m.pp < 1 || trainer_world % (m.tp * m.pp) != 0) {
    throw Error("RolloutWorker: the actor's tp " + std::to_string(m.tp) + " × pp " +
                std::to_string(m.pp) + " does not divide its " + std::to_string(trainer_world) +
                " workers");
  }
  training_.tp = m.tp;
  training_.pp = m.pp;
  training_.dp = trainer_world / (m.tp * m.pp);
  training_.make_vocab_size_divisible_by = m.vocab_divisible_by;
  // Expert parallelism: dp ranks 0..ep-1 send the experts of their EP rank.
  training_.ep = m.ep;
  if (m.ep < 1 || training_.dp % m.ep != 0) {
    throw Error("RolloutWorker: the actor's expert_model_parallel_size " + std::to_string(m.ep) +
                " does not divide its data-parallel size " + std::to_string(training_.dp));
  }
  const int64_t tp = options_.rollout.tp;
  if (tp < 1 || world_size() % tp != 0) {
    throw Error("RolloutWorker: rollout tensor_model_parallel_size " + std::to_string(tp) +
                " does not divide the " + std::to_string(world_size()) + " rollout workers");
  }
  register_mesh("rollout", static_cast<int>(rank() / tp), rank() % tp == 0);
}

void RolloutWorker::init_model() {
  ModelOptions m = options_.model;
  m.tp = options_.rollout.tp;
  m.pp = 1;
  m.ep = 1;  // every rollout rank holds every expert
  m.offload = {};
  // Generation only: no backward to recompute, no sequence-split activations.
  m.sequence_parallel = false;
  m.recompute_activations = false;
  model_ = std::make_unique<RoleModel>(info(), m, "rollout", nullptr);
  engine::GenerationOptions g;
  g.max_batch = options_.rollout.max_batch;
  g.cache.budget_bytes = options_.rollout.cache_bytes;
  g.cache.memory_utilization = options_.rollout.gpu_memory_utilization;
  g.packed_cpu_steps = options_.rollout.packed_cpu_steps;
  g.device_decode_steps = options_.rollout.device_decode_steps;
  g.cuda_graphs = options_.rollout.cuda_graphs;
  // Measured before the engine allocates its cache: the budget it will get.
  const std::string budget = engine::describe_kv_budget(
      engine::capped_cache_options(g, model_->model().config()), model_->model().device());
  engine_ = std::make_unique<engine::GenerationEngine>(model_->model_ptr(), g);
  const bool free_cache = options_.rollout.free_cache_engine;
  log(LogLevel::kInfo,
      "rollout KV cache: " + budget + "; " + std::to_string(engine_->cache().allocated_bytes()) +
          " bytes allocated" +
          (free_cache ? ", freed between generate calls" : ", kept (free_cache_engine false)"));
  // free_cache_engine: the cache is allocated only while generate runs.
  if (free_cache) engine_->sleep();
  if (options_.rollout.multi_turn.enable)
    agent_ = AgentLoopResources::load(options_.rollout.multi_turn);
}

std::string RolloutWorker::weight_sync_endpoint() {
  return info().master_addr + ":" + std::to_string(info().master_port);
}

void RolloutWorker::init_weight_sync(const std::string& endpoint, const std::string& name) {
  if (!model_) throw Error("RolloutWorker.init_weight_sync: init_model was not called");
  const int64_t size = engine::sync_group_size(training_, world_size());
  receiver_ = std::make_unique<engine::WeightReceiver>(
      model_->model_ptr(), training_,
      connect_weight_sync_group(endpoint, name, engine::receiver_sync_rank(training_, rank()), size,
                                options_.model.collective_timeout_ms));
}

int64_t RolloutWorker::receive_weights() {
  if (!receiver_) throw Error("RolloutWorker.receive_weights: init_weight_sync was not called");
  version_ = receiver_->receive().version;
  return version_;
}

DataProto RolloutWorker::generate_sequences(const DataProto& prompts) {
  if (!engine_) throw Error("RolloutWorker.generate_sequences: init_model was not called");
  const RolloutRequest req =
      rollout_request(prompts, options_.rollout.response_length, "generate_sequences");
  std::vector<engine::GeneratedSequence> seqs;
  // Multi-turn: the agent loop decides what follows each turn.
  std::optional<ToolAgentLoop> loop;
  if (agent_) {
    if (!req.continuations.empty())
      throw Error(
          "RolloutWorker.generate_sequences: a multi-turn rollout cannot continue partial "
          "rollouts (resume_generated): their turns' appended tokens would be taken as "
          "generated");
    loop.emplace(agent_->tokenizer, agent_->chat, agent_->tools, agent_->options,
                 tools_kwargs_of(prompts), agent_->interactions, interaction_kwargs_of(prompts));
  }
  {
    AwakeCache awake(*engine_, options_.rollout.free_cache_engine);
    seqs = engine_->generate(req.prompts, req.params, req.seeds, req.continuations,
                             loop ? &*loop : nullptr);
  }
  DataProto out = rollout_result(req, seqs);
  if (loop) add_multi_turn_columns(out, seqs, *loop);
  out.set_meta("param_version", Value(version_));
  return out;
}

void RolloutWorker::register_methods(MethodTable<RolloutWorker>& t) {
  namespace mode = dispatch_mode;
  t.def("init_model", &RolloutWorker::init_model);
  t.def("weight_sync_endpoint", &RolloutWorker::weight_sync_endpoint);
  t.def("init_weight_sync", &RolloutWorker::init_weight_sync);
  t.def("receive_weights", &RolloutWorker::receive_weights);
  t.def("param_version", &RolloutWorker::param_version);
  t.def("generate_sequences", &RolloutWorker::generate_sequences,
        MethodOptions().set_dispatch_mode(mode::mesh_proto("rollout")));
}

BATON_WORKER(RolloutWorker);

const char* rollout_worker_class() { return "RolloutWorker"; }

c10::intrusive_ptr<c10d::ProcessGroup> connect_weight_sync_group(const std::string& endpoint,
                                                                 const std::string& name,
                                                                 int64_t rank, int64_t size,
                                                                 int64_t timeout_ms) {
  auto store = connect_store(endpoint, std::chrono::milliseconds(timeout_ms));
  return engine::make_sync_group(c10::make_intrusive<c10d::PrefixStore>("weight_sync", store), name,
                                 rank, size, std::chrono::milliseconds(timeout_ms));
}

}  // namespace baton::workers
