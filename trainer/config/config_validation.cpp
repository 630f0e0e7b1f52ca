#include "trainer/config/config_validation.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/errors.h"
#include "engine/errors.h"
#include "engine/io/peft_adapter.h"
#include "trainer/config/settings.h"

namespace baton::trainer {
namespace {

using baton::detail::cat;

// Every problem found, instead of stopping at the first.
class Problems {
 public:
  void add(std::string message) { list_.push_back(std::move(message)); }
  std::vector<std::string> take() { return std::move(list_); }

  // `value` if it is ≥ minimum, else nullopt (a problem is recorded).
  std::optional<int64_t> at_least(const std::string& key, int64_t value, int64_t minimum) {
    if (value >= minimum) return value;
    add(cat(key, " = ", value, " must be >= ", minimum));
    return std::nullopt;
  }
  // Null, or an int ≥ 1. nullopt for null or a problem.
  std::optional<int64_t> positive_or_null(const std::string& key, std::optional<int64_t> value) {
    if (value && *value < 1) {
      add(cat(key, " = ", *value, " must be >= 1 (or null)"));
      return std::nullopt;
    }
    return value;
  }

 private:
  std::vector<std::string> list_;
};

// A model layout: TP × PP over the world; returns its DP size, or nullopt.
// `per_node` (set when the workers span several nodes): a TP group must stay
// within one, as WorkerGroup::spawn requires. An empty `pp_key`: no pipeline.
std::optional<int64_t> check_layout(Problems& p, std::optional<int64_t> world,
                                    const std::string& role, const std::string& tp_key,
                                    int64_t tp_value, const std::string& pp_key, int64_t pp_value,
                                    std::optional<int64_t> per_node) {
  const auto tp = p.at_least(tp_key, tp_value, 1);
  const auto pp = pp_key.empty() ? std::optional<int64_t>(1) : p.at_least(pp_key, pp_value, 1);
  if (per_node && tp && *per_node % *tp != 0)
    p.add(cat(tp_key, " = ", *tp, " does not divide trainer.n_gpus_per_node = ", *per_node,
              ": the ", role, "'s tensor-parallel groups would span two nodes"));
  if (!world || !tp || !pp) return std::nullopt;
  const int64_t model = *tp * *pp;
  if (*world % model != 0) {
    const std::string sizes =
        pp_key.empty() ? cat(tp_key, " = ", *tp)
                       : cat(tp_key, " x ", pp_key, " = ", *tp, " x ", *pp, " = ", model);
    p.add(cat("the ", role,
              " layout does not fit the workers: trainer.nnodes x trainer.n_gpus_per_node = ",
              *world, " is not divisible by ", sizes));
    return std::nullopt;
  }
  return *world / model;
}

// What the layout checks found, for the batch checks that need it (empty
// where a size was out of range: that is reported already).
struct Layouts {
  std::optional<int64_t> actor_dp, rollout_dp, critic_dp;
};

// <prefix>expert_model_parallel_size: at least 1, dividing the role's DP
// size, and with the plain optimizer (the distributed one does not shard
// expert parameters).
void check_expert_parallel(Problems& p, const std::string& prefix,
                           const workers::ModelOptions& model, const workers::OptimOptions& optim,
                           std::optional<int64_t> dp) {
  const std::string key = prefix + "expert_model_parallel_size";
  if (!p.at_least(key, model.ep, 1) || model.ep == 1) return;
  if (dp && *dp % model.ep != 0)
    p.add(cat(key, " = ", model.ep, " does not divide the data-parallel size ", *dp,
              " (expert parallel ranks are carved from the data-parallel ones)"));
  if (optim.distributed)
    p.add(cat(key, " = ", model.ep, " needs ", prefix,
              "use_distributed_optimizer = false (the distributed optimizer does not shard "
              "expert parameters)"));
}

// Workers and layouts: nodes and slots, each role's TP x PP over the world.
Layouts check_workers_and_layouts(Problems& p, const TrainerSettings& s) {
  const auto nnodes = p.at_least("trainer.nnodes", s.nnodes, 1);
  const auto per_node = p.at_least("trainer.n_gpus_per_node", s.per_node, 1);
  const std::optional<int64_t> world =
      nnodes && per_node ? std::optional<int64_t>(*nnodes * *per_node) : std::nullopt;
  if (nnodes && *nnodes > 1 && s.cluster_listen.empty())
    p.add(cat("trainer.nnodes = ", *nnodes,
              " needs node agents: set trainer.cluster_listen to the host:port where the "
              "driver waits for them (`baton-agent --driver HOST:PORT` on every node)"));
  if (!s.cluster_listen.empty() && s.async.enable)
    p.add(
        "trainer.cluster_listen: the fully-async trainer runs on one machine only "
        "(set async_training.enable = false to use node agents)");
  // Several nodes: every TP group within one.
  const std::optional<int64_t> node_size =
      nnodes && *nnodes > 1 ? per_node : std::optional<int64_t>();
  const std::string actor = "actor_rollout_ref.actor.megatron.";
  Layouts l;
  l.actor_dp =
      check_layout(p, world, "actor", actor + "tensor_model_parallel_size", s.actor.model.tp,
                   actor + "pipeline_model_parallel_size", s.actor.model.pp, node_size);
  // The reference policy is a frozen copy in the actor's processes: its layout is the actor's.
  for (const auto& [size, ref, act] :
       {std::tuple("tensor_model_parallel_size", s.ref_tp, s.actor.model.tp),
        std::tuple("pipeline_model_parallel_size", s.ref_pp, s.actor.model.pp)}) {
    if (ref != act)
      p.add(cat("actor_rollout_ref.ref.megatron.", size, " = ", ref, " differs from ", actor, size,
                " = ", act, "; the reference policy runs in the actor's layout (set them equal)"));
  }
  l.rollout_dp =
      check_layout(p, world, "rollout", "actor_rollout_ref.rollout.tensor_model_parallel_size",
                   s.actor.rollout.tp, "", 1, node_size);
  if (s.use_critic)
    l.critic_dp = check_layout(p, world, "critic", "critic.megatron.tensor_model_parallel_size",
                               s.critic.model.tp, "critic.megatron.pipeline_model_parallel_size",
                               s.critic.model.pp, node_size);
  check_expert_parallel(p, "actor_rollout_ref.actor.megatron.", s.actor.model, s.actor.optim,
                        l.actor_dp);
  if (s.use_critic)
    check_expert_parallel(p, "critic.megatron.", s.critic.model, s.critic.optim, l.critic_dp);
  if (s.use_rm)
    check_layout(p, world, "reward model", "reward_model.megatron.tensor_model_parallel_size",
                 s.rm.model.tp, "reward_model.megatron.pipeline_model_parallel_size", s.rm.model.pp,
                 node_size);
  return l;
}

// A packed micro-batch holds whole sequences, so its budget must hold the
// longest one; the budget is checked to be positive even when it is off.
void check_budget(Problems& p, const TokenBudget& b, const std::string& switch_key,
                  const std::string& max_key, int64_t longest) {
  const auto max_tokens = p.at_least(max_key, b.max_tokens, 1);
  if (b.on && max_tokens && *max_tokens < longest)
    p.add(cat(max_key, " = ", *max_tokens, " cannot hold a sequence of ", longest,
              " tokens (data.max_prompt_length + data.max_response_length) with ", switch_key,
              " = true"));
}

// Mini- and micro-batches of one trained role over its DP ranks; `prefix`
// holds its ppo_* keys.
void check_update_batches(Problems& p, const std::string& role, const std::string& prefix,
                          const TrainedRoleSettings& r, std::optional<int64_t> train_batch,
                          std::optional<int64_t> n, std::optional<int64_t> dp) {
  const std::string mini_key = prefix + ".ppo_mini_batch_size";
  const std::string micro_key = prefix + ".ppo_micro_batch_size_per_gpu";
  const auto mini = p.at_least(mini_key, r.mini_batch_prompts, 1);
  const auto micro = p.positive_or_null(micro_key, r.micro_batch_size);
  if (!mini || !train_batch) return;
  if (*mini <= *train_batch && *train_batch % *mini != 0) {
    p.add(cat("data.train_batch_size = ", *train_batch, " is not divisible by ", mini_key, " = ",
              *mini, " (the ", role, "'s mini-batches must split the batch evenly)"));
    return;
  }
  if (!n || !dp) return;
  const int64_t effective = r.mini_prompts(*train_batch);
  const int64_t sequences = effective * *n;
  if (sequences % *dp != 0) {
    p.add(cat(mini_key, " x actor_rollout_ref.rollout.n = ", effective, " x ", *n, " = ", sequences,
              " sequences per mini-batch do not split evenly over the ", role, "'s ", *dp,
              " data-parallel ranks"));
    return;
  }
  const int64_t local = sequences / *dp;
  if (micro && local % *micro != 0)
    p.add(cat("the ", role, "'s ", local, " sequences per mini-batch and rank (", mini_key,
              " x rollout.n / DP = ", sequences, " / ", *dp, ") are not divisible by ", micro_key,
              " = ", *micro));
}

// Batches: sizes, dynamic batch budgets, mini- and micro-batches per rank.
void check_batches(Problems& p, const TrainerSettings& s, const Layouts& l) {
  const auto train_batch = p.at_least("data.train_batch_size", s.train_batch, 1);
  const auto n = p.at_least("actor_rollout_ref.rollout.n", s.n, 1);
  p.positive_or_null("data.val_batch_size", s.val_batch_size);
  p.at_least("actor_rollout_ref.rollout.val_kwargs.n", s.val_sampling.n, 1);
  p.at_least("data.max_prompt_length", s.dataset.max_prompt_length, 1);
  p.at_least("data.max_response_length", s.max_response_length, 1);
  p.at_least("actor_rollout_ref.actor.ppo_epochs", s.actor.update.epochs, 1);
  p.positive_or_null("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                     s.actor.ref_log_prob_micro_batch_size);
  p.positive_or_null("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                     s.actor.rollout.log_prob_micro_batch_size);
  const int64_t longest = s.dataset.max_prompt_length + s.max_response_length;
  check_budget(p, s.actor_train.budget, "actor_rollout_ref.actor.use_dynamic_bsz",
               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", longest);
  check_budget(p, s.rollout_log_prob_budget, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", longest);
  check_budget(p, s.ref_log_prob_budget, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", longest);
  check_update_batches(p, "actor", "actor_rollout_ref.actor", s.actor_train, train_batch, n,
                       l.actor_dp);
  if (s.use_critic) {
    p.at_least("critic.ppo_epochs", s.critic.update.epochs, 1);
    check_update_batches(p, "critic", "critic", s.critic_train, train_batch, n, l.critic_dp);
    check_budget(p, s.critic_train.budget, "critic.use_dynamic_bsz",
                 "critic.ppo_max_token_len_per_gpu", longest);
    check_budget(p, s.critic_forward_budget, "critic.use_dynamic_bsz",
                 "critic.forward_max_token_len_per_gpu", longest);
  }
  if (s.use_rm)
    check_budget(p, s.rm_budget, "reward_model.use_dynamic_bsz",
                 "reward_model.forward_max_token_len_per_gpu", longest);
  if (train_batch && n && l.rollout_dp && (*train_batch * *n) % *l.rollout_dp != 0)
    p.add(cat("data.train_batch_size x actor_rollout_ref.rollout.n = ", *train_batch, " x ", *n,
              " = ", *train_batch * *n, " sequences do not split evenly over the rollout's ",
              *l.rollout_dp,
              " data-parallel ranks (trainer.nnodes x trainer.n_gpus_per_node / "
              "actor_rollout_ref.rollout.tensor_model_parallel_size)"));
}

// optim.*: a learning rate >= 0, Adam's betas in [0, 1), ratios in [0, 1].
void check_optim(Problems& p, const std::string& prefix, const workers::OptimOptions& o,
                 const TrainedRoleSettings& r) {
  if (o.lr < 0) p.add(prefix + ".lr must be >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1))
    p.add(prefix + ".betas must be two numbers in [0, 1), like [0.9, 0.999]");
  p.at_least(prefix + ".lr_warmup_steps", r.lr_warmup_steps, -1);
  for (const auto& [name, value] : {std::pair(".lr_warmup_steps_ratio", r.lr_warmup_steps_ratio),
                                    std::pair(".min_lr_ratio", o.min_lr_ratio)}) {
    if (value < 0 || value > 1) p.add(cat(prefix, name, " = ", value, " must be in [0, 1]"));
  }
}

// actor_rollout_ref.model's LoRA keys: a rank >= 0 (0: none), alpha > 0,
// target modules the engine adapts, and no sequence parallelism beside them;
// a lora_adapter_path is a PEFT adapter directory (whose adapter_config.json
// settings.cpp has read the rank, alpha and modules from).
void check_lora(Problems& p, const TrainerSettings& s) {
  const engine::LoraOptions& lora = s.actor.model.lora;
  const std::string m = "actor_rollout_ref.model.";
  if (const std::string& path = s.actor.model.lora_adapter_path; !path.empty()) {
    if (!std::filesystem::is_directory(path))
      p.add(cat(m, "lora_adapter_path = '", path, "' is not a directory"));
    else if (!std::filesystem::is_regular_file(std::filesystem::path(path) /
                                               engine::kPeftConfigFile))
      p.add(cat(m, "lora_adapter_path = '", path, "' has no ", engine::kPeftConfigFile,
                " (not a PEFT adapter directory: PEFT's save_pretrained writes one)"));
  }
  p.at_least(m + "lora_rank", lora.rank, 0);
  if (!(lora.alpha > 0)) p.add(cat(m, "lora_alpha = ", lora.alpha, " must be > 0"));
  if (!lora.enabled()) return;
  try {
    if (lora.modules().empty())
      p.add(cat(m, "target_modules names no module, but ", m, "lora_rank = ", lora.rank,
                " (name some, or all-linear)"));
  } catch (const engine::EngineError& e) {
    p.add(cat(m, "target_modules: ", e.what()));
  }
  if (s.actor.model.sequence_parallel)
    p.add(cat(m, "lora_rank = ", lora.rank,
              " cannot be used with actor_rollout_ref.actor.megatron.sequence_parallel = true "
              "(set one of them off)"));
}

// The actor, its rollout and the reference: dtypes, optimizer, loss, sampling.
void check_actor(Problems& p, const TrainerSettings& s) {
  check_lora(p, s);
  // The rollout generates with the actor's parameters (the HybridEngine
  // shares or reshards them): its dtype is theirs.
  // (An empty dtype was not one of the dtypes: that is named already.)
  if (!s.rollout_dtype.empty() && !s.actor.model.dtype.empty() &&
      s.rollout_dtype != s.actor.model.dtype)
    p.add(cat("actor_rollout_ref.rollout.dtype = '", s.rollout_dtype,
              "' differs from actor_rollout_ref.actor.megatron.dtype = '", s.actor.model.dtype,
              "'; the rollout generates with the actor's parameters (set them equal)"));
  check_optim(p, "actor_rollout_ref.actor.optim", s.actor.optim, s.actor_train);
  const workers::PolicyOptions& policy = s.actor.policy;
  if (policy.loss_mode == "vanilla" && policy.clip_ratio_c <= 1.0)
    p.add(cat("actor_rollout_ref.actor.clip_ratio_c = ", policy.clip_ratio_c,
              " must be > 1 (the dual-clip bound of the vanilla policy loss)"));
  if (policy.loss_mode == "dro" && !policy.dro_beta)
    p.add(
        "actor_rollout_ref.actor.policy_loss.loss_mode = dro needs "
        "actor_rollout_ref.actor.policy_loss.dro_beta (DRO's KL weight β > 0)");
  const engine::SamplingParams& sp = s.sampling;
  if (s.logprob_temperature < 0)
    p.add(cat("actor_rollout_ref.rollout.temperature = ", s.logprob_temperature,
              " must be >= 0 (0 is greedy)"));
  if (!(sp.top_p > 0 && sp.top_p <= 1))
    p.add(cat("actor_rollout_ref.rollout.top_p = ", sp.top_p, " must be in (0, 1]"));
  const double utilization = s.actor.rollout.gpu_memory_utilization;
  if (!(utilization > 0 && utilization <= 1))
    p.add(cat("actor_rollout_ref.rollout.gpu_memory_utilization = ", utilization,
              " must be in (0, 1] (the fraction of a GPU's memory the rollout may fill)"));
  p.at_least("actor_rollout_ref.rollout.device_decode_steps", s.actor.rollout.device_decode_steps,
             0);
  const workers::MultiTurnRolloutOptions& mt = s.actor.rollout.multi_turn;
  if (mt.enable) {
    const std::string k = "actor_rollout_ref.rollout.multi_turn";
    if (mt.tool_config_path.empty() && mt.interaction_config_path.empty())
      p.add(k + ".enable needs " + k +
            ".tool_config_path (verl's tool config file, naming the registered tools "
            "(BATON_TOOL) the model is offered) or " + k +
            ".interaction_config_path (the interactions (BATON_INTERACTION) that answer it)");
    p.at_least(k + ".max_assistant_turns", mt.max_assistant_turns, 0);
    p.at_least(k + ".max_user_turns", mt.max_user_turns, 0);
    p.at_least(k + ".max_parallel_calls", mt.max_parallel_calls, 1);
    p.at_least(k + ".max_tool_response_length", mt.max_tool_response_length, 0);
    if (s.async.enable && s.async.partial_rollout)
      p.add(k + ".enable with async_training.partial_rollout: a partial rollout resumed "
                "after a weight sync would take the tool turns it carries for generated "
                "tokens; turn one off");
  }
  // verl's -1 (no truncation) reads as 0; below that is a mistake.
  p.at_least("actor_rollout_ref.rollout.top_k", sp.top_k, -1);
}

// The critic, the reward model and the algorithm: a critic where GAE needs
// one, the adaptive KL controller's horizon and target.
void check_critic_reward_and_algorithm(Problems& p, const TrainerSettings& s) {
  if (s.use_critic) {
    check_optim(p, "critic.optim", s.critic.optim, s.critic_train);
  } else if (s.adv_estimator == "gae") {
    // Without critic.enable, gae turns the critic on: it was set false.
    p.add("algorithm.adv_estimator = gae needs a critic, but critic.enable = false");
  }
  if (s.use_rm && s.rm.model.path.empty())
    p.add("reward_model.enable = true needs reward_model.model.path");
  if (s.adv_estimator == "remax" && s.use_rm)
    p.add(
        "algorithm.adv_estimator = remax scores its greedy baselines with the rule reward; "
        "with reward_model.enable = true the baselines would not be the reward model's");
  if (s.kl_ctrl.type == "adaptive") {
    if (s.kl_ctrl.horizon <= 0)
      p.add("algorithm.kl_ctrl.horizon must be > 0 with algorithm.kl_ctrl.type = adaptive");
    if (s.kl_ctrl.target_kl <= 0)
      p.add("algorithm.kl_ctrl.target_kl must be > 0 with algorithm.kl_ctrl.type = adaptive");
  }
  // Σπ² needs the logits, which a fused LM head never forms (verl's rule too).
  if (s.calculate_sum_pi_squared && s.actor.model.fused_lm_head)
    p.add(cat("actor_rollout_ref.model.use_fused_kernels = true, but ",
              s.adv_estimator.find("optimal_token_baseline") != std::string::npos
                  ? "algorithm.adv_estimator = " + s.adv_estimator
                  : std::string("actor_rollout_ref.actor.calculate_sum_pi_squared = true"),
              " needs Σπ² of every response token, which the fused LM head does not compute: "
              "set actor_rollout_ref.model.use_fused_kernels = false"));
  if (s.async.enable && s.async.tis_cap && s.rollout_correction.rollout_is)
    p.add(cat(
        "algorithm.rollout_correction.rollout_is with async_training.tis_cap = ", *s.async.tis_cap,
        ": both set the update's rollout_is_weights; set async_training.tis_cap = null to "
        "use rollout_correction's, or rollout_is = null to keep the async TIS"));
}

// reward_model.reward_manager's keys: the overlong buffer is the dapo
// manager's, shapes the rule reward only, and fits in the response.
void check_reward_manager(Problems& p, const TrainerSettings& s) {
  const rewards::OverlongBufferOptions& o = s.overlong_buffer;
  if (!o.enable) return;
  const std::string k = "reward_model.overlong_buffer";
  if (s.reward_manager != rewards::RewardManagerKind::kDapo)
    p.add(k +
          ".enable = true needs reward_model.reward_manager = dapo (the naive manager has "
          "no overlong buffer)");
  if (s.use_rm)
    p.add(k +
          ".enable = true with reward_model.enable = true: the reward model's scores "
          "replace the rule reward, and its overlong penalty with it");
  if (o.len < 1)
    p.add(cat(k, ".len = ", o.len, " must be >= 1 with ", k, ".enable = true"));
  else if (o.len > s.max_response_length)
    p.add(cat(k, ".len = ", o.len, " is more than data.max_response_length = ",
              s.max_response_length, " (the buffer is the last len tokens of a response)"));
}

// algorithm.filter_groups (DAPO's dynamic sampling, trainer/dynamic_sampling.h)
// and data.gen_batch_size, which only it lets differ from train_batch_size.
void check_dynamic_sampling(Problems& p, const TrainerSettings& s) {
  p.at_least("data.gen_batch_size", s.gen_batch, 1);
  const FilterGroupsOptions& f = s.filter_groups;
  const std::string k = "algorithm.filter_groups";
  if (!f.enable) {
    if (s.gen_batch != s.train_batch)
      p.add(cat("data.gen_batch_size = ", s.gen_batch,
                " differs from data.train_batch_size = ", s.train_batch, ": only ", k,
                ".enable = true generates batches of another size than it trains on"));
    return;
  }
  const std::vector<std::string> metrics = {"acc", "score", "seq_reward", "seq_final_reward"};
  if (f.metric.empty()) {
    p.add(k + ".metric is null; " + k +
          ".enable = true needs the value whose groups must vary: acc, score, seq_reward or "
          "seq_final_reward");
  } else if (std::find(metrics.begin(), metrics.end(), f.metric) == metrics.end()) {
    p.add(cat(k, ".metric = '", f.metric,
              "' is not one of: acc, score, seq_reward, seq_final_reward"));
  } else if (s.use_rm && (f.metric == "acc" || f.metric == "score")) {
    p.add(cat(k, ".metric = ", f.metric,
              " is the rule reward's; with reward_model.enable = true the reward model scores, "
              "which gives no per-row ",
              f.metric, " (use seq_reward or seq_final_reward)"));
  }
  if (s.async.enable)
    p.add(k +
          ".enable = true with async_training.enable = true: dynamic sampling runs in the "
          "synchronous trainer only");
}

// The run: files, epochs, steps, logging, restarts, resume.
void check_run(Problems& p, const TrainerSettings& s) {
  if (s.train_files.empty()) p.add("data.train_files names no file");
  p.at_least("trainer.total_epochs", s.total_epochs, 1);
  p.positive_or_null("trainer.total_training_steps", s.total_training_steps);
  p.at_least("trainer.critic_warmup", s.critic_warmup, 0);
  p.at_least("trainer.log_max_bytes", s.log_max_bytes, 1);
  p.at_least("trainer.log_backup_count", s.log_backup_count, 0);
  p.at_least("trainer.collective_timeout_s", s.collective_timeout_s, 1);
  p.at_least("trainer.max_restarts", s.max_restarts, 0);
  p.at_least("trainer.log_val_generations", s.log_val_generations, 0);
  if (s.rollout_data_dir && s.async.enable)
    p.add("trainer.rollout_data_dir with async_training.enable: the fully-async trainer does not "
          "dump its rollouts yet (trainer.validation_data_dir works)");
  if (s.resume_mode == "resume_path" && !s.resume_from_path)
    p.add("trainer.resume_mode = resume_path needs trainer.resume_from_path");
}

// async_training.* (trainer/async/async_trainer.h) when it is on, and what
// the async mode cannot run yet.
void check_async_training(Problems& p, const TrainerSettings& s) {
  const AsyncTrainingSettings& a = s.async;
  if (!a.enable) return;
  auto fail = [&](const std::string& key, const std::string& why) {
    p.add("async_training." + key + ": " + why);
  };
  const int64_t rollout_tp = s.actor.rollout.tp;
  if (a.rollout_world < 1 || (rollout_tp >= 1 && a.rollout_world % rollout_tp != 0))
    fail("rollout_n_gpus_per_node", cat(a.rollout_world,
                                        " rollout workers do not split into replicas of "
                                        "actor_rollout_ref.rollout.tensor_model_parallel_size ",
                                        rollout_tp));
  if (a.trigger_parameter_sync_step < 1)
    fail("trigger_parameter_sync_step", cat(a.trigger_parameter_sync_step, " < 1"));
  if (a.staleness_threshold < a.trigger_parameter_sync_step - 1)
    fail("staleness_threshold",
         cat(a.staleness_threshold,
             " is below trigger_parameter_sync_step - 1 = ", a.trigger_parameter_sync_step - 1,
             ": the batches between two weight syncs could never be trained"));
  if (a.max_queue_size < 1) fail("max_queue_size", cat(a.max_queue_size, " < 1"));
  if (a.tis_cap && *a.tis_cap <= 0) fail("tis_cap", std::to_string(*a.tis_cap) + " <= 0");
  if (s.adv_estimator == "remax")
    fail("enable", "remax's greedy baselines are not generated by the async rollouter");
  if (a.partial_rollout_chunk < 1)
    fail("partial_rollout_chunk", cat(a.partial_rollout_chunk, " < 1"));
  if (a.max_rollout_restarts < 0) fail("max_rollout_restarts", cat(a.max_rollout_restarts, " < 0"));
}

}  // namespace

std::vector<std::string> settings_problems(const TrainerSettings& s) {
  Problems p;
  const Layouts layouts = check_workers_and_layouts(p, s);
  check_batches(p, s, layouts);
  check_actor(p, s);
  check_critic_reward_and_algorithm(p, s);
  check_reward_manager(p, s);
  check_dynamic_sampling(p, s);
  check_run(p, s);
  check_async_training(p, s);
  return p.take();
}

}  // namespace baton::trainer
