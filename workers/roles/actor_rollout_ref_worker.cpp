#include "workers/roles/actor_rollout_ref_worker.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>

#include "dispatch/dispatch_modes.h"
#include "engine/checkpoint.h"
#include "engine/hf_model.h"
#include "engine/sharded_model.h"
#include "runtime/errors.h"
#include "runtime/process_group.h"
#include "workers/algos/agg_loss.h"
#include "workers/algos/kl.h"
#include "workers/algos/policy_loss.h"
#include "workers/roles/role_update.h"

namespace baton::workers {
namespace {

namespace fs = std::filesystem;

double meta_float(const DataProto& d, const char* key, double fallback) {
  const Value* v = d.meta_value(key);
  return v == nullptr || v->is_none() ? fallback : v->as_float();
}
int64_t meta_int(const DataProto& d, const char* key, int64_t fallback) {
  const Value* v = d.meta_value(key);
  return v == nullptr || v->is_none() ? fallback : v->as_int();
}
bool meta_bool(const DataProto& d, const char* key, bool fallback) {
  const Value* v = d.meta_value(key);
  return v == nullptr || v->is_none() ? fallback : v->as_bool();
}

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
  if (options_.ref) {
    ModelOptions ref_model = options_.model;
    ref_model.dtype = options_.ref_dtype;
    ref_model.offload = OffloadOptions{.params = options_.ref_param_offload};
    ref_ = std::make_unique<RoleModel>(info(), ref_model, "ref", nullptr, actor_->state_ptr());
  }
  engine::HybridEngineOptions h;
  h.rollout_tp = options_.rollout.tp;
  h.generation.max_batch = options_.rollout.max_batch;
  h.generation.cache.budget_bytes = options_.rollout.cache_bytes;
  h.generation.packed_cpu_steps = options_.rollout.packed_cpu_steps;
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
  prompts.require_tensors({"input_ids", "attention_mask"}, "generate_sequences");
  const at::Tensor ids = prompts.tensor("input_ids").to(at::kLong);
  const at::Tensor mask = prompts.tensor("attention_mask").to(at::kLong);
  const int64_t n_prompts = ids.size(0), P = ids.size(1);

  engine::SamplingParams sp;
  sp.n = meta_int(prompts, "n", 1);
  const bool do_sample = meta_bool(prompts, "do_sample", true);
  sp.temperature = do_sample ? meta_float(prompts, "temperature", 1.0) : 0.0;
  const int64_t top_k = meta_int(prompts, "top_k", -1);
  sp.top_k = top_k < 0 ? 0 : top_k;
  sp.top_p = meta_float(prompts, "top_p", 1.0);
  const int64_t R = meta_int(prompts, "response_length", options_.rollout.response_length);
  sp.max_new_tokens = R;
  const int64_t pad = meta_int(prompts, "pad_token_id", 0);
  if (const Value* stop = prompts.meta_value("stop_token_ids");
      stop != nullptr && !stop->is_none()) {
    for (const Value& s : stop->as_list()) sp.stop_token_ids.push_back(s.as_int());
  }
  std::vector<uint64_t> seeds;
  if (sp.temperature > 0 && !prompts.has_tensor("request_seed")) {
    throw Error(
        "generate_sequences: a sampled batch (do_sample, temperature > 0) needs a "
        "'request_seed' tensor, one int64 per prompt: without it every replica would "
        "draw from the same streams and a run could not repeat");
  }
  if (prompts.has_tensor("request_seed")) {
    at::Tensor s = prompts.tensor("request_seed").to(at::kLong).contiguous();
    for (int64_t i = 0; i < n_prompts; ++i)
      seeds.push_back(static_cast<uint64_t>(s[i].item<int64_t>()));
  }

  auto rows = unpadded_prompts(ids, mask, "generate_sequences");
  OffloadPhase phase(*actor_, /*training=*/false);
  // The optimizer state leaves a GPU during the rollout anyway (unless the
  // role's own optimizer offload already moved it).
  const bool move_optimizer = actor_->trainable() && !options_.model.offload.optimizer;
  if (move_optimizer) actor_->optimizer().offload();
  hybrid_->enter_rollout();
  std::vector<engine::GeneratedSequence> seqs;
  try {
    seqs = hybrid_->generate(rows, sp, seeds);
  } catch (...) {
    hybrid_->exit_rollout();
    if (move_optimizer) actor_->optimizer().reload();
    throw;
  }
  hybrid_->exit_rollout();
  if (move_optimizer) actor_->optimizer().reload();

  // Fixed widths (P from the input, R from the config), so that replicas'
  // results concatenate.
  const int64_t N = static_cast<int64_t>(seqs.size());
  at::Tensor out_prompts = at::empty({N, P}, at::kLong);
  at::Tensor prompt_mask = at::empty({N, P}, at::kLong);
  at::Tensor responses = at::full({N, R}, pad, at::kLong);
  at::Tensor response_mask = at::zeros({N, R}, at::kLong);
  at::Tensor rollout_lp = at::zeros({N, R}, at::kFloat);
  auto rp = responses.accessor<int64_t, 2>();
  auto rm = response_mask.accessor<int64_t, 2>();
  auto rl = rollout_lp.accessor<float, 2>();
  for (int64_t i = 0; i < N; ++i) {
    const auto& s = seqs[static_cast<size_t>(i)];
    out_prompts[i].copy_(ids[s.request]);
    prompt_mask[i].copy_(mask[s.request]);
    const int64_t len = std::min<int64_t>(R, static_cast<int64_t>(s.response.size()));
    for (int64_t t = 0; t < len; ++t) {
      rp[i][t] = s.response[static_cast<size_t>(t)];
      rm[i][t] = 1;
      if (static_cast<size_t>(t) < s.log_probs.size())
        rl[i][t] = s.log_probs[static_cast<size_t>(t)];
    }
  }
  at::Tensor attention = at::cat({prompt_mask, response_mask}, 1);
  DataProto out;
  out.set_tensor("prompts", out_prompts);
  out.set_tensor("responses", responses);
  out.set_tensor("input_ids", at::cat({out_prompts, responses}, 1));
  out.set_tensor("attention_mask", attention);
  out.set_tensor("position_ids", (attention.cumsum(1) - 1).clamp_min(0));
  out.set_tensor("response_mask", response_mask);
  out.set_tensor("rollout_log_probs", rollout_lp);
  return out;
}

DataProto ActorRolloutRefWorker::compute_log_prob(const DataProto& batch) {
  batch.require_tensors({"input_ids", "attention_mask", "responses"}, "compute_log_prob");
  at::Tensor entropy;
  OffloadPhase phase(actor(), /*training=*/false);
  at::Tensor lp = actor().response_log_probs(
      batch, {options_.rollout.log_prob_micro_batch_size, options_.rollout.log_prob_max_token_len},
      meta_float(batch, "temperature", 1.0), &entropy);
  DataProto out;
  if (lp.defined()) {
    out.set_tensor("old_log_probs", lp);
    out.set_tensor("entropys", entropy);
  }
  return out;
}

DataProto ActorRolloutRefWorker::compute_ref_log_prob(const DataProto& batch) {
  if (!ref_) {
    throw Error(
        "compute_ref_log_prob: this worker has no reference model (spawn it with "
        "ActorRolloutRefOptions::ref = true)");
  }
  batch.require_tensors({"input_ids", "attention_mask", "responses"}, "compute_ref_log_prob");
  OffloadPhase phase(*ref_, /*training=*/false);
  at::Tensor lp = ref_->response_log_probs(
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
  batch.require_tensors(keys, "update_actor");
  const double temperature = meta_float(batch, "temperature", 1.0);

  engine::ParallelState& ps = a.state();
  const int64_t R = response_width(batch);
  const algos::LossAggMode agg = algos::parse_loss_agg_mode(options_.update.loss_agg_mode);
  std::vector<std::string> mb_extra = {"response_mask", "advantages"};
  if (!on_policy) mb_extra.push_back("old_log_probs");
  if (po.use_kl_loss) mb_extra.push_back("ref_log_prob");

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
    engine::forward_backward(
        a.model(),
        make_micro_batches(mini, {options_.update.micro_batch_size, options_.update.max_token_len},
                           mb_extra, a.model().device()),
        [&](const at::Tensor& logits, const engine::MicroBatch& mb) {
          ResponseScores s = response_scores(logits, mb, R, temperature, ps.tp());
          const at::Tensor mask = mb.extra.at("response_mask").to(at::kFloat);
          const at::Tensor old = on_policy ? s.log_probs.detach() : mb.extra.at("old_log_probs");
          const at::Tensor adv = mb.extra.at("advantages");
          algos::PolicyLossResult pl =
              algos::policy_loss(po.loss_mode, old, s.log_probs, adv, mask, plo);
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
    const engine::StepStats step = a.optimizer().step();
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
}

BATON_WORKER(ActorRolloutRefWorker);

const char* actor_rollout_ref_worker_class() { return "ActorRolloutRefWorker"; }

}  // namespace baton::workers
