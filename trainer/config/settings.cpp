#include "trainer/config/settings.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <utility>

#include "engine/errors.h"
#include "engine/io/peft_adapter.h"
#include "trainer/async/staleness_policy.h"
#include "trainer/config/config_validation.h"
#include "trainer/step_profiler.h"
#include "workers/rewards/verl_reward_score.h"
#include "workers/tools/tool_config.h"

namespace baton::trainer {
namespace {

// A micro-batch size left null: no limit (one micro-batch per call).
constexpr int64_t kUnsetMicroBatch = int64_t{1} << 30;

// Reads keys, recording every problem instead of stopping at the first. A
// key that is missing, null or of another type reads as T{} and marks the
// read as failed, so that no check runs on such stand-ins.
class Reader {
 public:
  explicit Reader(const Config& config) : config_(config) {}

  const Config& config() const { return config_; }
  void problem(std::string message) { problems_.push_back(std::move(message)); }
  std::vector<std::string>& problems() { return problems_; }
  // Whether every key read as its type.
  bool typed() const { return typed_; }

  template <typename T>
  T get(const std::string& key) {
    try {
      return config_.get<T>(key);
    } catch (const ConfigError& e) {
      failed(e.what());
      return T{};
    }
  }
  template <typename T>
  std::optional<T> get_optional(const std::string& key) {
    try {
      return config_.get_optional<T>(key);
    } catch (const ConfigError& e) {
      failed(e.what());
      return std::nullopt;
    }
  }
  // A name among `choices`, or "" (a problem is recorded).
  std::string one_of(const std::string& key, std::initializer_list<const char*> choices) {
    const size_t before = problems_.size();
    const auto value = get<std::string>(key);
    if (problems_.size() != before) return "";
    if (std::none_of(choices.begin(), choices.end(), [&](const char* c) { return value == c; })) {
      std::string list;
      for (const char* c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
      problem(key + " = '" + value + "' is not one of: " + list);
      return "";
    }
    return value;
  }

 private:
  void failed(std::string message) {
    typed_ = false;
    problem(std::move(message));
  }

  const Config& config_;
  std::vector<std::string> problems_;
  bool typed_ = true;
};

constexpr std::initializer_list<const char*> kLossAggModes = {
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
    "seq-mean-token-sum-norm"};
constexpr std::initializer_list<const char*> kKlKinds = {
    "kl",  "k1",  "abs",  "mse",  "k2",  "low_var_kl",  "k3",
    "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"};
constexpr std::initializer_list<const char*> kDtypes = {"float32", "bfloat16"};

// A parameter dtype: one of kDtypes, or null for the device's default:
// bfloat16 on GPUs (trainer.device cuda; the optimizer keeps fp32 masters),
// float32 on the CPU (its kernels and the packed generation step are fp32).
std::string read_dtype(Reader& r, const std::string& key) {
  if (r.get_optional<std::string>(key)) return r.one_of(key, kDtypes);
  return r.get_optional<std::string>("trainer.device").value_or("cuda") == "cuda" ? "bfloat16"
                                                                                  : "float32";
}

// A list of strings, or one as a string; null: none (data.train_files,
// val_files, actor_rollout_ref.model.target_modules).
std::vector<std::string> string_list(Reader& r, const std::string& key) {
  if (r.config().is_null(key)) return {};
  try {
    return r.config().get<std::vector<std::string>>(key);
  } catch (const ConfigError&) {
    return {r.get<std::string>(key)};
  }
}

// One optimizer's settings; the warm-up (which may be a ratio of the
// schedule) waits for the checks and for set_total_steps.
workers::OptimOptions optim_from(Reader& r, const std::string& prefix, double grad_clip,
                                 TrainedRoleSettings& role) {
  workers::OptimOptions o;
  o.lr = r.get<double>(prefix + ".lr");
  o.weight_decay = r.get<double>(prefix + ".weight_decay");
  const auto betas = r.get<std::vector<double>>(prefix + ".betas");
  if (betas.size() == 2) {
    o.beta1 = betas[0];
    o.beta2 = betas[1];
  } else {
    r.problem(prefix + ".betas must be two numbers in [0, 1), like [0.9, 0.999]");
  }
  o.scheduler = r.one_of(prefix + ".lr_scheduler_type", {"constant", "cosine"});
  o.min_lr_ratio = r.get<double>(prefix + ".min_lr_ratio");
  role.lr_warmup_steps = r.get<int64_t>(prefix + ".lr_warmup_steps");
  role.lr_warmup_steps_ratio = r.get<double>(prefix + ".lr_warmup_steps_ratio");
  o.grad_clip = grad_clip;
  return o;
}

// actor_rollout_ref.rollout's sampling keys, or its val_kwargs', in the
// engine's terms (verl's do_sample false is greedy; its top_k -1 is off).
// `configured_temperature`, when given, gets the temperature as configured.
engine::SamplingParams sampling_from(Reader& r, const std::string& prefix, int64_t response_length,
                                     double* configured_temperature = nullptr) {
  engine::SamplingParams p;
  const double temperature = r.get<double>(prefix + ".temperature");
  if (configured_temperature) *configured_temperature = temperature;
  p.temperature = r.get<bool>(prefix + ".do_sample") ? temperature : 0.0;
  const int64_t top_k = r.get<int64_t>(prefix + ".top_k");
  p.top_k = top_k == -1 ? 0 : top_k;
  p.top_p = r.get<double>(prefix + ".top_p");
  p.n = r.get<int64_t>(prefix + ".n");
  p.max_new_tokens = response_length;
  return p;
}

// A role's megatron.{param,grad,optimizer}_offload.
workers::OffloadOptions offload_from(Reader& r, const std::string& megatron) {
  workers::OffloadOptions o;
  o.params = r.get<bool>(megatron + ".param_offload");
  o.grads = r.get<bool>(megatron + ".grad_offload");
  o.optimizer = r.get<bool>(megatron + ".optimizer_offload");
  return o;
}

// verl's lora_adapter_path: the actor's adapters start from a PEFT adapter
// and take its r, lora_alpha and target modules (as PeftModel.from_pretrained
// does), whatever lora_rank, lora_alpha and target_modules say. A path
// without an adapter_config.json is settings_problems' to name.
void read_lora_adapter(Reader& r, workers::ModelOptions& m) {
  const std::string key = "actor_rollout_ref.model.lora_adapter_path";
  m.lora_adapter_path = r.get_optional<std::string>(key).value_or("");
  if (m.lora_adapter_path.empty() ||
      !std::filesystem::is_regular_file(std::filesystem::path(m.lora_adapter_path) /
                                        engine::kPeftConfigFile))
    return;
  try {
    const engine::LoraOptions adapter = engine::read_peft_adapter_config(m.lora_adapter_path);
    m.lora.rank = adapter.rank;
    m.lora.alpha = adapter.alpha;
    m.lora.targets = adapter.targets;
  } catch (const engine::EngineError& e) {
    r.problem(key + ": " + e.what());
  }
}

// <role>.strategy: megatron, or verl's fsdp / fsdp2 run as data parallel with
// a sharded optimizer state (a note says so).
void read_strategy(Reader& r, TrainerSettings& s, const std::string& key, bool distributed) {
  const std::string strategy = r.one_of(key, {"megatron", "fsdp", "fsdp2"});
  if (strategy != "fsdp" && strategy != "fsdp2") return;
  s.notes.push_back(
      key + "=" + strategy + ": baton's engine trains data parallel over the megatron.* layout " +
      (distributed ? "with the optimizer state sharded over the data-parallel ranks (ZeRO-1); "
                     "parameters and gradients stay whole on each rank"
                   : "with whole parameters, gradients and optimizer state on each rank "
                     "(use_distributed_optimizer is false)"));
}

void read_actor(Reader& r, TrainerSettings& s) {
  const std::string a = "actor_rollout_ref.actor";
  workers::ActorRolloutRefOptions& o = s.actor;
  TrainedRoleSettings& t = s.actor_train;
  o.model.path = s.model_path;
  o.model.tp = r.get<int64_t>(a + ".megatron.tensor_model_parallel_size");
  o.model.pp = r.get<int64_t>(a + ".megatron.pipeline_model_parallel_size");
  o.model.seed = static_cast<uint64_t>(r.get<int64_t>(a + ".megatron.seed"));
  o.model.dtype = read_dtype(r, a + ".megatron.dtype");
  o.model.sequence_parallel = r.get<bool>(a + ".megatron.sequence_parallel");
  o.model.ep = r.get<int64_t>(a + ".megatron.expert_model_parallel_size");
  o.model.recompute_activations =
      r.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  o.model.fused_lm_head = r.get<bool>("actor_rollout_ref.model.use_fused_kernels");
  o.model.lora.rank = r.get<int64_t>("actor_rollout_ref.model.lora_rank");
  o.model.lora.alpha = r.get<double>("actor_rollout_ref.model.lora_alpha");
  const std::string targets = "actor_rollout_ref.model.target_modules";
  o.model.lora.targets = r.config().is_null(targets) ? std::vector<std::string>{"all-linear"}
                                                     : string_list(r, targets);
  read_lora_adapter(r, o.model);
  const std::string ref = "actor_rollout_ref.ref";
  s.ref_tp = r.get<int64_t>(ref + ".megatron.tensor_model_parallel_size");
  s.ref_pp = r.get<int64_t>(ref + ".megatron.pipeline_model_parallel_size");
  o.ref_dtype = read_dtype(r, ref + ".megatron.dtype");
  t.mini_batch_prompts = r.get<int64_t>(a + ".ppo_mini_batch_size");
  t.micro_batch_size = r.get_optional<int64_t>(a + ".ppo_micro_batch_size_per_gpu");
  t.budget = {r.get<bool>(a + ".use_dynamic_bsz"),
              r.get<int64_t>(a + ".ppo_max_token_len_per_gpu")};
  o.update.epochs = r.get<int64_t>(a + ".ppo_epochs");
  s.calculate_sum_pi_squared = r.get<bool>(a + ".calculate_sum_pi_squared") ||
                               s.adv_estimator == "optimal_token_baseline" ||
                               s.adv_estimator == "tir_optimal_token_baseline";
  // Rollout correction and Σπ² need the old-log-prob pass before the advantages.
  s.old_log_prob_from_update =
      r.get<bool>(a + ".skip_old_log_prob_on_policy") && o.update.epochs == 1 &&
      t.mini_prompts(s.train_batch) == s.train_batch && !s.use_kl_in_reward &&
      !s.rollout_correction.enabled() && !s.calculate_sum_pi_squared;
  o.update.shuffle = r.get<bool>(a + ".shuffle");
  o.update.loss_agg_mode = s.loss_agg_mode;
  o.update.loss_scale_factor = r.get_optional<double>(a + ".loss_scale_factor");
  o.update.seed = s.data_seed;
  o.optim = optim_from(r, a + ".optim", r.get<double>(a + ".grad_clip"), t);
  o.optim.distributed = r.get<bool>(a + ".megatron.use_distributed_optimizer");
  read_strategy(r, s, a + ".strategy", o.optim.distributed);
  s.remove_padding = r.get<bool>("actor_rollout_ref.model.use_remove_padding");
  o.optim.overlap_grad_reduce = r.get<bool>(a + ".megatron.overlap_grad_reduce");
  o.optim.bucket_bytes = r.get<int64_t>(a + ".megatron.grad_reduce_bucket_bytes");
  o.model.offload = offload_from(r, a + ".megatron");
  o.ref_param_offload = r.get<bool>(ref + ".megatron.param_offload");

  workers::PolicyOptions& p = o.policy;
  const std::string pl = a + ".policy_loss";
  p.loss_mode = r.get<std::string>(pl + ".loss_mode");
  p.clip_ratio = r.get<double>(a + ".clip_ratio");
  p.clip_ratio_low = r.get_optional<double>(a + ".clip_ratio_low").value_or(p.clip_ratio);
  p.clip_ratio_high = r.get_optional<double>(a + ".clip_ratio_high").value_or(p.clip_ratio);
  p.clip_ratio_c = r.get<double>(a + ".clip_ratio_c");
  p.clip_cov_ratio = r.get<double>(pl + ".clip_cov_ratio");
  p.clip_cov_lb = r.get<double>(pl + ".clip_cov_lb");
  p.clip_cov_ub = r.get<double>(pl + ".clip_cov_ub");
  p.kl_cov_ratio = r.get<double>(pl + ".kl_cov_ratio");
  p.ppo_kl_coef = r.get<double>(pl + ".ppo_kl_coef");
  p.tau_pos = r.get<double>(pl + ".tau_pos");
  p.tau_neg = r.get<double>(pl + ".tau_neg");
  p.dro_beta = r.get_optional<double>(pl + ".dro_beta");
  p.entropy_coeff = r.get<double>(a + ".entropy_coeff");
  p.use_kl_loss = s.use_kl_loss;
  p.kl_loss_coef = r.get<double>(a + ".kl_loss_coef");
  p.kl_loss_type = r.one_of(a + ".kl_loss_type", kKlKinds);

  const std::string ro = "actor_rollout_ref.rollout";
  o.rollout.tp = r.get<int64_t>(ro + ".tensor_model_parallel_size");
  o.rollout.response_length = s.response_length;
  o.rollout.max_batch = r.get<int64_t>(ro + ".max_num_seqs");
  o.rollout.cache_bytes = r.get<int64_t>(ro + ".kv_cache_bytes");
  o.rollout.gpu_memory_utilization = r.get<double>(ro + ".gpu_memory_utilization");
  o.rollout.free_cache_engine = r.get<bool>(ro + ".free_cache_engine");
  o.rollout.packed_cpu_steps = r.get<bool>(ro + ".packed_cpu_steps");
  o.rollout.device_decode_steps = r.get<int64_t>(ro + ".device_decode_steps");
  o.rollout.cuda_graphs = !r.get<bool>(ro + ".enforce_eager");
  workers::MultiTurnRolloutOptions& mt = o.rollout.multi_turn;
  const std::string mk = ro + ".multi_turn";
  mt.enable = r.get<bool>(mk + ".enable");
  mt.tool_config_path = r.get_optional<std::string>(mk + ".tool_config_path").value_or("");
  mt.interaction_config_path =
      r.get_optional<std::string>(mk + ".interaction_config_path").value_or("");
  mt.format = r.one_of(mk + ".format", {"hermes", "llama3_json"});
  mt.max_assistant_turns = r.get_optional<int64_t>(mk + ".max_assistant_turns").value_or(0);
  mt.max_user_turns = r.get_optional<int64_t>(mk + ".max_user_turns").value_or(0);
  mt.max_parallel_calls = r.get<int64_t>(mk + ".max_parallel_calls");
  mt.max_tool_response_length = r.get<int64_t>(mk + ".max_tool_response_length");
  mt.tool_response_truncate_side =
      r.one_of(mk + ".tool_response_truncate_side", {"left", "right", "middle"});
  mt.tokenizer_path = s.tokenizer_path;
  // The prompts show the model the tools' schemas (the chat template's
  // `tools`); a bad file fails here, naming it, before any worker starts.
  if (mt.enable && !mt.tool_config_path.empty())
    s.dataset.chat_template_variables = {
        {"tools", tools::tool_schemas_for_template(tools::load_tool_config(mt.tool_config_path))}};
  s.rollout_dtype = read_dtype(r, ro + ".dtype");
  o.rollout.log_prob_micro_batch_size =
      r.get_optional<int64_t>(ro + ".log_prob_micro_batch_size_per_gpu").value_or(kUnsetMicroBatch);
  o.ref_log_prob_micro_batch_size =
      r.get_optional<int64_t>(ref + ".log_prob_micro_batch_size_per_gpu")
          .value_or(kUnsetMicroBatch);
  s.rollout_log_prob_budget = {r.get<bool>(ro + ".log_prob_use_dynamic_bsz"),
                               r.get<int64_t>(ro + ".log_prob_max_token_len_per_gpu")};
  s.ref_log_prob_budget = {r.get<bool>(ref + ".log_prob_use_dynamic_bsz"),
                           r.get<int64_t>(ref + ".log_prob_max_token_len_per_gpu")};
  o.ref = s.use_ref;
}

void read_critic(Reader& r, TrainerSettings& s) {
  workers::CriticOptions& k = s.critic;
  TrainedRoleSettings& t = s.critic_train;
  k.model.path = r.get<std::string>("critic.model.path");
  k.model.value_model = true;
  k.model.tp = r.get<int64_t>("critic.megatron.tensor_model_parallel_size");
  k.model.pp = r.get<int64_t>("critic.megatron.pipeline_model_parallel_size");
  k.model.seed = static_cast<uint64_t>(r.get<int64_t>("critic.megatron.seed"));
  k.model.dtype = read_dtype(r, "critic.megatron.dtype");
  k.model.sequence_parallel = r.get<bool>("critic.megatron.sequence_parallel");
  k.model.ep = r.get<int64_t>("critic.megatron.expert_model_parallel_size");
  k.model.recompute_activations = r.get<bool>("critic.model.enable_gradient_checkpointing");
  t.mini_batch_prompts = r.get<int64_t>("critic.ppo_mini_batch_size");
  t.micro_batch_size = r.get_optional<int64_t>("critic.ppo_micro_batch_size_per_gpu");
  k.update.epochs = r.get<int64_t>("critic.ppo_epochs");
  k.update.shuffle = r.get<bool>("critic.shuffle");
  k.update.loss_agg_mode = r.one_of("critic.loss_agg_mode", kLossAggModes);
  k.update.seed = s.data_seed;
  k.optim = optim_from(r, "critic.optim", r.get<double>("critic.grad_clip"), t);
  k.optim.distributed = r.get<bool>("critic.megatron.use_distributed_optimizer");
  read_strategy(r, s, "critic.strategy", k.optim.distributed);
  k.optim.overlap_grad_reduce = r.get<bool>("critic.megatron.overlap_grad_reduce");
  k.optim.bucket_bytes = r.get<int64_t>("critic.megatron.grad_reduce_bucket_bytes");
  k.model.offload = offload_from(r, "critic.megatron");
  k.cliprange_value = r.get<double>("critic.cliprange_value");
  // One switch for both budgets.
  const bool dynamic = r.get<bool>("critic.use_dynamic_bsz");
  t.budget = {dynamic, r.get<int64_t>("critic.ppo_max_token_len_per_gpu")};
  s.critic_forward_budget = {dynamic, r.get<int64_t>("critic.forward_max_token_len_per_gpu")};
}

void read_reward_model(Reader& r, TrainerSettings& s) {
  s.rm.model.path = r.get_optional<std::string>("reward_model.model.path").value_or("");
  s.rm.model.value_model = true;
  s.rm.model.tp = r.get<int64_t>("reward_model.megatron.tensor_model_parallel_size");
  s.rm.model.pp = r.get<int64_t>("reward_model.megatron.pipeline_model_parallel_size");
  s.rm.model.offload.params = r.get<bool>("reward_model.megatron.param_offload");
  s.rm.model.sequence_parallel = r.get<bool>("reward_model.megatron.sequence_parallel");
  s.rm_centralized = r.get<bool>("reward_model.centralized");
  s.rm_prefetch = r.get<bool>("reward_model.prefetch");
  s.rm.micro_batch_size =
      r.get_optional<int64_t>("reward_model.micro_batch_size_per_gpu").value_or(kUnsetMicroBatch);
  s.rm_budget = {r.get<bool>("reward_model.use_dynamic_bsz"),
                 r.get<int64_t>("reward_model.forward_max_token_len_per_gpu")};
}

// async_training.* (trainer/async/async_trainer.h).
void read_async_training(Reader& r, TrainerSettings& s) {
  const std::string k = "async_training";
  AsyncTrainingSettings& a = s.async;
  a.enable = r.get<bool>(k + ".enable");
  a.rollout_world = r.get<int64_t>(k + ".rollout_n_gpus_per_node");
  a.trigger_parameter_sync_step = r.get<int64_t>(k + ".trigger_parameter_sync_step");
  a.staleness_threshold = r.get<int64_t>(k + ".staleness_threshold");
  if (const std::string policy = r.one_of(k + ".staleness_policy", {"wait", "drop"});
      !policy.empty())
    a.policy = parse_staleness_policy(policy, k + ".staleness_policy");
  a.max_queue_size = r.get<int64_t>(k + ".max_queue_size");
  a.tis_cap = r.get_optional<double>(k + ".tis_cap");
  a.max_rollout_restarts = r.get<int64_t>(k + ".max_rollout_restarts");
  a.partial_rollout = r.get<bool>(k + ".partial_rollout");
  a.partial_rollout_chunk = r.get<int64_t>(k + ".partial_rollout_chunk");
}

// What the workers are told that follows from the checked settings: batch
// sizes over each layout, token budgets, warm-ups, the collective deadline.
void derive_worker_options(TrainerSettings& s) {
  auto update = [&](workers::UpdateOptions& u, workers::OptimOptions& o,
                    const TrainedRoleSettings& t, const workers::ModelOptions& m) {
    const int64_t dp = s.world / (m.tp * m.pp);
    u.mini_batch_size = t.mini_prompts(s.train_batch) * s.n;
    // null: the local mini-batch, in micro-batches of at most 8 sequences.
    u.micro_batch_size = t.micro_batch_size.value_or(std::min<int64_t>(u.mini_batch_size / dp, 8));
    u.max_token_len = t.budget.for_workers();
    o.warmup_steps = std::max<int64_t>(t.lr_warmup_steps, 0);  // a ratio: set_total_steps
  };
  workers::ActorRolloutRefOptions& a = s.actor;
  update(a.update, a.optim, s.actor_train, a.model);
  a.rollout.log_prob_max_token_len = s.rollout_log_prob_budget.for_workers();
  a.ref_log_prob_max_token_len = s.ref_log_prob_budget.for_workers();
  if (s.remove_padding) {
    // The padded micro-batch's tokens, packed: as many whole sequences as fit.
    const int64_t longest = s.dataset.max_prompt_length + s.max_response_length;
    if (!s.actor_train.budget.on) a.update.max_token_len = a.update.micro_batch_size * longest;
    if (!s.rollout_log_prob_budget.on && a.rollout.log_prob_micro_batch_size < kUnsetMicroBatch)
      a.rollout.log_prob_max_token_len = a.rollout.log_prob_micro_batch_size * longest;
    if (!s.ref_log_prob_budget.on && a.ref_log_prob_micro_batch_size < kUnsetMicroBatch)
      a.ref_log_prob_max_token_len = a.ref_log_prob_micro_batch_size * longest;
  }
  if (s.use_critic) {
    workers::CriticOptions& k = s.critic;
    update(k.update, k.optim, s.critic_train, k.model);
    k.forward_micro_batch_size = k.update.micro_batch_size;
    k.forward_max_token_len = s.critic_forward_budget.for_workers();
  }
  if (s.use_rm) s.rm.max_token_len = s.rm_budget.for_workers();
  // Every role's collective deadline (engine/parallel/deadline_group.h), which the
  // async rollout's workers take from the actor's options.
  for (workers::ModelOptions* m : {&s.actor.model, &s.critic.model, &s.rm.model})
    m->collective_timeout_ms = s.collective_timeout_s * 1000;
}

// Paths, names and data.*.
void read_data(Reader& r, TrainerSettings& s) {
  s.model_path = r.get<std::string>("actor_rollout_ref.model.path");
  s.tokenizer_path = r.get_optional<std::string>("data.tokenizer").value_or(s.model_path);
  s.out_dir = r.get<std::string>("trainer.default_local_dir");
  s.project_name = r.get<std::string>("trainer.project_name");
  s.experiment_name = r.get<std::string>("trainer.experiment_name");
  s.train_files = string_list(r, "data.train_files");
  s.val_files = string_list(r, "data.val_files");

  s.dataset.max_prompt_length = r.get<int64_t>("data.max_prompt_length");
  s.max_response_length = r.get<int64_t>("data.max_response_length");
  s.dataset.filter_overlong_prompts = r.get<bool>("data.filter_overlong_prompts");
  if (const std::string t = r.one_of("data.truncation", {"error", "left", "right", "middle"});
      !t.empty())
    s.dataset.truncation = data::parse_truncation(t);
  s.dataset.prompt_key = r.get<std::string>("data.prompt_key");
  s.data_shuffle = r.get<bool>("data.shuffle");
  s.data_seed = static_cast<uint64_t>(r.get<int64_t>("data.seed"));
  s.val_batch_size = r.get_optional<int64_t>("data.val_batch_size");
  s.reward_fn_key = r.get<std::string>("data.reward_fn_key");
  s.custom_reward_fn = r.get_optional<std::string>("custom_reward_function.name");
  if (auto path = r.get_optional<std::string>("custom_reward_function.path")) {
    rewards::PythonRewardOptions py;
    py.path = *path;
    py.function = s.custom_reward_fn.value_or("compute_score");
    s.custom_reward_fn.reset();
    py.python = r.get<std::string>("custom_reward_function.python");
    py.processes = r.get<int64_t>("custom_reward_function.processes");
    py.timeout_s = r.get<double>("custom_reward_function.timeout_s");
    // reward_kwargs: each value as JSON when it reads as a JSON scalar, else text.
    const std::string kw = "custom_reward_function.reward_kwargs";
    // is_null records the (maybe empty) mapping as read.
    if (!r.config().is_null(kw)) {
      for (const std::string& key : r.config().keys(kw)) {
        const std::string text = r.get<std::string>(kw + "." + key);
        const nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
        py.kwargs[key] =
            value.is_discarded() || value.is_structured() ? nlohmann::json(text) : value;
      }
    }
    if (py.path.size() < 3 || py.path.compare(py.path.size() - 3, 3, ".py") != 0)
      r.problem("custom_reward_function.path = '" + py.path +
                "': baton runs Python reward files (.py); a C++ function is registered "
                "(BATON_REWARD_FUNCTION) and named by custom_reward_function.name");
    // One of verl's own reward_score files: its built-in, no Python
    // (workers/rewards/verl_reward_score.h).
    std::optional<std::string> builtin;
    try {
      builtin = rewards::builtin_for_verl_reward_file(py.path, py.function);
    } catch (const Error& e) {
      r.problem(std::string("custom_reward_function.path: ") + e.what());
    }
    if (builtin && !py.kwargs.empty())
      r.problem("custom_reward_function.reward_kwargs: not applied to verl's own reward_score "
                "file " + py.path + ", which baton scores with " +
                (builtin->empty() ? std::string("its built-ins by data source")
                                  : "its built-in '" + *builtin + "'"));
    if (builtin && !builtin->empty()) s.custom_reward_fn = *builtin;
    if (!builtin) s.python_reward = std::move(py);
  }
  s.zero_on_reward_error = r.get<bool>("reward_model.zero_on_error");
  if (const std::string kind = r.one_of("reward_model.reward_manager", {"naive", "dapo"});
      !kind.empty())
    s.reward_manager = rewards::parse_reward_manager_kind(kind);
  const std::string ob = "reward_model.overlong_buffer";
  s.overlong_buffer.enable = r.get<bool>(ob + ".enable");
  s.overlong_buffer.len = r.get<int64_t>(ob + ".len");
  s.overlong_buffer.penalty_factor = r.get<double>(ob + ".penalty_factor");
  s.overlong_buffer.log = r.get<bool>(ob + ".log");
  s.overlong_buffer.max_resp_len = s.max_response_length;
}

// algorithm.rollout_correction: verl's keys, each spec parsed here so that a
// bad one fails naming its key. Only the decoupled mode runs.
void read_rollout_correction(Reader& r, TrainerSettings& s) {
  const std::string k = "algorithm.rollout_correction";
  algos::RolloutCorrectionOptions& o = s.rollout_correction;
  const auto is = r.get_optional<std::string>(k + ".rollout_is");
  const auto is_threshold = r.get_optional<std::string>(k + ".rollout_is_threshold");
  o.batch_normalize = r.get<bool>(k + ".rollout_is_batch_normalize");
  const auto rs = r.get_optional<std::string>(k + ".rollout_rs");
  const auto rs_threshold = r.get_optional<std::string>(k + ".rollout_rs_threshold");
  const bool bypass = r.get<bool>(k + ".bypass_mode");
  r.one_of(k + ".loss_type", {"ppo_clip", "reinforce"});
  const std::string decoupled_only =
      ": baton runs rollout correction in verl's decoupled mode only (old log-probs recomputed "
      "by the actor, rollout_is weights and rollout_rs rejection applied before the "
      "advantages); set it to false (loss_type is then unused)";
  if (bypass) r.problem(k + ".bypass_mode = true" + decoupled_only);
  // The parsers' messages start with the key's last part.
  auto parse = [&](auto&& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      r.problem(k + "." + e.what());
    }
  };
  if (is) parse([&] { o.rollout_is = algos::parse_rollout_is_level(*is); });
  if (is && !is_threshold)
    r.problem(k + ".rollout_is_threshold is null with rollout_is = " + *is +
              ": give the truncation bound (2.0) or IcePop's \"lower_upper\"");
  if (is && is_threshold)
    parse([&] { o.is_threshold = algos::parse_rollout_is_threshold(*is_threshold); });
  if (rs) parse([&] { o.rejection = algos::parse_rollout_rs(*rs, rs_threshold.value_or("")); });
}

// The workers, the step's sizes and sampling, the algorithm.
void read_step(Reader& r, TrainerSettings& s) {
  s.nnodes = r.get<int64_t>("trainer.nnodes");
  s.per_node = r.get<int64_t>("trainer.n_gpus_per_node");
  s.world = s.nnodes * s.per_node;
  s.cluster_listen = r.get_optional<std::string>("trainer.cluster_listen").value_or("");
  s.use_gpu = r.one_of("trainer.device", {"cpu", "cuda"}) == "cuda";
  s.train_batch = r.get<int64_t>("data.train_batch_size");
  s.gen_batch = r.get<int64_t>("data.gen_batch_size");
  const std::string fg = "algorithm.filter_groups";
  s.filter_groups.enable = r.get<bool>(fg + ".enable");
  s.filter_groups.metric = r.get_optional<std::string>(fg + ".metric").value_or("");
  s.filter_groups.max_num_gen_batches = r.get<int64_t>(fg + ".max_num_gen_batches");
  // The rollout's own key (verl's; data.max_response_length unless set).
  s.response_length = r.get<int64_t>("actor_rollout_ref.rollout.response_length");
  const std::string ro = "actor_rollout_ref.rollout";
  s.sampling = sampling_from(r, ro, s.response_length, &s.logprob_temperature);
  s.val_sampling = sampling_from(r, ro + ".val_kwargs", s.response_length);
  s.n = s.sampling.n;
  s.rollout_seed = static_cast<uint64_t>(r.get<int64_t>(ro + ".seed"));
  s.adv_estimator = r.get<std::string>("algorithm.adv_estimator");
  // critic.enable null: a critic when the estimator is GAE.
  s.use_critic = r.get_optional<bool>("critic.enable").value_or(s.adv_estimator == "gae");
  s.use_kl_in_reward = r.get<bool>("algorithm.use_kl_in_reward");
  s.kl_penalty = r.one_of("algorithm.kl_penalty", kKlKinds);
  s.use_kl_loss = r.get<bool>("actor_rollout_ref.actor.use_kl_loss");
  s.use_ref = s.use_kl_in_reward || s.use_kl_loss;
  s.loss_agg_mode = r.one_of("actor_rollout_ref.actor.loss_agg_mode", kLossAggModes);
  s.adv.gamma = r.get<double>("algorithm.gamma");
  s.adv.lam = r.get<double>("algorithm.lam");
  s.adv.grpo.norm_adv_by_std = r.get<bool>("algorithm.norm_adv_by_std_in_grpo");
  s.kl_ctrl.type = r.one_of("algorithm.kl_ctrl.type", {"fixed", "adaptive"});
  s.kl_ctrl.kl_coef = r.get<double>("algorithm.kl_ctrl.kl_coef");
  s.kl_ctrl.target_kl = r.get<double>("algorithm.kl_ctrl.target_kl");
  s.kl_ctrl.horizon = r.get<double>("algorithm.kl_ctrl.horizon");
  read_rollout_correction(r, s);
}

// trainer.*: the run's length, checkpoints, logs, restarts.
void read_run(Reader& r, TrainerSettings& s) {
  s.total_training_steps = r.get_optional<int64_t>("trainer.total_training_steps");
  s.total_epochs = r.get<int64_t>("trainer.total_epochs");
  s.critic_warmup = r.get<int64_t>("trainer.critic_warmup");
  s.balance_batch = r.get<bool>("trainer.balance_batch");
  s.test_freq = r.get<int64_t>("trainer.test_freq");
  s.save_freq = r.get<int64_t>("trainer.save_freq");
  s.val_before_train = r.get<bool>("trainer.val_before_train");
  s.resume_mode = r.one_of("trainer.resume_mode", {"auto", "disable", "resume_path"});
  s.resume_from_path = r.get_optional<std::string>("trainer.resume_from_path");
  s.max_restarts = r.get<int64_t>("trainer.max_restarts");
  s.loggers = r.get<std::vector<std::string>>("trainer.logger");
  for (const std::string& logger : s.loggers)
    if (logger != "console" && logger != "file" && logger != "tensorboard" && logger != "wandb")
      r.problem("trainer.logger has '" + logger +
                "'; loggers baton has: console, file, tensorboard, wandb (swanlab, mlflow, "
                "clearml, trackio: not in baton)");
  s.logger_python = r.get<std::string>("trainer.logger_python");
  if (r.config().has("trainer.wandb_proxy"))
    s.wandb_proxy = r.get_optional<std::string>("trainer.wandb_proxy").value_or("");
  s.rollout_data_dir = r.get_optional<std::string>("trainer.rollout_data_dir");
  s.validation_data_dir = r.get_optional<std::string>("trainer.validation_data_dir");
  s.log_val_generations = r.get<int64_t>("trainer.log_val_generations");
  s.log_max_bytes = r.get<int64_t>("trainer.log_max_bytes");
  s.log_backup_count = r.get<int64_t>("trainer.log_backup_count");
  s.collective_timeout_s = r.get<int64_t>("trainer.collective_timeout_s");
}

}  // namespace

TrainerSettings read_trainer_settings(const Config& config) {
  Reader r(config);
  TrainerSettings s;
  read_data(r, s);
  read_step(r, s);
  read_run(r, s);
  read_actor(r, s);
  s.use_rm = r.get<bool>("reward_model.enable");
  if (s.use_rm) read_reward_model(r, s);
  if (s.use_critic) read_critic(r, s);
  read_async_training(r, s);

  // The checks need every key's value: none run on a stand-in for one that
  // could not be read.
  std::vector<std::string>& problems = r.problems();
  if (r.typed())
    for (std::string& p : settings_problems(s)) problems.push_back(std::move(p));
  s.profiler = read_profiler_settings(config, problems);
  if (!problems.empty()) {
    std::string message = "the config cannot be used:";
    for (const auto& p : problems) message += "\n  - " + p;
    throw ConfigError(message);
  }
  derive_worker_options(s);
  return s;
}

void set_total_steps(TrainerSettings& s, int64_t batches_per_epoch) {
  s.total_steps = s.total_training_steps.value_or(batches_per_epoch * s.total_epochs);
  auto schedule = [&](workers::OptimOptions& o, const workers::UpdateOptions& u,
                      const TrainedRoleSettings& t) {
    o.total_steps = s.total_steps * u.epochs * (s.train_batch / t.mini_prompts(s.train_batch));
    if (t.lr_warmup_steps < 0)
      o.warmup_steps =
          static_cast<int64_t>(t.lr_warmup_steps_ratio * static_cast<double>(o.total_steps));
  };
  schedule(s.actor.optim, s.actor.update, s.actor_train);
  if (s.use_critic) schedule(s.critic.optim, s.critic.update, s.critic_train);
}

}  // namespace baton::trainer
