#include "trainer/ppo_trainer.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>

#include "base/errors.h"
#include "base/log.h"
#include "base/profiler.h"
#include "data/prompt_dataset.h"
#include "data/prompt_loader.h"
#include "dispatch/data_proto.h"
#include "engine/rollout/sampling.h"
#include "runtime/resource_pool.h"
#include "runtime/worker_group.h"
#include "text/tokenizer/tokenizer.h"
#include "trainer/async/async_trainer.h"
#include "trainer/config/settings.h"
#include "trainer/dynamic_sampling.h"
#include "trainer/generation_dump.h"
#include "trainer/metric_utils.h"
#include "trainer/metrics.h"
#include "trainer/progress_line.h"
#include "trainer/seqlen_balancing.h"
#include "trainer/step_phases.h"
#include "trainer/trainer_state.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/kl.h"
#include "workers/algos/masked_reductions.h"
#include "workers/rewards/reward_manager.h"
#include "workers/rewards/reward_registry.h"
#include "workers/roles/actor_rollout_ref_worker.h"
#include "workers/roles/critic_worker.h"
#include "workers/roles/prompt_batch.h"
#include "workers/roles/reward_model_worker.h"
#include "workers/roles/role_options.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;

using Settings = TrainerSettings;

}  // namespace

namespace {

// The rollout's responses to `prompts` (input_ids, attention_mask; any other
// keys are dropped), sp.n per prompt, in prompt order, sampled with sp's
// temperature (0: greedy), top_k and top_p; max_new_tokens is the rollout's
// own. Each rollout replica generates for its share: a batch that does not
// split over `replicas` is padded with copies of its last prompt, whose
// samples are dropped. seed(i) is prompt i's request seed (padding rows
// included); none for greedy runs.
DataProto generate(WorkerGroup& actor, const DataProto& prompts, const engine::SamplingParams& sp,
                   int64_t replicas, int64_t pad_token_id,
                   const std::function<int64_t(int64_t)>& seed = nullptr) {
  auto [gen, pad] = prompts.select({"input_ids", "attention_mask"}).pad_to_multiple(replicas);
  if (seed) {
    std::vector<int64_t> seeds;
    for (int64_t i = 0; i < gen.size(); ++i) seeds.push_back(seed(i));
    gen.set_tensor("request_seed", at::tensor(seeds, at::kLong));
  }
  gen.set_meta("n", Value(sp.n));
  gen.set_meta("temperature", Value(sp.temperature));
  gen.set_meta("top_k", Value(sp.top_k));
  gen.set_meta("top_p", Value(sp.top_p));
  gen.set_meta("pad_token_id", Value(pad_token_id));
  return actor.call("generate_sequences", {gen}).get().as<DataProto>().unpad(pad * sp.n);
}

}  // namespace

namespace {

// The training prompts' loader at its start: batches of data.gen_batch_size
// (data.train_batch_size unless algorithm.filter_groups is on).
std::unique_ptr<data::PromptLoader> make_loader(const PpoTrainer::State& st) {
  const Settings& s = st.s;
  return std::make_unique<data::PromptLoader>(*st.train_data, data::PromptLoaderOptions()
                                                                  .set_batch_size(s.gen_batch)
                                                                  .set_shuffle(s.data_shuffle)
                                                                  .set_seed(s.data_seed));
}

// The groups that own processes (not role views).
std::vector<WorkerGroup*> process_groups(PpoTrainer::State& st) {
  std::vector<WorkerGroup*> groups;
  for (std::optional<WorkerGroup>* g : {&st.group, &st.critic_group, &st.rm_group, &st.rollout})
    if (g->has_value()) groups.push_back(&**g);
  return groups;
}

// Spawns every worker group of the run (the actor's with its colocated
// roles, a critic's or reward model's of their own, the async rollout's),
// inits their models and the step profiler over their processes.
void spawn_workers(PpoTrainer::State& st) {
  const Settings& s = st.s;
  ResourcePoolOptions popts;
  popts.processes_on_nodes = {static_cast<int>(s.world)};
  if (!s.cluster_listen.empty()) {
    // Workers on node agents: per_node on each of the nnodes machines.
    if (!st.cluster) {
      ClusterOptions co;
      co.listen = s.cluster_listen;
      co.nodes = static_cast<int>(s.nnodes);
      st.cluster = Cluster::listen(co);
    }
    st.cluster->wait_for_nodes();
    popts.processes_on_nodes.assign(static_cast<size_t>(s.nnodes), static_cast<int>(s.per_node));
    popts.cluster = st.cluster;
  }
  popts.use_gpu = s.use_gpu;
  popts.max_colocate_count = 2;
  if (s.async.enable)
    popts.intra_op_threads = async_worker_threads(s);  // cores shared with the rollout's
  st.pool.emplace(popts);
  ParallelLayout layout;
  layout.tp = static_cast<int>(s.actor.model.tp);
  layout.pp = static_cast<int>(s.actor.model.pp);
  layout.dp = static_cast<int>(s.world / (s.actor.model.tp * s.actor.model.pp));
  const bool colocate_critic = s.use_critic && s.critic.model.tp == s.actor.model.tp &&
                               s.critic.model.pp == s.actor.model.pp;
  std::vector<RoleSpec> roles = {
      {"actor", workers::actor_rollout_ref_worker_class(), {s.actor.to_json()}}};
  if (colocate_critic)
    roles.push_back({"critic", workers::critic_worker_class(), {s.critic.to_json()}});
  const bool colocate_rm = s.use_rm && !s.rm_centralized && s.rm.model.tp == s.actor.model.tp &&
                           s.rm.model.pp == s.actor.model.pp;
  if (colocate_rm) roles.push_back({"rm", workers::reward_model_worker_class(), {s.rm.to_json()}});
  st.group.emplace(WorkerGroup::spawn_colocated(
      roles, *st.pool, WorkerGroupOptions().set_layout(layout).set_name("actor_rollout_ref")));
  if (s.use_critic && !colocate_critic) {
    ParallelLayout cl;
    cl.tp = static_cast<int>(s.critic.model.tp);
    cl.pp = static_cast<int>(s.critic.model.pp);
    cl.dp = static_cast<int>(s.world / (s.critic.model.tp * s.critic.model.pp));
    st.critic_group.emplace(
        WorkerGroup::spawn(workers::critic_worker_class(), *st.pool, {s.critic.to_json()},
                           WorkerGroupOptions().set_layout(cl).set_name("critic")));
  }
  if (s.use_rm && !colocate_rm) {
    ParallelLayout rl;
    rl.tp = static_cast<int>(s.rm.model.tp);
    rl.pp = static_cast<int>(s.rm.model.pp);
    rl.dp = static_cast<int>(s.world / (s.rm.model.tp * s.rm.model.pp));
    ResourcePool* rm_pool = &*st.pool;
    if (s.rm_centralized) {
      // One replica, in processes of its own on the first tp x pp devices.
      rl.dp = 1;
      ResourcePoolOptions ro = popts;
      ro.processes_on_nodes = {static_cast<int>(rl.tp * rl.pp)};
      st.rm_pool.emplace(ro);
      rm_pool = &*st.rm_pool;
    }
    st.rm_group.emplace(
        WorkerGroup::spawn(workers::reward_model_worker_class(), *rm_pool, {s.rm.to_json()},
                           WorkerGroupOptions().set_layout(rl).set_name("reward_model")));
  }
  if (colocate_rm) st.rm.emplace(st.group->role("rm"));
  st.actor.emplace(st.group->role("actor"));
  if (colocate_critic) st.critic.emplace(st.group->role("critic"));
  st.actor->call("init_model", {}).get();
  if (s.use_critic) st.critic_role().call("init_model", {}).get();
  if (s.use_rm) {
    st.reward_model().call("init_model", {}).get();
    // The reward model's parameter bytes on a training rank's device, on
    // average: every replica's shard beside the actor, or one copy over all.
    double total = 0;
    const List shards = st.reward_model().call("param_bytes", {}).get().as_list();
    for (const Value& b : shards) total += static_cast<double>(b.as_int());
    const double replicas =
        s.rm_centralized ? 1.0 : static_cast<double>(s.world) / static_cast<double>(shards.size());
    st.rm_param_bytes_per_rank = total * replicas / static_cast<double>(s.world);
  }
  if (s.async.enable) spawn_async_rollout(st);
  // Each worker process once: the groups that own processes.
  st.profiler = std::make_unique<StepProfiler>(st.s.profiler, process_groups(st));
}

// trainer.max_restarts: every group shut down and spawned again, the run's
// state back to what a resume from the latest checkpoint of this run's
// directory restores (or to the start, without one).
void restart_workers(PpoTrainer::State& st) {
  st.profiler.reset();
  st.actor.reset();
  st.critic.reset();
  st.rm.reset();
  st.rollout.reset();
  st.rollout_pool.reset();
  st.rm_group.reset();
  st.rm_pool.reset();
  st.critic_group.reset();
  st.group.reset();
  st.pool.reset();
  st.global_step = 0;
  st.restored_ledger.clear();
  st.loader = make_loader(st);
  st.kl_ctrl = algos::make_kl_controller(st.s.kl_ctrl);
  if (has_trainer_checkpoint(st.s.out_dir)) st.s.resume_mode = "auto";
  spawn_workers(st);
}

}  // namespace

namespace {

// Generation batch `gen` (1, 2, ... within the step) of step st.global_step:
// data.gen_batch_size prompts from the loader and their n responses each (a
// prompt's rows together, sharing its uid), with meta temperature and
// global_steps; for remax, `reward_baselines` gets each row's baseline. A
// later batch of a step (dynamic sampling) has uids and seeds of its own.
DataProto generate_batch(PpoTrainer::State& st, StepTimer& timed, int64_t gen,
                         at::Tensor& reward_baselines) {
  const Settings& s = st.s;
  WorkerGroup& actor = *st.actor;
  const int64_t replicas = s.world / s.actor.rollout.tp;
  const std::string uid_prefix =
      std::to_string(st.global_step) + "-" + (gen > 1 ? std::to_string(gen) + "-" : "");
  DataProto prompts = workers::prompt_batch_proto(st.loader->next(), uid_prefix);
  DataProto out;
  timed("gen", [&] {
    // Mixed through SplitMix64 (the sampler's own request seeding): a
    // step's seed from (rollout.seed, step), each prompt's from that and
    // its position among the step's prompts; no linear formula whose values
    // repeat across steps.
    const uint64_t step_seed = engine::SequenceRng::request_seed(s.rollout_seed, st.global_step);
    const int64_t first = (gen - 1) * s.gen_batch;
    out = generate(actor, prompts, s.sampling, replicas, st.train_data->pad_id(), [&](int64_t i) {
      return static_cast<int64_t>(engine::SequenceRng::request_seed(step_seed, first + i));
    });
  });
  if (s.adv_estimator == "remax") {
    timed("gen_max", [&] {
      // ReMax's baseline (verl's gen_max): each prompt's greedy response,
      // scored by the same reward, for each of its n samples.
      engine::SamplingParams greedy_sampling;
      greedy_sampling.temperature = 0;
      greedy_sampling.n = 1;
      const DataProto greedy =
          generate(actor, prompts, greedy_sampling, replicas, st.train_data->pad_id());
      DataProto rows = prompts.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                           .union_with(greedy);
      const std::vector<double> scores = st.reward->compute(rows).scores;
      reward_baselines = at::tensor(scores, at::kDouble).to(at::kFloat).repeat_interleave(s.n);
    });
  }
  DataProto batch = prompts.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                        .repeat(s.n, true)
                        .union_with(out);
  batch.set_meta("temperature", Value(s.logprob_temperature));
  batch.set_meta("global_steps", Value(st.global_step));
  return batch;
}

// DAPO's dynamic sampling (algorithm.filter_groups, trainer/dynamic_sampling.h):
// generation batches, each scored (after the old and reference log-prob
// passes and the KL penalty when the reward has one, as verl's DAPO trainer:
// seq_final_reward reads it), their varied groups kept until
// data.train_batch_size groups are. Returns exactly those groups' rows and
// sets `reward_baselines` to theirs; metric train/num_gen_batches.
DataProto sample_varied_groups(PpoTrainer::State& st, StepTimer& timed, Metrics& m,
                               at::Tensor& reward_baselines) {
  const Settings& s = st.s;
  DynamicSampler sampler(s.train_batch, s.filter_groups);
  do {
    at::Tensor baselines;
    DataProto gen = generate_batch(st, timed, sampler.gen_batches() + 1, baselines);
    if (s.use_kl_in_reward) {
      timed("old_log_prob", [&] {
        old_log_prob_pass(*st.actor, gen, s.loss_agg_mode, m, s.calculate_sum_pi_squared);
      });
      timed("ref", [&] { ref_log_prob_pass(*st.actor, gen); });
    }
    RewardModelScores rm = start_reward_model(st, gen, m);
    timed("reward", [&] {
      reward_phase(st, gen, rm, m);
      if (rm.pending()) rm.collect(gen);  // the filter reads the scores now
      kl_in_reward(gen, s, *st.kl_ctrl, m);
    });
    sampler.add(std::move(gen), baselines);
    if (!sampler.full())
      log(LogLevel::kInfo,
          "step " + std::to_string(st.global_step) + ": " + std::to_string(sampler.kept_groups()) +
              " of " + std::to_string(s.train_batch) + " groups with a varied " +
              s.filter_groups.metric + " after " + std::to_string(sampler.gen_batches()) +
              " generation batches; generating another");
  } while (!sampler.full());
  m["train/num_gen_batches"] = static_cast<double>(sampler.gen_batches());
  auto [batch, baselines] = sampler.take();
  reward_baselines = std::move(baselines);
  return batch;
}

}  // namespace

PpoTrainer::PpoTrainer(Config config) : s_(std::make_unique<State>()) {
  State& st = *s_;
  st.config = config.resolved();
  const Config& c = st.config;
  st.s = read_trainer_settings(c);
  Settings& s = st.s;
  // Registry names fail here, before any file is read or worker started
  // (baton::InvalidArgument naming the closest registered name).
  algos::find_advantage_estimator(s.adv_estimator);
  algos::find_policy_loss(s.actor.policy.loss_mode);
  if (s.custom_reward_fn) rewards::find_reward_function(*s.custom_reward_fn);
  // The wandb logger's python must have wandb: known before workers start.
  if (std::find(s.loggers.begin(), s.loggers.end(), "wandb") != s.loggers.end())
    check_wandb_importable(s.logger_python);
  fs::create_directories(s.out_dir);
  c.save(fs::path(s.out_dir) / "config.yaml");
  // Every process's lines from here on (the workers' through the driver).
  set_log_file((fs::path(s.out_dir) / "baton.log").string(), s.log_max_bytes,
               static_cast<int>(s.log_backup_count));
  log(LogLevel::kInfo,
      "run " + s.project_name + "/" + s.experiment_name + ": log file " + log_file_path());
  for (const std::string& note : s.notes) log(LogLevel::kInfo, note);

  st.tokenizer.emplace(data::Tokenizer::load(s.tokenizer_path));
  st.train_data = data::PromptDataset::load(s.train_files, *st.tokenizer, s.dataset);
  if (!s.val_files.empty())
    st.val_data = data::PromptDataset::load(s.val_files, *st.tokenizer, s.dataset);
  st.loader = make_loader(st);
  if (st.loader->batches_per_epoch() < 1) {
    throw ConfigError(
        (s.gen_batch == s.train_batch ? "data.train_batch_size = " : "data.gen_batch_size = ") +
        std::to_string(s.gen_batch) + " is more than the " + std::to_string(st.train_data->size()) +
        " prompts of data.train_files");
  }
  set_total_steps(s, st.loader->batches_per_epoch());

  rewards::RewardManagerOptions ropts;
  ropts.kind = s.reward_manager;
  ropts.overlong_buffer = s.overlong_buffer;
  ropts.reward_fn_name = s.custom_reward_fn;
  ropts.reward_fn_key = s.reward_fn_key;
  ropts.zero_on_error = s.zero_on_reward_error;
  if (s.python_reward) ropts.python = std::make_shared<rewards::PythonRewardPool>(*s.python_reward);
  st.reward = std::make_unique<rewards::RewardManager>(*st.tokenizer, ropts);
  st.kl_ctrl = algos::make_kl_controller(s.kl_ctrl);

  spawn_workers(st);
}

PpoTrainer::~PpoTrainer() = default;

std::map<std::string, double> PpoTrainer::validate() {
  State& st = *s_;
  if (!st.val_data) return {};
  const engine::SamplingParams& vs = st.s.val_sampling;
  const int64_t n = vs.n;
  WorkerGroup& actor = *st.actor;
  const int64_t replicas = st.s.world / st.s.actor.rollout.tp;
  const int64_t batch_size =
      st.s.val_batch_size.value_or(static_cast<int64_t>(st.val_data->size()));
  // Per data source, per value: "reward", and a dapo manager's per-row
  // values (acc, ...), which verl's validation reports too.
  std::map<std::string, std::map<std::string, std::vector<double>>> by_source;
  std::vector<GenerationRecord> records;  // validation_data_dir, log_val_generations
  for (size_t start = 0; start < st.val_data->size(); start += static_cast<size_t>(batch_size)) {
    std::vector<size_t> idx;
    for (size_t i = start;
         i < std::min(st.val_data->size(), start + static_cast<size_t>(batch_size)); ++i)
      idx.push_back(i);
    DataProto batch = workers::prompt_batch_proto(st.val_data->batch(idx), "val-");
    const DataProto out =
        generate(actor, batch, vs, replicas, st.val_data->pad_id(),
                 [&](int64_t i) { return static_cast<int64_t>(st.s.rollout_seed) + i; });
    DataProto rows = batch.select({}, {"data_source", "ground_truth", "extra_info", "uid"})
                         .repeat(n, true)
                         .union_with(out);
    std::vector<double> scores;
    std::map<std::string, std::vector<double>> extra;
    if (st.s.use_rm) {
      // Rows padded to the reward model's DP size for its dispatch, then dropped.
      const int64_t rm_dp = st.s.world / (st.s.rm.model.tp * st.s.rm.model.pp);
      auto [scored, rm_pad] =
          rows.select({"input_ids", "attention_mask", "position_ids", "responses", "response_mask"})
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
      rewards::RewardResult r = st.reward->compute(rows);
      scores = std::move(r.scores);
      if (st.s.reward_manager == rewards::RewardManagerKind::kDapo) extra = std::move(r.extra);
    }
    const List& sources = rows.column("data_source");
    for (size_t i = 0; i < scores.size(); ++i) {
      std::map<std::string, std::vector<double>>& values = by_source[sources[i].as_string()];
      values["reward"].push_back(scores[i]);
      for (const auto& [name, v] : extra) values[name].push_back(v[i]);
    }
    if (st.s.validation_data_dir || st.s.log_val_generations > 0) {
      std::vector<GenerationRecord> r = generation_records(rows, scores, *st.tokenizer);
      records.insert(records.end(), std::make_move_iterator(r.begin()),
                     std::make_move_iterator(r.end()));
    }
  }
  if (st.s.validation_data_dir) dump_generations(*st.s.validation_data_dir, st.global_step, records);
  if (st.s.log_val_generations > 0)
    std::cout << "validation generations (step " << st.global_step << "):\n"
              << format_generations(records, st.s.log_val_generations) << std::flush;
  // Each prompt's n samples are consecutive: mean@n over every sample; with
  // n > 1 also the mean over prompts of the best and the worst of their n
  // (verl's best@n; worst@n). As verl's, the core value is acc where there
  // is one (a dapo manager's), else reward; the others go under val-aux.
  Metrics m;
  const std::string at_n = "@" + std::to_string(n);
  for (const auto& [source, values] : by_source) {
    const std::string core = values.count("acc") ? "acc" : "reward";
    for (const auto& [name, scores] : values) {
      const std::string section = name == core ? "val-core/" : "val-aux/";
      const std::string prefix = source + "/" + name + "/";
      double total = 0, best = 0, worst = 0;
      for (size_t g = 0; g < scores.size(); g += static_cast<size_t>(n)) {
        const auto first = scores.begin() + static_cast<std::ptrdiff_t>(g);
        const auto last = first + n;
        for (auto it = first; it != last; ++it) total += *it;
        best += *std::max_element(first, last);
        worst += *std::min_element(first, last);
      }
      const double prompts = static_cast<double>(scores.size()) / static_cast<double>(n);
      m[section + prefix + "mean" + at_n] = total / static_cast<double>(scores.size());
      if (n > 1) {
        m[section + prefix + "best" + at_n] = best / prompts;
        m["val-aux/" + prefix + "worst" + at_n] = worst / prompts;
      }
    }
  }
  return m;
}

FitResult PpoTrainer::fit() {
  State& st = *s_;
  for (int64_t restarts = 0;; ++restarts) {
    try {
      FitResult r = st.s.async.enable ? fit_async(st, [this] { return validate(); }) : fit_once();
      r.restarts = restarts;
      return r;
    } catch (const std::exception& e) {
      const std::vector<WorkerGroup*> groups = process_groups(st);
      const bool dead = std::any_of(groups.begin(), groups.end(),
                                    [](const WorkerGroup* g) { return !g->alive(); });
      if (!dead || restarts >= st.s.max_restarts) throw;
      log(LogLevel::kWarn,
          "trainer: a worker died at step " + std::to_string(st.global_step) + " (" + e.what() +
              "); restarting every worker group (restart " + std::to_string(restarts + 1) +
              " of trainer.max_restarts = " + std::to_string(st.s.max_restarts) + ") and " +
              (has_trainer_checkpoint(st.s.out_dir)
                   ? "resuming from the latest checkpoint under " + st.s.out_dir
                   : std::string("starting over (no checkpoint yet)")));
      restart_workers(st);
    }
  }
}

FitResult PpoTrainer::fit_once() {
  State& st = *s_;
  Settings& s = st.s;
  FitResult result;
  WorkerGroup& actor = *st.actor;
  WorkerGroup* critic = s.use_critic ? &st.critic_role() : nullptr;

  begin_run(st, result, [this] { return validate(); });
  ProgressLine progress("training", s.total_steps);
  while (st.global_step < s.total_steps) {
    ++st.global_step;
    st.profiler->begin_step(st.global_step);
    const auto step_start = Clock::now();
    Metrics m;
    StepTimer timed{progress, st.global_step, {}};
    Metrics& timing = timed.timing;

    at::Tensor reward_baselines;  // remax: [prompts x n]
    DataProto batch = s.filter_groups.enable ? sample_varied_groups(st, timed, m, reward_baselines)
                                             : generate_batch(st, timed, 1, reward_baselines);
    // Under dynamic sampling with a KL penalty in the reward, the log-prob
    // passes and the penalty ran on each generation batch before the filter.
    const bool scored_with_kl = s.filter_groups.enable && s.use_kl_in_reward;
    if (s.balance_batch) {
      const std::vector<int64_t> order = balance_batch(batch, actor_dp(s), m);
      if (!order.empty() && reward_baselines.defined())
        reward_baselines = reward_baselines.index_select(0, at::tensor(order, at::kLong));
    }
    RewardModelScores rm;  // dynamic sampling scored each generation batch
    if (!s.filter_groups.enable) {
      rm = start_reward_model(st, batch, m);
      timed("reward", [&] { reward_phase(st, batch, rm, m); });
    }
    if (!s.old_log_prob_from_update && !scored_with_kl)
      timed("old_log_prob", [&] {
        old_log_prob_pass(actor, batch, s.loss_agg_mode, m, s.calculate_sum_pi_squared);
      });
    if (s.use_ref && !scored_with_kl) timed("ref", [&] { ref_log_prob_pass(actor, batch); });
    if (s.use_critic) timed("values", [&] { values_pass(*critic, batch); });
    if (rm.pending()) timed("reward_wait", [&] { rm.collect(batch); });
    timed("adv", [&] {
      if (s.filter_groups.enable) {  // token_level_rewards are set
        rollout_correction(batch, s, m);
        advantages(batch, s, reward_baselines);
      } else {
        rewards_and_advantages(batch, s, *st.kl_ctrl, m, reward_baselines);
      }
    });
    if (s.use_critic) {
      timed("update_critic", [&] {
        merge_metrics(m, critic->call("update_critic", {batch}).get().as<DataProto>());
      });
    }
    // verl's rule (ray_trainer.py: `critic_warmup <= global_steps`, steps count from 1).
    if (st.global_step >= s.critic_warmup) {
      timed("update_actor",
            [&] { merge_metrics(m, actor.call("update_actor", {batch}).get().as<DataProto>()); });
      // actor/entropy is the old-log-prob pass's (verl's); the update reports
      // its own forward's as actor/update_entropy. Without that pass the
      // update's first forward ran at the same weights: it is that value.
      if (s.old_log_prob_from_update && m.count("actor/update_entropy"))
        m["actor/entropy"] = m.at("actor/update_entropy");
    }
    timing["step"] = seconds_since(step_start);
    if (s.rollout_data_dir) {
      // The reward of each sample (a KL penalty in the reward is not part of it).
      const at::Tensor scores = batch
                                    .tensor(batch.has_tensor("token_level_scores")
                                                ? "token_level_scores"
                                                : "token_level_rewards")
                                    .sum(1)
                                    .to(at::kDouble)
                                    .contiguous();
      dump_generations(*s.rollout_data_dir, st.global_step,
                       generation_records(
                           batch, std::vector<double>(scores.data_ptr<double>(),
                                                      scores.data_ptr<double>() + scores.numel()),
                           *st.tokenizer));
    }

    validate_if_due(st, result, m, timing, [this] { return validate(); });
    log_step(st, result, batch, m, timing, progress);
    if (s.save_freq > 0 && (st.global_step % s.save_freq == 0 || st.global_step == s.total_steps)) {
      profiler::Span span("save_checkpoint", "trainer");
      save_trainer_checkpoint(st);
    }
    end_profiled_step(st);
  }
  result.steps = st.global_step;
  progress.update(st.global_step);
  progress.finish();

  export_and_plot(st, actor, result);
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
    for (const std::string& note : cl.notes) log(LogLevel::kInfo, note);
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
