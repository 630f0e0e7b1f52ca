#include "trainer/ppo_trainer.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "data/prompt_dataset.h"
#include "data/prompt_loader.h"
#include "data/tokenizer.h"
#include "dispatch/data_proto.h"
#include "runtime/errors.h"
#include "runtime/log.h"
#include "runtime/resource_pool.h"
#include "runtime/worker_group.h"
#include "trainer/config_validation.h"
#include "trainer/metric_utils.h"
#include "trainer/metrics.h"
#include "trainer/progress_line.h"
#include "workers/actor_rollout_ref_worker.h"
#include "workers/algo_registry.h"
#include "workers/critic_worker.h"
#include "workers/kl.h"
#include "workers/masked_reductions.h"
#include "workers/reward_manager.h"
#include "workers/reward_model_worker.h"
#include "workers/role_options.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Metrics = std::map<std::string, double>;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// verl's trainer/ppo/ray_trainer.py ties these together; here each is read
// once from the config.
struct Settings {
  std::string model_path, tokenizer_path, out_dir;
  int64_t world = 1;
  bool use_gpu = false;
  int64_t train_batch = 1, n = 1, response_length = 1;
  bool use_critic = false, use_kl_in_reward = false, use_kl_loss = false, use_ref = false;
  // The update's own forward pass gives the old log-probs (see ppo_trainer.yaml).
  bool old_log_prob_from_update = false;
  std::string adv_estimator, kl_penalty;
  int64_t total_steps = 0, total_epochs = 1, critic_warmup = 0;
  int64_t test_freq = -1, save_freq = -1;
  bool val_before_train = true;
  uint64_t rollout_seed = 0;
  std::vector<std::string> loggers;
  workers::ActorRolloutRefOptions actor;
  workers::CriticOptions critic;
  bool use_rm = false;
  workers::RewardModelOptions rm;
  algos::AdvantageOptions adv;
  algos::KLControlOptions kl_ctrl;
  std::string loss_agg_mode;
};

workers::OptimOptions optim_from(const Config& c, const std::string& prefix, double grad_clip,
                                 int64_t total_updates) {
  workers::OptimOptions o;
  o.lr = c.get<double>(prefix + ".lr");
  o.weight_decay = c.get<double>(prefix + ".weight_decay");
  const auto betas = c.get<std::vector<double>>(prefix + ".betas");
  o.beta1 = betas.at(0);
  o.beta2 = betas.at(1);
  o.scheduler = c.get<std::string>(prefix + ".lr_scheduler_type");
  o.min_lr_ratio = c.get<double>(prefix + ".min_lr_ratio");
  o.total_steps = total_updates;
  const int64_t warmup = c.get<int64_t>(prefix + ".lr_warmup_steps");
  o.warmup_steps = warmup >= 0 ? warmup
                               : static_cast<int64_t>(c.get<double>(prefix + ".lr_warmup_steps_ratio") *
                                                      static_cast<double>(total_updates));
  o.grad_clip = grad_clip;
  return o;
}

}  // namespace

struct PpoTrainer::State {
  Config config;
  Settings s;
  std::optional<data::Tokenizer> tokenizer;
  std::optional<data::PromptDataset> train_data, val_data;
  std::unique_ptr<data::PromptLoader> loader;
  std::unique_ptr<rewards::RewardManager> reward, val_reward;
  std::unique_ptr<algos::KLController> kl_ctrl;
  std::optional<ResourcePool> pool;
  std::optional<WorkerGroup> group;         // the actor's (and colocated critic's) processes
  std::optional<WorkerGroup> critic_group;  // a critic with a layout of its own
  std::optional<WorkerGroup> actor;         // views: the actor role of `group`,
  std::optional<WorkerGroup> critic;        // the critic's role or critic_group
  std::optional<WorkerGroup> rm_group;      // a reward model with a layout of its own
  std::optional<WorkerGroup> rm;            // the reward model's role (colocated)

  WorkerGroup& reward_model() { return rm ? *rm : *rm_group; }
  std::unique_ptr<MetricsLogger> logger;
  int64_t global_step = 0;
};

namespace {

Settings read_settings(const Config& c) {
  Settings s;
  s.model_path = c.get<std::string>("actor_rollout_ref.model.path");
  s.tokenizer_path = c.get_optional<std::string>("data.tokenizer").value_or(s.model_path);
  s.out_dir = c.get<std::string>("trainer.default_local_dir");
  s.world = c.get<int64_t>("trainer.nnodes") * c.get<int64_t>("trainer.n_gpus_per_node");
  s.use_gpu = c.get<std::string>("trainer.device") != "cpu";
  s.train_batch = c.get<int64_t>("data.train_batch_size");
  s.n = c.get<int64_t>("actor_rollout_ref.rollout.n");
  s.response_length = c.get<int64_t>("data.max_response_length");
  s.use_critic = critic_enabled(c);
  s.adv_estimator = c.get<std::string>("algorithm.adv_estimator");
  s.use_kl_in_reward = c.get<bool>("algorithm.use_kl_in_reward");
  s.kl_penalty = c.get<std::string>("algorithm.kl_penalty");
  s.use_kl_loss = c.get<bool>("actor_rollout_ref.actor.use_kl_loss");
  s.use_ref = s.use_kl_in_reward || s.use_kl_loss;
  s.total_epochs = c.get<int64_t>("trainer.total_epochs");
  s.critic_warmup = c.get<int64_t>("trainer.critic_warmup");
  s.test_freq = c.get<int64_t>("trainer.test_freq");
  s.save_freq = c.get<int64_t>("trainer.save_freq");
  s.val_before_train = c.get<bool>("trainer.val_before_train");
  s.rollout_seed = static_cast<uint64_t>(c.get<int64_t>("actor_rollout_ref.rollout.seed"));
  s.loggers = c.get<std::vector<std::string>>("trainer.logger");
  s.loss_agg_mode = c.get<std::string>("actor_rollout_ref.actor.loss_agg_mode");

  s.adv.gamma = c.get<double>("algorithm.gamma");
  s.adv.lam = c.get<double>("algorithm.lam");
  s.adv.grpo.norm_adv_by_std = c.get<bool>("algorithm.norm_adv_by_std_in_grpo");
  s.kl_ctrl.type = c.get<std::string>("algorithm.kl_ctrl.type");
  s.kl_ctrl.kl_coef = c.get<double>("algorithm.kl_ctrl.kl_coef");
  s.kl_ctrl.target_kl = c.get<double>("algorithm.kl_ctrl.target_kl");
  s.kl_ctrl.horizon = c.get<double>("algorithm.kl_ctrl.horizon");
  return s;
}

// The actor's and the critic's options; `steps` is the number of training steps.
void fill_role_options(const Config& c, Settings& s, int64_t steps) {
  const std::string a = "actor_rollout_ref.actor";
  workers::ActorRolloutRefOptions& o = s.actor;
  o.model.path = s.model_path;
  o.model.tp = c.get<int64_t>(a + ".megatron.tensor_model_parallel_size");
  o.model.pp = c.get<int64_t>(a + ".megatron.pipeline_model_parallel_size");
  o.model.seed = static_cast<uint64_t>(c.get<int64_t>(a + ".megatron.seed"));
  o.model.dtype = c.get<std::string>(a + ".megatron.dtype");
  o.ref_dtype = c.get<std::string>("actor_rollout_ref.ref.megatron.dtype");
  const int64_t dp = s.world / (o.model.tp * o.model.pp);
  const int64_t mini_prompts = std::min(c.get<int64_t>(a + ".ppo_mini_batch_size"), s.train_batch);
  o.update.mini_batch_size = mini_prompts * s.n;
  const int64_t local_mini = o.update.mini_batch_size / dp;
  o.update.micro_batch_size =
      c.get_optional<int64_t>(a + ".ppo_micro_batch_size_per_gpu").value_or(std::min<int64_t>(local_mini, 8));
  o.update.epochs = c.get<int64_t>(a + ".ppo_epochs");
  s.old_log_prob_from_update = c.get<bool>(a + ".skip_old_log_prob_on_policy") &&
                               o.update.epochs == 1 && mini_prompts == s.train_batch &&
                               !s.use_kl_in_reward;
  o.update.shuffle = c.get<bool>(a + ".shuffle");
  o.update.loss_agg_mode = s.loss_agg_mode;
  o.update.seed = static_cast<uint64_t>(c.get<int64_t>("data.seed"));
  const int64_t updates = steps * o.update.epochs * (s.train_batch / mini_prompts);
  o.optim = optim_from(c, a + ".optim", c.get<double>(a + ".grad_clip"), updates);
  o.optim.distributed = c.get<bool>(a + ".megatron.use_distributed_optimizer");
  o.optim.overlap_grad_reduce = c.get<bool>(a + ".megatron.overlap_grad_reduce");
  o.optim.bucket_bytes = c.get<int64_t>(a + ".megatron.grad_reduce_bucket_bytes");
  workers::PolicyOptions& p = o.policy;
  p.loss_mode = c.get<std::string>(a + ".policy_loss.loss_mode");
  p.clip_ratio = c.get<double>(a + ".clip_ratio");
  p.clip_ratio_low = c.get_optional<double>(a + ".clip_ratio_low").value_or(p.clip_ratio);
  p.clip_ratio_high = c.get_optional<double>(a + ".clip_ratio_high").value_or(p.clip_ratio);
  p.clip_ratio_c = c.get<double>(a + ".clip_ratio_c");
  p.clip_cov_ratio = c.get<double>(a + ".policy_loss.clip_cov_ratio");
  p.clip_cov_lb = c.get<double>(a + ".policy_loss.clip_cov_lb");
  p.clip_cov_ub = c.get<double>(a + ".policy_loss.clip_cov_ub");
  p.kl_cov_ratio = c.get<double>(a + ".policy_loss.kl_cov_ratio");
  p.ppo_kl_coef = c.get<double>(a + ".policy_loss.ppo_kl_coef");
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
  o.ref = s.use_ref;

  s.use_rm = c.get<bool>("reward_model.enable");
  if (s.use_rm) {
    const auto path = c.get_optional<std::string>("reward_model.model.path");
    if (!path) throw ConfigError("reward_model.enable = true needs reward_model.model.path");
    s.rm.model.path = *path;
    s.rm.model.value_model = true;
    s.rm.model.tp = c.get<int64_t>("reward_model.megatron.tensor_model_parallel_size");
    s.rm.model.pp = c.get<int64_t>("reward_model.megatron.pipeline_model_parallel_size");
    s.rm.micro_batch_size =
        c.get_optional<int64_t>("reward_model.micro_batch_size_per_gpu").value_or(int64_t{1} << 30);
  }

  if (!s.use_critic) return;
  workers::CriticOptions& k = s.critic;
  k.model.path = c.get<std::string>("critic.model.path");
  k.model.value_model = true;
  k.model.tp = c.get<int64_t>("critic.megatron.tensor_model_parallel_size");
  k.model.pp = c.get<int64_t>("critic.megatron.pipeline_model_parallel_size");
  k.model.seed = static_cast<uint64_t>(c.get<int64_t>("critic.megatron.seed"));
  k.model.dtype = c.get<std::string>("critic.megatron.dtype");
  const int64_t cdp = s.world / (k.model.tp * k.model.pp);
  const int64_t cmini = std::min(c.get<int64_t>("critic.ppo_mini_batch_size"), s.train_batch);
  k.update.mini_batch_size = cmini * s.n;
  k.update.micro_batch_size = c.get_optional<int64_t>("critic.ppo_micro_batch_size_per_gpu")
                                  .value_or(std::min<int64_t>(k.update.mini_batch_size / cdp, 8));
  k.update.epochs = c.get<int64_t>("critic.ppo_epochs");
  k.update.shuffle = c.get<bool>("critic.shuffle");
  k.update.loss_agg_mode = c.get<std::string>("critic.loss_agg_mode");
  k.update.seed = o.update.seed;
  k.optim = optim_from(c, "critic.optim", c.get<double>("critic.grad_clip"),
                       steps * k.update.epochs * (s.train_batch / cmini));
  k.optim.distributed = c.get<bool>("critic.megatron.use_distributed_optimizer");
  k.optim.overlap_grad_reduce = c.get<bool>("critic.megatron.overlap_grad_reduce");
  k.optim.bucket_bytes = c.get<int64_t>("critic.megatron.grad_reduce_bucket_bytes");
  k.cliprange_value = c.get<double>("critic.cliprange_value");
  k.forward_micro_batch_size = k.update.micro_batch_size;
}

DataProto prompt_proto(const data::PromptBatch& pb, const std::string& uid_prefix) {
  const auto to_tensor = [&](const std::vector<int32_t>& v) {
    return at::from_blob(const_cast<int32_t*>(v.data()), {pb.size, pb.seq_len}, at::kInt)
        .to(at::kLong);
  };
  DataProto d;
  d.set_tensor("input_ids", to_tensor(pb.input_ids));
  d.set_tensor("attention_mask", to_tensor(pb.attention_mask));
  d.set_tensor("position_ids", to_tensor(pb.position_ids));
  List sources, truths, extras, uids;
  for (int64_t i = 0; i < pb.size; ++i) {
    const auto k = static_cast<size_t>(i);
    sources.emplace_back(pb.data_sources[k]);
    truths.emplace_back(pb.ground_truths[k]);
    extras.emplace_back(pb.extra_infos[k]);
    uids.emplace_back(uid_prefix + std::to_string(pb.indices[k]));
  }
  d.set_column("data_source", std::move(sources));
  d.set_column("ground_truth", std::move(truths));
  d.set_column("extra_info", std::move(extras));
  d.set_column("uid", std::move(uids));
  return d;
}

algos::Uids uids_of(const DataProto& d) {
  algos::Uids out;
  for (const Value& v : d.column("uid")) out.push_back(v.as_string());
  return out;
}

void merge_metrics(Metrics& into, const DataProto& result) {
  const Value* m = result.meta_value("metrics");
  if (m == nullptr) return;
  std::map<std::string, std::vector<double>> lists;
  for (const auto& [k, v] : m->as_dict()) {
    std::vector<double>& xs = lists[k];
    if (v.kind() == ValueKind::kList) {
      for (const Value& x : v.as_list()) xs.push_back(x.as_float());
    } else {
      xs.push_back(v.as_float());
    }
  }
  for (const auto& [k, v] : reduce_metrics(lists)) into[k] = v;
}

const char* kLatestFile = "latest_checkpointed_iteration.txt";

}  // namespace

// trainer.default_local_dir/global_step_N/{actor,critic}/ (the workers'
// sharded checkpoints: model, optimizer, RNG) and trainer_state.json (the
// data loader's position, the KL controller); latest_checkpointed_iteration.txt
// names N once all of it is on disk.
void save_trainer_checkpoint(PpoTrainer::State& st);
bool resume_trainer_checkpoint(PpoTrainer::State& st);

PpoTrainer::PpoTrainer(Config config) : s_(std::make_unique<State>()) {
  validate_ppo_config(config);
  State& st = *s_;
  st.config = config.resolved();
  const Config& c = st.config;
  st.s = read_settings(c);
  Settings& s = st.s;
  fs::create_directories(s.out_dir);
  c.save(fs::path(s.out_dir) / "config.yaml");

  st.tokenizer.emplace(data::Tokenizer::load(s.tokenizer_path));
  data::PromptDatasetOptions dopts;
  dopts.max_prompt_length(c.get<int64_t>("data.max_prompt_length"))
      .filter_overlong_prompts(c.get<bool>("data.filter_overlong_prompts"))
      .truncation(data::parse_truncation(c.get<std::string>("data.truncation")))
      .prompt_key(c.get<std::string>("data.prompt_key"));
  st.train_data = data::PromptDataset::load(c.get<std::vector<std::string>>("data.train_files"),
                                            *st.tokenizer, dopts);
  if (auto val = c.get_optional<std::vector<std::string>>("data.val_files"); val && !val->empty()) {
    st.val_data = data::PromptDataset::load(*val, *st.tokenizer, dopts);
  }
  st.loader = std::make_unique<data::PromptLoader>(
      *st.train_data, data::PromptLoaderOptions()
                          .batch_size(s.train_batch)
                          .shuffle(c.get<bool>("data.shuffle"))
                          .seed(static_cast<uint64_t>(c.get<int64_t>("data.seed"))));
  if (st.loader->batches_per_epoch() < 1) {
    throw ConfigError("data.train_batch_size = " + std::to_string(s.train_batch) +
                      " is more than the " + std::to_string(st.train_data->size()) +
                      " prompts of data.train_files");
  }
  const auto steps_key = c.get_optional<int64_t>("trainer.total_training_steps");
  s.total_steps = steps_key ? *steps_key : st.loader->batches_per_epoch() * s.total_epochs;
  fill_role_options(c, s, s.total_steps);

  rewards::RewardManagerOptions ropts;
  ropts.reward_fn_name(c.get_optional<std::string>("custom_reward_function.name"))
      .reward_fn_key(c.get<std::string>("data.reward_fn_key"));
  st.reward = std::make_unique<rewards::RewardManager>(*st.tokenizer, ropts);
  st.kl_ctrl = algos::make_kl_controller(s.kl_ctrl);
  algos::find_advantage_estimator(s.adv_estimator);  // an unknown name fails before spawning

  ResourcePoolOptions popts;
  popts.processes_per_node({static_cast<int>(s.world)}).gpu(s.use_gpu).colocate(2);
  st.pool.emplace(popts);
  ParallelLayout layout;
  layout.tp = static_cast<int>(s.actor.model.tp);
  layout.pp = static_cast<int>(s.actor.model.pp);
  layout.dp = static_cast<int>(s.world / (s.actor.model.tp * s.actor.model.pp));
  const bool colocate_critic =
      s.use_critic && s.critic.model.tp == s.actor.model.tp && s.critic.model.pp == s.actor.model.pp;
  std::vector<RoleSpec> roles = {
      {"actor", workers::actor_rollout_ref_worker_class(), {s.actor.to_json()}}};
  if (colocate_critic) roles.push_back({"critic", workers::critic_worker_class(), {s.critic.to_json()}});
  const bool colocate_rm =
      s.use_rm && s.rm.model.tp == s.actor.model.tp && s.rm.model.pp == s.actor.model.pp;
  if (colocate_rm) roles.push_back({"rm", workers::reward_model_worker_class(), {s.rm.to_json()}});
  st.group.emplace(WorkerGroup::spawn_colocated(
      roles, *st.pool, WorkerGroupOptions().set_layout(layout).set_name("actor_rollout_ref")));
  if (s.use_critic && !colocate_critic) {
    ParallelLayout cl;
    cl.tp = static_cast<int>(s.critic.model.tp);
    cl.pp = static_cast<int>(s.critic.model.pp);
    cl.dp = static_cast<int>(s.world / (s.critic.model.tp * s.critic.model.pp));
    st.critic_group.emplace(WorkerGroup::spawn(workers::critic_worker_class(), *st.pool,
                                               {s.critic.to_json()},
                                               WorkerGroupOptions().set_layout(cl).set_name("critic")));
  }
  if (s.use_rm && !colocate_rm) {
    ParallelLayout rl;
    rl.tp = static_cast<int>(s.rm.model.tp);
    rl.pp = static_cast<int>(s.rm.model.pp);
    rl.dp = static_cast<int>(s.world / (s.rm.model.tp * s.rm.model.pp));
    st.rm_group.emplace(WorkerGroup::spawn(workers::reward_model_worker_class(), *st.pool,
                                           {s.rm.to_json()},
                                           WorkerGroupOptions().set_layout(rl).set_name("reward_model")));
  }
  if (colocate_rm) st.rm.emplace(st.group->role("rm"));
  st.actor.emplace(st.group->role("actor"));
  if (colocate_critic) st.critic.emplace(st.group->role("critic"));
  st.actor->call("init_model", {}).get();
  if (s.use_critic) (st.critic ? *st.critic : *st.critic_group).call("init_model", {}).get();
  if (s.use_rm) st.reward_model().call("init_model", {}).get();

}

PpoTrainer::~PpoTrainer() = default;

std::map<std::string, double> PpoTrainer::validate() {
  State& st = *s_;
  if (!st.val_data) return {};
  const Config& c = st.config;
  const std::string vk = "actor_rollout_ref.rollout.val_kwargs";
  const int64_t n = c.get<int64_t>(vk + ".n");
  WorkerGroup& actor = *st.actor;
  const int64_t replicas = st.s.world / st.s.actor.rollout.tp;
  const int64_t batch_size = c.get_optional<int64_t>("data.val_batch_size")
                                 .value_or(static_cast<int64_t>(st.val_data->size()));
  std::map<std::string, std::vector<double>> by_source;
  for (size_t start = 0; start < st.val_data->size(); start += static_cast<size_t>(batch_size)) {
    std::vector<size_t> idx;
    for (size_t i = start; i < std::min(st.val_data->size(), start + static_cast<size_t>(batch_size)); ++i)
      idx.push_back(i);
    DataProto batch = prompt_proto(st.val_data->batch(idx), "val-");
    auto [padded, pad] = batch.pad_to_multiple(replicas);
    DataProto gen = padded.select({"input_ids", "attention_mask"});
    std::vector<int64_t> seeds;
    for (int64_t i = 0; i < gen.size(); ++i) seeds.push_back(static_cast<int64_t>(st.s.rollout_seed) + i);
    gen.set_tensor("request_seed", at::tensor(seeds, at::kLong));
    gen.set_meta("n", Value(n));
    gen.set_meta("do_sample", Value(c.get<bool>(vk + ".do_sample")));
    gen.set_meta("temperature", Value(c.get<double>(vk + ".temperature")));
    gen.set_meta("top_k", Value(c.get<int64_t>(vk + ".top_k")));
    gen.set_meta("top_p", Value(c.get<double>(vk + ".top_p")));
    gen.set_meta("pad_token_id", Value(static_cast<int64_t>(st.val_data->pad_id())));
    DataProto out = actor.call("generate_sequences", {gen}).get().as<DataProto>();
    out = out.unpad(pad * n);
    DataProto rows = batch.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                         .repeat(n, true)
                         .union_with(out);
    std::vector<double> scores;
    if (st.s.use_rm) {
      // Rows padded to the reward model's DP size for its dispatch, then dropped.
      const int64_t rm_dp = st.s.world / (st.s.rm.model.tp * st.s.rm.model.pp);
      auto [scored, rm_pad] = rows.select({"input_ids", "attention_mask", "position_ids",
                                           "responses", "response_mask"})
                                  .pad_to_multiple(rm_dp);
      const at::Tensor rm = st.reward_model()
                                .call("compute_rm_score", {scored})
                                .get()
                                .as<DataProto>()
                                .unpad(rm_pad)
                                .tensor("rm_scores")
                                .sum(1);
      for (int64_t i = 0; i < rm.size(0); ++i) scores.push_back(rm[i].item<double>());
    } else {
      scores = st.reward->compute(rows).scores;
    }
    const List& sources = rows.column("data_source");
    for (size_t i = 0; i < scores.size(); ++i) by_source[sources[i].as_string()].push_back(scores[i]);
  }
  // Each prompt's n samples are consecutive: mean@n over every sample; with
  // n > 1 also the mean over prompts of the best and the worst of their n
  // (verl's best@n; worst@n).
  Metrics m;
  const std::string at_n = "@" + std::to_string(n);
  for (const auto& [source, scores] : by_source) {
    double total = 0, best = 0, worst = 0;
    for (size_t g = 0; g < scores.size(); g += static_cast<size_t>(n)) {
      const auto first = scores.begin() + static_cast<std::ptrdiff_t>(g);
      const auto last = first + n;
      for (auto it = first; it != last; ++it) total += *it;
      best += *std::max_element(first, last);
      worst += *std::min_element(first, last);
    }
    const double prompts = static_cast<double>(scores.size()) / static_cast<double>(n);
    m["val-core/" + source + "/reward/mean" + at_n] = total / static_cast<double>(scores.size());
    if (n > 1) {
      m["val-core/" + source + "/reward/best" + at_n] = best / prompts;
      m["val-aux/" + source + "/reward/worst" + at_n] = worst / prompts;
    }
  }
  return m;
}

namespace {

void write_text_atomically(const fs::path& file, const std::string& text) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) throw Error("cannot write " + tmp.string());
  }
  fs::rename(tmp, file);
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("cannot read " + file.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

WorkerGroup& critic_group(PpoTrainer::State& st) {
  return st.critic ? *st.critic : *st.critic_group;
}

void save_trainer_checkpoint(PpoTrainer::State& st) {
  const int64_t step = st.global_step;
  const fs::path dir = fs::path(st.s.out_dir) / ("global_step_" + std::to_string(step));
  fs::create_directories(dir);
  st.actor->call("save_checkpoint", {(dir / "actor").string(), step, std::string("{}")}).get();
  if (st.s.use_critic) {
    critic_group(st).call("save_checkpoint", {(dir / "critic").string(), step, std::string("{}")}).get();
  }
  nlohmann::json state = {{"global_step", step},
                          {"loader", nlohmann::json::parse(st.loader->state().to_json())},
                          {"kl_coef", st.kl_ctrl->value}};
  write_text_atomically(dir / "trainer_state.json", state.dump(2));
  write_text_atomically(fs::path(st.s.out_dir) / kLatestFile, std::to_string(step));
}

bool resume_trainer_checkpoint(PpoTrainer::State& st) {
  const Config& c = st.config;
  const std::string mode = c.get<std::string>("trainer.resume_mode");
  fs::path dir;
  if (mode == "disable") return false;
  if (mode == "auto") {
    const fs::path latest = fs::path(st.s.out_dir) / kLatestFile;
    if (!fs::exists(latest)) return false;
    dir = fs::path(st.s.out_dir) / ("global_step_" + read_text(latest));
  } else if (mode == "resume_path") {
    const auto path = c.get_optional<std::string>("trainer.resume_from_path");
    if (!path) throw ConfigError("trainer.resume_mode = resume_path needs trainer.resume_from_path");
    dir = *path;
  } else {
    throw ConfigError("trainer.resume_mode = '" + mode + "' is not one of: auto, disable, resume_path");
  }
  const fs::path state_file = dir / "trainer_state.json";
  if (!fs::exists(state_file)) {
    throw Error("resume: " + state_file.string() + " does not exist (not a global_step_N checkpoint?)");
  }
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_text(state_file));
    const int64_t step = state.at("global_step").get<int64_t>();
    st.actor->call("load_checkpoint", {(dir / "actor").string(), step}).get();
    if (st.s.use_critic) critic_group(st).call("load_checkpoint", {(dir / "critic").string(), step}).get();
    st.loader->restore(data::LoaderState::from_json(state.at("loader").dump(), state_file.string()));
    st.kl_ctrl->value = state.at("kl_coef").get<double>();
    st.global_step = step;
  } catch (const nlohmann::json::exception& e) {
    throw Error("resume: " + state_file.string() + ": " + e.what());
  }
  log(LogLevel::kInfo, "resumed from " + dir.string() + " (step " + std::to_string(st.global_step) + ")");
  return true;
}

FitResult PpoTrainer::fit() {
  State& st = *s_;
  Settings& s = st.s;
  const Config& c = st.config;
  FitResult result;
  WorkerGroup& actor = *st.actor;
  WorkerGroup* critic = s.use_critic ? &critic_group(st) : nullptr;

  const bool resumed = resume_trainer_checkpoint(st);
  MetricsLoggerOptions lopts;
  lopts.dir = s.out_dir;
  lopts.loggers = s.loggers;
  lopts.set_names(c.get<std::string>("trainer.project_name"), c.get<std::string>("trainer.experiment_name"));
  // A resumed run keeps the metrics of the steps it resumed from.
  if (resumed) lopts.set_resume_step(st.global_step);
  st.logger = std::make_unique<MetricsLogger>(lopts);
  ProgressLine progress("training", s.total_steps);
  if (s.val_before_train && st.val_data) {
    Metrics v = validate();
    result.first_validation = v;
    result.last_validation = v;
    st.logger->log(st.global_step, v);
  }
  const std::string r = "actor_rollout_ref.rollout";
  const int64_t replicas = s.world / s.actor.rollout.tp;
  const double temperature = c.get<double>(r + ".temperature");
  while (st.global_step < s.total_steps) {
    ++st.global_step;
    const auto step_start = Clock::now();
    Metrics m, timing;
    auto timed = [&](const char* name, auto&& fn) {
      progress.update(st.global_step - 1, "step " + std::to_string(st.global_step) + ": " + name);
      const auto t0 = Clock::now();
      fn();
      timing[name] = seconds_since(t0);
    };

    DataProto batch = prompt_proto(st.loader->next(), std::to_string(st.global_step) + "-");
    DataProto out;
    timed("gen", [&] {
      // Each rollout replica generates for its share of the prompts; a batch
      // that does not split is padded with copies of its last prompt, whose
      // samples are dropped.
      auto [padded, pad] = batch.select({"input_ids", "attention_mask"}).pad_to_multiple(replicas);
      DataProto gen = padded;
      std::vector<int64_t> seeds;
      for (int64_t i = 0; i < gen.size(); ++i) {
        seeds.push_back(static_cast<int64_t>(s.rollout_seed * 1000003ULL +
                                             static_cast<uint64_t>(st.global_step) * 7919ULL +
                                             static_cast<uint64_t>(i)));
      }
      gen.set_tensor("request_seed", at::tensor(seeds, at::kLong));
      gen.set_meta("n", Value(s.n));
      gen.set_meta("do_sample", Value(c.get<bool>(r + ".do_sample")));
      gen.set_meta("temperature", Value(temperature));
      gen.set_meta("top_k", Value(c.get<int64_t>(r + ".top_k")));
      gen.set_meta("top_p", Value(c.get<double>(r + ".top_p")));
      gen.set_meta("pad_token_id", Value(static_cast<int64_t>(st.train_data->pad_id())));
      out = actor.call("generate_sequences", {gen}).get().as<DataProto>().unpad(pad * s.n);
    });
    batch = batch.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                .repeat(s.n, true)
                .union_with(out);
    batch.set_meta("temperature", Value(temperature));
    batch.set_meta("global_steps", Value(st.global_step));

    timed("reward", [&] {
      if (s.use_rm) {
        // As verl's naive manager: a reward model's scores replace the rule rewards.
        const int64_t rm_dp = s.world / (s.rm.model.tp * s.rm.model.pp);
        auto [scored, rm_pad] = batch.pad_to_multiple(rm_dp);
        batch.set_tensor("token_level_scores", st.reward_model()
                                                   .call("compute_rm_score", {scored})
                                                   .get()
                                                   .as<DataProto>()
                                                   .unpad(rm_pad)
                                                   .tensor("rm_scores"));
      } else {
        batch = st.reward->with_token_level_scores(batch);
      }
    });
    if (!s.old_log_prob_from_update) timed("old_log_prob", [&] {
      DataProto lp = actor.call("compute_log_prob", {batch}).get().as<DataProto>();
      const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
      m["actor/entropy"] = algos::agg_loss(lp.tensor("entropys"), mask,
                                           algos::parse_loss_agg_mode(s.loss_agg_mode))
                               .item<double>();
      batch.set_tensor("old_log_probs", lp.tensor("old_log_probs"));
    });
    if (s.use_ref) {
      timed("ref", [&] {
        DataProto lp = actor.call("compute_ref_log_prob", {batch}).get().as<DataProto>();
        batch.set_tensor("ref_log_prob", lp.tensor("ref_log_prob"));
      });
    }
    if (s.use_critic) {
      timed("values", [&] {
        DataProto v = critic->call("compute_values", {batch}).get().as<DataProto>();
        batch.set_tensor("values", v.tensor("values"));
      });
    }
    timed("adv", [&] {
      const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
      const at::Tensor scores = batch.tensor("token_level_scores");
      if (s.use_kl_in_reward) {
        // verl's apply_kl_penalty: rewards = scores − β·KL per token.
        const at::Tensor kld = algos::kl_penalty(batch.tensor("old_log_probs"),
                                                 batch.tensor("ref_log_prob"), s.kl_penalty) *
                               mask;
        const double beta = st.kl_ctrl->value;
        batch.set_tensor("token_level_rewards", scores - beta * kld);
        const double current_kl = (kld.sum(1) / mask.sum(1).clamp_min(1)).mean().item<double>();
        st.kl_ctrl->update(current_kl, batch.size());
        m["critic/kl"] = current_kl;
        m["critic/kl_coef"] = beta;
      } else {
        batch.set_tensor("token_level_rewards", scores);
      }
      algos::AdvantageInputs in;
      in.token_level_rewards = batch.tensor("token_level_rewards");
      in.response_mask = mask;
      in.uids = uids_of(batch);
      if (s.use_critic) in.values = batch.tensor("values");
      algos::AdvantageResult adv = algos::compute_advantage(s.adv_estimator, in, s.adv);
      batch.set_tensor("advantages", adv.advantages);
      batch.set_tensor("returns", adv.returns);
    });
    if (s.use_critic) {
      timed("update_critic", [&] {
        merge_metrics(m, critic->call("update_critic", {batch}).get().as<DataProto>());
      });
    }
    if (st.global_step > s.critic_warmup) {
      timed("update_actor", [&] {
        merge_metrics(m, actor.call("update_actor", {batch}).get().as<DataProto>());
      });
    }
    timing["step"] = seconds_since(step_start);

    if (s.test_freq > 0 && st.val_data &&
        (st.global_step % s.test_freq == 0 || st.global_step == s.total_steps)) {
      const auto t0 = Clock::now();
      Metrics v = validate();
      timing["testing"] = seconds_since(t0);
      result.last_validation = v;
      if (result.first_validation.empty()) result.first_validation = v;
      m.insert(v.begin(), v.end());
    }
    for (const auto& [k, v] : compute_data_metrics(batch, s.use_critic, s.response_length)) m[k] = v;
    for (const auto& [k, v] : compute_timing_metrics(batch, timing)) m[k] = v;
    for (const auto& [k, v] :
         compute_throughput_metrics(batch, timing, static_cast<int>(s.world)))
      m[k] = v;
    m["training/global_step"] = static_cast<double>(st.global_step);
    progress.clear();
    st.logger->log(st.global_step, m);
    result.last_metrics = m;
    if (s.save_freq > 0 && (st.global_step % s.save_freq == 0 || st.global_step == s.total_steps)) {
      save_trainer_checkpoint(st);
    }
  }
  result.steps = st.global_step;
  progress.update(st.global_step);
  progress.finish();

  result.hf_dir = (fs::path(s.out_dir) / "actor_hf").string();
  actor.call("export_hf", {result.hf_dir}).get();
  if (std::find(s.loggers.begin(), s.loggers.end(), "file") != s.loggers.end()) {
    try {
      result.plot = (fs::path(s.out_dir) / "curves.png").string();
      st.logger->plot(result.plot);
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, std::string("no plot: ") + e.what());
      result.plot.clear();
    }
  }
  return result;
}

namespace {

std::string format_scores(const std::map<std::string, double>& v) {
  std::string out;
  char buf[64];
  for (const auto& [k, x] : v) {
    std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * x);
    out += (out.empty() ? "" : ", ") + k + " = " + buf;
  }
  return out.empty() ? "-" : out;
}

}  // namespace

int run_trainer_main(int argc, char** argv, const std::string& default_config) {
  try {
    CommandLineConfig cl = config_from_command_line(argc, argv, default_config);
    if (!cl.other_args.empty()) {
      std::cerr << "unknown argument '" << cl.other_args.front()
                << "' (expected --config FILE and key=value overrides)\n";
      return 2;
    }
    PpoTrainer trainer(cl.config);
    const FitResult r = trainer.fit();
    std::cout << "\nsteps: " << r.steps << "\n"
              << "validation before training: " << format_scores(r.first_validation) << "\n"
              << "validation after training:  " << format_scores(r.last_validation) << "\n"
              << "trained actor (HF format):  " << r.hf_dir << "\n";
    if (!r.plot.empty()) std::cout << "curves:                     " << r.plot << "\n";
    return 0;
  } catch (const ConfigError& e) {
    std::cerr << "config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace baton::trainer
