#include "workers/roles/actor_rollout_ref_worker.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "base/errors.h"
#include "base/log.h"
#include "dispatch/dispatch_modes.h"
#include "engine/io/checkpoint.h"
#include "engine/io/hf_model.h"
#include "engine/io/sharded_model.h"
#include "runtime/process_group.h"
#include "workers/algos/agg_loss.h"
#include "workers/algos/kl.h"
#include "workers/algos/policy_loss.h"
#include "workers/roles/role_update.h"
#include "workers/roles/rollout_batch.h"
#include "workers/roles/rollout_worker.h"

namespace baton::workers {
namespace {

namespace fs = std::filesystem;

// RAII: a LoRA model's adapters off for a scope (the frozen base, a LoRA
// actor's reference policy), restored at its exit, also when it throws.
class AdaptersOff {
 public:
  explicit AdaptersOff(engine::Transformer& model) : model_(model), was_on_(model.lora_enabled()) {
    model_.set_lora_enabled(false);
  }
  ~AdaptersOff() { model_.set_lora_enabled(was_on_); }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  engine::Transformer& model_;
  bool was_on_;
};

}  // namespace

ActorRolloutRefWorker::ActorRolloutRefWorker(const List& init_args) {
  if (init_args.size() != 1 || init_args[0].kind() != ValueKind::kString) {
    throw Error(
        "ActorRolloutRefWorker: expected one init argument, ActorRolloutRefOptions::to_json()");
  }
  options_ = ActorRolloutRefOptions::from_json(init_args[0].as_string());
  const int64_t tp = options_.rollout.tp;
  if (tp < 1 || world_size() % tp != 0) {
    throw Error("ActorRolloutRefWorker: rollout tensor_model_parallel_size " + std::to_string(tp) +
                " does not divide the " + std::to_string(world_size()) + " workers");
  }
  // Rollout replica k is ranks [k·tp, (k+1)·tp) (HybridEngine's layout).
  register_mesh("rollout", static_cast<int>(rank() / tp), rank() % tp == 0);
}

RoleModel& ActorRolloutRefWorker::actor() {
  if (!actor_) throw Error("ActorRolloutRefWorker: init_model was not called");
  return *actor_;
}

void ActorRolloutRefWorker::init_model() {
  actor_ = std::make_unique<RoleModel>(info(), options_.model, "actor",
                                       options_.actor ? &options_.optim : nullptr);
  // A LoRA actor's reference policy is its own base (the adapters off), as
  // verl's: no second copy.
  if (options_.ref && !options_.model.lora.enabled()) {
    ModelOptions ref_model = options_.model;
    ref_model.dtype = options_.ref_dtype;
    ref_model.offload = OffloadOptions{.params = options_.ref_param_offload};
    ref_ = std::make_unique<RoleModel>(info(), ref_model, "ref", nullptr, actor_->state_ptr());
  }
  engine::HybridEngineOptions h;
  h.rollout_tp = options_.rollout.tp;
  h.generation.max_batch = options_.rollout.max_batch;
  h.generation.cache.budget_bytes = options_.rollout.cache_bytes;
  h.generation.cache.memory_utilization = options_.rollout.gpu_memory_utilization;
  h.generation.packed_cpu_steps = options_.rollout.packed_cpu_steps;
  h.generation.device_decode_steps = options_.rollout.device_decode_steps;
  h.generation.cuda_graphs = options_.rollout.cuda_graphs;
  h.free_cache = options_.rollout.free_cache_engine;
  // The cache lives where the actor's weights do and is sized when a
  // rollout allocates it; this is what that budget would be now.
  log(LogLevel::kInfo,
      "rollout KV cache: " +
          engine::describe_kv_budget(
              engine::capped_cache_options(h.generation, actor_->model().config()),
              actor_->model().device()) +
          (h.free_cache ? "; allocated at each rollout, freed after it"
                        : "; allocated at the first rollout and kept (free_cache_engine false)"));
  if (options_.rollout.multi_turn.enable)
    agent_ = AgentLoopResources::load(options_.rollout.multi_turn);
  hybrid_ = std::make_unique<engine::HybridEngine>(actor_->model_ptr(),
                                                   rendezvous_store(info(), "hybrid"), h);
  if (hybrid_->rollout_replica() != rank() / options_.rollout.tp) {
    throw Error("ActorRolloutRefWorker: rank " + std::to_string(rank()) + " is rollout replica " +
                std::to_string(hybrid_->rollout_replica()) + ", its mesh says " +
                std::to_string(rank() / options_.rollout.tp));
  }
  actor_->idle();
  if (ref_) ref_->idle();
}

DataProto ActorRolloutRefWorker::generate_sequences(const DataProto& prompts) {
  actor();
  const RolloutRequest req =
      rollout_request(prompts, options_.rollout.response_length, "generate_sequences");
  OffloadPhase phase(*actor_, /*training=*/false);
  // The optimizer state leaves a GPU during the rollout anyway (unless the
  // role's own optimizer offload already moved it).
  const bool move_optimizer = actor_->trainable() && !options_.model.offload.optimizer;
  if (move_optimizer) actor_->optimizer().offload();
  hybrid_->enter_rollout();
  std::vector<engine::GeneratedSequence> seqs;
  // Multi-turn: the tool agent loop decides what follows each turn.
  std::optional<ToolAgentLoop> loop;
  if (agent_)
    loop.emplace(agent_->tokenizer, agent_->chat, agent_->tools, agent_->options,
                 tools_kwargs_of(prompts), agent_->interactions, interaction_kwargs_of(prompts));
  try {
    seqs = hybrid_->generate(req.prompts, req.params, req.seeds, req.continuations,
                             loop ? &*loop : nullptr);
  } catch (...) {
    hybrid_->exit_rollout();
    if (move_optimizer) actor_->optimizer().reload();
    throw;
  }
  hybrid_->exit_rollout();
  if (move_optimizer) actor_->optimizer().reload();
  DataProto out = rollout_result(req, seqs);
  if (loop) add_multi_turn_columns(out, seqs, *loop);
  return out;
}

DataProto ActorRolloutRefWorker::compute_log_prob(const DataProto& batch) {
  batch.require_tensors({"input_ids", "attention_mask", "responses"}, "compute_log_prob");
  at::Tensor entropy, sum_pi_squared;
  const Value* want_sum = batch.meta_value("calculate_sum_pi_squared");
  const bool with_sum = want_sum != nullptr && !want_sum->is_none() && want_sum->as_bool();
  OffloadPhase phase(actor(), /*training=*/false);
  at::Tensor lp = actor().response_log_probs(
      batch, {options_.rollout.log_prob_micro_batch_size, options_.rollout.log_prob_max_token_len},
      meta_float(batch, "temperature", 1.0), &entropy, with_sum ? &sum_pi_squared : nullptr);
  DataProto out;
  if (lp.defined()) {
    out.set_tensor("old_log_probs", lp);
    out.set_tensor("entropys", entropy);
    if (with_sum) out.set_tensor("sum_pi_squared", sum_pi_squared);
  }
  return out;
}

DataProto ActorRolloutRefWorker::compute_ref_log_prob(const DataProto& batch) {
  const bool lora_base = options_.ref && options_.model.lora.enabled();
  if (!ref_ && !lora_base) {
    throw Error(
        "compute_ref_log_prob: this worker has no reference model (spawn it with "
        "ActorRolloutRefOptions::ref = true)");
  }
  batch.require_tensors({"input_ids", "attention_mask", "responses"}, "compute_ref_log_prob");
  RoleModel& ref = ref_ ? *ref_ : actor();
  OffloadPhase phase(ref, /*training=*/false);
  std::optional<AdaptersOff> base;
  if (lora_base) base.emplace(ref.model());
  at::Tensor lp = ref.response_log_probs(
      batch, {options_.ref_log_prob_micro_batch_size, options_.ref_log_prob_max_token_len},
      meta_float(batch, "temperature", 1.0));
  DataProto out;
  if (lp.defined()) out.set_tensor("ref_log_prob", lp);
  return out;
}

DataProto ActorRolloutRefWorker::update_actor(const DataProto& batch) {
  RoleModel& a = actor();
  if (!a.trainable()) throw Error("update_actor: this worker has no actor role (options.actor)");
  MetricLists metrics;
  {
    OffloadPhase phase(a, /*training=*/true);
    metrics = update_actor_resident(batch);
    metrics["perf/resident_gb/actor_update"].push_back(gigabytes(a.resident_bytes()));
  }
  metrics["perf/resident_gb/actor_idle"].push_back(gigabytes(a.resident_bytes()));
  add_device_memory_metrics(metrics, a.model().device());
  return metrics_proto(metrics);
}

MetricLists ActorRolloutRefWorker::update_actor_resident(const DataProto& batch) {
  RoleModel& a = actor();
  const PolicyOptions& po = options_.policy;
  // Without old_log_probs the update is on-policy: the old log-probs are
  // this pass's own, detached (the driver skips its old-log-prob pass).
  const bool on_policy = !batch.has_tensor("old_log_probs");
  std::vector<std::string> keys = {"input_ids", "attention_mask", "position_ids",
                                   "responses", "response_mask",  "advantages"};
  if (!on_policy) keys.push_back("old_log_probs");
  if (po.use_kl_loss) keys.push_back("ref_log_prob");
  // Importance weights of off-policy samples (the driver's truncated IS of
  // an asynchronous rollout): the per-token loss is multiplied by them.
  const bool weighted = batch.has_tensor("rollout_is_weights");
  if (weighted) keys.push_back("rollout_is_weights");
  batch.require_tensors(keys, "update_actor");
  const double temperature = meta_float(batch, "temperature", 1.0);

  engine::ParallelState& ps = a.state();
  const int64_t R = response_width(batch);
  const algos::LossAggMode agg = algos::parse_loss_agg_mode(options_.update.loss_agg_mode);
  std::vector<std::string> mb_extra = {"response_mask", "advantages"};
  if (!on_policy) mb_extra.push_back("old_log_probs");
  if (po.use_kl_loss) mb_extra.push_back("ref_log_prob");
  if (weighted) mb_extra.push_back("rollout_is_weights");

  std::vector<DataProto> minis = local_mini_batches(batch.select(keys), options_.update,
                                                    ps.config().dp, updates_, "update_actor");
  if (on_policy && minis.size() != 1) {
    throw Error(
        "update_actor: the batch has no old_log_probs, which only an on-policy update "
        "(one epoch, one mini-batch) may leave out; this one makes " +
        std::to_string(minis.size()) + " optimizer steps (run compute_log_prob first)");
  }
  MetricLists metrics;
  for (const DataProto& mini : minis) {
    algos::GlobalBatchInfo global = global_batch_info(mini, ps);
    global.loss_scale_factor = options_.update.loss_scale_factor;
    algos::PolicyLossOptions plo;
    plo.clip_ratio = po.clip_ratio;
    plo.clip_ratio_low = po.clip_ratio_low;
    plo.clip_ratio_high = po.clip_ratio_high;
    plo.clip_ratio_c = po.clip_ratio_c;
    plo.clip_cov_ratio = po.clip_cov_ratio;
    plo.clip_cov_lb = po.clip_cov_lb;
    plo.clip_cov_ub = po.clip_cov_ub;
    plo.kl_cov_ratio = po.kl_cov_ratio;
    plo.ppo_kl_coef = po.ppo_kl_coef;
    plo.tau_pos = po.tau_pos;
    plo.tau_neg = po.tau_neg;
    plo.dro_beta = po.dro_beta;
    plo.agg = agg;
    plo.global = global;

    // [pg_loss, kl_loss, entropy·mask sum] summed over micro-batches.
    std::vector<double> sums(3, 0.0);
    MetricLists micro_metrics;
    a.optimizer().zero_grad();
    std::vector<engine::MicroBatch> mbs =
        make_micro_batches(mini,
                           a.batching_for(mini, {.rows = options_.update.micro_batch_size,
                                                 .max_tokens = options_.update.max_token_len}),
                           mb_extra, a.model().device());
    // MoE: the router's load-balancing loss (router_aux_loss_coef of the
    // model's config, as HF adds it), each micro-batch's a share of the
    // mini-batch's; every stage adds its own layers' (Transformer::
    // set_router_aux_loss_scale).
    engine::Transformer& model = a.model();
    const double aux_coef = model.config().moe.router_aux_loss_coef;
    const bool moe = model.has_sparse_layers();
    std::vector<double> aux_losses;
    if (moe) model.set_router_aux_loss_scale(aux_coef / static_cast<double>(mbs.size()));
    engine::forward_backward(
        model, std::move(mbs), [&](const at::Tensor& out, const engine::MicroBatch& mb) {
          if (moe) aux_losses.push_back(model.last_router_aux_loss());
          ResponseScores s = a.scores(out, mb, R, temperature);
          const at::Tensor mask = mb.extra.at("response_mask").to(at::kFloat);
          const at::Tensor old = on_policy ? s.log_probs.detach() : mb.extra.at("old_log_probs");
          const at::Tensor adv = mb.extra.at("advantages");
          std::optional<at::Tensor> is_weights;
          if (weighted) is_weights = mb.extra.at("rollout_is_weights").to(at::kFloat);
          algos::PolicyLossResult pl =
              algos::policy_loss(po.loss_mode, old, s.log_probs, adv, mask, plo, is_weights);
          at::Tensor loss = pl.loss;
          sums[0] += pl.loss.item<double>();
          if (mask.sum().item<double>() > 0) {
            for (const auto& [k, v] : pl.metrics)
              micro_metrics[k].push_back(v);  // keys carry "actor/"
          }
          sums[2] += (s.entropy.detach() * mask).sum().item<double>();
          if (po.entropy_coeff != 0) {
            loss = loss - po.entropy_coeff * algos::agg_loss(s.entropy, mask, agg, global);
          }
          if (po.use_kl_loss) {
            const at::Tensor ref = mb.extra.at("ref_log_prob");
            at::Tensor kl = algos::agg_loss(algos::kl_penalty(s.log_probs, ref, po.kl_loss_type),
                                            mask, agg, global);
            sums[1] += kl.item<double>();
            loss = loss + po.kl_loss_coef * kl;
          }
          return loss;
        });
    if (moe) model.set_router_aux_loss_scale(0);
    const engine::StepStats step = a.optimizer().step();
    if (!aux_losses.empty()) {
      double total = 0;
      for (double x : aux_losses) total += x;
      metrics["actor/router_aux_loss"].push_back(total / static_cast<double>(aux_losses.size()));
    }
    if (ps.is_last_stage()) {
      // The micro-batch losses are shares of the mini-batch's (global
      // normalisation scales each by dp): their DP sum over dp is its value.
      all_reduce_sum(sums, ps.dp(), ps.device());
      const double dp = static_cast<double>(ps.config().dp);
      metrics["actor/pg_loss"].push_back(sums[0] / dp);
      if (po.use_kl_loss) {
        metrics["actor/kl_loss"].push_back(sums[1] / dp);
        metrics["actor/kl_coef"].push_back(po.kl_loss_coef);
      }
      if (global.batch_num_tokens && *global.batch_num_tokens > 0) {
        metrics["actor/update_entropy"].push_back(sums[2] / *global.batch_num_tokens);
      }
      for (auto& [k, v] : micro_metrics) {
        double total = 0;
        for (double x : v) total += x;
        metrics[k].push_back(total / static_cast<double>(v.size()));
      }
    }
    metrics["actor/grad_norm"].push_back(step.grad_norm);
    metrics["actor/lr"].push_back(step.lr);
    if (step.skipped) metrics["actor/skipped_steps"].push_back(1.0);
  }
  return metrics;
}

void ActorRolloutRefWorker::save_checkpoint(const std::string& dir, int64_t step,
                                            const std::string& extra_json) {
  RoleModel& a = actor();
  OffloadPhase phase(a, /*training=*/true);
  nlohmann::json extra =
      extra_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra_json);
  engine::save_checkpoint(dir, step, a.model(), a.optimizer(), extra);
}

std::string ActorRolloutRefWorker::load_checkpoint(const std::string& dir, int64_t step) {
  RoleModel& a = actor();
  OffloadPhase phase(a, /*training=*/true);
  return engine::load_checkpoint(dir, a.model(), a.optimizer(),
                                 step < 0 ? std::nullopt : std::optional<int64_t>(step))
      .dump();
}

void ActorRolloutRefWorker::init_weight_sync(const std::string& endpoint, const std::string& name,
                                             int64_t rollout_world) {
  RoleModel& a = actor();
  const int64_t size = engine::sync_group_size(a.state().config(), rollout_world);
  c10::intrusive_ptr<c10d::ProcessGroup> sync;
  if (const int64_t r = engine::trainer_sync_rank(a.state()); r >= 0)
    sync = connect_weight_sync_group(endpoint, name, r, size, options_.model.collective_timeout_ms);
  sender_ = std::make_unique<engine::WeightSender>(a.model_ptr(), sync);
}

double ActorRolloutRefWorker::send_weights(int64_t version) {
  if (!sender_) throw Error("send_weights: init_weight_sync was not called");
  OffloadPhase phase(actor(), /*training=*/false);
  return sender_->send(version).seconds;
}

void ActorRolloutRefWorker::export_hf(const std::string& dir) {
  OffloadPhase phase(actor(), /*training=*/false);
  export_hf_model(actor(), dir);
}

void ActorRolloutRefWorker::register_methods(MethodTable<ActorRolloutRefWorker>& t) {
  namespace mode = dispatch_mode;
  t.def("init_model", &ActorRolloutRefWorker::init_model);
  t.def("generate_sequences", &ActorRolloutRefWorker::generate_sequences,
        MethodOptions().set_dispatch_mode(mode::mesh_proto("rollout")));
  t.def("compute_log_prob", &ActorRolloutRefWorker::compute_log_prob,
        MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
  t.def("compute_ref_log_prob", &ActorRolloutRefWorker::compute_ref_log_prob,
        MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
  t.def("update_actor", &ActorRolloutRefWorker::update_actor,
        MethodOptions().set_dispatch_mode(mode::kMegatronComputeProto));
  t.def("save_checkpoint", &ActorRolloutRefWorker::save_checkpoint);
  t.def("load_checkpoint", &ActorRolloutRefWorker::load_checkpoint);
  t.def("export_hf", &ActorRolloutRefWorker::export_hf);
  t.def("init_weight_sync", &ActorRolloutRefWorker::init_weight_sync);
  t.def("send_weights", &ActorRolloutRefWorker::send_weights);
}

BATON_WORKER(ActorRolloutRefWorker);

const char* actor_rollout_ref_worker_class() { return "ActorRolloutRefWorker"; }

}  // namespace baton::workers
