#include "trainer/config/settings.h"

#include <algorithm>

#include "trainer/async/staleness_policy.h"
#include "trainer/config/config_validation.h"

namespace baton::trainer {
namespace {

// data.train_files / val_files: a list of files, or one file as a string.
std::vector<std::string> files(const Config& c, const std::string& key) {
  if (c.is_null(key)) return {};
  try {
    return c.get<std::vector<std::string>>(key);
  } catch (const ConfigError&) {
    return {c.get<std::string>(key)};
  }
}

// One optimizer's settings; the schedule's length (and a warm-up given as a
// ratio of it) waits for set_total_steps.
workers::OptimOptions optim_from(const Config& c, const std::string& prefix, double grad_clip,
                                 std::optional<double>& warmup_ratio) {
  workers::OptimOptions o;
  o.lr = c.get<double>(prefix + ".lr");
  o.weight_decay = c.get<double>(prefix + ".weight_decay");
  const auto betas = c.get<std::vector<double>>(prefix + ".betas");
  if (betas.size() != 2)
    throw ConfigError(prefix + ".betas must hold two numbers, got " + std::to_string(betas.size()));
  o.beta1 = betas[0];
  o.beta2 = betas[1];
  o.scheduler = c.get<std::string>(prefix + ".lr_scheduler_type");
  o.min_lr_ratio = c.get<double>(prefix + ".min_lr_ratio");
  const int64_t warmup = c.get<int64_t>(prefix + ".lr_warmup_steps");
  const double ratio = c.get<double>(prefix + ".lr_warmup_steps_ratio");
  o.warmup_steps = std::max<int64_t>(warmup, 0);
  warmup_ratio = warmup >= 0 ? std::nullopt : std::optional<double>(ratio);
  o.grad_clip = grad_clip;
  return o;
}

SamplingSettings sampling_from(const Config& c, const std::string& prefix, int64_t n) {
  SamplingSettings s;
  s.do_sample = c.get<bool>(prefix + ".do_sample");
  s.temperature = c.get<double>(prefix + ".temperature");
  s.top_k = c.get<int64_t>(prefix + ".top_k");
  s.top_p = c.get<double>(prefix + ".top_p");
  s.n = n;
  return s;
}

// A role's packed micro-batch budget: `max_key`'s tokens when `switch_key`
// (a use_dynamic_bsz) is on, else 0 (micro-batches of rows).
int64_t dynamic_max_tokens(const Config& c, const std::string& switch_key,
                           const std::string& max_key) {
  const auto max_tokens = c.get<int64_t>(max_key);  // read (and typed) either way
  return c.get<bool>(switch_key) ? max_tokens : 0;
}

// A role's megatron.{param,grad,optimizer}_offload.
workers::OffloadOptions offload_from(const Config& c, const std::string& megatron) {
  workers::OffloadOptions o;
  o.params = c.get<bool>(megatron + ".param_offload");
  o.grads = c.get<bool>(megatron + ".grad_offload");
  o.optimizer = c.get<bool>(megatron + ".optimizer_offload");
  return o;
}

void read_actor(const Config& c, TrainerSettings& s) {
  const std::string a = "actor_rollout_ref.actor";
  workers::ActorRolloutRefOptions& o = s.actor;
  o.model.path = s.model_path;
  o.model.tp = c.get<int64_t>(a + ".megatron.tensor_model_parallel_size");
  o.model.pp = c.get<int64_t>(a + ".megatron.pipeline_model_parallel_size");
  o.model.seed = static_cast<uint64_t>(c.get<int64_t>(a + ".megatron.seed"));
  o.model.dtype = c.get<std::string>(a + ".megatron.dtype");
  o.ref_dtype = c.get<std::string>("actor_rollout_ref.ref.megatron.dtype");
  const int64_t dp = s.world / (o.model.tp * o.model.pp);
  s.actor_mini_prompts = std::min(c.get<int64_t>(a + ".ppo_mini_batch_size"), s.train_batch);
  o.update.mini_batch_size = s.actor_mini_prompts * s.n;
  // null: the local mini-batch, in micro-batches of at most 8 sequences.
  o.update.micro_batch_size = c.get_optional<int64_t>(a + ".ppo_micro_batch_size_per_gpu")
                                  .value_or(std::min<int64_t>(o.update.mini_batch_size / dp, 8));
  o.update.max_token_len =
      dynamic_max_tokens(c, a + ".use_dynamic_bsz", a + ".ppo_max_token_len_per_gpu");
  o.update.epochs = c.get<int64_t>(a + ".ppo_epochs");
  s.old_log_prob_from_update = c.get<bool>(a + ".skip_old_log_prob_on_policy") &&
                               o.update.epochs == 1 && s.actor_mini_prompts == s.train_batch &&
                               !s.use_kl_in_reward;
  o.update.shuffle = c.get<bool>(a + ".shuffle");
  o.update.loss_agg_mode = s.loss_agg_mode;
  o.update.loss_scale_factor = c.get_optional<double>(a + ".loss_scale_factor");
  o.update.seed = s.data_seed;
  o.optim = optim_from(c, a + ".optim", c.get<double>(a + ".grad_clip"), s.actor_warmup_ratio);
  o.optim.distributed = c.get<bool>(a + ".megatron.use_distributed_optimizer");
  o.optim.overlap_grad_reduce = c.get<bool>(a + ".megatron.overlap_grad_reduce");
  o.optim.bucket_bytes = c.get<int64_t>(a + ".megatron.grad_reduce_bucket_bytes");
  o.model.offload = offload_from(c, a + ".megatron");
  o.ref_param_offload = c.get<bool>("actor_rollout_ref.ref.megatron.param_offload");

  workers::PolicyOptions& p = o.policy;
  const std::string pl = a + ".policy_loss";
  p.loss_mode = c.get<std::string>(pl + ".loss_mode");
  p.clip_ratio = c.get<double>(a + ".clip_ratio");
  p.clip_ratio_low = c.get_optional<double>(a + ".clip_ratio_low").value_or(p.clip_ratio);
  p.clip_ratio_high = c.get_optional<double>(a + ".clip_ratio_high").value_or(p.clip_ratio);
  p.clip_ratio_c = c.get<double>(a + ".clip_ratio_c");
  p.clip_cov_ratio = c.get<double>(pl + ".clip_cov_ratio");
  p.clip_cov_lb = c.get<double>(pl + ".clip_cov_lb");
  p.clip_cov_ub = c.get<double>(pl + ".clip_cov_ub");
  p.kl_cov_ratio = c.get<double>(pl + ".kl_cov_ratio");
  p.ppo_kl_coef = c.get<double>(pl + ".ppo_kl_coef");
  p.tau_pos = c.get<double>(pl + ".tau_pos");
  p.tau_neg = c.get<double>(pl + ".tau_neg");
  p.dro_beta = c.get_optional<double>(pl + ".dro_beta");
  if (p.loss_mode == "dro" && !p.dro_beta)
    throw ConfigError(pl + ".loss_mode = dro needs " + pl + ".dro_beta (DRO's KL weight β > 0)");
  p.entropy_coeff = c.get<double>(a + ".entropy_coeff");
  p.use_kl_loss = s.use_kl_loss;
  p.kl_loss_coef = c.get<double>(a + ".kl_loss_coef");
  p.kl_loss_type = c.get<std::string>(a + ".kl_loss_type");

  const std::string r = "actor_rollout_ref.rollout";
  o.rollout.tp = c.get<int64_t>(r + ".tensor_model_parallel_size");
  o.rollout.response_length = s.response_length;
  o.rollout.max_batch = c.get<int64_t>(r + ".max_num_seqs");
  o.rollout.cache_bytes = c.get<int64_t>(r + ".kv_cache_bytes");
  o.rollout.packed_cpu_steps = c.get<bool>(r + ".packed_cpu_steps");
  o.rollout.log_prob_micro_batch_size =
      c.get_optional<int64_t>(r + ".log_prob_micro_batch_size_per_gpu").value_or(int64_t{1} << 30);
  o.ref_log_prob_micro_batch_size =
      c.get_optional<int64_t>("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")
          .value_or(int64_t{1} << 30);
  o.rollout.log_prob_max_token_len =
      dynamic_max_tokens(c, r + ".log_prob_use_dynamic_bsz", r + ".log_prob_max_token_len_per_gpu");
  o.ref_log_prob_max_token_len =
      dynamic_max_tokens(c, "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
                         "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu");
  o.ref = s.use_ref;
}

void read_critic(const Config& c, TrainerSettings& s) {
  workers::CriticOptions& k = s.critic;
  k.model.path = c.get<std::string>("critic.model.path");
  k.model.value_model = true;
  k.model.tp = c.get<int64_t>("critic.megatron.tensor_model_parallel_size");
  k.model.pp = c.get<int64_t>("critic.megatron.pipeline_model_parallel_size");
  k.model.seed = static_cast<uint64_t>(c.get<int64_t>("critic.megatron.seed"));
  k.model.dtype = c.get<std::string>("critic.megatron.dtype");
  const int64_t cdp = s.world / (k.model.tp * k.model.pp);
  s.critic_mini_prompts = std::min(c.get<int64_t>("critic.ppo_mini_batch_size"), s.train_batch);
  k.update.mini_batch_size = s.critic_mini_prompts * s.n;
  k.update.micro_batch_size = c.get_optional<int64_t>("critic.ppo_micro_batch_size_per_gpu")
                                  .value_or(std::min<int64_t>(k.update.mini_batch_size / cdp, 8));
  k.update.epochs = c.get<int64_t>("critic.ppo_epochs");
  k.update.shuffle = c.get<bool>("critic.shuffle");
  k.update.loss_agg_mode = c.get<std::string>("critic.loss_agg_mode");
  k.update.seed = s.data_seed;
  k.optim = optim_from(c, "critic.optim", c.get<double>("critic.grad_clip"), s.critic_warmup_ratio);
  k.optim.distributed = c.get<bool>("critic.megatron.use_distributed_optimizer");
  k.optim.overlap_grad_reduce = c.get<bool>("critic.megatron.overlap_grad_reduce");
  k.optim.bucket_bytes = c.get<int64_t>("critic.megatron.grad_reduce_bucket_bytes");
  k.model.offload = offload_from(c, "critic.megatron");
  k.cliprange_value = c.get<double>("critic.cliprange_value");
  k.forward_micro_batch_size = k.update.micro_batch_size;
  k.update.max_token_len =
      dynamic_max_tokens(c, "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu");
  k.forward_max_token_len =
      dynamic_max_tokens(c, "critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu");
}

void read_reward_model(const Config& c, TrainerSettings& s) {
  const auto path = c.get_optional<std::string>("reward_model.model.path");
  if (!path) throw ConfigError("reward_model.enable = true needs reward_model.model.path");
  s.rm.model.path = *path;
  s.rm.model.value_model = true;
  s.rm.model.tp = c.get<int64_t>("reward_model.megatron.tensor_model_parallel_size");
  s.rm.model.pp = c.get<int64_t>("reward_model.megatron.pipeline_model_parallel_size");
  s.rm.model.offload.params = c.get<bool>("reward_model.megatron.param_offload");
  s.rm_centralized = c.get<bool>("reward_model.centralized");
  s.rm_prefetch = c.get<bool>("reward_model.prefetch");
  s.rm.micro_batch_size =
      c.get_optional<int64_t>("reward_model.micro_batch_size_per_gpu").value_or(int64_t{1} << 30);
  s.rm.max_token_len = dynamic_max_tokens(c, "reward_model.use_dynamic_bsz",
                                          "reward_model.forward_max_token_len_per_gpu");
}

// async_training.* (trainer/async/async_trainer.h), and what the async mode
// cannot run yet.
void read_async_training(const Config& c, TrainerSettings& s) {
  const std::string k = "async_training";
  AsyncTrainingSettings& a = s.async;
  a.enable = c.get<bool>(k + ".enable");
  a.rollout_world = c.get<int64_t>(k + ".rollout_n_gpus_per_node");
  a.trigger_parameter_sync_step = c.get<int64_t>(k + ".trigger_parameter_sync_step");
  a.staleness_threshold = c.get<int64_t>(k + ".staleness_threshold");
  a.policy = parse_staleness_policy(c.get<std::string>(k + ".staleness_policy"),
                                    k + ".staleness_policy");
  a.max_queue_size = c.get<int64_t>(k + ".max_queue_size");
  a.tis_cap = c.get_optional<double>(k + ".tis_cap");
  a.max_rollout_restarts = c.get<int64_t>(k + ".max_rollout_restarts");
  a.partial_rollout = c.get<bool>(k + ".partial_rollout");
  a.partial_rollout_chunk = c.get<int64_t>(k + ".partial_rollout_chunk");
  if (!a.enable) return;
  auto fail = [&](const std::string& key, const std::string& why) {
    throw ConfigError(k + "." + key + ": " + why);
  };
  if (a.rollout_world < 1 || a.rollout_world % s.actor.rollout.tp != 0)
    fail("rollout_n_gpus_per_node", std::to_string(a.rollout_world) +
                                        " rollout workers do not split into replicas of "
                                        "actor_rollout_ref.rollout.tensor_model_parallel_size " +
                                        std::to_string(s.actor.rollout.tp));
  if (a.trigger_parameter_sync_step < 1)
    fail("trigger_parameter_sync_step", std::to_string(a.trigger_parameter_sync_step) + " < 1");
  if (a.staleness_threshold < a.trigger_parameter_sync_step - 1)
    fail("staleness_threshold",
         std::to_string(a.staleness_threshold) + " is below trigger_parameter_sync_step - 1 = " +
             std::to_string(a.trigger_parameter_sync_step - 1) +
             ": the batches between two weight syncs could never be trained");
  if (a.max_queue_size < 1) fail("max_queue_size", std::to_string(a.max_queue_size) + " < 1");
  if (a.tis_cap && *a.tis_cap <= 0) fail("tis_cap", std::to_string(*a.tis_cap) + " <= 0");
  if (s.adv_estimator == "remax")
    fail("enable", "remax's greedy baselines are not generated by the async rollouter");
  if (a.partial_rollout_chunk < 1)
    fail("partial_rollout_chunk", std::to_string(a.partial_rollout_chunk) + " < 1");
  if (a.max_rollout_restarts < 0)
    fail("max_rollout_restarts", std::to_string(a.max_rollout_restarts) + " < 0");
}

}  // namespace

TrainerSettings read_trainer_settings(const Config& c) {
  TrainerSettings s;
  s.model_path = c.get<std::string>("actor_rollout_ref.model.path");
  s.tokenizer_path = c.get_optional<std::string>("data.tokenizer").value_or(s.model_path);
  s.out_dir = c.get<std::string>("trainer.default_local_dir");
  s.project_name = c.get<std::string>("trainer.project_name");
  s.experiment_name = c.get<std::string>("trainer.experiment_name");
  s.train_files = files(c, "data.train_files");
  if (s.train_files.empty()) throw ConfigError("data.train_files names no file");
  s.val_files = files(c, "data.val_files");

  s.dataset.max_prompt_length = c.get<int64_t>("data.max_prompt_length");
  s.dataset.filter_overlong_prompts = c.get<bool>("data.filter_overlong_prompts");
  s.dataset.truncation = data::parse_truncation(c.get<std::string>("data.truncation"));
  s.dataset.prompt_key = c.get<std::string>("data.prompt_key");
  s.data_shuffle = c.get<bool>("data.shuffle");
  s.data_seed = static_cast<uint64_t>(c.get<int64_t>("data.seed"));
  s.val_batch_size = c.get_optional<int64_t>("data.val_batch_size");
  s.reward_fn_key = c.get<std::string>("data.reward_fn_key");
  s.custom_reward_fn = c.get_optional<std::string>("custom_reward_function.name");
  s.zero_on_reward_error = c.get<bool>("reward_model.zero_on_error");

  s.nnodes = c.get<int64_t>("trainer.nnodes");
  s.per_node = c.get<int64_t>("trainer.n_gpus_per_node");
  s.world = s.nnodes * s.per_node;
  s.cluster_listen = c.get_optional<std::string>("trainer.cluster_listen").value_or("");
  s.use_gpu = c.get<std::string>("trainer.device") != "cpu";
  s.train_batch = c.get<int64_t>("data.train_batch_size");
  s.n = c.get<int64_t>("actor_rollout_ref.rollout.n");
  // The rollout's own key (verl's; data.max_response_length unless set).
  s.response_length = c.get<int64_t>("actor_rollout_ref.rollout.response_length");
  s.use_critic = critic_enabled(c);
  s.adv_estimator = c.get<std::string>("algorithm.adv_estimator");
  s.use_kl_in_reward = c.get<bool>("algorithm.use_kl_in_reward");
  s.kl_penalty = c.get<std::string>("algorithm.kl_penalty");
  s.use_kl_loss = c.get<bool>("actor_rollout_ref.actor.use_kl_loss");
  s.use_ref = s.use_kl_in_reward || s.use_kl_loss;
  s.loss_agg_mode = c.get<std::string>("actor_rollout_ref.actor.loss_agg_mode");
  const std::string r = "actor_rollout_ref.rollout";
  s.sampling = sampling_from(c, r, s.n);
  s.val_sampling = sampling_from(c, r + ".val_kwargs", c.get<int64_t>(r + ".val_kwargs.n"));
  s.rollout_seed = static_cast<uint64_t>(c.get<int64_t>(r + ".seed"));

  s.total_training_steps = c.get_optional<int64_t>("trainer.total_training_steps");
  s.total_epochs = c.get<int64_t>("trainer.total_epochs");
  s.critic_warmup = c.get<int64_t>("trainer.critic_warmup");
  s.balance_batch = c.get<bool>("trainer.balance_batch");
  s.test_freq = c.get<int64_t>("trainer.test_freq");
  s.save_freq = c.get<int64_t>("trainer.save_freq");
  s.val_before_train = c.get<bool>("trainer.val_before_train");
  s.resume_mode = c.get<std::string>("trainer.resume_mode");
  s.resume_from_path = c.get_optional<std::string>("trainer.resume_from_path");
  s.max_restarts = c.get<int64_t>("trainer.max_restarts");
  if (s.max_restarts < 0)
    throw ConfigError("trainer.max_restarts: " + std::to_string(s.max_restarts) + " < 0");
  s.loggers = c.get<std::vector<std::string>>("trainer.logger");

  s.adv.gamma = c.get<double>("algorithm.gamma");
  s.adv.lam = c.get<double>("algorithm.lam");
  s.adv.grpo.norm_adv_by_std = c.get<bool>("algorithm.norm_adv_by_std_in_grpo");
  s.kl_ctrl.type = c.get<std::string>("algorithm.kl_ctrl.type");
  s.kl_ctrl.kl_coef = c.get<double>("algorithm.kl_ctrl.kl_coef");
  s.kl_ctrl.target_kl = c.get<double>("algorithm.kl_ctrl.target_kl");
  s.kl_ctrl.horizon = c.get<double>("algorithm.kl_ctrl.horizon");

  read_actor(c, s);
  s.use_rm = c.get<bool>("reward_model.enable");
  if (s.use_rm) read_reward_model(c, s);
  if (s.use_critic) read_critic(c, s);
  // Every role's collective deadline (engine/parallel/deadline_group.h), which the
  // async rollout's workers take from the actor's options.
  const int64_t deadline_s = c.get<int64_t>("trainer.collective_timeout_s");
  if (deadline_s < 1)
    throw ConfigError("trainer.collective_timeout_s: " + std::to_string(deadline_s) + " < 1");
  for (workers::ModelOptions* m : {&s.actor.model, &s.critic.model, &s.rm.model})
    m->collective_timeout_ms = deadline_s * 1000;
  read_async_training(c, s);
  return s;
}

void set_total_steps(TrainerSettings& s, int64_t batches_per_epoch) {
  s.total_steps = s.total_training_steps.value_or(batches_per_epoch * s.total_epochs);
  auto schedule = [&](workers::OptimOptions& o, const workers::UpdateOptions& u,
                      int64_t mini_prompts, const std::optional<double>& warmup_ratio) {
    o.total_steps = s.total_steps * u.epochs * (s.train_batch / mini_prompts);
    if (warmup_ratio)
      o.warmup_steps = static_cast<int64_t>(*warmup_ratio * static_cast<double>(o.total_steps));
  };
  schedule(s.actor.optim, s.actor.update, s.actor_mini_prompts, s.actor_warmup_ratio);
  if (s.use_critic)
    schedule(s.critic.optim, s.critic.update, s.critic_mini_prompts, s.critic_warmup_ratio);
}

}  // namespace baton::trainer
