#include "trainer/step_phases.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "base/log.h"
#include "trainer/metric_utils.h"
#include "trainer/metrics.h"
#include "trainer/seqlen_balancing.h"
#include "trainer/step_profiler.h"
#include "trainer/trainer_state.h"
#include "workers/algos/algo_registry.h"
#include "workers/algos/masked_reductions.h"
#include "workers/algos/rollout_correction.h"
#include "workers/rewards/reward_manager.h"

namespace baton::trainer {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t actor_dp(const TrainerSettings& s) {
  return s.world / (s.actor.model.tp * s.actor.model.pp);
}

std::vector<int64_t> balance_batch(DataProto& batch, int64_t dp, Metrics& m) {
  if (dp < 1 || batch.size() % dp != 0) return {};
  const at::Tensor lens = batch.tensor("attention_mask").to(at::kLong).sum(1).contiguous();
  const std::vector<int64_t> sizes(lens.data_ptr<int64_t>(),
                                   lens.data_ptr<int64_t>() + lens.numel());
  const auto parts = balanced_partitions(sizes, dp);
  std::vector<int64_t> order = balanced_order(parts);
  batch = batch.select_rows(order);
  for (const auto& [k, v] : seqlen_balance_metrics(sizes, parts)) m[k] = v;
  return order;
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

void RewardModelScores::collect(DataProto& batch) {
  batch.set_tensor("token_level_scores",
                   scores_->get().as<DataProto>().unpad(pad_).tensor("rm_scores"));
  scores_.reset();
}

RewardModelScores start_reward_model(PpoTrainer::State& st, const DataProto& batch, Metrics& m) {
  const TrainerSettings& s = st.s;
  if (!s.use_rm) return {};
  const int64_t replicas = s.rm_centralized ? 1 : s.world / (s.rm.model.tp * s.rm.model.pp);
  auto [padded, pad] = batch.pad_to_multiple(replicas);
  m["reward_model/param_bytes_per_training_rank"] = st.rm_param_bytes_per_rank;
  return RewardModelScores(st.reward_model().call("compute_rm_score", {padded}), pad);
}

void reward_phase(PpoTrainer::State& st, DataProto& batch, RewardModelScores& rm, Metrics& m) {
  const TrainerSettings& s = st.s;
  if (s.use_rm) {
    if (!s.rm_prefetch) rm.collect(batch);
    return;
  }
  batch = st.reward->with_token_level_scores(batch);
  if (s.zero_on_reward_error) m["reward/errors"] += batch.meta_value("reward_errors")->as_float();
}

void old_log_prob_pass(WorkerGroup& actor, DataProto& batch, const std::string& loss_agg_mode,
                       Metrics& m, bool sum_pi_squared) {
  if (sum_pi_squared) batch.set_meta("calculate_sum_pi_squared", Value(true));
  DataProto lp = actor.call("compute_log_prob", {batch}).get().as<DataProto>();
  if (sum_pi_squared) batch.set_tensor("sum_pi_squared", lp.tensor("sum_pi_squared"));
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  m["actor/entropy"] =
      algos::agg_loss(lp.tensor("entropys"), mask, algos::parse_loss_agg_mode(loss_agg_mode))
          .item<double>();
  batch.set_tensor("old_log_probs", lp.tensor("old_log_probs"));
}

void ref_log_prob_pass(WorkerGroup& actor, DataProto& batch) {
  DataProto lp = actor.call("compute_ref_log_prob", {batch}).get().as<DataProto>();
  batch.set_tensor("ref_log_prob", lp.tensor("ref_log_prob"));
}

void values_pass(WorkerGroup& critic, DataProto& batch) {
  DataProto v = critic.call("compute_values", {batch}).get().as<DataProto>();
  batch.set_tensor("values", v.tensor("values"));
}

void kl_in_reward(DataProto& batch, const TrainerSettings& s, algos::KLController& kl, Metrics& m) {
  const at::Tensor mask = batch.tensor("response_mask").to(at::kFloat);
  const at::Tensor scores = batch.tensor("token_level_scores");
  if (s.use_kl_in_reward) {
    // verl's apply_kl_penalty: rewards = scores − β·KL per token.
    const at::Tensor kld = algos::kl_penalty(batch.tensor("old_log_probs"),
                                             batch.tensor("ref_log_prob"), s.kl_penalty) *
                           mask;
    const double beta = kl.value;
    batch.set_tensor("token_level_rewards", scores - beta * kld);
    const double current_kl = (kld.sum(1) / mask.sum(1).clamp_min(1)).mean().item<double>();
    kl.update(current_kl, batch.size());
    m["critic/kl"] = current_kl;
    m["critic/kl_coef"] = beta;
  } else {
    batch.set_tensor("token_level_rewards", scores);
  }
}

void advantages(DataProto& batch, const TrainerSettings& s, const at::Tensor& reward_baselines) {
  algos::AdvantageInputs in;
  in.token_level_rewards = batch.tensor("token_level_rewards");
  in.response_mask = batch.tensor("response_mask").to(at::kFloat);
  for (const Value& v : batch.column("uid")) in.uids.push_back(v.as_string());
  if (batch.has_tensor("values")) in.values = batch.tensor("values");
  if (reward_baselines.defined()) in.reward_baselines = reward_baselines;
  for (auto [key, field] : {std::pair{"old_log_probs", &in.old_log_probs},
                            std::pair{"sum_pi_squared", &in.sum_pi_squared},
                            std::pair{"rollout_is_weights", &in.rollout_is_weights}})
    if (batch.has_tensor(key)) *field = batch.tensor(key);
  algos::AdvantageResult adv = algos::compute_advantage(s.adv_estimator, in, s.adv);
  batch.set_tensor("advantages", adv.advantages);
  batch.set_tensor("returns", adv.returns);
}

void rollout_correction(DataProto& batch, const TrainerSettings& s, Metrics& m) {
  if (!s.rollout_correction.enabled()) return;
  algos::RolloutCorrection c = algos::compute_rollout_correction(
      batch.tensor("old_log_probs"), batch.tensor("rollout_log_probs"),
      batch.tensor("response_mask"), s.rollout_correction);
  batch.set_tensor("response_mask", c.response_mask);
  if (c.rollout_is_weights.defined()) batch.set_tensor("rollout_is_weights", c.rollout_is_weights);
  m.merge(c.metrics);
}

void rewards_and_advantages(DataProto& batch, const TrainerSettings& s, algos::KLController& kl,
                            Metrics& m, const at::Tensor& reward_baselines) {
  kl_in_reward(batch, s, kl, m);
  rollout_correction(batch, s, m);
  advantages(batch, s, reward_baselines);
}

void begin_run(PpoTrainer::State& st, FitResult& result, const std::function<Metrics()>& validate) {
  const TrainerSettings& s = st.s;
  const bool resumed = resume_trainer_checkpoint(st);
  MetricsLoggerOptions lopts;
  lopts.dir = s.out_dir;
  lopts.loggers = s.loggers;
  lopts.set_names(s.project_name, s.experiment_name);
  lopts.wandb.set_python(s.logger_python).set_config_yaml(st.config.to_yaml());
  lopts.wandb.https_proxy = s.wandb_proxy;
  if (resumed) lopts.set_resume_step(st.global_step);
  st.logger = std::make_unique<MetricsLogger>(lopts);
  if (s.val_before_train && st.val_data) {
    Metrics v = validate();
    result.first_validation = v;
    result.last_validation = v;
    st.logger->log(st.global_step, v);
  }
}

void validate_if_due(PpoTrainer::State& st, FitResult& result, Metrics& m, Metrics& timing,
                     const std::function<Metrics()>& validate) {
  const TrainerSettings& s = st.s;
  if (s.test_freq <= 0 || !st.val_data ||
      (st.global_step % s.test_freq != 0 && st.global_step != s.total_steps))
    return;
  profiler::Span span("testing", "trainer");
  const auto t0 = Clock::now();
  Metrics v = validate();
  timing["testing"] = seconds_since(t0);
  result.last_validation = v;
  if (result.first_validation.empty()) result.first_validation = v;
  m.insert(v.begin(), v.end());
}

void log_step(PpoTrainer::State& st, FitResult& result, const DataProto& batch, Metrics& m,
              const Metrics& timing, ProgressLine& progress) {
  const TrainerSettings& s = st.s;
  for (const auto& [k, v] : compute_data_metrics(batch, s.use_critic, s.response_length)) m[k] = v;
  for (const auto& [k, v] : compute_timing_metrics(batch, timing)) m[k] = v;
  for (const auto& [k, v] : compute_throughput_metrics(batch, timing, static_cast<int>(s.world)))
    m[k] = v;
  m["training/global_step"] = static_cast<double>(st.global_step);
  progress.clear();
  st.logger->log(st.global_step, m);
  result.last_metrics = m;
}

void end_profiled_step(PpoTrainer::State& st) {
  const std::string trace = st.profiler->end_step(st.global_step);
  if (!trace.empty())
    log(LogLevel::kInfo, "profile of step " + std::to_string(st.global_step) + ": " + trace);
}

void export_and_plot(PpoTrainer::State& st, WorkerGroup& actor, FitResult& result) {
  const TrainerSettings& s = st.s;
  result.hf_dir = (std::filesystem::path(s.out_dir) / "actor_hf").string();
  actor.call("export_hf", {result.hf_dir}).get();
  if (std::find(s.loggers.begin(), s.loggers.end(), "file") == s.loggers.end()) return;
  try {
    result.plot = (std::filesystem::path(s.out_dir) / "curves.png").string();
    st.logger->plot(result.plot);
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, std::string("no plot: ") + e.what());
    result.plot.clear();
  }
}

}  // namespace baton::trainer
